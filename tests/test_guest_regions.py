"""Guest regions (the ivshmem transport) from the host side: the server serves a region file,
a client maps that same file (as a VM guest maps the BAR backed by it). Sessions have no
socket, so what a socket gives for free is checked here: a client that dies ends its session,
a busy region makes the next client wait, a region nobody serves fails fast, tenants and
quotas apply, and one region never gets two servers. The real-VM test is test_vm_guest.py."""

import os
import signal
import subprocess
import time

from conftest import WH, Server, wait_for

CL_SUCCESS = 0
CL_MEM_OBJECT_ALLOCATION_FAILURE = -4


def test_killed_guest_client_ends_its_session_and_frees_its_memory(tmp_path, c_programs):
    s = Server(tmp_path, guest=True).start()
    try:
        holder = s.popen([c_programs["alloc"], "hold", "16"])
        assert holder.stdout.readline().split() == ["16", "0"]
        (sess,) = s.status()["sessions"]
        assert sess["guest_region"] == s.region
        assert sess["detail"]["mem_bytes"] == 16 << 20
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        # No socket tells the server: the client's heartbeat stops, and within a few seconds
        # the session ends, its memory is released and a fresh worker waits for the next one.
        # (The 3 s of silence, the session's end and a new worker: more than wait_for's
        # default 10 s leaves on a loaded machine.)
        wait_for(lambda: s.status()["sessions"] and s.status()["sessions"][0]["worker"] != sess["worker"], timeout=30)
        assert all(t["mem_bytes"] == 0 for t in s.status()["tenants"])
        r = s.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr
        assert "stopped its heartbeat" in s.log.read_text()
    finally:
        s.stop()


def test_second_client_waits_for_the_region(tmp_path, c_programs):
    s = Server(tmp_path, guest=True).start()
    try:
        holder = s.popen([c_programs["alloc"], "hold", "1"])
        assert holder.stdout.readline().split() == ["1", "0"]
        second = s.popen([c_programs["vector_add"]])
        time.sleep(1.0)
        assert second.poll() is None  # still waiting for the region
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(timeout=10) == 0
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert "OK, checksum 1649265868800" in out
    finally:
        s.stop()


def test_region_nobody_serves_fails_fast(tmp_path, c_programs):
    region = tmp_path / "orphan.region"
    region.write_bytes(bytes(16 << 20))
    s = Server(tmp_path)  # not started: only its run() helper is used
    env = s.env(WORMHOLE_SERVER=f"ivshmem:{region}")
    t0 = time.monotonic()
    r = subprocess.run([str(WH), "run", "--", c_programs["vector_add"]], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "-1001" in r.stderr  # CL_PLATFORM_NOT_FOUND_KHR: no platforms
    assert "no Wormhole worker serves" in r.stderr
    # 3 s of silence and two process starts; waiting out the 10 s patience, or for ever, fails.
    assert time.monotonic() - t0 < 8


def test_guest_tenant_quota_and_one_server_per_region(tmp_path, c_programs):
    region = tmp_path / "vm1.region"
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(
        f'[[tenant]]\nname = "vm1"\nmem_quota_mib = 32\n\n'
        f'[[guest]]\nregion = "{region}"\nsize_mib = 8\ntenant = "vm1"\n'
    )
    s = Server(tmp_path, config=cfg).start()
    try:
        r = s.run([c_programs["alloc"], "16", "32", "8"], WORMHOLE_SERVER=f"ivshmem:{region}")
        assert r.returncode == 0, r.stderr
        assert [int(l.split()[1]) for l in r.stdout.split("\n") if l] == [CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_SUCCESS]
        assert os.path.getsize(region) == 8 << 20
        (t,) = s.status()["tenants"]
        assert t["name"] == "vm1"
        # A second server must not reset a region the first one serves.
        other = subprocess.run(
            [str(WH), "serve", "--socket", str(tmp_path / "other.sock"), "--config", str(cfg), "--state-dir", str(tmp_path / "other-state")],
            capture_output=True, text=True, timeout=30,
        )
        assert other.returncode != 0
        assert "another Wormhole server serves this region" in other.stderr
        r = s.run([c_programs["vector_add"]], WORMHOLE_SERVER=f"ivshmem:{region}")
        assert r.returncode == 0, r.stderr
    finally:
        s.stop()


def test_two_guests_two_regions_two_workers(tmp_path, c_programs):
    r1, r2 = tmp_path / "vm1.region", tmp_path / "vm2.region"
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text(
        '[[tenant]]\nname = "vm1"\n\n[[tenant]]\nname = "vm2"\n\n'
        f'[[guest]]\nregion = "{r1}"\ntenant = "vm1"\n\n[[guest]]\nregion = "{r2}"\ntenant = "vm2"\n'
    )
    s = Server(tmp_path, config=cfg).start()
    try:
        a = s.popen([c_programs["alloc"], "hold", "4"], WORMHOLE_SERVER=f"ivshmem:{r1}")
        b = s.popen([c_programs["alloc"], "hold", "8"], WORMHOLE_SERVER=f"ivshmem:{r2}")
        for p, mib in ((a, "4"), (b, "8")):
            line = p.stdout.readline()
            assert line.split() == [mib, "0"], line + (p.stderr.read() if p.poll() is not None else "")
        st = s.status()
        by_region = {x["guest_region"]: x for x in st["sessions"]}
        assert set(by_region) == {str(r1), str(r2)}
        assert by_region[str(r1)]["tenant"] == "vm1" and by_region[str(r1)]["detail"]["mem_bytes"] == 4 << 20
        assert by_region[str(r2)]["tenant"] == "vm2" and by_region[str(r2)]["detail"]["mem_bytes"] == 8 << 20
        assert by_region[str(r1)]["worker"] != by_region[str(r2)]["worker"]
        for p in (a, b):
            p.stdin.write("done\n")
            p.stdin.flush()
            assert p.wait(timeout=10) == 0
    finally:
        s.stop()


def test_forked_child_exiting_leaves_the_session_open(tmp_path, c_programs):
    s = Server(tmp_path, guest=True).start()
    try:
        r = s.run([c_programs["fork_child"]])
        assert r.returncode == 0, r.stderr
        assert "fork OK" in r.stdout
        # Only the parent's exit closes the session.
        wait_for(lambda: "closed by the client" in s.log.read_text())
        assert s.log.read_text().count("guest session started") == 1
    finally:
        s.stop()
