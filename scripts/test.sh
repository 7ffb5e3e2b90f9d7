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
echo "== integration tests (pytest)"
.venv/bin/python -m pytest -v --timeout=1800 tests
