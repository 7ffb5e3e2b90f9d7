#!/usr/bin/env bash
# The GPU tests (pytest marker `gpu`) and GPU benchmarks, on a machine with an NVIDIA GPU and
# its driver. The GPU machine has no Rust and no network, and a device call carries at most
# 64 MiB: build here with `scripts/gpu-test.sh --prepare` (release build, bench clients,
# debug info stripped into target/gpu, pytest for python3), carry `target/gpu` alone, and run
# this there: it puts the carried build where the tests look for it. Elsewhere the same tests
# skip, saying why.
#
#   scripts/gpu-test.sh [PART...] [-- PYTEST-ARGS...]
#
# PARTs, in the order they run (default: all of them), each with its share of the call:
#   cuda-tests    tests/test_cuda.py's GPU tests (driver API, cudart, cuBLAS, NVML, quotas) 180 s
#   torch-tests   tests/test_torch.py's GPU tests (where python3 has PyTorch; the       200 s
#                 torch.compile test last)
#   cuda-bench    `wh bench --part cuda`: the CUDA table (native, shared memory, TCP)     80 s
#   opencl-bench  the OpenCL call and transfer table (`wh bench --part transfers`:     100 s
#                 native and shared memory) on NVIDIA's OpenCL, with pinned staging and
#                 without (half each)
#   torch-bench   `wh bench --part torch` (where python3 has PyTorch)                   60 s
#   cts           (only when named) the OpenCL conformance suites #11 compares on the GPU
#                 (events, mem_host_flags, api, buffers, profiling, printf), natively and
#                 through Wormhole on NVIDIA's OpenCL (scripts/cts.sh), from the CTS build
#                 `--prepare` carried (CTS_DIR, default /work/cts/build); its tables and logs
#                 in $OUT/cts                                                         300 s
# A session has 15 minutes of the GPU machine in all, its start (a minute or two) included,
# and a machine is not started with under 4 left: plan on one call. So all the parts fit one
# device command (at most 600 s): each part stops at its share plus what the parts before it
# left unused (PART_LIMIT, if set, caps every part instead), all of them after CALL_LIMIT
# (default 550) s, each test after TEST_LIMIT (default 60) s, a PyTorch test (two trainings)
# after TORCH_TEST_LIMIT (150): a hang costs one test, not the call. Where $OUT is set (the
# device machine), each part's output is kept in $OUT/<part>.log, and the test servers' logs
# and the traces of the programs the tests ran through Wormhole in $OUT/logs.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILT=(wh libwormhole_cuda.so libwormhole_nvml.so libwormhole_opencl.so wh-cuda-bench-client wh-bench-client)
# The CTS suites the `cts` part runs (#11's GPU table), and where each binary lies in a build.
CTS_SUITES=(events mem_host_flags api buffers profiling printf)
cts_binary() { echo "test_conformance/$1/test_$1"; }
if [ "${1:-}" = "--prepare" ]; then
    cargo build --release --workspace --quiet
    ./scripts/bench-clients.sh
    rm -rf target/gpu
    mkdir -p target/gpu/release
    # Debug info is most of each file's size (the release profile keeps it for backtraces).
    for f in "${BUILT[@]}"; do strip --strip-debug -o "target/gpu/release/$f" "target/release/$f"; done
    # Pure-Python pytest for another machine's python3 (no venv there: no network to fill one).
    .venv/bin/python -m pip install -q --target target/gpu/py pytest pytest-timeout
    # The CTS suites of the `cts` part, where a CTS build is at hand (never built here).
    cts_build=${CTS_DIR:-/work/cts/build}
    if [ -d "$cts_build/test_conformance" ]; then
        for s in "${CTS_SUITES[@]}"; do
            bin=$(cts_binary "$s")
            mkdir -p "target/gpu/cts/$(dirname "$bin")"
            strip --strip-debug -o "target/gpu/cts/$bin" "$cts_build/$bin"
        done
    else
        echo "gpu-test: no CTS build at $cts_build (CTS_DIR; scripts/build-cts.sh makes one): the cts part will have nothing to run"
    fi
    du -sh target/gpu
    echo "gpu-test: carry [\"target/gpu\"]; there run scripts/gpu-test.sh PART..."
    exit 0
