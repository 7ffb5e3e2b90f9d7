"""PyTorch through Wormhole's CUDA client (issue #13), on a machine with an NVIDIA GPU and
PyTorch (the GPU machine: `scripts/gpu-test.sh`); elsewhere every test skips, saying why.
bench/torch_train.py trains an MLP and a small cuDNN CNN from fixed seeds; through Wormhole
it must print the losses it prints natively, report the forwarded device and the tenant's
memory, and a tenant over its quota must get PyTorch's own out-of-memory error while another
trains on."""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import Server, wait_for
from test_cuda import has_gpu, output_diff

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "bench" / "torch_train.py"
FEATURES = ROOT / "tests" / "torch_features.py"
# The GPU machine's PyTorch is its plain python3, which runs pytest there (scripts/gpu-test.sh).
PYTHON = os.environ.get("WORMHOLE_TORCH_PYTHON", sys.executable)

gpu = pytest.mark.gpu


def has_torch():
    return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


@pytest.fixture
def torch_gpu():
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here (scripts/gpu-test.sh runs these on the GPU machine)")
    if not has_torch():
        pytest.skip(f"no PyTorch for {PYTHON} (WORMHOLE_TORCH_PYTHON names another)")


def losses(out):
    return {m: line.split("losses ", 1)[1] for m, line in
            ((line.split(":", 1)[0], line) for line in out.splitlines() if " losses " in line)}


def result(out):
    return json.loads(out.strip().splitlines()[-1])


def waited(stderr):
    return int(re.search(r"wormhole call counts \(cuda\): waited=(\d+)", stderr).group(1))


def native_and_through_wormhole(tmp_path, argv, env=None, wormhole_env=None, skip_reason=None):
    """Runs `argv` natively (with `env` added), then through a server of its own (with
    `wormhole_env`, else `env`): both runs, each having succeeded, and the server's log. With
    `skip_reason`, a native exit status of 3 (a script's "PyTorch lacks what I need") skips the
    test."""
    env = env or {}
    native = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    if skip_reason and native.returncode == 3:
        pytest.skip(skip_reason)
    assert native.returncode == 0, native.stdout + native.stderr
    s = Server(tmp_path).start()
    try:
        r = s.run(argv, timeout=600, **(env if wormhole_env is None else wormhole_env))
        log = s.log.read_text()
        assert r.returncode == 0, r.stdout + r.stderr + log[-4000:]
    finally:
        s.stop()
    return native, r, log


@gpu
def test_training_gives_native_losses_and_device(torch_gpu, tmp_path):
    native, r, _ = native_and_through_wormhole(tmp_path, [PYTHON, str(TRAIN), "--steps", "300"])
    assert losses(r.stdout) == losses(native.stdout)
    assert losses(r.stdout).keys() == {"mlp", "cnn"}
    assert [l for l in r.stdout.splitlines() if l.startswith("device:")] == \
        [l for l in native.stdout.splitlines() if l.startswith("device:")]
    ours, theirs = result(r.stdout), result(native.stdout)
    for m in ours:
        print(f"{m}: {ours[m]['steps_per_s']:.0f} steps/s through Wormhole, "
              f"{theirs[m]['steps_per_s']:.0f} natively: {ours[m]['steps_per_s'] / theirs[m]['steps_per_s']:.2f}x")


@gpu
def test_streams_events_graphs_and_page_locked_copies_as_natively(torch_gpu, tmp_path):
    """tests/torch_features.py: the device's name and capability, a side stream ordered and
    timed by events, a whole training step captured into a CUDA graph and replayed on new
    data, page-locked memory with non-blocking copies both ways, and the caching allocator's
    count: the same lines natively and through Wormhole."""
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    native, r, _ = native_and_through_wormhole(tmp_path, [PYTHON, str(FEATURES)], env=env)
    assert r.stdout == native.stdout, output_diff(native.stdout, r.stdout)
    assert "graph replays, losses:" in r.stdout and "non-blocking copies both ways: True" in r.stdout


