"""The QEMU test guest (tests/guest.py, target/vm/ from scripts/vm/prepare.sh) boots, runs the
host's own Python, maps an ivshmem-plain BAR both ways, reaches the host over TCP, and the
device-event counting attributes virtio kicks to a TCP phase and none to a shared-memory one.
One guest boot serves every test here (~10-20 s under TCG)."""

import os
import socket
import sys
import threading

import pytest

import guest

SHM_SIZE = 1 << 20
N = 20  # round trips per counted phase

GUEST_SCRIPT = r"""
echo "pci=$(cat $WH_IVSHMEM0/vendor):$(cat $WH_IVSHMEM0/device)"
"$WH_PY" - "$(wh_ivshmem 0)" <<'PY'
import mmap, os, socket, sys
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 0)
print("bar_size=%d" % len(m))
print("from_host=%s" % bytes(m[0:16]).decode())
m[4096:4096 + 16] = b"guest-wrote-this"
m.flush()

s = socket.create_connection((os.environ["WH_HOST"], int(os.environ["ECHO_PORT"])), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def echo(msg):
    s.sendall(msg)
    got = b""
    while len(got) < len(msg):
        got += s.recv(4096)
    return got
print("tcp=%s" % echo(b"ping-through-slirp").decode())

ctl = os.open(os.environ["WH_CTL_TTY"], os.O_RDWR | os.O_NOCTTY)
def handshake(line):
    os.write(ctl, line)
    while os.read(ctl, 1) != b"\n":
        pass
def phase(name, fn):
    handshake(b"B %s\n" % name.encode())
    fn()
    handshake(b"E\n")
n = int(os.environ["N"])
def tcp():
    for _ in range(n):
        echo(b"x" * 64)
def poll():
    x = 0
    for _ in range(n):
        x += m[8192]
phase("empty", lambda: None)
phase("tcp", tcp)
phase("poll", poll)
print("phases=done")
PY
"""


@pytest.fixture(scope="module")
def guest_run(tmp_path_factory):
    missing = guest.vm_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must boot the test guest: {missing}")
        pytest.skip(missing)
    work = tmp_path_factory.mktemp("guest")
    shm = work / "shm"
    with open(shm, "wb") as f:
        f.truncate(SHM_SIZE)
        f.write(b"host-wrote-this!")

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                while data := c.recv(4096):
                    c.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        g = guest.Guest(work, ivshmem=[(shm, SHM_SIZE)], net=True)
        res = g.run(GUEST_SCRIPT, timeout=240, count_events=True,
                    env={"WH_PY": sys.executable, "ECHO_PORT": port, "N": N})
    finally:
        srv.close()
    print(f"guest: boot {res.boot_seconds:.1f}s, script {res.script_seconds:.1f}s ({g.accel})")
    values = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
    return res, values, shm


def test_guest_runs_host_python(guest_run):
    res, values, _ = guest_run
    assert res.status == 0, res.output
    assert values.get("phases") == "done", res.output


def test_ivshmem_bar_maps_both_ways(guest_run):
    _, values, shm = guest_run
    assert values.get("pci") == "0x1af4:0x1110"
    assert int(values["bar_size"]) == SHM_SIZE
    assert values["from_host"] == "host-wrote-this!"
    assert shm.read_bytes()[4096:4096 + 16] == b"guest-wrote-this"


def test_tcp_to_host_over_user_networking(guest_run):
    _, values, _ = guest_run
    assert values.get("tcp") == "ping-through-slirp"


def test_device_events_attributed_to_phases(guest_run):
    res, _, _ = guest_run
    assert set(res.phases) == {"empty", "tcp", "poll"}, res.phases
    base = res.phases["empty"]
    tcp = guest.summarize(res.phases["tcp"], base)
    poll = guest.summarize(res.phases["poll"], base)
    # Every TCP send kicks virtio-net's transmit queue; every reply comes with an interrupt.
    assert tcp["kicks"] >= N and tcp["irqs"] >= N, tcp
    # Reading the ivshmem BAR is plain RAM for QEMU: no kicks, no interrupts.
    assert poll["kicks"] <= 1 and poll["irqs"] <= 2, poll
