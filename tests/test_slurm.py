"""Slurm gives jobs Wormhole device memory as a GRES (`--gres=whmem:10G`): a real munged,
slurmctld and slurmd (Debian's) on this machine, with scripts/slurm's prolog, task prolog and
epilog. A job runs an OpenCL program through a token with exactly its quota; jobs that together
exceed the node's pool wait for each other; an impossible request is refused; the token is
revoked when the job ends."""

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
from conftest import ROOT, WH, Server, free_port, wait_for

DAEMONS = ["munged", "slurmctld", "slurmd", "sbatch"]
pytestmark = [
    pytest.mark.skipif(any(shutil.which(d) is None for d in DAEMONS), reason="Slurm and munge are not installed (scripts/install.sh installs them)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs jobs as their users: it needs root"),
]

CL_MEM_OBJECT_ALLOCATION_FAILURE = -4


class Slurm:
    """A one-node Slurm cluster in `d`, its node offering `pool` of the whmem GRES."""

    def __init__(self, d, server, pool="16G"):
        self.d = d
        self.host = socket.gethostname().split(".")[0]
        for sub in ["state", "spool", "log", "munge", "sock", "run", "tokens"]:
            (d / sub).mkdir()
        (d / "munge").chmod(0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # munged wants every directory above its socket searchable by all.
        (d / "sock").chmod(0o755)
        self.munge_sock = d / "sock" / "munge.sock"
        # The scripts as an operator installs them, their settings in a file of plain assignments
        # (as /etc/wormhole/slurm.env would be).
        settings = d / "slurm.env"
        settings.write_text(f'WH="{WH}"\nWORMHOLE_SOCKET="{server.socket}"\nWORMHOLE_SLURM_TOKENS="{d / "tokens"}"\n')
        for name in ["prolog", "task_prolog", "epilog"]:
            w = d / f"{name}.sh"
            w.write_text(f"#!/bin/sh\nexport WORMHOLE_SLURM_ENV={settings}\nexec {ROOT / 'scripts' / 'slurm' / (name + '.sh')}\n")
            w.chmod(0o755)
        self.conf = d / "slurm.conf"
        self.conf.write_text("\n".join([
            "ClusterName=wh",
            f"SlurmctldHost={self.host}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_sock}",
            "CredType=cred/munge",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd.pid'}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "GresTypes=whmem",
            "ReturnToService=2",
            "MpiDefault=none",
            f"Prolog={d / 'prolog.sh'}",
            f"TaskProlog={d / 'task_prolog.sh'}",
            f"Epilog={d / 'epilog.sh'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            f"NodeName={self.host} CPUs=2 RealMemory=1000 Gres=whmem:{pool} State=UNKNOWN",
            f"PartitionName=main Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        (d / "gres.conf").write_text(f"NodeName={self.host} Name=whmem Count={pool}\n")
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs = []

    def start(self):
        m = self.d / "munge"
        # Each daemon under its own name, in the foreground (Slurm 22.05 applies node GRES only
        # when its daemons run as `slurmctld` and `slurmd`).
        self.procs.append(subprocess.Popen(["munged", "-F", f"--key-file={m / 'munge.key'}", f"--socket={self.munge_sock}",
                                            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"],
                                           start_new_session=True))
        wait_for(lambda: self.munge_sock.exists())
        self.procs.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=self.env, start_new_session=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.procs.append(subprocess.Popen(["slurmd", "-D"], env=self.env, start_new_session=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout, timeout=60)
        return self

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        # A job still running (a failed test) lives on under its slurmstepd, outside the
        # daemons' process groups: end this cluster's jobs and their steps.
        for pid in os.listdir("/proc"):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
                ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                parent = open(f"/proc/{ppid}/comm").read().strip()
            except (OSError, ValueError, IndexError):
                continue
            if str(self.d) in cmd:
                for victim in [int(pid)] + ([ppid] if parent == "slurmstepd" else []):
                    try:
                        os.kill(victim, 9)
                    except OSError:
                        pass

    def run(self, argv, check=True):
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert r.returncode == 0, (argv, r.stdout, r.stderr, self.logs())
        return r

    def sbatch(self, script, *opts):
        r = self.run(["sbatch", "--parsable", "-o", str(self.d / "job-%j.out"), "-e", str(self.d / "job-%j.err"), *opts, "--wrap", script])
        return r.stdout.strip().split(";")[0]

    def state(self, job):
        r = self.run(["squeue", "-h", "-j", job, "-o", "%T %r"], check=False)
        return r.stdout.strip() or "GONE"

    def output(self, job):
        return (self.d / f"job-{job}.out").read_text()

    def logs(self):
        return "\n".join((self.d / "log" / f).read_text()[-3000:] for f in ["slurmctld.log", "slurmd.log"] if (self.d / "log" / f).exists())


@pytest.fixture
def cluster(tmp_path):
    # Outside pytest's 0700 tmp_path: munged checks the directories above its socket.
    d = pathlib.Path(tempfile.mkdtemp(prefix="wh-slurm-"))
    d.chmod(0o755)
    (tmp_path / "wh").mkdir()
    (d / "slurm").mkdir()
    # A closed server (tenants configured, none of them the jobs' user): a job is a tenant only
    # through its whmem token, so no job runs outside the quota Slurm gave it.
    cfg = tmp_path / "wormhole.toml"
    cfg.write_text('[[tenant]]\nname = "staff"\nuids = [65534]\n')
    server = Server(tmp_path / "wh", config=cfg).start()
    slurm = Slurm(d / "slurm", server)
    try:
        yield slurm.start(), server
    finally:
        slurm.stop()
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


def tenants(server):
    return {t["name"]: t for t in server.tenant("list")["tenants"]}


def test_jobs_get_their_gres_as_a_quota_that_holds(cluster, c_programs):
    slurm, server = cluster
    fifo = slurm.d / "go"
    os.mkfifo(fifo)
    # The job records its token, then allocates (11 GiB is over its 10 GiB, 1 GiB twice is
    # not) and holds its memory until the test writes a line into the fifo.
    job = slurm.sbatch(f'echo "$WORMHOLE_TOKEN" > {slurm.d}/token; {WH} run {c_programs["alloc"]} hold 11264 1024 1024 < {fifo}',
                       "--gres=whmem:10G")
    name = f"slurm-job-{job}"
    wait_for(lambda: slurm.state(job).startswith("RUNNING"), timeout=60)
    t = wait_for(lambda: tenants(server).get(name))
    assert t["mem_quota_mib"] == 10240 and t["added_at_run_time"]
    # A second 10G job does not fit beside it in the 16G pool: it waits for the first.
    second = slurm.sbatch(f"{WH} run {c_programs['alloc']} 64", "--gres=whmem:10G")
    wait_for(lambda: slurm.state(second) == "PENDING Resources", timeout=60)
    # More than the node has is refused at once.
    r = slurm.run(["sbatch", "--gres=whmem:32G", "--wrap", "true"], check=False)
    assert r.returncode != 0 and "Requested node configuration is not available" in r.stderr

    with open(fifo, "w") as go:
        # The job's session is its tenant's, with the quota, holding what it allocated.
        session = wait_for(lambda: [x["detail"] for x in server.status()["sessions"]
                                    if x["tenant"] == name and (x["detail"] or {}).get("tenant_mem_bytes") == 2 << 30], timeout=60)
        assert session[0]["mem_quota"] == 10 << 30
        assert slurm.state(second) == "PENDING Resources"
        go.write("\n")
    wait_for(lambda: slurm.state(job) == "GONE", timeout=60)
    lines = [line.split() for line in slurm.output(job).strip().splitlines()]
    assert lines == [["11264", str(CL_MEM_OBJECT_ALLOCATION_FAILURE)], ["1024", "0"], ["1024", "0"]], (lines, (slurm.d / f"job-{job}.err").read_text())
    # At the job's end its tenant is gone and its token is refused.
    token = (slurm.d / "token").read_text().strip()
    assert token.startswith("wh1_")
    wait_for(lambda: name not in tenants(server), timeout=30)
    assert not (slurm.d / "tokens" / f"{job}.token").exists()
    r = server.run([c_programs["alloc"], "8"], WORMHOLE_TOKEN=token)
    assert r.returncode != 0 and "unknown token" in r.stderr
    # The waiting job ran once the first one's memory was free, with its own tenant.
    wait_for(lambda: slurm.state(second) == "GONE", timeout=60)
    assert slurm.output(second).split() == ["64", "0"]
    wait_for(lambda: not [n for n in tenants(server) if n.startswith("slurm-job-")], timeout=30)


def test_jobs_without_whmem_get_no_tenant(cluster, c_programs):
    slurm, server = cluster
    job = slurm.sbatch(f'echo "token=[$WORMHOLE_TOKEN]"; {WH} run {c_programs["alloc"]} 8')
    wait_for(lambda: slurm.state(job) == "GONE", timeout=60)
    assert slurm.output(job).strip() == "token=[]"
    # Outside any tenant the server serves it nothing.
    assert "is not a tenant of this server" in (slurm.d / f"job-{job}.err").read_text()
    assert [n for n in tenants(server) if n.startswith("slurm-job-")] == []
