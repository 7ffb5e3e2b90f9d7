#!/usr/bin/env bash
# Prints the path of a Go toolchain new enough for Kubernetes ($GO_MIN): the machine's `go` if it
# is, else the official toolchain fetched as a module (golang.org/toolchain) through the Go module
# proxy by whatever `go` the machine has (Debian 12's golang-go is 1.19: too old to build, new
# enough to download).
set -euo pipefail
GO_MIN=${GO_MIN:-1.26.0}
GO_TOOLCHAIN=${GO_TOOLCHAIN:-go1.26.8}
newer() { [ "$(printf '%s\n%s\n' "$GO_MIN" "$1" | sort -V | head -n1)" = "$GO_MIN" ]; }
for go in "$(command -v go || true)" /usr/local/go/bin/go; do
    if [ -x "$go" ]; then
        v=$("$go" env GOVERSION 2>/dev/null || true)
        if newer "${v#go}"; then echo "$go"; exit 0; fi
    fi
done
# Unpacked once into target/go (the module cache keeps its files read-only and not executable).
root=$(cd "$(dirname "$0")/../.." && pwd)
local_go=$root/target/go/$GO_TOOLCHAIN
if [ -x "$local_go/bin/go" ]; then echo "$local_go/bin/go"; exit 0; fi
base=$(command -v go || true)
if [ -z "$base" ]; then
    echo "go.sh: no Go on this machine (scripts/install.sh installs golang-go)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$(cd "$tmp" && GOFLAGS=-mod=mod GO111MODULE=on "$base" mod download -json \
      "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$("$base" env GOARCH)" \
      | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') || true
if [ -z "$dir" ] || [ ! -f "$dir/bin/go" ]; then
    echo "go.sh: could not fetch the Go toolchain $GO_TOOLCHAIN as a module" >&2
    exit 1
fi
mkdir -p "$root/target/go"
rm -rf "$local_go.tmp" "$local_go"
cp -r "$dir" "$local_go.tmp"
chmod -R u+w "$local_go.tmp"
chmod +x "$local_go.tmp"/bin/* "$local_go.tmp"/pkg/tool/*/*
mv "$local_go.tmp" "$local_go"
echo "$local_go/bin/go"
