#!/usr/bin/env bash
# The whole benchmark: native vs Wormhole (shared memory, TCP, guest region) on this host,
# then a QEMU guest comparing ivshmem and TCP (round trips and device events per call), then
# PyOpenCL's own test suite as a real application (wall time, native vs shared memory).
# Needs ./scripts/install.sh first. WH_BENCH_SKIP_SUITE=1 leaves out the suite (~5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
target/release/wh bench
.venv/bin/python bench/vm_bench.py
if [ -z "${WH_BENCH_SKIP_SUITE:-}" ]; then
    echo
    .venv/bin/python bench/pyopencl_suite.py --rounds 1
fi
