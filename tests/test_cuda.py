"""CUDA programs through Wormhole's libcuda.so.1.

Without a GPU (here, CI): a CUDA program built with nvcc (static and shared cudart), run through
`wh run` against a server that has no CUDA driver, learns within a second that there is no
device (cudaErrorNoDevice), and the server's log says why; Wormhole's own answers (entry-point
lookup, status texts, what it does not forward) are checked by a C program.

With a GPU (tests marked `gpu`, run by scripts/gpu-test.sh on the GPU machine): the same
programs print through Wormhole what they print natively."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import concurrent.futures
import difflib

import pytest

from conftest import ROOT, WH, Server, wait_for

CUDA_DIR = ROOT / "tests" / "cuda"


def nvcc_and_flags(out: pathlib.Path):
    """nvcc and the flags that link cudart: the CUDA 13.0 toolkit scripts/install.sh put in the
    venv (from PyPI, whose libcudart lacks its unversioned name: a link to it goes in `out`),
    else the system's (the GPU machine's)."""
    base = pathlib.Path(sys.prefix) / "lib"
    for nv in sorted(base.glob("python3*/site-packages/nvidia/cu13")):
        if (nv / "bin" / "nvcc").exists():
            (out / "libcudart.so").symlink_to(nv / "lib" / "libcudart.so.13")
            return str(nv / "bin" / "nvcc"), [f"-L{nv / 'lib'}", f"-L{out}", "-Xlinker", f"-rpath={nv / 'lib'}"]
    system = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if pathlib.Path(system).exists():
        # Shared cudart where the toolkit keeps it, whatever the library path there.
        lib64 = pathlib.Path(system).resolve().parent.parent / "lib64"
        return system, ["-Xlinker", f"-rpath={lib64}"]
    pytest.fail("no nvcc: neither the venv's (scripts/install.sh puts CUDA 13.0 there) nor the system's")


def library_flags(nvcc: str, libdir: pathlib.Path):
    """The flags that link cuBLAS and cuFFT (tests/cuda/libraries.cu), or None where neither
    the toolkit beside nvcc nor Python's site-packages (PyPI's nvidia-cublas and nvidia-cufft:
    scripts/install.sh puts them in the venv; PyTorch's environment has them) has both."""
    toolkit = pathlib.Path(nvcc).resolve().parent.parent
    if all((toolkit / "lib64" / f"lib{n}.so").exists() for n in ("cublas", "cufft")) \
            and (toolkit / "include" / "cublas_v2.h").exists() and (toolkit / "include" / "cufft.h").exists():
        return ["-lcublas", "-lcufft"]
    for nv in sorted(pathlib.Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu13")):
        found = {n: sorted((nv / "lib").glob(f"lib{n}.so.*")) for n in ("cublas", "cufft")}
        if all(found.values()) and (nv / "include" / "cublas_v2.h").exists() and (nv / "include" / "cufft.h").exists():
            for n, libs in found.items():
                link = libdir / f"lib{n}.so"  # the wheels lack the unversioned names
                if not link.exists():
                    link.symlink_to(libs[0])
            return [f"-I{nv / 'include'}", f"-L{libdir}", "-Xlinker", f"-rpath={nv / 'lib'}", "-lcublas", "-lcufft"]
    return None


def output_diff(native: str, ours: str) -> str:
    """The lines where Wormhole's output differs from native (a GPU run's log is all a
    session gets back, and pytest cuts long string comparisons short)."""
    lines = difflib.unified_diff(native.splitlines(), ours.splitlines(), "native", "wormhole", lineterm="")
    return "\n".join(lines)


def same_as_native(server, argv, timeout=300, **env):
    """Runs `argv` natively and then through `server`; both must succeed and print the same."""
    native = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert native.returncode == 0, native.stdout + native.stderr
    r = server.run(argv, timeout=timeout, **env)
    assert r.returncode == 0, r.stdout + r.stderr + server.log.read_text()[-4000:]
    assert r.stdout == native.stdout, output_diff(native.stdout, r.stdout)


def has_gpu():
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def cuda_programs(tmp_path_factory):
    """tests/cuda/*.cu built with static and with shared cudart, and the C programs that load
    libcuda.so.1 themselves."""
    out = tmp_path_factory.mktemp("cudabin")
    libdir = out / "lib"
    libdir.mkdir()
    nvcc, flags = nvcc_and_flags(libdir)
    # C programs of the driver API link the driver by its soname (libcuda.so.1): Wormhole's
    # library stands in for it at link time (no stub library comes with the PyPI toolkit).
    (libdir / "libcuda.so").symlink_to(ROOT / "target" / "release" / "libwormhole_cuda.so")
    include = pathlib.Path(nvcc).parent.parent / "include"
    libraries = library_flags(nvcc, libdir)
    builds = {}  # program -> its command
    for src in sorted(CUDA_DIR.glob("*.cu")):
        if src.stem == "kernels":  # no program: the driver-API program's module
            continue
        extra = []
        if src.stem == "libraries":
            if libraries is None:  # its tests skip, saying why
                continue
            extra = libraries
        for cudart in ("static", "shared"):
            exe = out / f"{src.stem}_{cudart}"
            builds[f"{src.stem}_{cudart}"] = [nvcc, "-arch=sm_90", "--cudart", cudart, *flags, "-o", str(exe),
                                             str(src), *extra]
    # Kernels for the driver-API program, which loads them itself.
    builds["kernels.fatbin"] = [nvcc, "-fatbin", "-arch=sm_90", "-o", str(out / "kernels.fatbin"),
                                str(CUDA_DIR / "kernels.cu")]
    for src in sorted(CUDA_DIR.glob("*.c")):
        builds[src.stem] = ["gcc", "-O1", "-Wall", f"-I{include}", "-o", str(out / src.stem), str(src), f"-L{libdir}",
                            "-lcuda", "-ldl"]
    # In parallel: nvcc takes seconds a program, and the GPU machine's minutes are few.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for done in pool.map(lambda argv: subprocess.run(argv, capture_output=True, text=True), builds.values()):
            assert done.returncode == 0, " ".join(done.args) + "\n" + done.stdout + done.stderr
    progs = {name: argv[argv.index("-o") + 1] for name, argv in builds.items()}
    return progs


@pytest.fixture
def cpu_server(tmp_path):
    """A server on this machine, which has no CUDA driver."""
    if has_gpu():
        pytest.skip("this machine has a GPU: the no-device tests are for machines without one")
    s = Server(tmp_path).start()
    yield s
    s.stop()


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_a_cuda_program_learns_quickly_that_there_is_no_device(cpu_server, cuda_programs, cudart):
    r = cpu_server.run([cuda_programs[f"vector_add_{cudart}"]], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("error: first -> 100 cudaErrorNoDevice: no CUDA-capable device is detected"
            in r.stdout), r.stdout + r.stderr
    first = float(re.search(r"first call: ([0-9.]+) ms", r.stderr).group(1))
    assert first < 1000, r.stderr
    # The program's log says why, and so does the server's.
    assert "no CUDA device: the server refused the session" in r.stderr
    assert "the server cannot load the CUDA driver" in cpu_server.log.read_text()


@pytest.mark.parametrize("transport", ["tcp", "tls", "guest"])
def test_every_transport_says_quickly_that_there_is_no_device(tmp_path, cuda_programs, transport):
    """Over TCP, TLS and a VM guest's region (a region that serves CUDA, from the config) the
    session is refused as over the local socket: cudaErrorNoDevice within a second, the reason
    in the program's log line and in the server's."""
    if has_gpu():
        pytest.skip("this machine has a GPU: the no-device tests are for machines without one")
    region = tmp_path / "guest.region"
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(f'[[guest]]\nregion = "{region}"\napi = "cuda"\n' if transport == "guest" else "")
    s = Server(tmp_path, config=cfg, tcp=transport == "tcp", tls=transport == "tls").start()
    try:
        env = {"WORMHOLE_SERVER": f"ivshmem:{region}"} if transport == "guest" else {}
        if transport == "guest":
            wait_for(lambda: "guest region ready" in s.log.read_text(), timeout=30, what="the guest region")
        r = s.run([cuda_programs["vector_add_static"]], timeout=60, **env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "first -> 100 cudaErrorNoDevice" in r.stdout, r.stdout + r.stderr
        assert float(re.search(r"first call: ([0-9.]+) ms", r.stderr).group(1)) < 1000, r.stderr
        assert "the server cannot load the CUDA driver" in r.stderr
        assert "the server cannot load the CUDA driver" in s.log.read_text()
    finally:
        s.stop()


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_runtime_and_library_programs_learn_quickly_that_there_is_no_device(cpu_server, cuda_programs, cudart):
    """The GPU tests' other runtime programs build here, and without a device they end at their
    first call, within seconds: cudart's device count, cuBLAS's handle."""
    r = cpu_server.run([cuda_programs[f"runtime_features_{cudart}"]], timeout=60)
    assert r.returncode == 2 and "-> 100 cudaErrorNoDevice" in r.stdout, r.stdout + r.stderr
    libraries = cuda_programs.get(f"libraries_{cudart}")
    assert libraries, "cuBLAS and cuFFT are not where scripts/install.sh puts them"
    r = cpu_server.run([libraries], timeout=60)
    assert r.returncode == 2 and "cublasCreate -> CUBLAS_STATUS_NOT_INITIALIZED" in r.stdout, r.stdout + r.stderr
    assert "no CUDA device: the server refused the session" in r.stderr


def test_a_server_without_warm_devices_serves_as_before(tmp_path, cuda_programs):
    """`warm_device = false` reaches the workers (a flag of theirs, absent by default): the
    standby workers start with it, and a CUDA session still learns that there is no device."""
    if has_gpu():
        pytest.skip("this machine has a GPU: the no-device tests are for machines without one")
    for warm in (True, False):
        d = tmp_path / str(warm)
        d.mkdir()
        cfg = d / "wormhole.toml"
        cfg.write_text("" if warm else "warm_device = false\n")
        s = Server(d, config=cfg).start()
        try:
            standby = wait_for(lambda: [t["standby_worker"] for t in s.status(details=False)["tenants"]][0],
                               timeout=30, what="a standby worker")
            argv = pathlib.Path(f"/proc/{standby}/cmdline").read_bytes().split(b"\0")
            assert (b"--no-warm-device" in argv) != warm, argv
            r = s.run([cuda_programs["vector_add_static"]], timeout=60)
            assert r.returncode == 2 and "cudaErrorNoDevice" in r.stdout, r.stdout + r.stderr
        finally:
            s.stop()


def test_natively_the_same_program_finds_no_driver(cuda_programs):
    """The baseline: without Wormhole (and without NVIDIA's driver) cudart finds no libcuda.so.1
    at all and says the driver is insufficient; through Wormhole it finds one with no device."""
    if has_gpu():
        pytest.skip("this machine has NVIDIA's driver")
    r = subprocess.run([cuda_programs["vector_add_static"]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "35 cudaErrorInsufficientDriver" in r.stdout, r.stdout


def test_wormholes_own_answers(cpu_server, cuda_programs):
    r = cpu_server.run([cuda_programs["driver_entry_points"]], timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # What is not forwarded is said, once per entry point, naming it.
    assert "cuGraphClone is not forwarded by Wormhole" in r.stderr
    assert "cuGetExportTable(57485748574857485748574857485748): this export table is not served" in r.stderr
    # The runtimes' optional table is absent without a word (every CUDA program asks for it).
    assert "f8cff951" not in r.stderr
    assert "export table CUDART_INTERFACE slot 4 is not served by Wormhole" in r.stderr


def test_the_trace_shows_each_entry_point_lookup_and_answer(cpu_server, cuda_programs, tmp_path):
    """WORMHOLE_TRACE: cudart's version-aware lookups and what they found, each entry point it
    called with what it returned (cuInit: no device), nested calls indented, in a file per
    process named by its pid."""
    prog = cuda_programs["vector_add_static"]
    r = cpu_server.run([prog], timeout=60, WORMHOLE_TRACE=str(tmp_path / "trace.%p"))
    assert r.returncode == 2, r.stdout + r.stderr
    traces = list(tmp_path.glob("trace.*"))
    assert len(traces) == 1, traces
    lines = traces[0].read_text().splitlines()
    text = "\n".join(lines)
    assert lines[0].endswith(f"trace of pid {traces[0].suffix[1:]}: {prog}"), text[:2000]
    events = [l.split(" ", 3)[3] for l in lines[1:]]
    # cudart finds cuInit through cuGetProcAddress, asking for the CUDA version of its ABI.
    assert any(re.fullmatch(r'  lookup "cuInit" for CUDA \d+, flags 0x0: cuInit', e) for e in events), text[:4000]
    assert any(e.startswith("> cuGetProcAddress") for e in events), text[:4000]
    # Its call of cuInit, and the answer of a server with no GPU.
    start = events.index("> cuInit")
    assert any(re.fullmatch(r"< cuInit = 100 \(\d+ µs\)", e) for e in events[start:]), text[:4000]


def test_a_driver_api_program_learns_that_there_is_no_device(cpu_server, cuda_programs):
    r = cpu_server.run([cuda_programs["driver_api"], cuda_programs["kernels.fatbin"]], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: cuInit(0) -> 100 CUDA_ERROR_NO_DEVICE" in r.stdout


def test_an_nvml_program_learns_quickly_that_the_driver_is_not_loaded(cpu_server, cuda_programs):
    """NVML through Wormhole against a server without NVIDIA's driver: nvmlInit answers
    NVML_ERROR_DRIVER_NOT_LOADED within a second, saying why; the rules that need no device
    (status texts, NVML_ERROR_UNINITIALIZED before nvmlInit) hold (the program checks them)."""
    r = cpu_server.run([cuda_programs["nvml_queries"]], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FAIL" not in r.stdout, r.stdout
    assert "Wormhole's NVML: yes" in r.stderr
    assert "nvmlInit_v2 -> 9 Driver Not Loaded" in r.stdout, r.stdout
    took = float(re.search(r"nvmlInit_v2: ([0-9.]+) ms", r.stderr).group(1))
    assert took < 1000, r.stderr
    assert "no NVIDIA driver: the server refused the session" in r.stderr
    assert "the server cannot load NVML (libnvidia-ml.so.1)" in cpu_server.log.read_text()


LOADED_FROM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
int cuDriverGetVersion(int *version);
int main(void) {
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)cuDriverGetVersion, &info) || !realpath(info.dli_fname, path)) return 1;
    printf("cuDriverGetVersion from %s\n", path);
    return 0;
}
"""


def test_the_driver_found_by_its_unversioned_name_is_wormholes(cpu_server, tmp_path):
    """Programs that look for the driver by its development name get Wormhole's libraries, as
    those that ask for the soname do: `dlopen("libcuda.so")` (Numba tries it first) and
    `libnvidia-ml.so`, and a program linked with `-lcuda` where TRITON_LIBCUDA_PATH points
    (Triton builds its kernel launcher so while torch.compile runs). Natively this machine
    has no driver to link against."""
    code = ("import ctypes\n"
            "for name in ('libcuda.so', 'libnvidia-ml.so'): ctypes.CDLL(name)\n"
            "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libwormhole_' in l}))")
    r = cpu_server.run([sys.executable, "-c", code], timeout=60)
    assert r.returncode == 0, r.stderr
    release = ROOT / "target" / "release"
    assert r.stdout.strip() == str([str(release / "libwormhole_cuda.so"), str(release / "libwormhole_nvml.so")])

    src = tmp_path / "loaded_from.c"
    src.write_text(LOADED_FROM)
    exe = tmp_path / "loaded_from"
    link = ["gcc", "-o", str(exe), str(src), "-L${TRITON_LIBCUDA_PATH:?}", "-lcuda"]
    nvidias = subprocess.run(["gcc", "-print-file-name=libcuda.so"], capture_output=True, text=True).stdout.strip()
    if nvidias == "libcuda.so":  # the linker knows no libcuda.so of NVIDIA's here
        natively = subprocess.run(["sh", "-c", " ".join(link)], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "TRITON_LIBCUDA_PATH": str(tmp_path)})
        assert natively.returncode != 0 and "-lcuda" in natively.stderr, natively.stderr
    r = cpu_server.run(["sh", "-c", " ".join(link) + f" && {exe}"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"cuDriverGetVersion from {release / 'libwormhole_cuda.so'}\n"


def test_natively_the_nvml_program_finds_no_library(cuda_programs):
    if has_gpu():
        pytest.skip("this machine has NVIDIA's driver")
    r = subprocess.run([cuda_programs["nvml_queries"]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no NVML: libnvidia-ml.so.1" in r.stdout, r.stdout + r.stderr


def test_the_cuda_bench_says_it_needs_a_gpu(tmp_path):
    """`wh bench --part cuda` compares against native CUDA: without NVIDIA's driver it measures
    nothing and says why, at once."""
    if has_gpu():
        pytest.skip("this machine has a GPU")
    client = tmp_path / "cuda_bench_client"
    subprocess.run(["gcc", "-O2", "-o", str(client), str(ROOT / "bench" / "cuda_bench_client.c"), "-ldl"],
                   check=True)
    r = subprocess.run([str(WH), "bench", "--part", "cuda"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "WORMHOLE_CUDA_BENCH_CLIENT": str(client)})
    assert r.returncode != 0
    assert "needs NVIDIA's driver and a GPU" in r.stderr and "no CUDA driver" in r.stderr, r.stderr


def test_wh_devices_says_why_there_is_no_cuda_device(cpu_server):
    import json
    out = subprocess.run([cpu_server.wh, "devices", "--socket", cpu_server.socket], capture_output=True, text=True,
                         timeout=60, check=True)
    cuda = [a for a in json.loads(out.stdout)["apis"] if a["api"] == "cuda"][0]
    assert cuda["devices"] == []
    # Not a failure (a cluster integration waits out failures): no driver, so no devices.
    assert "error" not in cuda
    assert "no libcuda.so.1" in cuda["not_installed"]
    nvml = [a for a in json.loads(out.stdout)["apis"] if a["api"] == "nvml"][0]
    assert nvml["devices"] == [] and "no libnvidia-ml.so.1" in nvml["not_installed"]


# ---- on the GPU machine (scripts/gpu-test.sh) ----

gpu = pytest.mark.gpu


@pytest.fixture
def gpu_server(tmp_path):
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    s = Server(tmp_path).start()
    yield s
    s.stop()


@gpu
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_vector_add_gives_native_results(gpu_server, cuda_programs, cudart):
    same_as_native(gpu_server, [cuda_programs[f"vector_add_{cudart}"]], timeout=120)


@gpu
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_stream_capture_and_graphs_give_native_results(gpu_server, cuda_programs, cudart):
    """Capture status before, during and after a capture (answered in the client until the
    first capture begins), the graph and dependencies lent while capturing, the thread's mode,
    instantiation, ten replays into page-locked memory, a capture the program breaks, host
    functions and stream callbacks in stream order and as graph nodes (run in the client)."""
    same_as_native(gpu_server, [cuda_programs[f"graphs_{cudart}"]], timeout=120)


@gpu
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_the_runtime_gives_native_results(gpu_server, cuda_programs, cudart):
    """Device queries; kernels with pointers, scalars of every width, padded structs and a 1 KiB
    by-value array; streams, priorities, events and their errors; host functions and stream
    callbacks; pageable and page-locked copies both ways, sync and async, 1 byte to 80 MiB (two
    pieces), at odd offsets; mapped and registered host memory; memsets and 2D copies; a
    launch error; four threads with streams of their own."""
    same_as_native(gpu_server, [cuda_programs[f"runtime_features_{cudart}"]])


@gpu
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_cublas_and_cufft_give_native_results(gpu_server, cuda_programs, cudart):
    """SGEMM, DGEMM, batched and strided batched GEMM, GEMMs on the program's stream; cuFFT
    complex there and back, and a 2D real-to-complex transform on a stream."""
    prog = cuda_programs.get(f"libraries_{cudart}")
    if prog is None:
        pytest.skip("neither the CUDA toolkit nor Python's site-packages has cuBLAS and cuFFT to link")
    same_as_native(gpu_server, [prog])


@gpu
def test_two_tenants_at_once_give_native_results(tmp_path, cuda_programs):
    """Two tenants (this user's, and one named by its token), each with a quota, run the runtime
    program at once on the one GPU, each in a worker of its own: both print what it prints
    natively."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(f'[[tenant]]\nname = "one"\nuids = [{os.getuid()}]\nmem_quota_mib = 4096\n\n'
                   f'[[tenant]]\nname = "two"\ntoken = "two-token"\nmem_quota_mib = 4096\n')
    argv = {"one": [cuda_programs["runtime_features_shared"]], "two": [cuda_programs["runtime_features_static"]]}
    native = {k: subprocess.run(a, capture_output=True, text=True, timeout=300) for k, a in argv.items()}
    s = Server(tmp_path, config=cfg).start()
    try:
        runs = {"one": s.popen(argv["one"]), "two": s.popen(argv["two"], WORMHOLE_TOKEN="two-token")}
        # Both hold sessions at once, one per tenant (seen in one answer).
        st = wait_for(lambda: (lambda st: st if len(st.get("sessions", [])) == 2 else None)(s.status(details=False)),
                      timeout=60, what="two sessions")
        tenants = {t["name"]: t for t in st["tenants"]}
        assert tenants["one"]["sessions"] == 1 and tenants["two"]["sessions"] == 1, tenants
        out = {k: p.communicate(timeout=300) for k, p in runs.items()}
    finally:
        s.stop()
    for k in argv:
        assert native[k].returncode == 0, native[k].stdout + native[k].stderr
        assert runs[k].returncode == 0, out[k][0] + out[k][1]
        assert out[k][0] == native[k].stdout, output_diff(native[k].stdout, out[k][0])


@gpu
def test_a_tenant_over_its_quota_gets_out_of_memory_and_carries_on(tmp_path, cuda_programs):
    """512 MiB asked of a 256 MiB quota: cudaMalloc and cudaMallocAsync answer
    cudaErrorMemoryAllocation (the runtime's last error too), as a full device does natively,
    and the program goes on to allocate, launch and copy as natively."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    argv = [cuda_programs["runtime_features_static"], "alloc", "512"]
    native = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert native.returncode == 0 and "cudaMalloc of 512 MiB -> cudaSuccess" in native.stdout, native.stdout
    expected = native.stdout.replace("MiB -> cudaSuccess", "MiB -> cudaErrorMemoryAllocation").replace(
        "last error after it -> cudaSuccess", "last error after it -> cudaErrorMemoryAllocation")
    s = quota_server(tmp_path, 256)
    try:
        r = s.run(argv, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + s.log.read_text()[-4000:]
        assert r.stdout == expected, output_diff(expected, r.stdout)
    finally:
        s.stop()


@gpu
def test_a_client_killed_mid_copy_frees_its_memory_and_the_server_serves_on(gpu_server, cuda_programs):
    """A program killed while it copies 64 MiB both ways (pageable, staged through the arena,
    and page-locked) leaves no session and no device memory behind, and the next program runs
    as natively."""
    p = gpu_server.popen([cuda_programs["runtime_features_shared"], "copy-forever"])
    try:
        line = p.stdout.readline()
        assert line.strip() == "copying", line + p.stderr.read()
        time.sleep(1.0)
        held = sum(t["mem_bytes"] for t in gpu_server.status()["tenants"])
        assert held >= 64 << 20, gpu_server.status()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    wait_for(lambda: all(t["sessions"] == 0 and t["mem_bytes"] == 0 for t in gpu_server.status()["tenants"]),
             timeout=10, what="the killed session's end")
    same_as_native(gpu_server, [cuda_programs["vector_add_shared"]])


@gpu
@pytest.mark.parametrize("warm", [True, False], ids=["warm_device", "no_warm_device"])
def test_a_primary_context_made_in_advance_is_not_seen(tmp_path, cuda_programs, warm):
    """A tenant's standby CUDA worker makes the primary context of the tenant's first device
    before a session comes (`warm_device`, on by default). The program sees the context's
    life as natively: inactive and without flags before it retains it, its flags set before
    it exists, the last release ending it, a release too many refused, a reset; and the same
    with `warm_device = false`. The first retain's time is printed (natively and through
    Wormhole) for the bench's start-up row to be read against."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    argv = [cuda_programs["primary_context"]]
    native = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text("" if warm else "warm_device = false\n")
    s = Server(tmp_path, config=cfg).start()
    try:
        made = "a warm context waits for the session"
        if warm:
            wait_for(lambda: made in s.log.read_text(), timeout=60, what="the standby's warm context")
        else:
            time.sleep(2)  # the standby worker up (it loads the driver only)
        r = s.run(argv, timeout=120)
        log = s.log.read_text()
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr + log[-4000:]
    assert r.stdout == native.stdout, output_diff(native.stdout, r.stdout)
    assert (made in log) == warm, log[-4000:]
    first = lambda err: re.search(r"first retain: ([0-9.]+) ms", err).group(1)
    print(f"first retain: {first(native.stderr)} ms natively, {first(r.stderr)} ms through Wormhole "
          f"({'warm' if warm else 'no warm'} device)")


@gpu
def test_the_driver_api_gives_native_results(gpu_server, cuda_programs):
    """Module images, functions and their parameter layouts, launches by kernelParams and by
    the extra buffer, copies, memsets, streams, events: no cudart (and so no export tables)."""
    same_as_native(gpu_server, [cuda_programs["driver_api"], cuda_programs["kernels.fatbin"]], timeout=120)


@gpu
def test_nvml_reports_the_forwarded_gpu_as_natively(gpu_server, cuda_programs):
    """Name, UUID, PCI address, capability, memory total, driver versions, and NVML's own
    errors (a short buffer, a wrong struct version), as a program on the GPU's machine sees
    them."""
    prog = cuda_programs["nvml_queries"]
    native = subprocess.run([prog], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    r = gpu_server.run([prog], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + gpu_server.log.read_text()[-4000:]
    assert "Wormhole's NVML: yes" in r.stderr
    assert r.stdout == native.stdout, output_diff(native.stdout, r.stdout)


def quota_server(tmp_path, mib):
    """A server whose tenant (this user) may hold `mib` MiB of device memory."""
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(f'[[tenant]]\nname = "local"\nuids = [{os.getuid()}]\nmem_quota_mib = {mib}\n')
    return Server(tmp_path, config=cfg).start()


@gpu
def test_a_tenant_with_a_quota_sees_its_quota_as_the_gpus_memory(tmp_path, cuda_programs):
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    s = quota_server(tmp_path, 1024)
    try:
        prog = cuda_programs["nvml_queries"]
        native = subprocess.run([prog], capture_output=True, text=True, timeout=120)
        r = s.run([prog], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + s.log.read_text()[-4000:]
        quota = 1024 << 20
        expected = re.sub(r"(memory(?: v2)? -> 0 total )\d+", rf"\g<1>{quota}", native.stdout)
        assert r.stdout == expected, output_diff(expected, r.stdout)
        # Free never exceeds what the quota leaves, and the parts add up (the program checks).
        free = int(re.search(r"memory free (\d+)", r.stderr).group(1))
        assert free <= quota
    finally:
        s.stop()


@gpu
def test_nvidia_smi_in_a_tenant_shows_the_gpu_and_its_quota(tmp_path):
    """NVIDIA's own `nvidia-smi`, run through Wormhole in a tenant with a 1 GiB quota, names
    the forwarded GPU as natively and shows the quota as its memory (#13: nvidia-smi-style
    tools inside a tenant show what that tenant may use)."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    smi = shutil.which("nvidia-smi")
    query = [smi, "--query-gpu=name,uuid,memory.total", "--format=csv,noheader,nounits"]
    native = subprocess.run(query, capture_output=True, text=True, timeout=60)
    assert native.returncode == 0, native.stdout + native.stderr
    s = quota_server(tmp_path, 1024)
    try:
        r = s.run(query, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr + s.log.read_text()[-4000:]
    finally:
        s.stop()
    print(f"natively: {native.stdout.strip()}; through Wormhole: {r.stdout.strip()}")
    name, uuid, _ = [f.strip() for f in native.stdout.splitlines()[0].split(",")]
    assert [f.strip() for f in r.stdout.splitlines()[0].split(",")] == [name, uuid, "1024"], r.stdout


@gpu
def test_a_reset_gives_the_contexts_memory_back_to_the_quota(tmp_path, cuda_programs):
    """600 MiB allocated, the device reset, 600 MiB again: within a 1 GiB quota as natively
    (the reset frees the first); likewise for a context the program made and destroyed."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    s = quota_server(tmp_path, 1024)
    try:
        prog = cuda_programs["reset_within_quota"]
        native = subprocess.run([prog], capture_output=True, text=True, timeout=120)
        assert native.returncode == 0, native.stdout + native.stderr
        r = s.run([prog], timeout=120)
        assert r.returncode == 0 and r.stdout == native.stdout, output_diff(native.stdout, r.stdout) + r.stderr + s.log.read_text()[-4000:]
    finally:
        s.stop()


@gpu
def test_a_tenant_sees_only_the_devices_it_may_use(tmp_path, cuda_programs):
    """A tenant whose `devices` filter matches no GPU has none (cuDeviceGet of 0 is an invalid
    device, as under an empty CUDA_VISIBLE_DEVICES; NVML counts none); one whose filter
    matches sees it as device 0 and runs as natively."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    import os
    argv = [cuda_programs["driver_api"], cuda_programs["kernels.fatbin"]]
    native = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    for pattern, sees in (("no such GPU", False), ("NVIDIA", True)):
        cfg = tmp_path / f"{sees}.toml"
        cfg.write_text(f'[[tenant]]\nname = "local"\nuids = [{os.getuid()}]\ndevices = ["{pattern}"]\n')
        d = tmp_path / str(sees)
        d.mkdir()
        s = Server(d, config=cfg).start()
        try:
            r = s.run(argv, timeout=120)
            nvml = s.run([cuda_programs["nvml_queries"]], timeout=120)
            if sees:
                assert r.returncode == 0 and r.stdout == native.stdout, output_diff(native.stdout, r.stdout) + r.stderr
                assert nvml.returncode == 0 and "devices -> 0 0" not in nvml.stdout, nvml.stdout
            else:
                assert r.returncode != 0
                assert "cuDeviceGet(&dev, 0) -> 101" in r.stdout, r.stdout + r.stderr
                # NVML shows the tenant no GPU either.
                assert "devices -> 0 0" in nvml.stdout, nvml.stdout + nvml.stderr
        finally:
            s.stop()
