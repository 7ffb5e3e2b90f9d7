#!/usr/bin/env bash
# Builds what the Kubernetes tests and a deployment run, into target/k8s/bin:
#   wh-dra, kubelet-sim      Wormhole's DRA driver and the test's stand-in for the kubelet
#   kube-apiserver, kube-scheduler, kube-controller-manager
#                            Kubernetes' own, from the Go module proxy at $KUBE_VERSION (built
#                            once per version: tens of minutes on 2 cores, then kept)
# Go comes from scripts/k8s/go.sh (the machine's, or the toolchain module if that one is old).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
go=$(scripts/k8s/go.sh)
out=$root/target/k8s
mkdir -p "$out/bin"

echo "k8s: wh-dra and kubelet-sim ($("$go" version))"
# Our own module builds from its go.sum as committed.
(cd kubernetes && GOFLAGS=-mod=readonly "$go" build -trimpath -ldflags "-s -w" -o "$out/bin/" ./cmd/wh-dra ./test/kubelet-sim)

kube_bins=(kube-apiserver kube-scheduler kube-controller-manager)
stamp=$out/bin/.kube-$KUBE_VERSION
built=1
for b in "${kube_bins[@]}"; do [ -x "$out/bin/$b" ] || built=0; done
if [ -e "$stamp" ] && [ "$built" = 1 ]; then
    echo "k8s: skipped Kubernetes $KUBE_VERSION: built already ($out/bin)"
    exit 0
fi
echo "k8s: building kube-apiserver, kube-scheduler, kube-controller-manager $KUBE_VERSION"
# k8s.io/kubernetes points its staging modules at its own source tree, which its module does not
# carry: a module of our own requires it and points them at their published versions instead.
mod=$out/kube-build
rm -rf "$mod" && mkdir -p "$mod"
gomod=$(cd "$mod" && GOFLAGS=-mod=mod "$go" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
if [ ! -f "$gomod" ]; then
    echo "k8s: the Go module proxy gave no go.mod for k8s.io/kubernetes@$KUBE_VERSION" >&2
    exit 1
fi
staging_version=v0.${KUBE_VERSION#v1.}
{
    echo "module wormhole.local/kube-build"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    grep -E '=> \./staging/' "$gomod" | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
} > "$mod/go.mod"
cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
rm -f "$stamp"
(cd "$mod" && export GOFLAGS=-mod=mod && "$go" mod tidy && "$go" build -ldflags "-s -w" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager)
touch "$stamp"
echo "k8s: built $(ls "$out/bin" | tr '\n' ' ')"
