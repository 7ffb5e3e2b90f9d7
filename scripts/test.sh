#!/usr/bin/env bash
# Runs every test: formatting and lints, the Rust unit tests, and the integration tests
# (a real server, real PoCL behind the real ICD loader; C clients, clinfo, PyOpenCL's own
# test suite, sessions, faults).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --workspace --quiet 2>&1 | tail -n 40
echo "== fuzzing the decoders and the server's request path (bounded)"
if command -v cargo-fuzz >/dev/null 2>&1 && rustup toolchain list | grep -q nightly; then
    (cd fuzz && cargo +nightly fuzz build 2>&1 | tail -n 3)
    # Objects the fuzzed requests create are never released: leaks are expected, not bugs.
    (cd fuzz && ASAN_OPTIONS=detect_leaks=0 cargo +nightly fuzz run frame_decode -- -max_total_time=30 2>&1 | tail -n 2)
    (cd fuzz && ASAN_OPTIONS=detect_leaks=0 cargo +nightly fuzz run server_request -- -max_total_time=90 -rss_limit_mb=4096 2>&1 | tail -n 2)
else
    echo "fuzzing skipped: needs nightly Rust and cargo-fuzz" >&2
    exit 1
fi
echo "== integration tests (pytest)"
.venv/bin/python -m pytest -v --timeout=1800 tests
