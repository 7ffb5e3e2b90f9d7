"""Calls the client pipelines (answers at once, without waiting for the server) can still fail
in the server; the failure reaches the application at its next synchronisation point on that
queue, as a status, once."""

import os

from conftest import Server


def test_a_pipelined_failure_is_reported_at_the_next_clfinish(tmp_path, c_programs):
    # A tenant that may hold 40 objects: the session's own (platform, device, context, queue,
    # program, kernel, buffer) and 30-odd events; 60 launches each keep an event.
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(f'[[tenant]]\nname = "small"\nuids = [{os.getuid()}]\nmax_objects = 40\n')
    s = Server(tmp_path, config=cfg).start()
    try:
        r = s.run([c_programs["deferred_error"], "60"], timeout=120)
        assert r.returncode == 0, r.stderr
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        # The first launch waited for the driver's verdict; the repeats were pipelined, so the
        # application saw CL_SUCCESS for each.
        assert lines["launches"] == "failed 0"
        # clFinish reports the refused events' CL_OUT_OF_HOST_MEMORY, and only once.
        assert lines["finish"] == "-6 0", r.stdout
        assert "a call the client sent without waiting failed" in s.log.read_text()
        # Under the limit nothing is reported.
        r = s.run([c_programs["deferred_error"], "10"], timeout=120)
        assert "finish 0 0" in r.stdout, r.stdout + r.stderr
    finally:
        s.stop()