fi
# On the device machine: the carried build where the tests and `wh` look for it (every time:
# a warm machine keeps an earlier call's copy).
if [ -d target/gpu/release ] && ! command -v cargo >/dev/null 2>&1; then
    mkdir -p target/release
    cp -p target/gpu/release/* target/release/
fi
ALL=(cuda-tests torch-tests cuda-bench opencl-bench torch-bench)  # cts only when named
parts=()
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; pytest_args=("$@"); break ;;
        cuda-tests|torch-tests|cuda-bench|opencl-bench|torch-bench|cts) parts+=("$1") ;;
        # Arguments before any part name go to pytest, as before parts existed.
        *) pytest_args+=("$1") ;;
    esac
    shift
done
[ ${#parts[@]} -gt 0 ] || parts=("${ALL[@]}")
wants() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
# The call's seconds are shared among the parts asked for, in proportion to their shares.
declare -A share=([cuda-tests]=180 [torch-tests]=200 [cuda-bench]=80 [opencl-bench]=100 [torch-bench]=60 [cts]=300)
planned=0
for p in "${parts[@]}"; do planned=$((planned + ${share[$p]})); done
share[opencl-bench-unstaged]=$((share[opencl-bench] / 2))
share[opencl-bench]=$((share[opencl-bench] / 2))

for f in "${BUILT[@]}"; do
    [ -e "target/release/$f" ] || { echo "gpu-test: target/release/$f is missing (here: scripts/gpu-test.sh --prepare, then carry target/gpu)" >&2; exit 1; }
done
nvidia-smi -L || { echo "gpu-test: no NVIDIA GPU here" >&2; exit 1; }
# The machine's own pytest where it has pytest-timeout too, else the one carried.
if python3 -c "import pytest, pytest_timeout" 2>/dev/null; then py=(python3); else py=(env PYTHONPATH=target/gpu/py python3); fi
has_torch() { python3 -c "import torch" 2>/dev/null; }
# NVIDIA's OpenCL library there, if any (only PoCL is registered with the loader).
nvidia_opencl() { ls /usr/lib/libnvidia-opencl.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 2>/dev/null | head -1 || true; }
export PYTHONUNBUFFERED=1
# A part's output, kept in $OUT/<part>.log too where $OUT is set. A part stops after its
# share of the call (plus what earlier parts left unused), and all of them together after
# CALL_LIMIT (a device command is killed at 600 s, its output with it): SIGINT first, so
# pytest still prints what failed.
call_limit=${CALL_LIMIT:-550}
test_limit=${TEST_LIMIT:-60}
spare=0
keep() { if [ -n "${OUT:-}" ]; then tee -a "$OUT/$1.log"; else cat; fi; }
part() {
    local name=$1 left limit st started=$SECONDS
    shift
    left=$((call_limit - SECONDS))
    limit=${PART_LIMIT:-$((${share[$name]} * call_limit / planned + spare))}
    [ "$limit" -le "$left" ] || limit=$left
    if [ "$limit" -lt 20 ]; then
        echo "gpu-test: $name skipped: ${left}s left of this call's ${call_limit}s" | keep "$name"
        rc=1
        return
    fi
    echo "gpu-test: $name (at most ${limit}s)"
    set +e
    timeout -s INT -k 15 "$limit" "$@" 2>&1 | keep "$name"
    st=${PIPESTATUS[0]}
    set -e
    [ "$st" -eq 0 ] || rc=$st
    spare=$((limit - (SECONDS - started)))
    [ "$spare" -ge 0 ] || spare=0
    echo "gpu-test: $name took $((SECONDS - started))s (status $st)" | keep "$name"
}
rc=0
# What a failure is read from afterwards, kept in $OUT/logs.tar.gz where $OUT is set: each
# test server's log (tests/conftest.py keeps them under the test's name) and, for the test
# parts, a trace of every program run through Wormhole (WORMHOLE_TRACE: each entry point the
# program called and its answer, each lookup, export table slot and request; the first
# 100,000 lines of each process), the benches left untraced.
keep_dir=$(mktemp -d)
export WH_KEEP_LOGS="$keep_dir"
traced=(env "WORMHOLE_TRACE=$keep_dir/trace.%p" WORMHOLE_TRACE_LIMIT=100000)
keep_logs() {
    [ -n "${OUT:-}" ] || return 0
    tar -czf "$OUT/logs.tar.gz" -C "$keep_dir" . || return 0
    # A file comes back only under 16 MiB: the traces' starts are what matter most.
    if [ "$(stat -c %s "$OUT/logs.tar.gz")" -gt $((15 << 20)) ]; then
        find "$keep_dir" -name 'trace.*' -size +2M -exec truncate -s 2M {} +
        tar -czf "$OUT/logs.tar.gz" -C "$keep_dir" .
    fi
    ls -l "$OUT/logs.tar.gz"
}
trap keep_logs EXIT
if wants cuda-tests; then
    part cuda-tests "${traced[@]}" "${py[@]}" -m pytest -v -rP -m gpu -p no:cacheprovider --timeout="$test_limit" tests/test_cuda.py ${pytest_args[@]+"${pytest_args[@]}"}
fi
if wants torch-tests; then
    # -rP: the passing tests' output too (steps/s, round trips per step).
    part torch-tests "${traced[@]}" "${py[@]}" -m pytest -v -rP -m gpu -p no:cacheprovider --timeout="${TORCH_TEST_LIMIT:-150}" tests/test_torch.py ${pytest_args[@]+"${pytest_args[@]}"}
fi
if wants cuda-bench; then
    # cuBLAS for the SGEMM row: the toolkit's, else PyTorch's (python3's nvidia/cu13 wheels).
    if [ -z "${WORMHOLE_BENCH_CUBLAS:-}" ] && ! { ldconfig -p 2>/dev/null || true; } | grep "libcublas.so.13 " >/dev/null; then
        prefix=$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null || true)
        for f in /usr/local/cuda/lib64/libcublas.so.13 "$prefix"/lib/python3*/site-packages/nvidia/cu13/lib/libcublas.so.13; do
            if [ -e "$f" ]; then export WORMHOLE_BENCH_CUBLAS="$f"; break; fi
        done
    fi
    part cuda-bench target/release/wh bench --part cuda
