"""The supervisor under hostile or unlucky conditions: idle connections, stuck workers and
status queries never hold up another tenant's session; the socket serves every local user a
tenant names."""

import os
import pathlib
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time

import pytest
from conftest import WH, Server, wait_for

HEADER = struct.Struct("<HBBHHII")
REFUSED = 0xF005
NOBODY = 65534


def time_to_session(server, c_programs, **env):
    """Seconds from starting a client until its first call has a session (block_forever prints
    "waiting" once it holds a context); the client is killed afterwards."""
    t0 = time.monotonic()
    p = server.popen([c_programs["block_forever"]], **env)
    try:
        line = p.stdout.readline().strip()
        elapsed = time.monotonic() - t0
        assert line == "waiting", line + p.stderr.read()
        return elapsed
    finally:
        p.kill()
        p.wait()


def warm_up(server, c_programs):
    """One session first, so the timed one finds a standby worker as it normally does."""
    time_to_session(server, c_programs)
    wait_for(lambda: all(t["standby_worker"] for t in server.status()["tenants"]))


def test_idle_local_connections_do_not_delay_other_sessions(server, c_programs):
    warm_up(server, c_programs)
    idle = []
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.connect(server.socket)
            idle.append(s)  # connected, never says HELLO
        elapsed = time_to_session(server, c_programs)
        # Before: each idle connection held the accept loop for its 5 s HELLO timeout (15 s
        # in all); a loaded machine may take a second or two to start the client.
        assert elapsed < 4.0, f"session start took {elapsed:.2f}s behind 3 idle connections"
        t0 = time.monotonic()
        r = server.run([c_programs["vector_add"]], timeout=60)
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 5.0
    finally:
        for s in idle:
            s.close()


def test_a_flood_of_idle_connections_is_refused_beyond_the_bound(server, c_programs):
    warm_up(server, c_programs)
    idle = []
    try:
        # 32 handshakes per peer may wait at once; the 33rd is refused with a reason at once.
        for _ in range(32):
            s = socket.socket(socket.AF_UNIX)
            s.connect(server.socket)
            idle.append(s)
        extra = socket.socket(socket.AF_UNIX)
        extra.settimeout(3)
        extra.connect(server.socket)
        header = extra.recv(HEADER.size, socket.MSG_WAITALL)
        assert len(header) == HEADER.size, "no answer to a connection over the bound"
        assert HEADER.unpack(header)[3] == REFUSED
        extra.close()
        wait_for(lambda: "too many are waiting for their HELLO" in server.log.read_text())
    finally:
        for s in idle:
            s.close()
    # Closed connections give their places back at once.
    assert time_to_session(server, c_programs) < 5.0
    assert server.proc.poll() is None


