"""The supervisor under hostile or unlucky conditions: idle connections never hold up another
tenant's session."""

import socket
import struct
import time

from conftest import wait_for

HEADER = struct.Struct("<HBBHHII")
REFUSED = 0xF005


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
        # Before: each idle connection held the accept loop for its 5 s HELLO timeout.
        assert elapsed < 1.0, f"session start took {elapsed:.2f}s behind 3 idle connections"
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

