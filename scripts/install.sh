#!/usr/bin/env bash
# Installs everything Wormhole needs on Debian 12 (run as root): the OpenCL stack (PoCL behind
# the ocl-icd loader), a C compiler, Rust (if missing), a Python venv with PyOpenCL and pytest,
# and builds the workspace in release mode. Safe to run again: a step whose result is already
# there is skipped, and says so and why (a second run takes seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

PYOPENCL_VERSION=2026.1.4

apt_packages=(pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo
              gcc libc6-dev make python3 python3-venv python3-pip ca-certificates curl procps
              # Slurm's own daemons, for the tests of scripts/slurm (they run a private cluster)
              munge slurmctld slurmd slurm-client
              # Kubernetes' store and the keys of its test cluster (tests/test_k8s.py)
              etcd-server openssl)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install: apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "install: skipped apt: all ${#apt_packages[@]} packages installed"
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "install: Rust (rustup, stable)"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
else
    echo "install: skipped Rust: $(cargo --version) found"
fi

if [ ! -x .venv/bin/python ]; then
    echo "install: Python venv in .venv"
    python3 -m venv .venv
else
    echo "install: skipped the venv: .venv exists"
fi
if ! .venv/bin/python -c "import pyopencl, pytest, pytest_timeout, mako, yaml" >/dev/null 2>&1 \
   || [ "$(.venv/bin/python -c 'import pyopencl; print(pyopencl.VERSION_TEXT)')" != "$PYOPENCL_VERSION" ]; then
    echo "install: PyOpenCL $PYOPENCL_VERSION, pytest"
    .venv/bin/python -m pip install -q "pyopencl==$PYOPENCL_VERSION" pytest pytest-timeout mako numpy pyyaml
else
    echo "install: skipped pip: PyOpenCL $PYOPENCL_VERSION, pytest, pytest-timeout, mako and yaml import"
fi

# nvcc for the CUDA test programs (tests/cuda), built here without a GPU: CUDA 13.0 from PyPI,
# matching driver 580 (what the GPU machine runs); with it cuda.h and cudaTypedefs.h, and
# nvml.h and cudaProfiler.h (nvidia-nvml-dev, nvidia-cuda-profiler-api), which the descriptions'
# ABI tests compile against; cuBLAS and cuFFT of CUDA 13.0 update 2, which the library test
# program links, and the C++ core libraries (CCCL) their headers include.
CUDA_PIP="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-nvml-dev==13.0.87 nvidia-cuda-profiler-api==13.0.85 nvidia-cublas==13.0.2.14 nvidia-cufft==12.0.0.61 nvidia-cuda-cccl==13.0.85"
cuda_pip_missing=""
for pinned in $CUDA_PIP; do
    # sed reads pip's whole answer (grep -q would stop early, and pip then fails on the pipe).
    if [ "$(.venv/bin/python -m pip show "${pinned%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" != "${pinned##*==}" ]; then
        cuda_pip_missing="$cuda_pip_missing $pinned"
    fi
done
if [ -n "$cuda_pip_missing" ]; then
    echo "install: from PyPI (CUDA 13.0 for the CUDA test programs and ABI tests):$cuda_pip_missing"
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install -q $CUDA_PIP
else
    echo "install: skipped nvcc, the CUDA headers, cuBLAS and cuFFT: the pinned versions are installed"
fi

.venv/bin/python scripts/fetch_pyopencl_tests.py "$PYOPENCL_VERSION" target/pyopencl-src

# Fuzzing needs a nightly toolchain and cargo-fuzz (only the test script uses them, and it
# fails without them: it does not skip fuzzing).
if ! rustup toolchain list 2>/dev/null | grep nightly >/dev/null; then
    echo "install: nightly Rust (for cargo fuzz)"
    rustup toolchain install nightly --profile minimal \
        || echo "install: could not install a nightly toolchain: scripts/test.sh cannot fuzz and will fail" >&2
else
    echo "install: skipped nightly Rust: a nightly toolchain is installed"
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "install: cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet \
        || echo "install: could not install cargo-fuzz: scripts/test.sh cannot fuzz and will fail" >&2
else
    echo "install: skipped cargo-fuzz: $(command -v cargo-fuzz) found"
fi

echo "install: building Wormhole (release; cargo rebuilds only what changed)"
cargo build --release --workspace --quiet
./scripts/bench-clients.sh
./scripts/vm/prepare.sh   # QEMU, kernel and initramfs for the guest tests (target/vm)
# Go (for the Kubernetes DRA driver, and Kubernetes itself for its tests): the machine's if new
# enough, else the toolchain module fetched by Debian's golang-go.
if ! scripts/k8s/go.sh >/dev/null 2>&1 && ! command -v go >/dev/null 2>&1; then
    echo "install: apt golang-go (to fetch a newer Go toolchain as a module)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go
fi
./scripts/k8s/build.sh    # wh-dra, and kube-apiserver/-scheduler/-controller-manager (target/k8s)
echo "install: done ($(pwd)/target/release/wh)"
