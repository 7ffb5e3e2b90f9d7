"""Tenants made and removed while the server runs (`wh tenant add|remove`): a minted token is
its tenant's identity with exactly the limits asked for, tenants outlive a restart, and removal
revokes the token and ends the tenant's sessions with a clear error."""

import json
import os
import pathlib
import shutil
import tempfile
import stat
import subprocess
import time

import pytest
import wire
from conftest import WH, Server, wait_for

CL_SUCCESS = wire.CL["CL_SUCCESS"]
CL_OUT_OF_RESOURCES = wire.CL["CL_OUT_OF_RESOURCES"]
CL_MEM_OBJECT_ALLOCATION_FAILURE = wire.CL["CL_MEM_OBJECT_ALLOCATION_FAILURE"]


def statuses(out):
    return [int(line.split()[1]) for line in out.strip().splitlines()]


def test_added_tenant_gets_its_quota_and_outlives_a_restart(tmp_path, c_programs):
    s = Server(tmp_path, tcp=True).start()
    try:
        added = s.tenant("add", "job-1", "--mem-quota-mib", "64", "--max-sessions", "1")
        token = added["token"]
        assert added["tenant"]["name"] == "job-1" and added["tenant"]["added_at_run_time"]
        assert added["tenant"]["mem_quota_mib"] == 64
        # The secret is not in the server's state file, only its digest.
        state = (tmp_path / "state" / "tenants.json").read_text()
        assert token not in state and "job-1" in state
        assert stat.S_IMODE(os.stat(tmp_path / "state" / "tenants.json").st_mode) == 0o600
        # Over TCP and locally alike, the token is the tenant, with exactly its quota.
        for server in ("", None):
            env = {"WORMHOLE_TOKEN": token}
            if server is not None:
                env["WORMHOLE_SERVER"] = server
            r = s.run([c_programs["alloc"], "32", "16", "32"], **env)
            assert r.returncode == 0, r.stderr
            assert statuses(r.stdout) == [CL_SUCCESS, CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE]
        # Its session limit holds too.
        holder = s.popen([c_programs["alloc"], "hold", "8"], WORMHOLE_TOKEN=token, WORMHOLE_SERVER="")
        assert holder.stdout.readline().split() == ["8", "0"]
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token, WORMHOLE_SERVER="")
        assert r.returncode != 0 and "limit of 1 sessions" in r.stderr
        holder.communicate("\n", timeout=30)
        # A name taken, a bad name, and the wrong token are refused with reasons.
        r = s.tenant("add", "job-1", check=False)
        assert r.returncode != 0 and "exists already" in r.stderr
        r = s.tenant("add", "../etc", check=False)
        assert r.returncode != 0 and "tenant name" in r.stderr
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token + "x")
        assert r.returncode != 0 and "unknown token" in r.stderr

        s.stop()
        s.start()
        listed = {t["name"]: t for t in s.tenant("list")["tenants"]}
        assert listed["job-1"]["mem_quota_mib"] == 64 and listed["job-1"]["added_at_run_time"]
        assert not listed["default"]["added_at_run_time"]
        r = s.run([c_programs["alloc"], "32", "16", "32"], WORMHOLE_TOKEN=token)
        assert r.returncode == 0, r.stderr
        assert statuses(r.stdout) == [CL_SUCCESS, CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE]
    finally:
        s.stop()


