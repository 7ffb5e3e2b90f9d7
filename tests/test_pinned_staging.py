"""Pinned staging, the way blocking transfers go to a discrete GPU (crates/opencl/server/src/
staging.rs): the worker copies between the ring and page-locked slots in pieces while the device
moves the previous piece. PoCL is a CPU device, which keeps the in-place arena; the server's
WORMHOLE_PINNED_STAGING=always treats it as a discrete one, so that the path's behaviour is
checked here on every transport (its speed is measured by `wh bench` on the GPU machine)."""

import subprocess

import pytest
from conftest import Server


def test_native_baseline(c_programs):
    r = subprocess.run([c_programs["staged"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "staged OK\ncontext destroyed\n"


@pytest.mark.parametrize("transport", ["shm", "tcp", "ivshmem"])
def test_transfers_through_pinned_staging_are_native(tmp_path, c_programs, transport):
    s = Server(
        tmp_path,
        tcp=transport == "tcp",
        guest=transport == "ivshmem",
        extra_env={"WORMHOLE_PINNED_STAGING": "always"},
    ).start()
    try:
        p = s.popen([c_programs["staged"], "hold"])
        try:
            assert p.stdout.readline() == "staged OK\n", p.stderr.read()
            (session,) = s.status()["sessions"]
            d = session["detail"]
            # Blocking reads of the program's first thread went through the slots on every
            # transport (5), its writes too where the worker takes them from a ring (shared
            # memory, a guest's region: 5 more); of two threads at once, one may find the
            # slots taken and go the ordinary way.
            assert d["staged_transfers"] >= (10 if transport != "tcp" else 5), d
            assert d["direct_transfers"] == 0 and d["shared_mem_bytes"] == 0, d
        finally:
            p.stdin.close()
            # The context goes after the application's last release, staging and all.
            assert p.stdout.read() == "context destroyed\n"
            assert p.wait(timeout=60) == 0, p.stderr.read()
        # Errors, wait lists and contents of the older bulk program, as natively.
        r = s.run([c_programs["bulk"]], STRICT="1")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        s.stop()


def test_cpu_devices_keep_the_in_place_arena(server, c_programs):
    """By default (auto) a device that computes in host memory is not staged: its large
    buffers live in the arena and the client copies them itself."""
    p = server.popen([c_programs["staged"], "hold"])
    try:
        assert p.stdout.readline() == "staged OK\n", p.stderr.read()
        d = server.status()["sessions"][0]["detail"]
        assert d["staged_transfers"] == 0 and d["direct_transfers"] > 0, d
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()
