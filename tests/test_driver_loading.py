"""The server reaches the driver stack at run time, never through a link-time dependency
(issue #10): `wh` must start, serve and refuse cleanly whatever `libOpenCL.so.1` the machine
has first on its library path. NVIDIA's loader (the CUDA toolkit's) lacks entry points the
system ICD loader has, such as clGetKernelSubGroupInfoKHR; a stub loader put first on
LD_LIBRARY_PATH stands in for it here."""

import os
import subprocess

import pytest

from conftest import WH, Server, wait_for

# A loader that knows only clGetPlatformIDs: with ONE_PLATFORM it reports a platform, which
# clGetPlatformInfo describes (the application's loader asks before it lists a platform) and
# every other entry point is then missing in the loader; else none, as a loader without ICDs
# does. The platform is an ICD object: its first field is a dispatch table with every slot set,
# as a real driver's (the server checks a slot before it calls the loader's entry point).
STUB = r"""
#include <stdint.h>
#include <stddef.h>
static void unused(void) {}
static void *dispatch[256];
static struct { void **dispatch; } platform = { dispatch };
__attribute__((constructor)) static void fill(void) {
    for (int i = 0; i < 256; i++) dispatch[i] = (void *)unused;
}
int32_t clGetPlatformIDs(uint32_t n, void **platforms, uint32_t *num) {
#ifdef ONE_PLATFORM
    if (num) *num = 1;
    if (platforms && n > 0) platforms[0] = &platform;
    return 0;
#else
    (void)n; (void)platforms;
    if (num) *num = 0;
    return -1001; /* CL_PLATFORM_NOT_FOUND_KHR */
#endif
}
#ifdef ONE_PLATFORM
#include <string.h>
int32_t clGetPlatformInfo(void *p, uint32_t param, size_t size, void *value, size_t *size_ret) {
    /* The application's loader lists only platforms with cl_khr_icd (CL_PLATFORM_EXTENSIONS). */
    const char *text = param == 0x0904 ? "cl_khr_icd" : "OpenCL 3.0 Stub";
    size_t n = strlen(text) + 1;
    (void)p;
    if (size_ret) *size_ret = n;
    if (value) {
        if (size < n) return -30; /* CL_INVALID_VALUE */
        memcpy(value, text, n);
    }
    return 0;
}
#endif
"""

# ocl-icd's (and NVIDIA's) version nodes, with only the stub's functions defined in them.
VERSION_SCRIPT = """
OPENCL_1.0 { global: clGetPlatformIDs; clGetPlatformInfo; local: *; };
OPENCL_1.1 {} OPENCL_1.0;
OPENCL_1.2 {} OPENCL_1.1;
OPENCL_2.0 {} OPENCL_1.2;
OPENCL_2.1 {} OPENCL_2.0;
OPENCL_2.2 {} OPENCL_2.1;
OPENCL_3.0 {} OPENCL_2.2;
"""

# A client of the system's own loader, which reaches Wormhole's ICD through `wh run`.
CLIENT = r"""
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
int main(void) {
    cl_uint n = 0;
    cl_int rc = clGetPlatformIDs(0, NULL, &n);
    printf("platforms rc=%d n=%u\n", rc, n);
    if (rc == CL_SUCCESS && n > 0) {
        cl_platform_id p;
        clGetPlatformIDs(1, &p, NULL);
        for (int i = 0; i < 3; i++) {
            cl_uint devices = 0;
            rc = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, NULL, &devices);
            printf("devices rc=%d n=%u\n", rc, devices);
        }
    }
    return 0;
}
"""


def build_stub(d, versioned=False, one_platform=False, unloadable=False):
    """Compiles the stub as d/libOpenCL.so.1; returns d."""
    d.mkdir()
    (d / "stub.c").write_text(STUB)
    cmd = ["gcc", "-shared", "-fPIC", "-o", str(d / "libOpenCL.so.1"), str(d / "stub.c"), "-Wl,-soname,libOpenCL.so.1"]
    if versioned:
        (d / "stub.map").write_text(VERSION_SCRIPT)
        cmd.append(f"-Wl,--version-script={d / 'stub.map'}")
    if one_platform:
        cmd.append("-DONE_PLATFORM")
    if unloadable:
        # It needs a library that is then removed: dlopen fails as for a missing loader (the
        # system's own libOpenCL.so.1 cannot be hidden from the dynamic linker otherwise).
        (d / "gone.c").write_text("int wormhole_gone;\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libwhgone.so"), str(d / "gone.c")], check=True)
        cmd += [f"-L{d}", "-Wl,--no-as-needed", "-lwhgone"]
    subprocess.run(cmd, check=True)
    if unloadable:
        (d / "libwhgone.so").unlink()
    return d


