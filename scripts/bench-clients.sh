#!/usr/bin/env bash
# The benchmark clients `wh bench` runs natively and through Wormhole (C, beside `wh` in
# target/release), rebuilt only when their sources are newer.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/release
newer() { [ ! -x "$1" ] || [ "$2" -nt "$1" ] || [ bench/bench_measure.h -nt "$1" ]; }
if newer target/release/wh-bench-client bench/bench_client.c; then
    gcc -O2 -o target/release/wh-bench-client bench/bench_client.c -lOpenCL
else
    echo "install: skipped the benchmark client: target/release/wh-bench-client is newer than its source"
fi
# The CUDA one needs no toolkit: it loads libcuda.so.1 itself (wh bench --part cuda, on a GPU).
if newer target/release/wh-cuda-bench-client bench/cuda_bench_client.c; then
    gcc -O2 -o target/release/wh-cuda-bench-client bench/cuda_bench_client.c -ldl
fi
