"""Unmodified C programs give the same results through Wormhole as natively."""

import pathlib
import re
import subprocess

import pytest

from conftest import Server

PROGRAMS = [
    "vector_add", "multithread", "callbacks", "gated_callbacks", "errors", "svm", "svm_fine", "bulk", "windows",
    "host_ptr_maps", "empty_source_part", "long_kernel_name", "big_image", "bad_ranges",
    "bad_rect_ranges", "bad_sizes", "finish_waits", "cross_thread_order", "gated_write",
    "nonblocking_transfers", "immutable_info", "kernel_per_call", "released_event_callback",
    "buffer_commands", "unsynced_host_ptr_map", "svm_migrate_host", "thread_churn",
    "order_after_reply", "crossed_releases", "pipelined_transfers",
]


@pytest.mark.parametrize("name", PROGRAMS)
def test_native_baseline(c_programs, name):
    r = subprocess.run([c_programs[name]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", PROGRAMS)
def test_through_wormhole(any_server, c_programs, name):
    # STRICT=1: also the checks the spec requires that PoCL itself skips (wrong-kind handles,
    # an empty dispatch slot), which Wormhole answers with the proper error.
    r = any_server.run([c_programs[name]], STRICT="1")
    assert r.returncode == 0, r.stdout + r.stderr
    if name == "vector_add":
        assert "Wormhole \u2192" in r.stdout
        assert "OK, checksum 1649265868800" in r.stdout


def test_crossed_releases_leave_no_object_behind(any_server, c_programs):
    """Two threads' releases of one event, crossed on their way (crossed_releases.c): none is
    refused, and once the program has released everything the session holds nothing of its
    own (no event of 2000 rounds left), only the platform and device the server exported."""
    p = any_server.popen([c_programs["crossed_releases"], "2000", "hold"])
    try:
        line = p.stdout.readline()
        assert line.startswith("crossed releases: 2000 rounds"), line + p.stderr.read()
        (s,) = any_server.status()["sessions"]
        assert set(s["detail"]["objects"]) <= {"Platform", "Device"}, s["detail"]["objects"]
    finally:
        out, err = p.communicate("go\n", timeout=30)
    assert p.returncode == 0, out + err


def test_a_device_queue_the_device_lacks_is_refused(any_server, c_programs):
    """PoCL 3.1 aborts on a device-side queue (Boost.Compute's tests ask for one), so this
    runs through Wormhole only: the worker answers CL_INVALID_QUEUE_PROPERTIES and the
    session carries on."""
    r = any_server.run([c_programs["device_queue"]])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "refused\nok\n"


def test_finish_answers_as_native(any_server, c_programs):
    """clFinish, answered from the driver's completion callback over shared memory, waits
    for work gated on another thread's user event and gives the driver's own status where a
    command before it failed (PoCL never calls that marker back: the worker's watch answers)."""
    native = subprocess.run([c_programs["finish_waits"]], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    r = any_server.run([c_programs["finish_waits"]])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == native.stdout


def test_the_trace_shows_each_call_request_and_status(any_server, c_programs, tmp_path):
    """WORMHOLE_TRACE: each entry point the program called through the ICD and what it
    returned, and within it each request carried, waited for with the reply's status or
    pipelined, whatever the transport; a refusal's status as the server answered it."""
    trace = tmp_path / "opencl.trace"
    r = any_server.run([c_programs["vector_add"]], WORMHOLE_TRACE=str(trace))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = trace.read_text().splitlines()
    assert lines[0].endswith(f": {c_programs['vector_add']}"), lines[0]
    events = [l.split(" ", 3)[3] for l in lines[1:]]
    shapes = (r"> cl\w+", r"< cl\w+ = (-?\d+|0x[0-9a-f]+) \(\d+ µs\)",
              r"(  )?request [\w ]+: (waited, status -?\d+ \(\d+ µs\)|pipelined)")
    assert all(any(re.fullmatch(p, e) for p in shapes) for e in events), events
    build = events.index("> clBuildProgram")
    assert re.match(r"  request clBuildProgram: waited, status 0 ", events[build + 1]), events[build:build + 3]
    assert re.match(r"< clBuildProgram = 0 ", events[build + 2]), events[build:build + 3]
    assert "  request clReleaseKernel: pipelined" in events, events
    # A second run appends to the same file, with its own header.
    r = any_server.run([c_programs["errors"]], WORMHOLE_TRACE=str(trace))
    assert r.returncode == 0, r.stdout + r.stderr
    errors_run = trace.read_text().split(f": {c_programs['errors']}\n", 1)[1]
    # The server's refusals, with their statuses (CL_INVALID_VALUE and the like), and the
    # client's own (user data without a callback: CL_INVALID_VALUE, no request).
    assert re.search(r"request \w+: waited, status -\d+ ", errors_run), errors_run[-3000:]
    assert re.search(r"\n[^\n]* opencl > clBuildProgram\n[^\n]* opencl < clBuildProgram = -30 ", errors_run), \
        errors_run[-3000:]


def test_repeated_sessions_are_independent(server, c_programs):
    for _ in range(3):
        r = server.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("transport", ["tcp", "ivshmem"])
def test_threads_that_ended_leave_their_lane_to_new_ones(tmp_path, c_programs, transport):
    """40 threads one after another, then two at once: a lane each while they live, given back
    when they end, so the worker serves three lanes (the main thread's and the two live at
    once), not one per thread ever started (before: all 15). Over TCP and guest regions the
    worker starts a lane's thread when the lane is first used: its threads tell."""
    s = Server(tmp_path, tcp=transport == "tcp", guest=transport == "ivshmem").start()
    try:
        p = s.popen([c_programs["thread_churn"], "hold"])
        try:
            assert p.stdout.readline().strip() == "threads OK", p.stderr.read()
            worker = s.status()["sessions"][0]["detail"]["pid"]
            names = [pathlib.Path(t, "comm").read_text().strip()
                     for t in pathlib.Path(f"/proc/{worker}/task").iterdir()]
            # Threads the driver starts from a lane's thread inherit its name: count names.
            lanes = sorted({n for n in names if n.startswith("lane-")})
            assert lanes == ["lane-0", "lane-1", "lane-2"], str(names)
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        s.stop()


def test_large_buffers_are_copied_by_the_client_itself(server, c_programs):
    """Over shared memory, large buffers of PoCL's CPU device live in the session's arena:
    blocking transfers are the client's own copies (counted by the worker as direct), and the
    arena's bytes are reported. Small buffers keep driver storage."""
    p = server.popen([c_programs["windows"], "hold"])
    try:
        assert p.stdout.readline().strip() == "windows OK", p.stderr.read()
        detail = server.status()["sessions"][0]["detail"]
        assert detail["direct_transfers"] >= 80
        # src, dst and plain, 16 MiB each, are what the program still holds.
        assert detail["shared_mem_bytes"] == 3 * (16 << 20)
        assert detail["mem_bytes"] == 3 * (16 << 20)
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0


def test_non_blocking_transfers_on_an_idle_queue_are_copied_by_the_client(server, c_programs):
    """A non-blocking read or write of a buffer in the arena whose queue is idle (finished, and
    nothing enqueued since) is the client's own copy, as a blocking one is: not a trip through
    the rings and a staging buffer the driver copies again (18-48x slower than native at
    1-64 MiB before). Behind a running kernel it is queued as natively (the program checks the
    order)."""
    p = server.popen([c_programs["nonblocking_transfers"], "hold"])
    try:
        assert p.stdout.readline().strip() == "nonblocking transfers OK", p.stderr.read()
        detail = server.status()["sessions"][0]["detail"]
        # Per size and round: 2 blocking reads, and 3 non-blocking transfers on an idle queue.
        assert detail["direct_transfers"] >= 3 * 3 * (2 + 3), detail
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0


def test_remote_sessions_keep_driver_storage(tmp_path, c_programs):
    """Over TCP the client cannot reach the server's memory: every transfer is forwarded. A
    large blocking write goes into the driver's mapping of the buffer chunk by chunk, as its
    data arrives (the worker's reader passes it on while the lane runs the write)."""
    tcp = Server(tmp_path, tcp=True).start()
    try:
        p = tcp.popen([c_programs["windows"], "hold"])
        try:
            assert p.stdout.readline().strip() == "windows OK", p.stderr.read()
            detail = tcp.status()["sessions"][0]["detail"]
            assert detail["direct_transfers"] == 0 and detail["shared_mem_bytes"] == 0
            assert detail["streamed_writes"] > 0, detail
            assert detail["mem_bytes"] == 3 * (16 << 20)
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0
    finally:
        tcp.stop()


def test_a_streamed_write_leaves_its_queue_idle(tmp_path, c_programs):
    """Over TCP a large blocking write goes into the driver's mapping as its bytes arrive,
    past the ordinary path's bookkeeping. It counts as an enqueue there, and once it returns
    its in-order queue is idle: a small non-blocking read after it runs at once, its bytes in
    its reply (it went through a later collection before: one more round trip)."""
    tcp = Server(tmp_path, tcp=True).start()
    try:
        p = tcp.popen([c_programs["idle_after_write"], "hold"])
        try:
            assert p.stdout.readline().strip() == "idle after write OK", p.stderr.read()
            detail = tcp.status()["sessions"][0]["detail"]
            assert detail["streamed_writes"] >= 5, detail
            assert detail["at_once_transfers"] >= 5, detail
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0
    finally:
        tcp.stop()


def test_fine_grained_svm_beyond_a_frame(server, c_programs):
    """Fine-grained SVM larger than a frame's limit (1 GiB) is made coherent in batches: the
    session survives and host and device changes both arrive (was: the session was lost)."""
    floats = (1 << 28) + (8 << 20)  # 1.03 GiB
    r = server.run([c_programs["svm_fine"], str(floats)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fine-grained svm OK" in r.stdout


def test_image_transfers_beyond_a_frame(server, c_programs):
    """A 1 GiB image (CL_RGBA/CL_UNSIGNED_INT8 at PoCL's largest 2D size, the CTS's
    imagedim_pow2) written, read (blocking and not), mapped and unmapped whole, the same bytes
    through a buffer's rectangle transfers, and an image and a buffer created from them: data
    that does not fit one frame with its request or reply travels in pieces (was: the write
    failed with CL_OUT_OF_HOST_MEMORY, the read with CL_OUT_OF_RESOURCES)."""
    r = server.run([c_programs["big_image"], "16384", "16384"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    if "skipped" in r.stdout:
        pytest.skip(r.stdout.strip())
    assert "big image OK" in r.stdout


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_threads_sharing_few_lanes_never_wait_for_each_other(tmp_path, c_programs, transport):
    """With 2 lanes, finish_waits' 9 threads share them: a thread blocked in clFinish or
    clWaitForEvents on a user event holds its lane while the thread that sets the event needs
    one. A call whose lane is held takes a free one (unless its own pipelined calls must come
    first), over TCP as over shared memory, so the program ends as natively."""
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text("lanes = 2\n")
    s = Server(tmp_path, tcp=transport == "tcp", config=cfg).start()
    try:
        native = subprocess.run([c_programs["finish_waits"]], capture_output=True, text=True, timeout=120)
        assert native.returncode == 0, native.stdout + native.stderr
        r = s.run([c_programs["finish_waits"]], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout == native.stdout
    finally:
        s.stop()


def test_call_counts_say_which_calls_were_round_trips(server, c_programs):
    """WORMHOLE_CALL_COUNTS=1: at exit the client reports its calls per entry point, waited for
    and pipelined (how a framework's step is profiled); without it, nothing."""
    r = server.run([c_programs["vector_add"]], WORMHOLE_CALL_COUNTS="1")
    assert r.returncode == 0, r.stderr
    total = re.search(r"^wormhole call counts \(opencl\): waited=(\d+) pipelined=(\d+)$", r.stderr, re.M)
    assert total, r.stderr
    rows = dict((m.group(1), (int(m.group(2)), int(m.group(3)))) for m in re.finditer(
        r"^wormhole call counts:   (.+?) waited=(\d+) pipelined=(\d+)$", r.stderr, re.M))
    assert sum(w for w, _ in rows.values()) == int(total.group(1))
    assert sum(p for _, p in rows.values()) == int(total.group(2))
    # A build waits; a release is pipelined; the blocking read of a buffer in the arena is
    # the client's own copy after a DIRECT request, named as such.
    assert rows.get("clBuildProgram", (0, 0))[0] >= 1, r.stderr
    assert rows.get("clReleaseMemObject", (0, 0))[1] >= 1, r.stderr
    assert rows.get("direct transfer", (0, 0))[0] >= 1, r.stderr
    quiet = server.run([c_programs["vector_add"]])
    assert "wormhole call counts" not in quiet.stderr


def waited_calls_as_native(server, c_programs, name, *args):
    """Runs test client `name` natively and through Wormhole, which must print the same; returns
    the Wormhole run and each entry point's waited-for calls (its WORMHOLE_CALL_COUNTS report)."""
    native = subprocess.run([c_programs[name], *args], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    r = server.run([c_programs[name], *args], WORMHOLE_CALL_COUNTS="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout == native.stdout
    return r, dict((m.group(1), int(m.group(2))) for m in re.finditer(
        r"^wormhole call counts:   (.+?) waited=(\d+) pipelined=\d+$", r.stderr, re.M))


def test_info_that_never_changes_is_asked_for_once(server, c_programs):
    """A program's context, devices and source, and an event's context, queue and command type,
    never change: repeats are answered in the client, a buffer's size even the first time
    (clFFT asks its program for the context at every transform, which cost a round trip behind
    each pipelined launch). What changes (a
    reference count, an event's status, the kernels after a build, a kernel's local memory after
    its local arguments were set) is still asked for, and the output is native's."""
    r, rows = waited_calls_as_native(server, c_programs, "immutable_info", "300")
    # 300 rounds of three program queries: the first of each, the source's, the changing ones.
    assert rows["clGetProgramInfo"] < 20, r.stderr
    # Each round's event is new and asked twice: its three queries go to the server once each.
    assert rows["clGetEventInfo"] <= 3 * 300 + 10, r.stderr
    # A buffer's size is the client's to tell (300 new buffers, a sub-buffer).
    assert rows.get("clGetMemObjectInfo", 0) < 5, r.stderr


def test_a_kernel_object_per_call_is_pipelined(server, c_programs):
    """OpenCV makes a kernel object for every operation: create by name, set its arguments,
    launch, ask for a completion callback, release. What the driver accepted of one kernel of a
    program and name holds for the next (one signature until the program is built again), so
    after the first round nothing of that waits; what must be refused still is, as natively."""
    r, waited = waited_calls_as_native(server, c_programs, "kernel_per_call", "200")
    for call in ("clCreateKernel", "clSetKernelArg", "clEnqueueNDRangeKernel", "clSetEventCallback"):
        assert waited.get(call, 0) < 12, (call, r.stderr)


def test_repeated_non_blocking_writes_are_pipelined(any_server, c_programs):
    """A non-blocking write repeating the buffer and queue of one the driver accepted, in a
    range the client checks, no wait list, is sent without waiting (with its data, behind a
    busy queue's kernels); what the driver refuses (past the end, a NULL pointer, a buffer
    the host may only read) is still refused at the call, as natively. (Reads keep waiting:
    one the worker runs at once brings its bytes with the reply, which was faster than
    collecting them later, on every transport here.)"""
    r, waited = waited_calls_as_native(any_server, c_programs, "pipelined_transfers", "100")
    # 4 buffers of 100 rounds: the first of each waits, and the refused ones. Over shared
    # memory a write that finds its queue idle (or soon idle) goes the direct way instead.
    assert waited.get("clEnqueueWriteBuffer", 0) < 50, r.stderr
    pipelined = re.search(r"^wormhole call counts:   clEnqueueWriteBuffer waited=\d+ pipelined=(\d+)$",
                          r.stderr, re.M)
    assert pipelined and int(pipelined.group(1)) >= 150, r.stderr


def test_repeated_buffer_copies_and_fills_are_pipelined(server, c_programs):
    """A copy or fill on the device repeating the queue and buffers (and pattern size) of one
    the driver accepted, in a range the client checks against the sizes it knows, no wait list,
    is sent without waiting; overlaps within one buffer (or two sub-buffers of one) and ranges
    past the end are still refused at the call, as natively."""
    r, waited = waited_calls_as_native(server, c_programs, "buffer_commands", "200")
    for call in ("clEnqueueCopyBuffer", "clEnqueueFillBuffer"):
        assert waited.get(call, 0) < 10, (call, r.stderr)
