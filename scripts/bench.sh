#!/usr/bin/env bash
# The whole benchmark: native vs Wormhole (shared memory, TCP, guest region) on this host,
# then a QEMU guest comparing ivshmem and TCP (round trips and device events per call).
# Needs ./scripts/install.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
target/release/wh bench
.venv/bin/python bench/vm_bench.py
