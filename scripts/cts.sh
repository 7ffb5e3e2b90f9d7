#!/usr/bin/env bash
# Runs suites of the Khronos OpenCL conformance tests (CTS) twice, natively (the ICD loader
# sees PoCL only) and through Wormhole (a private `wh serve`, the binary under `wh run`), and
# compares the outcome of every test. It builds nothing: point it at a CTS build directory.
#
#   scripts/cts.sh [-o OUT] [-t SECONDS] [CTS_BUILD_DIR] [SUITE[:TEST,TEST...] ...]
#
# CTS_DIR may name the build directory instead of the first argument; CTS_OUT the output
# directory (default /tmp/cts-out: summary.txt, and a directory per suite with each side's
# log, the harness's JSON results and exit status as SIDE.p1.*, the tests a hang or crash
# kept from running run again as SIDE.p2.* and so on, and the server's log for that suite);
# CTS_TIMEOUT (or -t) the limit per run of a suite's binary for suites without their own
# below (default 900 s), CTS_CAP a bound on every suite's limit; POCL_ICD the vendor file of
# the native driver (default /etc/OpenCL/vendors/pocl.icd); CTS_FULL=1 also runs the tests the table below leaves out as
# too slow; CTS_TRANSPORT=tcp reaches the server over TCP on loopback (127.0.0.1, port
# CTS_TCP_PORT, default 7787) instead of shared memory; CTS_ICD_BY_FILE=1 names the native
# driver's library in OCL_ICD_FILENAMES too, for a loader that does not honour OCL_ICD_VENDORS
# (the CUDA toolkit's, first on the GPU machine's library path; `wh run` keeps it from the
# Wormhole side's program). SUITE:T1,T2 runs only those tests of SUITE; "images" stands for
# every images_* suite.
# Exit status: 0 when no test's outcome differs, 1 when one does, 2 on a usage or setup error.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
WH="$REPO/target/release/wh"
OUT="${CTS_OUT:-/tmp/cts-out}"
DEFAULT_TIMEOUT="${CTS_TIMEOUT:-900}"
POCL_ICD="${POCL_ICD:-/etc/OpenCL/vendors/pocl.icd}"
CTS="${CTS_DIR:-}"
TRANSPORT="${CTS_TRANSPORT:-shm}"
TCP_ADDR="127.0.0.1:${CTS_TCP_PORT:-7787}"

# name | binary, relative to the build directory | extra arguments | timeout (s, empty: the
# default) | tests left out (an extended regular expression matching whole names), with the
# reason in the comment above the line | tests too slow for a CPU device, left out unless
# CTS_FULL=1 (the same form).
SUITE_TABLE=(
    "mem_host_flags|test_conformance/mem_host_flags/test_mem_host_flags|||"
    "events|test_conformance/events/test_events||300|"
    "printf|test_conformance/printf/test_printf|||"
    "SVM|test_conformance/SVM/test_svm|||"
    # set_command_queue_property crashes natively on PoCL 3.1: nothing to compare.
    "api|test_conformance/api/test_api|||set_command_queue_property|"
    "buffers|test_conformance/buffers/test_buffers||1200|"
    "allocations|test_conformance/allocations/test_allocations|||"
    "profiling|test_conformance/profiling/test_profiling|||"
    "computeinfo|test_conformance/computeinfo/test_computeinfo|||"
    "device_timer|test_conformance/device_timer/test_device_timer|||"
    "compiler|test_conformance/compiler/test_compiler|||"
    # The async copies and prefetch move hundreds of MiB per vector type: each takes many
    # minutes on PoCL with two cores.
    "basic|test_conformance/basic/test_basic||1200||async_(strided_)?copy_.*|prefetch"
    "images_info|test_conformance/images/clGetInfo/test_cl_get_info|||"
    "images_methods|test_conformance/images/kernel_image_methods/test_kernel_image_methods|||"
    "images_kernel|test_conformance/images/kernel_read_write/test_image_streams|small_images CL_FILTER_NEAREST|1200|"
    "images_copy|test_conformance/images/clCopyImage/test_cl_copy_images|small_images|1200|"
    "images_fill|test_conformance/images/clFillImage/test_cl_fill_images|small_images||"
    "images_rw|test_conformance/images/clReadWriteImage/test_cl_read_write_images|small_images||"
    "images_samplerless|test_conformance/images/samplerlessReads/test_samplerless_reads|small_images||"
    "math_brute_force|test_conformance/math_brute_force/test_bruteforce|-w|1200|"
    "atomics|test_conformance/atomics/test_atomics|||"
    "subgroups|test_conformance/subgroups/test_subgroups|||"
    "non_uniform_work_group|test_conformance/non_uniform_work_group/test_non_uniform_work_group|||"
    "spirv_new|test_conformance/spirv_new/test_spirv_new|||"
    "multiple_device_context|test_conformance/multiple_device_context/test_multiples|||"
    # The full_* variants walk every global size up to the device's limits: hours on a CPU.
    "thread_dimensions|test_conformance/thread_dimensions/test_thread_dimensions||1200||full_.*"
    "device_partition|test_conformance/device_partition/test_device_partition|||"
    "workgroups|test_conformance/workgroups/test_workgroups|||"
    "generic_address_space|test_conformance/generic_address_space/test_generic_address_space|||"
    "c11_atomics|test_conformance/c11_atomics/test_c11_atomics||1200|"
    "commonfns|test_conformance/commonfns/test_commonfns|||"
    "geometrics|test_conformance/geometrics/test_geometrics|||"
    "relationals|test_conformance/relationals/test_relationals|||"
    "select|test_conformance/select/test_select|-w||"
    # vec_align_packed_struct builds a kernel per type, size and address space: over 15 min on
    # PoCL with two cores. The rest builds thousands of one-off programs: 803 s natively, 841 s
    # through Wormhole (1265 s while the program cache stored each build before answering it):
    # close to the default limit on a shared machine, so one with room above both.
    "vectors|test_conformance/vectors/test_vectors||1800||vec_align_packed_struct(_arr)?"
    "half|test_conformance/half/test_half|-w||"
    "contractions|test_conformance/contractions/test_contractions|||"
    # Over an hour per side on PoCL with two cores (ten of its 99 tests took eight minutes).
    "integer_ops|test_conformance/integer_ops/test_integer_ops||3600|"
    "pipes|test_conformance/pipes/test_pipes|||"
    "device_execution|test_conformance/device_execution/test_device_execution|||"
    "command_buffer|test_conformance/extensions/cl_khr_command_buffer/test_cl_khr_command_buffer|||"
    "semaphore|test_conformance/extensions/cl_khr_semaphore/test_cl_khr_semaphore|||"
)