def test_removal_revokes_the_token_and_ends_its_sessions(tmp_path, c_programs):
    s = Server(tmp_path, tcp=True).start()
    try:
        token_file = tmp_path / "job.token"
        added = s.tenant("add", "job-2", "--mem-quota-mib", "32", "--token-file", str(token_file))
        assert "written to" in added["token"]
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = token_file.read_text().strip()
        other = s.tenant("add", "job-3")["token"]
        # One session over shared memory, one over TCP, and one of another tenant.
        local = s.popen([c_programs["alloc"], "hold-call", "16"], WORMHOLE_TOKEN=token, WORMHOLE_SERVER="")
        remote = s.popen([c_programs["alloc"], "hold-call", "16"], WORMHOLE_TOKEN=token)
        bystander = s.popen([c_programs["alloc"], "hold-call", "16"], WORMHOLE_TOKEN=other, WORMHOLE_SERVER="")
        for p in (local, remote, bystander):
            assert p.stdout.readline().split() == ["16", "0"]
        wait_for(lambda: {t["name"]: t["mem_bytes"] for t in s.status()["tenants"]}.get("job-2") == 32 << 20)

        removed = s.tenant("remove", "job-2")
        assert removed == {"name": "job-2", "sessions_ended": 2}
        started = time.monotonic()
        for p in (local, remote):
            out, err = p.communicate("\n", timeout=30)
            assert out.split() == ["after", str(CL_OUT_OF_RESOURCES)], (out, err)
            assert "tenant job-2 was removed" in err
        assert time.monotonic() - started < 5
        out, err = bystander.communicate("\n", timeout=30)
        assert out.split() == ["after", str(CL_SUCCESS)], err

        # The token is refused from now on, and the tenant and its memory are gone.
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token)
        assert r.returncode != 0 and "unknown token" in r.stderr
        assert "job-2" not in [t["name"] for t in s.status()["tenants"]]
        assert "job-2" not in [t["name"] for t in s.tenant("list")["tenants"]]
        r = s.tenant("remove", "job-2", check=False)
        assert r.returncode != 0 and "no tenant named" in r.stderr
        # Configured tenants are the file's to remove.
        r = s.tenant("remove", "default", check=False)
        assert r.returncode != 0 and "configuration file" in r.stderr
        # A removed name can be given again, to a new token.
        again = s.tenant("add", "job-2")["token"]
        assert again != token

        s.stop()
        s.start()
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token)
        assert r.returncode != 0 and "unknown token" in r.stderr
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=again)
        assert r.returncode == 0 and statuses(r.stdout) == [CL_SUCCESS], r.stderr
    finally:
        s.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="asking as another user needs root")
def test_only_the_servers_user_may_manage_tenants():
    # A directory another user can reach (pytest's tmp_path is under a 0700 one), with wh.
    shared = pathlib.Path(tempfile.mkdtemp(prefix="wh-test-"))
    shared.chmod(0o755)
    shutil.copy(WH, shared)
    s = Server(shared).start()
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(shared / "wh"), "tenant", "add", "intruder", "--socket", s.socket],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode != 0 and "only root or the server's own user" in r.stderr
        assert "intruder" not in [t["name"] for t in s.tenant("list")["tenants"]]
    finally:
        s.stop()
        shutil.rmtree(shared, ignore_errors=True)


def test_second_server_on_a_state_directory_serves_without_run_time_tenants(tmp_path, c_programs):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Server(tmp_path / "a", state_dir=tmp_path / "state").start()
    second = Server(tmp_path / "b", state_dir=tmp_path / "state").start()
    try:
        r = second.tenant("add", "x", check=False)
        assert r.returncode != 0 and "in use by another server" in r.stderr
        assert first.tenant("add", "x")["token"]
        r = second.run([c_programs["alloc"], "8"])
        assert r.returncode == 0, r.stderr
    finally:
        second.stop()
        first.stop()


def test_unreadable_state_stops_the_server_rather_than_overwriting_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "tenants.json").write_text("{not json")
    s = Server(tmp_path)
    with pytest.raises(AssertionError):
        s.start()
    assert "tenants.json" in s.log.read_text()
    assert (state / "tenants.json").read_text() == "{not json"
    s.stop()


def test_a_tenant_per_job_leaves_nothing_behind(tmp_path, c_programs):
    """A server that makes and removes a tenant per job (Slurm) does not grow: a removed
    tenant's place, ledger and descriptors go to the next one."""
    s = Server(tmp_path).start()
    try:
        fds = lambda: len(os.listdir(f"/proc/{s.proc.pid}/fd"))
        counts = []
        for i in range(24):
            token = s.tenant("add", f"job-{i}", "--mem-quota-mib", "16")["token"]
            r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token)
            assert r.returncode == 0 and statuses(r.stdout) == [CL_SUCCESS], r.stderr
            s.tenant("remove", f"job-{i}")
            counts.append(fds())
        # Descriptors come and go with sessions and standby workers; kept ledgers would add
        # one per tenant (20 more by the end).
        assert max(counts[-4:]) <= max(counts[:4]) + 4, counts
        assert [t["name"] for t in s.tenant("list")["tenants"]] == ["default"]
    finally:
        s.stop()