def test_stopped_workers_do_not_stall_status_or_new_sessions(server, c_programs):
    clients = [server.popen([c_programs["block_forever"]]) for _ in range(3)]
    stopped = []
    stop = threading.Event()
    pollers = []
    try:
        for p in clients:
            assert p.stdout.readline().strip() == "waiting", p.stderr.read()
        pids = wait_for(lambda: (lambda w: w if len(w) == 3 else None)(server.worker_pids()))
        wait_for(lambda: all(t["standby_worker"] for t in server.status()["tenants"]))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        # SIGSTOP takes effect asynchronously: until then a worker may still answer.
        for pid in pids:
            wait_for(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T")
        # Three stuck workers cost one timeout (0.5 s) in all, not one each (1.5 s): the
        # quickest of three queries, so that a slow start of `wh` on a loaded machine is no
        # failure.
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            st = server.status(details=False)
            took.append(time.monotonic() - t0)
            assert [s["detail"] for s in st["sessions"]] == [None] * 3
        assert min(took) < 1.2, f"wh status took {took} s with 3 stopped workers"

        # Status queries all the time (a dashboard, a metrics scraper): before, each held the
        # server's lock while it waited for the stuck workers, and every accept waited too.
        def poll():
            while not stop.is_set():
                subprocess.run([str(WH), "status", "--socket", server.socket], capture_output=True, timeout=30)

        pollers = [threading.Thread(target=poll) for _ in range(4)]
        for t in pollers:
            t.start()
        time.sleep(0.5)
        # The quickest of three: each waited behind the queries before.
        elapsed = [time_to_session(server, c_programs) for _ in range(3)]
        assert min(elapsed) < 1.0, f"session starts took {elapsed} s while status queries waited on stopped workers"
    finally:
        stop.set()
        for t in pollers:
            t.join()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        for p in clients:
            p.kill()
            p.wait()
    # Resumed workers answer again.
    assert server.proc.poll() is None


@pytest.fixture
def shared_dir():
    """A directory every local user can reach (pytest's own tmp_path is under a 0700 one)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="wh-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(argv):
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + argv


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another user needs root")
def test_a_tenant_of_another_uid_can_connect(shared_dir, c_programs):
    # What nobody runs must be reachable by nobody: wh, the client library next to it, the
    # C programs; its own temporary directory (wh run writes its ICD file there).
    for f in [WH, WH.parent / "libwormhole_opencl.so", c_programs["vector_add"], c_programs["block_forever"]]:
        shutil.copy(f, shared_dir)
    wh = shared_dir / "wh"
    tmp = shared_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    cfg = shared_dir / "wormhole.toml"
    cfg.write_text(f'[[tenant]]\nname = "root"\nuids = [0]\n\n[[tenant]]\nname = "nobody"\nuids = [{NOBODY}]\n')
    s = Server(shared_dir, config=cfg).start()
    try:
        assert stat.S_IMODE(os.stat(s.socket).st_mode) == 0o666
        env = s.env(TMPDIR=str(tmp), HOME="/")
        r = subprocess.run(as_nobody([str(wh), "run", "--", str(shared_dir / "vector_add")]),
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        p = subprocess.Popen(as_nobody([str(wh), "run", "--", str(shared_dir / "block_forever")]),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "waiting", p.stderr.read()
            # (setpriv and wh run exec: the program keeps the pid Popen gave it.)
            (sess,) = [x for x in s.status()["sessions"] if x["client_pid"] == p.pid]
            assert sess["tenant"] == "nobody" and sess["client_uid"] == NOBODY
        finally:
            p.kill()
            p.wait()
    finally:
        s.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_wh_run_refuses_an_icd_directory_someone_else_controls(server, shared_dir, c_programs):
    # wh run's ICD directory has a predictable name under the temporary directory: another
    # user who made it first (and can write it) could hand the next program their library.
    tmp = shared_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    r = server.run([c_programs["vector_add"]], TMPDIR=str(tmp))
    assert r.returncode == 0, r.stderr
    (icd_dir,) = tmp.iterdir()
    assert stat.S_IMODE(icd_dir.stat().st_mode) == 0o700
    os.chown(icd_dir, NOBODY, NOBODY)
    icd_dir.chmod(0o777)
    r = server.run([c_programs["vector_add"]], TMPDIR=str(tmp))
    assert r.returncode != 0 and "no one else can write" in r.stderr, r.stderr
    # Its own again, it is used again.
    os.chown(icd_dir, 0, 0)
    icd_dir.chmod(0o700)
    r = server.run([c_programs["vector_add"]], TMPDIR=str(tmp))
    assert r.returncode == 0, r.stderr


def test_runtime_directory_is_created_reachable_and_an_existing_one_left_alone(tmp_path, c_programs):
    s = Server(tmp_path)
    s.socket = str(tmp_path / "run" / "wormhole" / "wh.sock")
    old = os.umask(0o077)
    try:
        s.start()
    finally:
        os.umask(old)
    try:
        for d in [tmp_path / "run", tmp_path / "run" / "wormhole"]:
            assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
        assert stat.S_IMODE(os.stat(s.socket).st_mode) == 0o666
        r = s.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr
    finally:
        s.stop()
    # A directory the operator made keeps its mode.
    mine = tmp_path / "private"
    mine.mkdir(mode=0o750)
    mine.chmod(0o750)
    s = Server(tmp_path)
    s.socket = str(mine / "wh.sock")
    s.start()
    try:
        assert stat.S_IMODE(mine.stat().st_mode) == 0o750
    finally:
        s.stop()


def test_a_second_server_on_a_live_socket_is_refused_and_a_dead_ones_socket_replaced(tmp_path, c_programs):
    """A server started on the socket of one that is serving would take the socket over and
    strand the first one's clients: it stops, saying why, before it starts anything. The
    socket of a killed server (nothing answers on it) is replaced."""
    first = Server(tmp_path).start()
    try:
        second = subprocess.run([WH, "serve", "--socket", first.socket, "--state-dir", str(tmp_path / "state2")],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "another server is serving on it" in second.stderr, second.stderr
        r = first.run([c_programs["vector_add"]], timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        first.stop()
    assert os.path.exists(first.socket), "the killed server's socket should lie there"
    again = subprocess.Popen([WH, "serve", "--socket", first.socket, "--state-dir", str(tmp_path / "state3")],
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "again.log", "w"), start_new_session=True)
    try:
        wait_for(lambda: "wormhole server listening" in (tmp_path / "again.log").read_text(), timeout=10)
        r = first.run([c_programs["vector_add"]], timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        os.killpg(again.pid, signal.SIGKILL)
        again.wait()
