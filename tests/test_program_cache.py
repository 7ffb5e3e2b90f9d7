"""The program cache all sessions of a server share: a build it serves behaves as a compiled
one (tests/c/program_cache.c checks code, source, log, references, rebuilds, callbacks and
errors), the next session's builds come from it, and it never serves what it should not."""

import hashlib
import os
import stat
import struct
import subprocess
import sys

import pytest
from conftest import Server, wait_for


@pytest.fixture
def cache_server(tmp_path):
    # PoCL's own kernel cache off: every build the program cache does not serve compiles.
    s = Server(tmp_path, extra_env={"POCL_KERNEL_CACHE": "0"}).start()
    yield s
    s.stop()


def counts(server, client, steps=("a", "b", "c", "d")):
    """Runs the cache client in one session and returns its (hits, misses), once the session's
    worker is gone: on PoCL, stores run in the background and finish before the worker exits."""
    p = server.popen([client, "hold"])
    try:
        for step in steps:
            line = p.stdout.readline()
            assert line == f"{step} ok\n", line + p.stderr.read()
        assert p.stdout.readline() == "ready\n"
        (session,) = server.status()["sessions"]
        d = session["detail"]
        return d["program_cache_hits"], d["program_cache_misses"]
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()
        wait_for(lambda: server.status()["sessions"] == [], timeout=60, what="the worker's exit")


def test_next_sessions_build_from_the_cache(cache_server, c_programs):
    client = c_programs["program_cache"]
    # First session: a) and c) compile (c fails, and is not stored); d) builds a's program
    # again in the same session: served. b) rebuilds an already built program: the driver's.
    assert counts(cache_server, client) == (1, 2)
    # Second session: a) and d) served; b) other options of a served program: compiled from
    # its source (and stored); c) compiled again.
    assert counts(cache_server, client) == (2, 2)
    # Third: everything but the failing build is served.
    assert counts(cache_server, client) == (3, 1)
    entries = list((cache_server.dir / "programs").glob("*.bin"))
    assert len(entries) == 2  # -DSCALE=3 and -DSCALE=5 for the one device
    mode = stat.S_IMODE(os.stat(cache_server.dir / "programs").st_mode)
    assert mode == 0o700


