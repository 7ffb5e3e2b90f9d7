#!/usr/bin/env bash
# The GPU tests (pytest marker `gpu`), on a machine with an NVIDIA GPU and its driver. The GPU
# machine has no Rust and no network: build here, carry target/release (wh, the client
# libraries) and target/gpu-py (pytest, made by `scripts/gpu-test.sh --prepare`), then run
# `scripts/gpu-test.sh` there; it then prints `wh bench --part cuda`, the OpenCL calls table on
# NVIDIA's OpenCL and `--part torch`. Elsewhere the same tests skip, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    # Pure-Python pytest for another machine's python3 (no venv there: no network to fill one).
    rm -rf target/gpu-py
    .venv/bin/python -m pip install -q --target target/gpu-py pytest pytest-timeout
    echo "gpu-test: pytest in target/gpu-py; carry target/release and target/gpu-py"
    exit 0
fi
for f in target/release/wh target/release/libwormhole_cuda.so target/release/libwormhole_nvml.so; do
    [ -e "$f" ] || { echo "gpu-test: $f is missing (build here: cargo build --release)" >&2; exit 1; }
done
nvidia-smi -L || { echo "gpu-test: no NVIDIA GPU here" >&2; exit 1; }
if python3 -c "import pytest" 2>/dev/null; then py=(python3); else py=(env PYTHONPATH=target/gpu-py python3); fi
rc=0
"${py[@]}" -m pytest -v -m gpu -p no:cacheprovider --timeout=900 tests/test_cuda.py tests/test_torch.py "$@" || rc=$?
# The CUDA table of `wh bench` (native, shared memory, TCP), for the session's note.
if [ -x target/release/wh-cuda-bench-client ]; then
    target/release/wh bench --part cuda || rc=$?
else
    echo "gpu-test: no target/release/wh-cuda-bench-client (scripts/install.sh builds it): no CUDA table" >&2
fi
# OpenCL on NVIDIA's driver, native vs Wormhole: the calls table, whose blocking transfers go
# through pinned staging on a discrete GPU (#11: >= 0.9x native at >= 1 MiB). Only PoCL is
# registered there, so NVIDIA's library is named in a vendors directory of our own.
nvidia_cl=$(ls /usr/lib/libnvidia-opencl.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 2>/dev/null | head -1 || true)
if [ -n "$nvidia_cl" ] && [ -x target/release/wh-bench-client ]; then
    vendors=$(mktemp -d)
    echo "$nvidia_cl" > "$vendors/nvidia.icd"
    echo "gpu-test: OpenCL calls table on NVIDIA's OpenCL, pinned staging on (auto)"
    OCL_ICD_VENDORS="$vendors" target/release/wh bench --part calls || rc=$?
    # The same without staging (mapped transfers), to see what staging buys on this GPU.
    echo "gpu-test: the same with WORMHOLE_PINNED_STAGING=never"
    WORMHOLE_PINNED_STAGING=never OCL_ICD_VENDORS="$vendors" target/release/wh bench --part calls || rc=$?
else
    echo "gpu-test: no NVIDIA OpenCL library or no target/release/wh-bench-client: no OpenCL table" >&2
fi
# PyTorch training, native vs Wormhole (bench/torch_train.py), where python3 has PyTorch.
if python3 -c "import torch" 2>/dev/null; then
    target/release/wh bench --part torch || rc=$?
fi
exit $rc