def stub_env(d):
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = ":".join(p for p in [str(d), os.environ.get("LD_LIBRARY_PATH", "")] if p)
    return e


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    out = tmp_path_factory.mktemp("client")
    (out / "client.c").write_text(CLIENT)
    subprocess.run(["gcc", "-O1", "-Wall", "-o", str(out / "client"), str(out / "client.c"), "-lOpenCL"], check=True)
    return str(out / "client")


def test_wh_does_not_link_the_driver():
    needed = subprocess.run(["readelf", "-d", str(WH)], capture_output=True, text=True, check=True).stdout
    assert "(NEEDED)" in needed
    assert "libOpenCL" not in needed, needed


def start_on_stub(tmp_path, stub, transport="shm"):
    """`wh serve` with the stub first on its library path (the client keeps the real loader)."""
    s = Server(tmp_path, extra_env={"LD_LIBRARY_PATH": stub_env(stub)["LD_LIBRARY_PATH"]},
               tcp=transport == "tcp", guest=transport == "ivshmem")
    return s.start()


def run_client(s, client):
    # The application uses the system's loader, which loads Wormhole's ICD; only the server
    # sees the stub.
    return s.run([client], timeout=60, LD_LIBRARY_PATH=os.environ.get("LD_LIBRARY_PATH", ""))


@pytest.mark.parametrize("versioned", [False, True], ids=["plain", "versioned"])
def test_loader_without_extension_symbols(tmp_path, client, versioned):
    stub = build_stub(tmp_path / "stub", versioned=versioned)
    env = stub_env(stub)
    h = subprocess.run([str(WH), "--help"], env=env, capture_output=True, text=True, timeout=30)
    assert h.returncode == 0, h.stderr
    s = start_on_stub(tmp_path, stub)
    try:
        r = run_client(s, client)
        assert r.returncode == 0, r.stderr
        assert "platforms rc=-1001 n=0" in r.stdout, r.stdout + r.stderr
        # The server (and its status, started with the stub too) lives on.
        assert s.proc.poll() is None, s.log.read_text()
        st = subprocess.run([str(WH), "status", "--socket", s.socket], env=env, capture_output=True, text=True, timeout=10)
        assert st.returncode == 0, st.stderr
        assert "panicked" not in s.log.read_text()
    finally:
        s.stop()


def test_missing_entry_points_answer_invalid_operation(tmp_path, client):
    stub = build_stub(tmp_path / "stub", versioned=True, one_platform=True)
    s = start_on_stub(tmp_path, stub)
    try:
        for _ in range(2):
            r = run_client(s, client)
            assert r.returncode == 0, r.stderr
            assert "platforms rc=0 n=1" in r.stdout, r.stdout + r.stderr
            # CL_INVALID_OPERATION, each time.
            assert r.stdout.count("devices rc=-59 n=0") == 3, r.stdout + r.stderr
        assert s.proc.poll() is None, s.log.read_text()
        # The missing function is named, once per worker (each session has its own, and a
        # standby one warms up): six calls in two sessions, at most one line per worker.
        log = wait_for(lambda: "clGetDeviceIDs" in s.log.read_text() and s.log.read_text())
        assert "panicked" not in log
        workers = log.count("OpenCL driver loaded")
        assert workers >= 2, log
        assert 1 <= log.count("clGetDeviceIDs") <= workers, log
    finally:
        s.stop()


@pytest.mark.parametrize("transport", ["shm", "tcp", "ivshmem"])
def test_missing_driver_refuses_the_session(tmp_path, client, transport):
    stub = build_stub(tmp_path / "stub", unloadable=True)
    s = start_on_stub(tmp_path, stub, transport)
    try:
        r = run_client(s, client)
        assert r.returncode == 0, r.stderr
        assert "platforms rc=-1001 n=0" in r.stdout, r.stdout + r.stderr
        assert "refused the session" in r.stderr and "libOpenCL.so.1" in r.stderr, r.stderr
        assert s.proc.poll() is None, s.log.read_text()
        log = wait_for(lambda: (t := s.log.read_text()).count("libwhgone.so") and t)
        assert "panicked" not in log
        # A second session is refused the same way.
        r = run_client(s, client)
        assert "refused the session" in r.stderr, r.stderr
        assert s.proc.poll() is None, s.log.read_text()
    finally:
        s.stop()