def test_devices_are_listed_and_a_token_file_identifies_the_tenant(tmp_path, c_programs):
    s = Server(tmp_path, tcp=True).start()
    try:
        # What a cluster integration publishes: every device, its memory, where to connect.
        r = subprocess.run([str(WH), "devices", "--socket", s.socket], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        inv = json.loads(r.stdout)
        assert inv["socket"] == s.socket and inv["tcp"] == s.tcp and inv["tls"] is False
        apis = {a["api"]: a for a in inv["apis"]}
        api = apis["opencl"]
        assert "error" not in api
        # CUDA: this machine has no NVIDIA driver, and the inventory says so instead of failing.
        assert apis["cuda"]["devices"] or (
            "error" not in apis["cuda"] and "no libcuda.so.1" in apis["cuda"]["not_installed"])
        assert api["devices"] and all(d["memory_bytes"] > 0 and d["name"] for d in api["devices"])
        assert api["devices"][0]["kind"] == "cpu" and "OpenCL" in api["devices"][0]["version"]

        token = s.tenant("add", "job-f", "--mem-quota-mib", "48")["token"]
        f = tmp_path / "token"
        f.write_text(token + "\n")
        r = s.run([c_programs["alloc"], "32", "32"], WORMHOLE_TOKEN_FILE=str(f), WORMHOLE_SERVER="")
        assert r.returncode == 0, r.stderr
        assert statuses(r.stdout) == [CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE]
        # A token file that cannot be read is an error saying so, not an anonymous session.
        r = s.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN_FILE=str(tmp_path / "missing"), WORMHOLE_SERVER="")
        assert r.returncode != 0 and "WORMHOLE_TOKEN_FILE" in r.stderr and "cannot read the token" in r.stderr
    finally:
        s.stop()


def test_admin_socket_and_tokens_only_keep_a_shared_socket_to_sessions_with_tokens(tmp_path, c_programs):
    # As deployed for containers: the session socket is handed out, so neither a peer's uid
    # (a container's root is uid 0) nor the socket itself may administer or identify anyone.
    admin = tmp_path / "admin.sock"
    cfg = tmp_path / "server.toml"
    cfg.write_text(f'admin_socket = "{admin}"\ntokens_only = true\n')
    s = Server(tmp_path, config=cfg).start()
    try:
        assert stat.S_IMODE(os.stat(admin).st_mode) == 0o600
        r = s.tenant("list", check=False)
        assert r.returncode != 0 and "admin socket only" in r.stderr
        r = s.run([c_programs["alloc"], "8"])
        assert r.returncode != 0 and "token only" in r.stderr
        added = subprocess.run([str(WH), "tenant", "add", "pod-1", "--mem-quota-mib", "16", "--socket", str(admin)],
                               capture_output=True, text=True, timeout=10)
        assert added.returncode == 0, added.stderr
        token = json.loads(added.stdout)["token"]
        r = s.run([c_programs["alloc"], "8", "16"], WORMHOLE_TOKEN=token)
        assert r.returncode == 0, r.stderr
        assert statuses(r.stdout) == [CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE]
        # Everyone may still ask what the server is and offers; the admin socket serves no sessions.
        assert s.status()["tenants"]
        r = subprocess.run([str(WH), "run", "--", c_programs["alloc"], "8"], capture_output=True, text=True,
                           timeout=60, env=s.env(WORMHOLE_SOCKET=str(admin), WORMHOLE_TOKEN=token))
        assert r.returncode != 0 and "serves no sessions" in r.stderr
    finally:
        s.stop()