@gpu
def test_synchronous_round_trips_per_step_are_counted(torch_gpu, tmp_path):
    """The client counts its round trips (WORMHOLE_CALL_COUNTS=1); two runs that differ only
    in their number of steps give the round trips one step costs."""
    s = Server(tmp_path).start()
    try:
        runs = {}
        for steps in (100, 300):
            r = s.run([PYTHON, str(TRAIN), "--model", "mlp", "--steps", str(steps)], timeout=600,
                      WORMHOLE_CALL_COUNTS="1")
            assert r.returncode == 0, r.stdout + r.stderr
            runs[steps] = waited(r.stderr)
    finally:
        s.stop()
    per_step = (runs[300] - runs[100]) / 200
    print(f"MLP: {per_step:.2f} synchronous round trips per training step")
    # A loss is read every 50 steps; the step's launches, copies to the device and event
    # records are pipelined (one waited for each would be dozens per step; LUPINE's driver
    # shim measured 4 per step of a GPT). Each tensor map cuBLASLt makes is one more.
    assert per_step < 10, per_step


@gpu
def test_two_tenants_train_and_the_one_over_quota_gets_pytorchs_oom(torch_gpu, tmp_path):
    uid = os.getuid()
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(f'[[tenant]]\nname = "big"\nuids = [{uid}]\nmem_quota_mib = 8192\n\n'
                   f'[[tenant]]\nname = "small"\ntoken = "small-token"\nmem_quota_mib = 1024\n')
    s = Server(tmp_path, tcp=True, config=cfg).start()
    try:
        big = s.popen([PYTHON, str(TRAIN), "--steps", "2000"], WORMHOLE_SERVER="")
        small = s.run([PYTHON, str(TRAIN), "--model", "mlp", "--steps", "100", "--until-oom"],
                      timeout=600, WORMHOLE_TOKEN="small-token")
        out, err = big.communicate(timeout=900)
    finally:
        s.stop()
    assert small.returncode == 0, small.stdout + small.stderr
    # The small tenant sees its quota as the device's memory, hits it, and trains on after.
    assert f"mem_get_info: total {1024 << 20}, free within it: True" in small.stdout
    oom = re.search(r"out of memory after (\d+) MiB: torch.cuda.OutOfMemoryError", small.stdout)
    assert oom and int(oom.group(1)) <= 1024, small.stdout
    assert "mlp: losses" in small.stdout
    assert big.returncode == 0, out + err
    assert f"mem_get_info: total {8192 << 20}" in out
    assert losses(out).keys() == {"mlp", "cnn"}


@gpu
def test_killing_a_training_process_frees_its_gpu_memory(torch_gpu, tmp_path):
    s = Server(tmp_path).start()
    try:
        p = s.popen([PYTHON, str(TRAIN), "--model", "cnn", "--hold-mib", "512", "--forever"])
        deadline = time.time() + 300
        for line in p.stdout:
            if line.strip() == "training" or time.time() > deadline:
                break
        held = sum(t["mem_bytes"] for t in s.status()["tenants"])
        assert held >= 512 << 20, s.status()
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.time() + 10
        while time.time() < deadline:
            tenants = s.status()["tenants"]
            if all(t["sessions"] == 0 and t["mem_bytes"] == 0 for t in tenants):
                break
            time.sleep(0.2)
        assert all(t["sessions"] == 0 and t["mem_bytes"] == 0 for t in s.status()["tenants"]), s.status()
    finally:
        s.stop()


@gpu
def test_a_second_process_finds_its_module_images_kept(torch_gpu, tmp_path):
    """A framework loads hundreds of module images at start (issue #12: 374 fatbins, 247 MiB
    for one import). The first process of a tenant sends each large one once the server asks
    for it; a second process names them by digest and the server loads them from its cache:
    none asked for, and most of the bytes from the cache. The time to the first training step
    of each is printed."""
    s = Server(tmp_path).start()
    try:
        seen = []
        for run in ("first", "second"):
            t = time.monotonic()
            p = s.popen([PYTHON, str(TRAIN), "--model", "cnn", "--forever"])
            try:
                for line in p.stdout:
                    if line.strip() == "training":
                        break
                started = time.monotonic() - t
                detail = [d for d in (x.get("detail") or {} for x in s.status()["sessions"])
                          if d.get("api") == "cuda"][0]
            finally:
                p.send_signal(signal.SIGKILL)
                p.wait()
            print(f"{run} process: first training step after {started:.2f} s; module images: {detail}")
            seen.append(detail)
            wait_for(lambda: not s.status(details=False).get("sessions"), timeout=10, what="the session's end")
    finally:
        s.stop()
    first, second = seen
    assert first["module_images_asked_for"] > 0, first  # large images went by digest first
    assert second["module_images_asked_for"] == 0, second
    assert second["module_images_from_cache"] >= first["module_images_asked_for"], second
    assert second["module_image_bytes_from_cache"] > second["module_image_bytes_received"], second


