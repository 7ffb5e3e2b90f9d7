"""Tenants, quotas and untrusted input: a tenant reaches only its own objects and stays within
its quota; unknown peers are refused; malformed messages end only their own session."""

import os
import signal
import socket
import struct
import subprocess
import time

import pytest
import wire
from conftest import Server

CL_SUCCESS = wire.CL["CL_SUCCESS"]
CL_INVALID_MEM_OBJECT = wire.CL["CL_INVALID_MEM_OBJECT"]
CL_MEM_OBJECT_ALLOCATION_FAILURE = wire.CL["CL_MEM_OBJECT_ALLOCATION_FAILURE"]


def config(tmp_path, body):
    p = tmp_path / "wormhole.toml"
    p.write_text(body)
    return p


@pytest.fixture
def quota_server(tmp_path):
    uid = os.getuid()
    cfg = config(tmp_path, f'[[tenant]]\nname = "local"\nuids = [{uid}]\nmem_quota_mib = 64\n\n[[tenant]]\nname = "remote"\ntoken = "s3cret"\nmem_quota_mib = 64\n')
    s = Server(tmp_path, tcp=True, config=cfg, metrics=True).start()
    yield s
    s.stop()


def statuses(out):
    return [int(line.split()[1]) for line in out.strip().splitlines()]


def test_quota_overrun_fails_cleanly(quota_server, c_programs):
    r = quota_server.run([c_programs["alloc"], "32", "16", "32", "8"], WORMHOLE_SERVER="")
    assert r.returncode == 0, r.stderr
    assert statuses(r.stdout) == [CL_SUCCESS, CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_SUCCESS]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_transfers_in_flight_stay_within_the_quota(quota_server, c_programs, transport):
    """Non-blocking reads and writes held back by a user event keep their bytes in the worker
    (natively they are the application's own memory): at most the tenant's 64 MiB quota of
    them, 8 of 8 MiB. The ninth is refused with CL_OUT_OF_HOST_MEMORY (and a log line), every
    accepted one moves the right bytes, and the next round gets the memory back."""
    env = {"WORMHOLE_TOKEN": "s3cret"} if transport == "tcp" else {"WORMHOLE_SERVER": ""}
    native = subprocess.run([c_programs["pending_transfers"], "8", "12"], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    assert native.stdout == ("reads accepted 12 refused 0\nwrites accepted 12 refused 0\n" * 2) + "ok\n"
    r = quota_server.run([c_programs["pending_transfers"], "8", "12"], **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ("reads accepted 8 refused 4\nwrites accepted 8 refused 4\n" * 2) + "ok\n"
    assert "a non-blocking transfer refused (CL_OUT_OF_HOST_MEMORY)" in quota_server.log.read_text()


def test_quota_is_per_tenant_across_sessions_and_freed_by_kill(quota_server, c_programs):
    holder = quota_server.popen([c_programs["alloc"], "hold", "48"], WORMHOLE_SERVER="")
    assert holder.stdout.readline().split() == ["48", "0"]
    # A second session of the same tenant shares the 64 MiB.
    r = quota_server.run([c_programs["alloc"], "32"], WORMHOLE_SERVER="")
    assert statuses(r.stdout) == [CL_MEM_OBJECT_ALLOCATION_FAILURE]
    # The other tenant has its own quota.
    r = quota_server.run([c_programs["alloc"], "32"], WORMHOLE_TOKEN="s3cret")
    assert statuses(r.stdout) == [CL_SUCCESS], r.stderr
    # Killing the holder gives its memory back to the tenant.
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        local = [t for t in quota_server.status()["tenants"] if t["name"] == "local"][0]
        if local["sessions"] == 0 and local["mem_bytes"] == 0:
            break
        time.sleep(0.1)
    assert local["mem_bytes"] == 0 and local["sessions"] == 0
    r = quota_server.run([c_programs["alloc"], "32"], WORMHOLE_SERVER="")
    assert statuses(r.stdout) == [CL_SUCCESS]


def test_freed_shared_virtual_memory_returns_to_the_quota(quota_server, c_programs):
    # 4 x 48 MiB in turn under a 64 MiB quota: each free gives its bytes back; the last asks
    # for more than the quota and is refused.
    r = quota_server.run([c_programs["alloc"], "svm-cycle", "48", "48", "48", "48", "80"], WORMHOLE_SERVER="")
    assert r.returncode == 0, r.stderr
    assert statuses(r.stdout) == [CL_SUCCESS] * 4 + [CL_MEM_OBJECT_ALLOCATION_FAILURE]
    local = [t for t in quota_server.status()["tenants"] if t["name"] == "local"][0]
    assert local["mem_bytes"] == 0


def test_unknown_uid_and_bad_tokens_are_refused(tmp_path, c_programs):
    cfg = config(tmp_path, '[[tenant]]\nname = "someone"\nuids = [4242]\ntoken = "right"\n')
    s = Server(tmp_path, tcp=True, config=cfg).start()
    try:
        r = s.run([c_programs["vector_add"]], WORMHOLE_SERVER="")
        assert r.returncode != 0
        assert "is not a tenant of this server" in r.stderr
        r = s.run([c_programs["vector_add"]])  # TCP, no token
        assert "refused" in r.stderr and r.returncode != 0
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="wrong")
        assert "unknown token" in r.stderr and r.returncode != 0
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="right")
        assert r.returncode == 0, r.stderr
        log = s.log.read_text()
        assert "is not a tenant" in log and "unknown token" in log
    finally:
        s.stop()


