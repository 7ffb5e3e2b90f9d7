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


def held_counts(server, program):
    """Runs staged.c with "hold" and returns the session's status detail at the hold."""
    p = server.popen([program, "hold"])
    try:
        assert p.stdout.readline() == "main OK\n", p.stderr.read()
        (session,) = server.status()["sessions"]
        return session["detail"]
    finally:
        p.stdin.close()
        # The rest: a context released early, two threads at once, errors; each context goes
        # after the application's last release, staging and all.
        assert p.stdout.read() == "staged OK\ncontext destroyed\n"
        assert p.wait(timeout=60) == 0, p.stderr.read()


@pytest.mark.parametrize("transport", ["shm", "tcp", "ivshmem"])
def test_transfers_through_pinned_staging_are_native(tmp_path, c_programs, transport):
    s = Server(
        tmp_path,
        tcp=transport == "tcp",
        guest=transport == "ivshmem",
        extra_env={"WORMHOLE_PINNED_STAGING": "always"},
    ).start()
    try:
        d = held_counts(s, c_programs["staged"])
        if transport == "tcp":
            # Over TCP every lane's replies share one stream, which a read's pieces would
            # hold while the device works (and a user event another thread sets through it
            # could never be set). Writes of 2 MiB and more come in chunks, staged as they
            # arrive (all but the one of 64 KiB).
            assert (d["staged_reads"], d["staged_writes"]) == (0, 5), d
        else:
            # Each of the main thread's blocking transfers of 64 KiB or more.
            assert (d["staged_reads"], d["staged_writes"]) == (7, 6), d
        assert d["direct_transfers"] == 0 and d["shared_mem_bytes"] == 0, d
        # Errors, wait lists and contents of the older bulk program, as natively.
        r = s.run([c_programs["bulk"]], STRICT="1")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        s.stop()


def test_cpu_devices_keep_the_in_place_arena(server, c_programs):
    """By default (auto) a device that computes in host memory is not staged: its large
    buffers live in the arena and the client copies them itself."""
    d = held_counts(server, c_programs["staged"])
    assert (d["staged_reads"], d["staged_writes"]) == (0, 0), d
    assert d["direct_transfers"] > 0, d