usage() {
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
    echo "suites: $(for s in "${SUITE_TABLE[@]}"; do printf '%s ' "${s%%|*}"; done)" >&2
    exit 2
}

while getopts "o:t:h" opt; do
    case "$opt" in
        o) OUT="$OPTARG" ;;
        t) DEFAULT_TIMEOUT="$OPTARG" ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ] && [ -d "$1" ]; then
    CTS="$1"
    shift
fi
[ -n "$CTS" ] && [ -d "$CTS" ] || { echo "error: no CTS build directory (argument or CTS_DIR)" >&2; usage; }
CTS="$(cd "$CTS" && pwd)"
[ -x "$WH" ] || { echo "error: $WH missing: cargo build --release --workspace" >&2; exit 2; }
[ -f "$POCL_ICD" ] || { echo "error: no native vendor file $POCL_ICD (set POCL_ICD)" >&2; exit 2; }
case "$DEFAULT_TIMEOUT" in '' | *[!0-9]*) echo "error: timeout must be seconds" >&2; exit 2 ;; esac
# How the Wormhole side reaches its server: the local socket (shared memory), or TCP.
SERVE_ARGS=()
CLIENT_ENV=()
case "$TRANSPORT" in
    shm) ;;
    tcp) SERVE_ARGS=(--tcp "$TCP_ADDR") CLIENT_ENV=(WORMHOLE_SERVER="tcp://$TCP_ADDR") ;;
    *) echo "error: CTS_TRANSPORT must be shm or tcp" >&2; exit 2 ;;
esac

declare -A BIN ARGS TMO EXCL SLOW
ALL=()
for row in "${SUITE_TABLE[@]}"; do
    IFS='|' read -r name bin args tmo excl slow <<<"$row"
    tmo="${tmo:-$DEFAULT_TIMEOUT}"
    # CTS_CAP bounds every suite's limit, its own included (a device call's time is short).
    [ -n "${CTS_CAP:-}" ] && [ "$tmo" -gt "$CTS_CAP" ] && tmo="$CTS_CAP"
    BIN[$name]="$bin" ARGS[$name]="$args" TMO[$name]="$tmo" EXCL[$name]="$excl"
    SLOW[$name]="$slow"
    ALL+=("$name")
done