# {{{ raw protocol over TCP: what a hostile client can send (the vocabulary from tests/wire.py,
# which reads it from the Rust sources)

HEADER = wire.HEADER
HELLO, WELCOME = wire.HELLO, wire.WELCOME
OP_GET_MEM_OBJECT_INFO = wire.OP["clGetMemObjectInfo"]
OP_ENQUEUE_WRITE_BUFFER = wire.OP["clEnqueueWriteBuffer"]
CL_MEM_SIZE = wire.CL["CL_MEM_SIZE"]


class Raw:
    """A minimal client that speaks Wormhole's frames over TCP by hand."""

    def __init__(self, addr, token=None):
        host, port = addr.split(":")
        self.s = socket.create_connection((host, int(port)), timeout=10)
        self.send(HELLO, wire.hello_body(token))
        op, _ = self.recv()
        assert op == WELCOME

    def send(self, op, body, lane=0, seq=1, raw_header=None):
        self.s.sendall((raw_header or wire.header(op, len(body), lane=lane, seq=seq)) + body)

    def recv(self):
        h = b""
        while len(h) < HEADER.size:
            chunk = self.s.recv(HEADER.size - len(h))
            if not chunk:
                raise ConnectionError("closed")
            h += chunk
        _, _, _, op, _, n, _ = HEADER.unpack(h)
        body = b""
        while len(body) < n:
            chunk = self.s.recv(n - len(body))
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
        return op, body

    def mem_size(self, mem_id):
        self.send(OP_GET_MEM_OBJECT_INFO, struct.pack("<QI", mem_id, CL_MEM_SIZE))
        _, body = self.recv()
        return struct.unpack("<i", body[:4])[0]


def test_made_up_and_foreign_handles_get_the_native_error(quota_server):
    a = Raw(quota_server.tcp, token=b"s3cret")
    for guess in [1, 2, 3, 1 << 63 | 1, 0xDEADBEEF, 2**64 - 1]:
        assert a.mem_size(guess) == CL_INVALID_MEM_OBJECT


@pytest.mark.parametrize(
    "garbage",
    ["bad magic", "huge length", "truncated body", "unknown opcode", "trailing bytes", "streamed write"],
)
def test_malformed_messages_end_only_their_session(quota_server, c_programs, garbage):
    bad = Raw(quota_server.tcp, token=b"s3cret")
    if garbage == "bad magic":
        bad.send(0, b"", raw_header=b"XX" + bytes(14))
    elif garbage == "huge length":
        bad.send(0, b"", raw_header=wire.header(OP_GET_MEM_OBJECT_INFO, 0xFFFFFFFF))
    elif garbage == "truncated body":
        bad.send(OP_GET_MEM_OBJECT_INFO, b"\x01\x02")
    elif garbage == "unknown opcode":
        assert 0x7777 not in wire.OP.values() and 0x7777 not in wire.CONTROL.values()
        bad.send(0x7777, b"")
    elif garbage == "trailing bytes":
        bad.send(OP_GET_MEM_OBJECT_INFO, struct.pack("<QI", 1, CL_MEM_SIZE) + b"extra")
    elif garbage == "streamed write":
        # Large enough that the worker takes it in chunks as it arrives (worker.rs, `streams`):
        # its header is garbage (an option tag of 0xff).
        bad.send(OP_ENQUEUE_WRITE_BUFFER, b"\xff" * (1 << 20))
    with pytest.raises((ConnectionError, OSError)):
        bad.recv()
    # The server and other sessions carry on.
    r = quota_server.run([c_programs["vector_add"]], WORMHOLE_SERVER="")
    assert r.returncode == 0, r.stderr
    assert "ending session" in quota_server.log.read_text() or "malformed" in quota_server.log.read_text()

# }}}


def test_a_client_gone_halfway_through_a_large_write_ends_only_its_session(quota_server, c_programs):
    """Over TCP a large write's data reaches the worker in chunks while its lane already runs
    it: a client that stops sending halfway (and closes) ends its session, nothing waits for
    the rest, and the server serves the next session."""
    bad = Raw(quota_server.tcp, token=b"s3cret")
    bad.s.sendall(wire.header(OP_ENQUEUE_WRITE_BUFFER, 64 << 20) + bytes(3 << 20))
    bad.s.shutdown(socket.SHUT_WR)
    with pytest.raises((ConnectionError, OSError)):
        bad.recv()
    deadline = time.time() + 10
    while time.time() < deadline and quota_server.status()["sessions"]:
        time.sleep(0.1)
    assert quota_server.status()["sessions"] == []
    r = quota_server.run([c_programs["vector_add"]], WORMHOLE_SERVER="")
    assert r.returncode == 0, r.stderr