@gpu
@pytest.mark.parametrize("alloc_conf", ["expandable_segments:True", "backend:cudaMallocAsync"])
def test_other_allocators_train_as_natively(torch_gpu, tmp_path, alloc_conf):
    """PyTorch's allocator on virtual memory management (expandable segments, which its
    out-of-memory message suggests: reservations, handles mapped side by side and tensors
    across them), and on the driver's stream-ordered pool (cudaMallocAsync), through Wormhole,
    give native's losses."""
    native, r, log = native_and_through_wormhole(
        tmp_path, [PYTHON, str(TRAIN), "--steps", "100"], {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf})
    assert losses(r.stdout) == losses(native.stdout)
    assert losses(r.stdout).keys() == {"mlp", "cnn"}
    assert "cuMemMap refused" not in log and "cuMemUnmap refused" not in log, log[-4000:]


NCCL_ONE_RANK = """
import os, socket, sys
import torch
import torch.distributed as dist
if not dist.is_nccl_available():
    print("no NCCL"); sys.exit(3)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
dist.all_reduce(t)
dist.broadcast(t, 0)
torch.cuda.synchronize()
print("all_reduce sum", t.sum().item())
dist.destroy_process_group()
"""


@gpu
def test_a_one_rank_nccl_job_runs_as_natively(torch_gpu, tmp_path):
    """torch.distributed on NCCL with one rank (a job written for several GPUs, run on one
    share): NCCL's buffers (virtual memory management, freed through
    cuMemRetainAllocationHandle), its kernels and its proxy thread, through Wormhole."""
    # NCCL's buffers on virtual memory management, and no log lines of NCCL's on stdout.
    native, r, log = native_and_through_wormhole(
        tmp_path, [PYTHON, "-c", NCCL_ONE_RANK], {"NCCL_CUMEM_ENABLE": "1", "NCCL_DEBUG": ""},
        skip_reason=f"no NCCL for {PYTHON}")
    sums = [[l for l in out.splitlines() if l.startswith("all_reduce sum")] for out in (r.stdout, native.stdout)]
    assert sums[0] == sums[1] and len(sums[0]) == 1, (r.stdout, native.stdout)
    assert " refused" not in log, log[-4000:]


COMPILE = ROOT / "tests" / "torch_compile.py"


def compiled_values(out):
    """The numbers torch_compile.py printed, by line."""
    return {k: [float(v) for v in rest.split()] for k, rest in
            (line.split(": ", 1) for line in out.splitlines() if line.startswith(("rows:", "probs sum:", "grad sum:")))}


@gpu
def test_torch_compile_gives_native_results(torch_gpu, tmp_path):
    """torch.compile's Triton kernels, and the C module Triton builds with -lcuda where
    TRITON_LIBCUDA_PATH points (`wh run` names Wormhole's directory; Inductor launches its
    kernels through PyTorch's own launcher by default), through Wormhole. Each
    run has caches of its own, so that Wormhole's builds its kernels and that module itself.
    Triton may time kernel configurations and pick another one than natively, so a reduction
    may add in another order: values agree to 1e-5 (1e-3 near zero), not to the last digit."""
    def caches(where):
        return {"TRITON_CACHE_DIR": str(tmp_path / where / "triton"),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / where / "inductor")}

    native, r, _ = native_and_through_wormhole(
        tmp_path, [PYTHON, str(COMPILE)], caches("native"), caches("wormhole"),
        skip_reason=f"no Triton for {PYTHON}: torch.compile has no GPU code generator")
    assert "matches eager: True True True" in native.stdout, native.stdout
    assert "matches eager: True True True" in r.stdout, r.stdout
    ours, theirs = compiled_values(r.stdout), compiled_values(native.stdout)
    assert ours.keys() == theirs.keys() == {"rows", "probs sum", "grad sum"}
    for k in ours:
        assert ours[k] == pytest.approx(theirs[k], rel=1e-5, abs=1e-3), (k, r.stdout, native.stdout)


def test_the_training_script_runs_where_there_is_no_gpu():
    """Here (no GPU): the script must say so and fail cleanly, not crash; it needs PyTorch."""
    if has_gpu():
        pytest.skip("this machine has a GPU: the tests above run")
    if not has_torch():
        pytest.skip(f"no PyTorch for {PYTHON}")
    r = subprocess.run([PYTHON, str(TRAIN)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stdout, r.stdout + r.stderr
