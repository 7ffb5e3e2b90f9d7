#!/usr/bin/env bash
# Builds the OpenCL conformance suites that scripts/cts.sh (and gpu-test.sh's `cts` part) run,
# from sources fetched outside this tree and never committed: KhronosGroup/OpenCL-CTS and the
# current KhronosGroup/OpenCL-Headers and SPIRV-Headers (Debian's are too old for the CTS),
# against the system's ICD loader, in Release.
#
#   scripts/build-cts.sh CTS OPENCL_HEADERS SPIRV_HEADERS [SUITE...]
#
# Each source is a work tree or a git directory (a bare clone or mirror: its HEAD is taken).
# SUITEs are cts.sh's names (default: the six gpu-test.sh carries; `all`: every suite in
# cts.sh's table). The build goes to CTS_BUILD (default /work/cts/build), the sources it
# compiles to CTS_BUILD/../src (replaced at each run). The CTS's `spir` suite is left out: its
# zip blobs are often missing from mirrors, and no suite here needs it. Installs cmake, ninja,
# g++ and spirv-tools (spirv-as, which test_compiler's SPIR-V tests call) where missing.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 3 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
CTS_SRC=$1 HEADERS=$2 SPIRV=$3
shift 3
BUILD=${CTS_BUILD:-/work/cts/build}
TOP=$(dirname "$BUILD")

missing=()
for p in cmake ninja-build g++ spirv-tools; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build-cts: apt packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A work tree as it is; a git directory's HEAD, extracted (without the CTS's `spir`).
tree() {
    local from=$1 to=$2
    if [ -d "$from/.git" ] || [ ! -e "$from/HEAD" ]; then
        echo "$from"
        return
    fi
    rm -rf "$to"
    mkdir -p "$to"
    # git may still name the `spir` blob it could not read: harmless, it is left out.
    git --git-dir "$from" archive HEAD -- . ':(exclude)test_conformance/spir' | tar -x -C "$to"
    echo "$to"
}
mkdir -p "$TOP"
cts=$(tree "$CTS_SRC" "$TOP/src")
headers=$(tree "$HEADERS" "$TOP/opencl-headers")
spirv=$(tree "$SPIRV" "$TOP/spirv-headers")
if [ ! -d "$cts/test_conformance/spir" ]; then
    sed -i '/add_subdirectory( *spir *)/d' "$cts/test_conformance/CMakeLists.txt"
fi

# The suites' binaries, from cts.sh's table (name|binary|...).
table=$(sed -n '/^SUITE_TABLE=(/,/^)/p' "$REPO/scripts/cts.sh" | grep -o '^ *"[^"]*"' | tr -d ' "')
binary_of() { echo "$table" | awk -F'|' -v s="$1" '$1 == s { print $2 }'; }
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(events mem_host_flags api buffers profiling printf)
[ "${suites[0]}" = all ] && mapfile -t suites < <(echo "$table" | cut -d'|' -f1)
targets=()
for s in "${suites[@]}"; do
    b=$(binary_of "$s")
    [ -n "$b" ] || { echo "build-cts: no suite $s in scripts/cts.sh's table" >&2; exit 2; }
    targets+=("$(basename "$b")")
done

loader=$(ldconfig -p | awk '/libOpenCL\.so / { print $NF; exit }')
[ -n "$loader" ] || loader=$(ldconfig -p | awk '/libOpenCL\.so\.1 / { print $NF; exit }')
cmake -S "$cts" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCL_INCLUDE_DIR="$headers" -DCL_LIB_DIR="$(dirname "$loader")" \
    -DOPENCL_LIBRARIES=OpenCL -DSPIRV_INCLUDE_DIR="$spirv" >/dev/null
cmake --build "$BUILD" --target "${targets[@]}"
for s in "${suites[@]}"; do
    ls -la "$BUILD/$(binary_of "$s")"
done
echo "build-cts: built ${suites[*]} in $BUILD (scripts/cts.sh -o OUT $BUILD SUITE...)"
