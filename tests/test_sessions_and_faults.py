"""Sessions get their own worker processes; a server that dies under a blocking call makes
that call fail within a second instead of hanging; a client that goes away ends its session."""

import os
import shutil
import signal
import time

import pytest
from conftest import WH, Server, wait_for


def start_blocked(server, c_programs):
    p = server.popen([c_programs["block_forever"]])
    assert p.stdout.readline().strip() == "waiting", p.stderr.read()
    return p


def test_two_sessions_two_workers(server, c_programs):
    a = start_blocked(server, c_programs)
    b = start_blocked(server, c_programs)
    try:
        pids = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(server.worker_pids()))
        assert pids[0] != pids[1]
        assert server.proc.pid not in pids
        sessions = server.status()["sessions"]
        assert {s["client_pid"] for s in sessions} == {a.pid, b.pid}
        for s in sessions:
            assert s["detail"]["objects"].get("Event") == 1
            assert s["detail"]["objects"].get("Context") == 1
    finally:
        a.kill()
        b.kill()
    # A client that dies ends its session and its worker.
    wait_for(lambda: server.status()["sessions"] == [])
    for pid in pids:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z")


@pytest.mark.parametrize("victim", ["worker", "whole server"])
def test_server_death_fails_blocking_call_fast(any_server, c_programs, victim):
    server = any_server
    p = start_blocked(server, c_programs)
    (worker,) = wait_for(server.worker_pids)
    t0 = time.monotonic()
    if victim == "worker":
        os.kill(worker, signal.SIGKILL)
    else:
        os.killpg(server.proc.pid, signal.SIGKILL)
    line = p.stdout.readline().strip()
    elapsed = time.monotonic() - t0
    assert line.startswith("returned "), line + p.stderr.read()
    assert int(line.split()[1]) == -5  # CL_OUT_OF_RESOURCES
    assert elapsed < 1.0, f"blocking call returned {elapsed:.2f}s after the server died"
    then = p.stdout.readline().strip()
    assert then == "then -5"
    assert p.wait(timeout=10) == 0


def test_one_worker_dying_leaves_other_sessions_working(server, c_programs):
    a = start_blocked(server, c_programs)
    (worker_a,) = wait_for(server.worker_pids)
    os.kill(worker_a, signal.SIGKILL)
    assert a.stdout.readline().startswith("returned -5")
    r = server.run([c_programs["vector_add"]])
    assert r.returncode == 0, r.stderr
    a.wait(timeout=10)


def test_server_ignores_wormholes_own_icd(tmp_path, c_programs):
    """Even with Wormhole registered as a vendor next to PoCL, the server never loads it."""
    from conftest import ROOT, Server

    vendors = tmp_path / "vendors"
    vendors.mkdir()
    for f in os.listdir("/etc/OpenCL/vendors"):
        (vendors / f).write_text(open(os.path.join("/etc/OpenCL/vendors", f)).read())
    (vendors / "wormhole.icd").write_text(str(ROOT / "target/release/libwormhole_opencl.so") + "\n")
    s = Server(tmp_path, extra_env={"OCL_ICD_VENDORS": str(vendors)}).start()
    try:
        r = s.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("Wormhole \u2192") == 1
    finally:
        s.stop()


def test_forked_child_cannot_use_the_parents_local_session(server, c_programs):
    r = server.run([c_programs["fork_child"]])
    assert r.returncode == 0, r.stderr
    assert "fork OK" in r.stdout


def test_sessions_start_on_a_standby_worker(server, c_programs):
    """The server keeps a worker with its driver loaded for the next session: a session starts
    on it, a new one takes its place, and one killed is replaced too. Standby workers are not
    sessions: they never show up as such, nor hold memory or use CPU."""
    standby = lambda: server.status()["tenants"][0]["standby_worker"]  # noqa: E731
    first = wait_for(standby)
    assert server.status()["sessions"] == []
    p = start_blocked(server, c_programs)
    try:
        (worker,) = wait_for(server.worker_pids)
        assert worker == first
        second = wait_for(lambda: (lambda s: s if s not in (None, first) else None)(standby()))
        # Asleep until it gets a session: no CPU time beyond its start.
        ticks = lambda pid: sum(int(x) for x in open(f"/proc/{pid}/stat").read().split()[13:15])  # noqa: E731

        def settled():
            # Its start (loading the driver) is over: asleep (not waiting for the disk, nor
            # starved of a CPU: those look quiet too, then run) through 0.5 s without CPU.
            state = lambda: open(f"/proc/{second}/stat").read().rsplit(")", 1)[1].split()[0]  # noqa: E731
            b = ticks(second)
            if state() != "S":
                return False
            time.sleep(0.5)
            return ticks(second) == b and state() == "S"

        wait_for(settled, timeout=10)
        before = ticks(second)
        time.sleep(1.0)
        assert ticks(second) - before <= 1
        os.kill(second, signal.SIGKILL)
        third = wait_for(lambda: (lambda s: s if s not in (None, second) else None)(standby()), timeout=15)
        assert third != first
        assert server.worker_pids() == [first]
    finally:
        p.kill()
    r = server.run([c_programs["vector_add"]])
    assert r.returncode == 0, r.stderr


def test_sessions_start_after_the_binary_was_replaced(tmp_path, c_programs):
    """An upgrade replaces `wh` on disk while the server runs: workers the supervisor starts
    afterwards are still its own executable, so sessions keep starting."""
    exe = tmp_path / "wh"
    shutil.copy(WH, exe)
    s = Server(tmp_path, wh=exe).start()
    try:
        exe.unlink()
        shutil.copy(WH, exe)  # a new file (inode) at the same path, as a package upgrade does
        # The first session takes the standby worker started before; the next ones need
        # workers started after the replacement.
        for _ in range(3):
            r = s.run([c_programs["vector_add"]])
            assert r.returncode == 0, r.stderr + s.log.read_text()
    finally:
        s.stop()