def test_many_clients_killed_at_random_leave_nothing_behind(server, c_programs):
    import random

    rng = random.Random(7)
    procs = []
    for i in range(100):
        p = server.popen([c_programs["multithread"]])
        procs.append(p)
        time.sleep(rng.uniform(0, 0.05))
        if len(procs) >= 8 or i == 99:
            for q in procs:
                time.sleep(rng.uniform(0, 0.1))
                q.send_signal(signal.SIGKILL)
            for q in procs:
                q.wait()
            procs = []
    deadline = time.time() + 20
    while time.time() < deadline and server.status()["sessions"]:
        time.sleep(0.1)
    st = server.status()
    assert st["sessions"] == []
    assert all(t["mem_bytes"] == 0 for t in st["tenants"])
    assert server.proc.poll() is None
    r = server.run([c_programs["vector_add"]])
    assert r.returncode == 0, r.stderr


def test_status_and_metrics_show_tenants_sessions_and_memory(quota_server, c_programs):
    import urllib.request

    holder = quota_server.popen([c_programs["alloc"], "hold", "16"], WORMHOLE_SERVER="")
    assert holder.stdout.readline().split() == ["16", "0"]
    try:
        st = quota_server.status()
        (sess,) = st["sessions"]
        assert sess["tenant"] == "local" and sess["detail"]["mem_bytes"] == 16 << 20
        assert sess["detail"]["objects"]["Mem"] == 1 and sess["calls_per_s"] > 0
        local = [t for t in st["tenants"] if t["name"] == "local"][0]
        assert local["mem_bytes"] == 16 << 20 and local["mem_quota"] == 64 << 20
        text = urllib.request.urlopen(f"http://{quota_server.metrics}/metrics", timeout=10).read().decode()
        assert f'wormhole_tenant_memory_bytes{{tenant="local"}} {16 << 20}' in text
        assert f'wormhole_tenant_memory_quota_bytes{{tenant="local"}} {64 << 20}' in text
        assert 'wormhole_session_objects{tenant="local"' in text
    finally:
        holder.kill()
        holder.wait()


def test_tls_tokens_and_plain_tcp_refused(tmp_path, c_programs):
    """TCP tenants authenticate with a token over TLS; a plain-TCP client, a client that does not
    trust the server's certificate and a wrong token are all refused."""
    cfg = config(tmp_path, '[[tenant]]\nname = "remote"\ntoken = "t0ken"\n')
    s = Server(tmp_path, config=cfg, tls=True).start()
    try:
        r = s.run([c_programs["callbacks"]], WORMHOLE_TOKEN="t0ken")
        assert r.returncode == 0, r.stderr
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="nope")
        assert r.returncode != 0 and "unknown token" in r.stderr
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="t0ken", WORMHOLE_SERVER=f"tcp://{s.tcp}")
        assert r.returncode != 0
        other = tmp_path / "other"
        subprocess.run([str(__import__("conftest").WH), "gen-cert", "--dir", str(other)], check=True, capture_output=True)
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="t0ken", WORMHOLE_CA=str(other / "cert.pem"))
        assert r.returncode != 0
        log = s.log.read_text()
        assert "no valid HELLO" in log  # the plain-TCP client
        assert "unknown token" in log
        # The tenant's TLS session still works after all that.
        r = s.run([c_programs["vector_add"]], WORMHOLE_TOKEN="t0ken")
        assert r.returncode == 0, r.stderr
    finally:
        s.stop()


def test_restarted_server_takes_new_sessions_at_once(server, c_programs):
    p = server.popen([c_programs["block_forever"]])
    assert p.stdout.readline().strip() == "waiting"
    server.stop()
    assert p.stdout.readline().startswith("returned -5")
    p.wait(timeout=10)
    server.start()
    r = server.run([c_programs["vector_add"]])
    assert r.returncode == 0, r.stderr


def test_tenant_sees_only_its_devices(tmp_path, c_programs):
    uid = os.getuid()
    cfg = config(tmp_path, f'[[tenant]]\nname = "gpu-only"\nuids = [{uid}]\ndevices = ["no-such-device"]\n')
    s = Server(tmp_path, config=cfg).start()
    try:
        r = s.run(["clinfo", "-l"])
        assert "Device #" not in r.stdout, r.stdout
        r = s.run([c_programs["vector_add"]])
        assert r.returncode != 0 and "-1" in r.stderr  # CL_DEVICE_NOT_FOUND from clGetDeviceIDs
    finally:
        s.stop()
    cfg = config(tmp_path, f'[[tenant]]\nname = "cpu"\nuids = [{uid}]\ndevices = ["pthread", "cpu"]\n')
    s = Server(tmp_path, config=cfg).start()
    try:
        r = s.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr
    finally:
        s.stop()
