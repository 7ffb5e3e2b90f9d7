#!/usr/bin/env bash
# The GPU tests (pytest marker `gpu`) and GPU benchmarks, on a machine with an NVIDIA GPU and
# its driver. The GPU machine has no Rust and no network: build here (`cargo build --release`,
# `scripts/install.sh` for the bench clients, `scripts/gpu-test.sh --prepare` for pytest),
# carry target/release and target/gpu-py, then run this there. Elsewhere the same tests skip,
# saying why.
#
#   scripts/gpu-test.sh [PART...] [-- PYTEST-ARGS...]
#
# PARTs, in the order they run (default: all of them):
#   cuda-tests    tests/test_cuda.py's GPU tests (driver API, cudart, NVML, quotas)
#   torch-tests   tests/test_torch.py's GPU tests (where python3 has PyTorch)
#   cuda-bench    `wh bench --part cuda`: the CUDA table (native, shared memory, TCP)
#   opencl-bench  the OpenCL calls table on NVIDIA's OpenCL, with pinned staging and without
#   torch-bench   `wh bench --part torch` (where python3 has PyTorch)
# A device command may run 10 minutes at most: give each call a few parts.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    # Pure-Python pytest for another machine's python3 (no venv there: no network to fill one).
    rm -rf target/gpu-py
    .venv/bin/python -m pip install -q --target target/gpu-py pytest pytest-timeout
    echo "gpu-test: pytest in target/gpu-py; carry target/release and target/gpu-py"
    exit 0
fi
ALL=(cuda-tests torch-tests cuda-bench opencl-bench torch-bench)
parts=()
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; pytest_args=("$@"); break ;;
        cuda-tests|torch-tests|cuda-bench|opencl-bench|torch-bench) parts+=("$1") ;;
        # Arguments before any part name go to pytest, as before parts existed.
        *) pytest_args+=("$1") ;;
    esac
    shift
done
[ ${#parts[@]} -gt 0 ] || parts=("${ALL[@]}")
wants() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

for f in target/release/wh target/release/libwormhole_cuda.so target/release/libwormhole_nvml.so; do
    [ -e "$f" ] || { echo "gpu-test: $f is missing (build here: cargo build --release)" >&2; exit 1; }
done
nvidia-smi -L || { echo "gpu-test: no NVIDIA GPU here" >&2; exit 1; }
# The machine's own pytest where it has pytest-timeout too, else the one carried.
if python3 -c "import pytest, pytest_timeout" 2>/dev/null; then py=(python3); else py=(env PYTHONPATH=target/gpu-py python3); fi
has_torch() { python3 -c "import torch" 2>/dev/null; }
rc=0
# Each test 300 s at most: a hang must not eat a session's 30 minutes of the machine.
if wants cuda-tests; then
    echo "gpu-test: cuda-tests"
    "${py[@]}" -m pytest -v -m gpu -p no:cacheprovider --timeout=300 tests/test_cuda.py ${pytest_args[@]+"${pytest_args[@]}"} || rc=$?
fi
if wants torch-tests; then
    echo "gpu-test: torch-tests"
    "${py[@]}" -m pytest -v -m gpu -p no:cacheprovider --timeout=300 tests/test_torch.py ${pytest_args[@]+"${pytest_args[@]}"} || rc=$?
fi
if wants cuda-bench; then
    echo "gpu-test: cuda-bench"
    if [ -x target/release/wh-cuda-bench-client ]; then
        target/release/wh bench --part cuda || rc=$?
    else
        echo "gpu-test: no target/release/wh-cuda-bench-client (scripts/install.sh builds it): no CUDA table" >&2
        rc=1
    fi
fi
# OpenCL on NVIDIA's driver, native vs Wormhole: the calls table, whose blocking transfers go
# through pinned staging on a discrete GPU (#11: >= 0.9x native at >= 1 MiB). Only PoCL is
# registered there, so NVIDIA's library is named in a vendors directory of our own (the
# Wormhole side's client is pointed at Wormhole's ICD by `wh bench` itself).
if wants opencl-bench; then
    echo "gpu-test: opencl-bench"
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
        rc=1
    fi
fi
# PyTorch training, native vs Wormhole (bench/torch_train.py), where python3 has PyTorch.
if wants torch-bench; then
    echo "gpu-test: torch-bench"
    if has_torch; then
        target/release/wh bench --part torch || rc=$?
    else
        echo "gpu-test: python3 has no PyTorch here: no torch table" >&2
    fi
fi
exit $rc
