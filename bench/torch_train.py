"""PyTorch training loops for comparing Wormhole with native on a GPU (tests/test_torch.py and
`wh bench --part torch` run it both ways): an MLP (256→512→10, batch 64, SGD) and a small CNN
whose convolutions are cuDNN's, on synthetic data from fixed seeds, with deterministic
algorithms where PyTorch has them, so the losses printed match to the last digit when the
kernels are deterministic.

    torch_train.py [--model mlp|cnn|both] [--steps N] [--hold-mib M] [--until-oom]

Prints the device as PyTorch sees it, `torch.cuda.mem_get_info()`, then per model the loss
every 50 steps and the steps/s of the timed steps (after 20 warm-up steps); the last line is
the same as JSON. --hold-mib keeps that much allocated while training; --until-oom allocates
64 MiB blocks until PyTorch raises its out-of-memory error and says how far it got;
--forever trains until killed (printing "training" once it has begun).
"""
import argparse
import json
import os
import sys
import time

# Deterministic cuBLAS (needed by torch.use_deterministic_algorithms): set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BATCH = 64
WARMUP = 20


def mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AvgPool2d(14),
        nn.Flatten(), nn.Linear(32, 10))


def batches(kind, n=8):
    g = torch.Generator(device="cuda").manual_seed(1234)
    shape = (BATCH, 256) if kind == "mlp" else (BATCH, 1, 28, 28)
    return [(torch.randn(shape, device="cuda", generator=g),
             torch.randint(0, 10, (BATCH,), device="cuda", generator=g)) for _ in range(n)]


def train(kind, steps, forever=False):
    torch.manual_seed(0)
    model = (mlp() if kind == "mlp" else cnn()).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(kind)
    losses = []

    def step(i):
        x, y = data[i % len(data)]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 50 == 0:
            losses.append(f"{loss.item():.6f}")

    for i in range(WARMUP):
        step(i)
    torch.cuda.synchronize()
    if forever:
        print("training", flush=True)
        i = WARMUP
        while True:
            step(i)
            i += 1
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + steps):
        step(i)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {"losses": losses, "steps_per_s": steps / elapsed}


def until_oom():
    held = []
    try:
        while True:
            held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        print(f"out of memory after {len(held) * 64} MiB: torch.cuda.OutOfMemoryError", flush=True)
    del held
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--hold-mib", type=int, default=0)
    p.add_argument("--until-oom", action="store_true")
    p.add_argument("--forever", action="store_true")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # Deterministic kernels where PyTorch has them (a warning, not an error, where it has not).
    torch.use_deterministic_algorithms(True, warn_only=True)
    if not torch.cuda.is_available():
        print("no CUDA device", flush=True)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, {torch.cuda.device_count()} device(s)")
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info: total {total}, free within it: {free <= total}", flush=True)
    hold = torch.empty(a.hold_mib << 20, dtype=torch.uint8, device="cuda") if a.hold_mib else None
    if a.until_oom:
        until_oom()
    results = {}
    for kind in (["mlp", "cnn"] if a.model == "both" else [a.model]):
        results[kind] = train(kind, a.steps, a.forever)
        print(f"{kind}: losses {' '.join(results[kind]['losses'])}")
        print(f"{kind}: {results[kind]['steps_per_s']:.1f} steps/s", file=sys.stderr)
    del hold
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