# The requested suites (name, or name:tests), "images" expanded.
REQ=()
[ $# -eq 0 ] && set -- "${ALL[@]}"
for spec in "$@"; do
    name="${spec%%:*}"
    if [ "$name" = images ]; then
        for s in "${ALL[@]}"; do [[ "$s" == images_* ]] && REQ+=("$s"); done
        continue
    fi
    [ -n "${BIN[$name]:-}" ] || { echo "error: unknown suite '$name'" >&2; usage; }
    REQ+=("$spec")
done

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# The loader of both sides sees one vendor file: PoCL natively, and the server drives PoCL.
ICD_DIR="$OUT/icd"
rm -rf "$ICD_DIR" && mkdir -p "$ICD_DIR" && cp "$POCL_ICD" "$ICD_DIR/"
export OCL_ICD_VENDORS="$ICD_DIR" OPENCL_VENDOR_PATH="$ICD_DIR"
if [ "${CTS_ICD_BY_FILE:-0}" = 1 ]; then
    OCL_ICD_FILENAMES="$(head -n 1 "$POCL_ICD" | tr -d '[:space:]')"
    export OCL_ICD_FILENAMES
fi
export WORMHOLE_SOCKET="$OUT/wh.sock"
# PoCL keeps the kernels it compiled (its own cache, shared by default): one per side, so the
# side that runs second does not find the first side's kernels compiled (timings), kept
# between runs of this script.
mkdir -p "$OUT/pocl-cache/native" "$OUT/pocl-cache/wormhole"
SERVER_LOG="$OUT/server.log"
: >"$SERVER_LOG"
SERVER_PID=""

start_server() {
    rm -f "$WORMHOLE_SOCKET"
    # A fresh program cache per run: an earlier run's binaries must not answer for this one.
    rm -rf "$OUT/program-cache"
    POCL_CACHE_DIR="$OUT/pocl-cache/wormhole" \
        "$WH" serve --program-cache "$OUT/program-cache" "${SERVE_ARGS[@]}" >>"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 300); do
        [ -S "$WORMHOLE_SOCKET" ] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "error: wh serve did not start (see $SERVER_LOG)" >&2
    exit 2
}
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# run_side SIDE SUITE_DIR LIMIT COMMAND...: runs COMMAND and the suite's tests in the binary's
# directory (the compiler and spirv_new suites find their inputs there) with a limit; a run
# past it is killed (its process group, TERM then KILL) and recorded as rc 124 or 137. When a
# run ends by a timeout or a signal, the tests it had not started run in a further part
# (SIDE.p2.*, up to MAX_PARTS), so that one hang or crash does not hide the tests after it;
# all parts of a side share a budget of three limits.
MAX_PARTS=4
run_side() {
    local side="$1" sd="$2" limit="$3"
    shift 3
    local part=1 rc t0 t1 p next left
    local -a tests
    cp "$sd/tests.txt" "$sd/$side.p1.tests"
    t0=$(date +%s)
    while :; do
        p="$sd/$side.p$part"
        mapfile -t tests <"$p.tests"
        left=$((3 * limit - ($(date +%s) - t0)))
        [ "$left" -lt "$limit" ] || left="$limit"
        (
            cd "$(dirname "$BINARY")" &&
                CL_CONFORMANCE_RESULTS_FILENAME="$p.json" \
                    timeout -k 15 "$left" stdbuf -oL -eL "$@" "${tests[@]}"
        ) >"$p.log" 2>&1 </dev/null
        rc=$?
        echo "$rc" >"$p.rc"
        { [ "$rc" -eq 124 ] || [ "$rc" -gt 128 ]; } && [ "$part" -lt "$MAX_PARTS" ] || break
        [ $((3 * limit - ($(date +%s) - t0))) -ge 60 ] || break
        # The harness announces each test as "NAME..." before running it.
        sed 's/$/.../' "$p.tests" >"$p.announced"
        grep -xF -f "$p.announced" "$p.log" | sed 's/\.\.\.$//' >"$p.started"
        rm -f "$p.announced"
        [ -s "$p.started" ] || break
        next="$sd/$side.p$((part + 1)).tests"
        grep -vxF -f "$p.started" "$p.tests" >"$next"
        [ -s "$next" ] || { rm -f "$next"; break; }
        echo "   $side: $(sed -n '$p' "$p.started") ended by $rc; running the $(wc -l <"$next") tests after it"
        part=$((part + 1))
    done
    echo "$part" >"$sd/$side.parts"
    t1=$(date +%s)
    echo $((t1 - t0)) >"$sd/$side.secs"
}

SUITE_DIRS=()
for spec in "${REQ[@]}"; do
    name="${spec%%:*}"
    BINARY="$CTS/${BIN[$name]}"
    sd="$OUT/$name"
    rm -rf "$sd" && mkdir -p "$sd"
    SUITE_DIRS+=("$sd")
    echo "$name" >"$sd/name"
    if [ ! -x "$BINARY" ]; then
        echo "== $name: $BINARY missing (not built?)"
        echo "missing" >"$sd/status"
        continue
    fi
    # The selected tests, named explicitly so that the log tells which one ran when a side
    # crashed or timed out. The harness lists its tests without touching a device.
    "$BINARY" --list 2>/dev/null | sed -n 's/^\t\(.*\)$/\1/p' >"$sd/all-tests.txt"
    if [ "$spec" != "$name" ]; then
        tr ',' '\n' <<<"${spec#*:}" | sed '/^$/d' >"$sd/tests.txt"
    else
        left_out="${EXCL[$name]}"
        [ "${CTS_FULL:-0}" = 1 ] || left_out="${left_out:+$left_out|}${SLOW[$name]}"
        left_out="${left_out%|}"
        if [ -n "$left_out" ]; then
            grep -xE "$left_out" "$sd/all-tests.txt" >"$sd/excluded.txt"
            grep -vxE "$left_out" "$sd/all-tests.txt" >"$sd/tests.txt"
        else
            : >"$sd/excluded.txt"
            cp "$sd/all-tests.txt" "$sd/tests.txt"
        fi
    fi
    if [ ! -s "$sd/tests.txt" ]; then
        echo "== $name: no tests selected (\`${BIN[$name]} --list\` listed none?)"
        echo "no tests listed" >"$sd/status"
        continue
    fi
    mapfile -t tests <"$sd/tests.txt"
    read -r -a extra <<<"${ARGS[$name]}"
    echo "== $name (${#tests[@]} tests$([ -s "$sd/excluded.txt" ] && echo ", $(wc -l <"$sd/excluded.txt") left out: $(paste -sd' ' "$sd/excluded.txt")"), limit ${TMO[$name]} s per run)"

    POCL_CACHE_DIR="$OUT/pocl-cache/native" run_side native "$sd" "${TMO[$name]}" "$BINARY" "${extra[@]}"
    echo "   native:   rc $(cat "$sd"/native.p*.rc | paste -sd+), $(cat "$sd/native.secs") s"

    if [ -z "$SERVER_PID" ] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
        [ -n "$SERVER_PID" ] && echo "   (the server had exited: restarted; see $SERVER_LOG)"
        start_server
    fi
    offset=$(stat -c %s "$SERVER_LOG")
    run_side wormhole "$sd" "${TMO[$name]}" env "${CLIENT_ENV[@]}" "$WH" run -- "$BINARY" "${extra[@]}"
    echo "   wormhole: rc $(cat "$sd"/wormhole.p*.rc | paste -sd+), $(cat "$sd/wormhole.secs") s"
    sleep 0.5 # the worker's last lines
    tail -c +"$((offset + 1))" "$SERVER_LOG" >"$sd/server.log"
    kill -0 "$SERVER_PID" 2>/dev/null || echo "server-died" >"$sd/status"
done

python3 - "$OUT" "${SUITE_DIRS[@]}" <<'EOF'
import json, os, re, signal, sys

out, dirs = sys.argv[1], sys.argv[2:]

def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default

def status_of(rc):
    """The side's exit as a word: exit N, TIMEOUT, or the signal that ended it."""
    if rc is None:
        return "not run"
    if rc in (124, 137):
        return "TIMEOUT"
    if rc > 128:
        try:
            return signal.Signals(rc - 128).name
        except ValueError:
            return f"signal {rc - 128}"
    return f"exit {rc}"

def part_outcomes(p, tests):
    """Per test of one run (part): pass, fail, skip, TIMEOUT, CRASH(...), or NOTRUN."""
    rc_text = read(f"{p}.rc").strip()
    rc = int(rc_text) if rc_text else None
    # The harness writes its JSON (CL_CONFORMANCE_RESULTS_FILENAME) once all tests ran; it
    # also has the final word when a test passed but its queue's clFinish then failed.
    try:
        res = dict(json.loads(read(f"{p}.json"))["results"])
    except (ValueError, KeyError, TypeError):
        res = {}
    # Without it (a crash, a timeout), the log: "NAME..." starts a test and the harness's
    # own lines end it; names are matched exactly, so kernel output cannot pass for them.
    started = []
    if len(res) < len(tests):
        names = set(tests)
        ends = [
            (re.compile(r"^(\S+) passed$"), "pass"),
            (re.compile(r"^(\S+) FAILED$"), "fail"),
            (re.compile(r"^(\S+) test not supported$"), "skip"),
            (re.compile(r"^(\S+) test currently not implemented$"), "skip"),
            (re.compile(r"^(\S+) skipped \(requires"), "skip"),
            (re.compile(r"^Subtest (\S+) tests is not supported"), "skip"),
        ]
        from_log = {}
        for line in read(f"{p}.log").splitlines():
            line = line.rstrip("\r")
            if line.endswith("...") and line[:-3] in names:
                started.append(line[:-3])
                continue
            for rx, word in ends:
                m = rx.match(line)
                if m and m.group(1) in names:
                    from_log[m.group(1)] = word
        for t, word in from_log.items():
            res.setdefault(t, word)
    st = status_of(rc)
    last = started[-1] if started else None
    for t in tests:
        if t in res:
            continue
        if t == last and rc is not None and rc != 0:
            res[t] = "TIMEOUT" if st == "TIMEOUT" else f"CRASH({st})"
        else:
            res[t] = "NOTRUN"
    return res, st

def outcomes(sd, side, tests):
    """Per test over all parts of a side (a later part ran what an earlier one did not)."""
    res = {t: "NOTRUN" for t in tests}
    statuses = []
    parts = int(read(f"{sd}/{side}.parts", "0").strip() or 0)
    for k in range(1, parts + 1):
        p = f"{sd}/{side}.p{k}"
        part_tests = [t for t in read(f"{p}.tests").splitlines() if t]
        r, st = part_outcomes(p, part_tests)
        res.update({t: r[t] for t in part_tests if t in res})
        statuses.append(st)
    return res, "+".join(statuses) or "not run"

rows, diffs, notes = [], [], []
for sd in dirs:
    name = read(f"{sd}/name").strip()
    status = read(f"{sd}/status").strip()
    tests = [t for t in read(f"{sd}/tests.txt").splitlines() if t]
    if status in ("missing", "no tests listed"):
        rows.append((name, "binary missing" if status == "missing" else status,
                     "", "", "", "", "", "", ""))
        continue
    n, nst = outcomes(sd, "native", tests)
    w, wst = outcomes(sd, "wormhole", tests)
    if status == "server-died":
        wst += ", server died"
    total = len(tests)
    def summary(res):
        p = sum(1 for t in tests if res[t] == "pass")
        s = sum(1 for t in tests if res[t] == "skip")
        return f"{p}/{total}", str(s)
    left_out = [t for t in read(f"{sd}/excluded.txt").splitlines() if t]
    shown = name
    if left_out:
        shown += " *"
        notes.append(f"* {name}: {len(left_out)} tests left out ({sd}/excluded.txt)")
    np_, ns = summary(n)
    wp, ws = summary(w)
    rows.append((shown, np_, ns, nst, read(f"{sd}/native.secs").strip(),
                 wp, ws, wst, read(f"{sd}/wormhole.secs").strip()))
    # A driver that crashes natively crashes the worker through Wormhole, and the harness
    # then ends the application itself (the signal differs: SIGSEGV natively, the harness's
    # SIGABRT here): the same outcome, said in a note rather than counted as a difference.
    def crashed(a, b):
        return a.startswith("CRASH") and b.startswith("CRASH")
    suite_diffs = [(f"{name}/{t}", n[t], w[t]) for t in tests if n[t] != w[t] and not crashed(n[t], w[t])]
    notes += [f"  {name}/{t} crashed both ways: {n[t]} natively, {w[t]} through Wormhole"
              for t in tests if n[t] != w[t] and crashed(n[t], w[t])]
    if not suite_diffs and nst != wst and not any(n[t] != w[t] for t in tests):
        suite_diffs.append((f"{name} (the process)", nst, wst))
    diffs += suite_diffs

hdr = ("suite", "native", "skip", "exit", "s", "wormhole", "skip", "exit", "s")
widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
def fmt(r):
    return "  ".join(str(c).ljust(widths[i]) if i in (0, 3, 7) else str(c).rjust(widths[i])
                     for i, c in enumerate(r)).rstrip()
lines = [fmt(hdr), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in rows] + notes
lines.append("")
if diffs:
    lines.append(f"{len(diffs)} differences (test: native -> wormhole):")
    tw = max(len(d[0]) for d in diffs)
    lines += [f"  {t.ljust(tw)}  {a} -> {b}" for t, a, b in diffs]
else:
    lines.append("no differences")
text = "\n".join(lines)
print(text)
with open(f"{out}/summary.txt", "w") as f:
    f.write(text + "\n")
sys.exit(1 if diffs else 0)
EOF