fi
# OpenCL on NVIDIA's driver, native vs Wormhole: the calls table, whose blocking transfers go
# through pinned staging on a discrete GPU (#11: >= 0.9x native at >= 1 MiB). Only PoCL is
# registered there, and the loader that comes first on the library path (the CUDA toolkit's)
# kept reaching PoCL with NVIDIA's library named in OCL_ICD_VENDORS (seen on the H200): it is
# named in OCL_ICD_FILENAMES too, and the bench client measures the platform named like
# $WH_PLATFORM (the Wormhole side's client is pointed at Wormhole's ICD alone by `wh bench`,
# and the server's platforms come prefixed with "Wormhole →").
if wants opencl-bench; then
    nvidia_cl=$(nvidia_opencl)
    if [ -n "$nvidia_cl" ]; then
        vendors=$(mktemp -d)
        echo "$nvidia_cl" > "$vendors/nvidia.icd"
        export OCL_ICD_VENDORS="$vendors" OCL_ICD_FILENAMES="$nvidia_cl" WH_PLATFORM=NVIDIA
        # Which loader and platform the native side reaches (the toolkit's libOpenCL.so.1
        # comes first on the library path there).
        { ldd target/release/wh-bench-client | grep -i opencl || true; } | keep opencl-bench
        { timeout 20 target/release/wh-bench-client platform 2>&1 || echo "gpu-test: the native side reached no NVIDIA OpenCL platform"; } | keep opencl-bench
        # Pinned staging on (auto), then without (mapped transfers): what staging buys.
        part opencl-bench target/release/wh bench --part transfers
        WORMHOLE_PINNED_STAGING=never part opencl-bench-unstaged target/release/wh bench --part transfers
        unset OCL_ICD_VENDORS OCL_ICD_FILENAMES WH_PLATFORM
    else
        echo "gpu-test: no NVIDIA OpenCL library here: no OpenCL table" >&2
        rc=1
    fi
fi
# The conformance suites on NVIDIA's OpenCL, natively and through Wormhole: the native
# library named as the opencl-bench part names it (OCL_ICD_FILENAMES too).
if wants cts; then
    nvidia_cl=$(nvidia_opencl)
    if [ -z "$nvidia_cl" ] || [ ! -d target/gpu/cts ]; then
        echo "gpu-test: cts needs NVIDIA's OpenCL here and a CTS build carried (target/gpu/cts)" | keep cts
        rc=1
    else
        icd_file=$(mktemp -d)/nvidia.icd
        echo "$nvidia_cl" > "$icd_file"
        # Each suite's runs get an equal part of the part's time (both sides, with room).
        per_run=$(( (${PART_LIMIT:-$((share[cts] * call_limit / planned + spare))}) / (2 * ${#CTS_SUITES[@]} + 1) ))
        [ "$per_run" -ge 20 ] || per_run=20
        part cts env CTS_ICD_BY_FILE=1 CTS_CAP="$per_run" POCL_ICD="$icd_file" scripts/cts.sh -o "${OUT:-/tmp}/cts" target/gpu/cts "${CTS_SUITES[@]}"
    fi
fi
# PyTorch training, native vs Wormhole (bench/torch_train.py), where python3 has PyTorch.
if wants torch-bench; then
    if has_torch; then
        part torch-bench target/release/wh bench --part torch
    else
        echo "gpu-test: python3 has no PyTorch here: no torch table" >&2
    fi
fi
exit $rc
