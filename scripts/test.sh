#!/usr/bin/env bash
# Runs every test: formatting and lints, the Rust unit tests, and the integration tests
# (a real server, real PoCL behind the real ICD loader; C clients, clinfo, PyOpenCL's own
# test suite, sessions, faults).
set -euo pipefail
cd "$(dirname "$0")/.."
# Installs what is missing and skips (saying why) what is there already: seconds when
# nothing changed.
./scripts/install.sh
export PATH="$HOME/.cargo/bin:$PATH"

# Fuzzing is part of the test run, never skipped: without its tools, fail now (not after the
# other steps) and say why.
fuzz_missing=()
rustup toolchain list 2>/dev/null | grep nightly >/dev/null || fuzz_missing+=("a nightly Rust toolchain (rustup toolchain install nightly)")
command -v cargo-fuzz >/dev/null 2>&1 || fuzz_missing+=("cargo-fuzz (cargo install cargo-fuzz --locked)")
if [ ${#fuzz_missing[@]} -gt 0 ]; then
    echo "error: fuzzing cannot run: scripts/install.sh could not install" >&2
    printf '  - %s\n' "${fuzz_missing[@]}" >&2
    echo "(see its output above); the test run fails rather than skip fuzzing" >&2
    exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --workspace --quiet 2>&1 | tail -n 40
echo "== fuzzing the decoders and the server's request path (bounded)"
(cd fuzz && cargo +nightly fuzz build 2>&1 | tail -n 3)
# Objects the fuzzed requests create are never released: leaks are expected, not bugs. A
# length from the client may ask for more memory than there is: the backends allocate such
# buffers fallibly and answer the API's out-of-memory status, so the fuzzer's allocator must
# fail the allocation as the system's does (allocator_may_return_null), not abort; and one
# large allocation is no finding (a staging buffer of a read is zero pages until the driver
# fills it): only the resident memory is bounded (-rss_limit_mb; -malloc_limit_mb would
# otherwise default to it).
(cd fuzz && ASAN_OPTIONS=detect_leaks=0 cargo +nightly fuzz run frame_decode -- -max_total_time=30 2>&1 | tail -n 2)
(cd fuzz && ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 cargo +nightly fuzz run server_request -- -max_total_time=90 -rss_limit_mb=4096 -malloc_limit_mb=1048576 2>&1 | tail -n 2)
(cd fuzz && ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 cargo +nightly fuzz run cuda_request -- -max_total_time=30 -rss_limit_mb=4096 -malloc_limit_mb=1048576 2>&1 | tail -n 2)
(cd fuzz && ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 cargo +nightly fuzz run nvml_request -- -max_total_time=20 -rss_limit_mb=4096 -malloc_limit_mb=1048576 2>&1 | tail -n 2)
echo "== the Kubernetes DRA driver: gofmt, go vet, go test"
go=$(scripts/k8s/go.sh)
unformatted=$(cd kubernetes && "$(dirname "$go")/gofmt" -l .)
if [ -n "$unformatted" ]; then echo "gofmt: not formatted: $unformatted" >&2; exit 1; fi
(cd kubernetes && GOFLAGS=-mod=readonly "$go" vet ./... && GOFLAGS=-mod=readonly "$go" test ./... 2>&1 | tail -n 20)
echo "== integration tests (pytest)"
.venv/bin/python -m pytest -v --timeout=1800 tests