def test_a_served_program_builds_again_as_natively(cache_server, c_programs):
    """Builds and compiles again of a program whose build the cache served (piglit's
    cl-api-build-program): the same answers and programs as natively, in a session that meets
    the cache cold and in one that meets it warm. PoCL 3.1 aborts a second build of a program
    made from binaries, which ended the session at the first rebuild before; and a build while
    a kernel the application released still waits in a queue is refused, with its callback, as
    natively (before, the served program was freed under that kernel: SIGABRT in PoCL)."""
    client = c_programs["rebuild_served"]
    native = subprocess.run([client], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    hits = []
    for _ in range(2):
        p = cache_server.popen([client, "hold"])
        try:
            lines = []
            while not lines or lines[-1] != "ready\n":
                line = p.stdout.readline()
                assert line, "".join(lines) + p.stderr.read()
                lines.append(line)
            assert "".join(lines[:-1]) == native.stdout
            (session,) = cache_server.status()["sessions"]
            hits.append(session["detail"]["program_cache_hits"])
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0, p.stderr.read()
            wait_for(lambda: cache_server.status()["sessions"] == [], timeout=60, what="the worker's exit")
    assert hits[1] >= 3, hits  # the first build, the build after the failures, the second program
    assert "signal" not in cache_server.log.read_text()


def test_damaged_entries_are_compiled_again(cache_server, c_programs):
    client = c_programs["program_cache"]
    counts(cache_server, client)
    for e in (cache_server.dir / "programs").glob("*.bin"):
        data = e.read_bytes()
        e.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    # a) finds its entry damaged: removed, compiled and stored again; b) rebuilds a compiled
    # program (the driver's own rebuild); c) fails; d) served.
    assert counts(cache_server, client) == (1, 2)
    assert "damaged entry removed" in cache_server.log.read_text()
    # b) now meets its damaged entry.
    assert counts(cache_server, client) == (2, 2)
    assert counts(cache_server, client) == (3, 1)


def test_binaries_the_driver_refuses_are_compiled_again(cache_server, c_programs):
    client = c_programs["program_cache"]
    counts(cache_server, client)
    # Entries sound by every check of the cache (magic, key, lengths, digest) whose binary the
    # driver refuses, as after a driver update that kept its version string.
    # The blob cache's format (crates/blobcache): magic, key, digest, part count, part
    # lengths, parts; an OpenCL program's parts are its build log and its binary.
    for e in (cache_server.dir / "programs").glob("*.bin"):
        data = e.read_bytes()
        magic, key, nparts = data[:8], data[8:40], struct.unpack("<Q", data[72:80])[0]
        assert nparts == 2
        log_len = struct.unpack("<Q", data[80:88])[0]
        log, binary = data[96 : 96 + log_len], b"\xa5" * 4096
        parts = [log, binary]
        digest = hashlib.sha256(b"".join(struct.pack("<Q", len(p)) + p for p in parts)).digest()
        lens = b"".join(struct.pack("<Q", len(p)) for p in parts)
        e.write_bytes(magic + key + digest + struct.pack("<Q", len(parts)) + lens + log + binary)
    assert counts(cache_server, client) == (1, 2)
    assert "the driver refused a cached binary" in cache_server.log.read_text()
    assert counts(cache_server, client) == (2, 2)
    assert counts(cache_server, client) == (3, 1)


def test_cache_off(tmp_path, c_programs):
    s = Server(tmp_path, program_cache=False).start()
    try:
        assert counts(s, c_programs["program_cache"]) == (0, 0)
        assert not (tmp_path / "programs").exists()
    finally:
        s.stop()


def test_a_directory_others_may_write_is_refused(tmp_path, c_programs):
    shared = tmp_path / "programs"
    shared.mkdir()
    os.chmod(shared, 0o777)
    s = Server(tmp_path).start()
    try:
        assert counts(s, c_programs["program_cache"]) == (0, 0)
        assert "program cache off" in s.log.read_text()
        assert not list(shared.iterdir())
    finally:
        s.stop()


def test_builds_whose_binary_forgets_kernel_attributes_are_not_served(cache_server, c_programs):
    """PoCL's binaries keep what kernels do, not what the source said of them: a build served
    from the cache answered CL_KERNEL_ATTRIBUTES with "" (the CTS api kernel_attributes). Such
    builds are compiled every time, so every session answers as native."""
    client = c_programs["kernel_attributes"]
    native = subprocess.run([client], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "reqd_work_group_size(1,1,1)" in native.replace(" ", "")
    for _ in range(2):
        r = cache_server.run([client], timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == native


def test_commands_of_a_required_work_group_size_outlive_the_store(tmp_path, c_programs):
    """PoCL before 7.0 aborted the worker when the cache asked a program for its binaries while
    commands of a kernel with a required work-group size ran (PyOpenCL's scans and sorts):
    the driver's code for the binaries and a running command's code shared its key, and the
    command gave back the wrong one. Such programs are never stored, so their binaries are
    never asked for. Each round starts with PoCL's own code cache empty, as on a machine that
    never built the program (a program PoCL built before comes back without its attribute);
    before the fix 7 rounds in 8 aborted."""
    for round in range(3):
        d = tmp_path / f"round{round}"
        d.mkdir()
        s = Server(d, extra_env={"POCL_CACHE_DIR": str(d / "pocl")}).start()
        try:
            p = s.popen([c_programs["required_size_store"], "hold"])
            try:
                line = p.stdout.readline()
                assert line == "ok\n", line + p.stderr.read()
                # The store ran (the session was quiet while the commands ran) and declined;
                # the program without the attribute was stored.
                detail = lambda: s.status()["sessions"][0]["detail"]
                wait_for(lambda: detail()["program_cache_uncacheable"] == 1, timeout=60, what="the store's decision")
                assert len(list((d / "programs").glob("*.bin"))) == 1
            finally:
                p.stdin.close()
                assert p.wait(timeout=60) == 0, p.stderr.read()
        finally:
            s.stop()
        assert "ref_count" not in s.log.read_text()


ONE_BUILD = r"""
import sys
import numpy as np
import pyopencl as cl

ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
q = cl.CommandQueue(ctx)
prg = cl.Program(ctx, "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }").build()
a = np.arange(16, dtype=np.int32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
prg.twice(q, a.shape, None, buf)
cl.enqueue_copy(q, a, buf)
assert (a == 2 * np.arange(16)).all(), a
print("built", flush=True)
sys.stdin.readline()
"""


def test_a_build_is_stored_once_the_session_is_quiet(cache_server):
    """On a CPU device the store is a second build, in a context of the worker's own, at a
    moment the session is quiet (`wh bench` measures what that saves the build's reply): an
    idle session's build is stored while the session is still open, and the next session is
    served the stored program (the kernel's result checked)."""
    entries = lambda: list((cache_server.dir / "programs").glob("*.bin"))
    for session in range(2):
        p = cache_server.popen([sys.executable, "-c", ONE_BUILD])
        try:
            assert p.stdout.readline() == "built\n", p.stderr.read()
            # The session holds still: its store runs now, while the session is open.
            wait_for(lambda: len(entries()) == 1, timeout=60, what="the store of the build")
            (s,) = cache_server.status()["sessions"]
            d = s["detail"]
            assert (d["program_cache_hits"], d["program_cache_misses"]) == (session, 1 - session)
            assert d["program_cache_stores_skipped"] == 0
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0, p.stderr.read()
        wait_for(lambda: cache_server.status()["sessions"] == [], timeout=60, what="the worker's exit")


WITH_HEADER = r"""
import sys
import numpy as np
import pyopencl as cl

ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
q = cl.CommandQueue(ctx)
src = '#include "value.h"\n__kernel void put(__global int *a) { a[get_global_id(0)] = VALUE; }\n'
prg = cl.Program(ctx, src).build(options=["-I", sys.argv[1]])
a = np.zeros(4, dtype=np.int32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, a.nbytes)
prg.put(q, a.shape, None, buf)
cl.enqueue_copy(q, a, buf)
print(int(a[0]))
"""


def test_a_build_that_includes_a_file_is_never_served_stale(cache_server, tmp_path):
    """The key covers the source and options, not the files a build includes: such builds
    compile every time, so a changed header changes the program."""
    include = tmp_path / "include"
    include.mkdir()
    for value in (3, 5):
        (include / "value.h").write_text(f"#define VALUE {value}\n")
        r = cache_server.run([sys.executable, "-c", WITH_HEADER, str(include)], timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(value)
        wait_for(lambda: cache_server.status()["sessions"] == [], timeout=60, what="the worker's exit")
    assert not list((cache_server.dir / "programs").glob("*.bin"))
