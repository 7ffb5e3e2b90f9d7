"""Integration-test fixtures: a real Wormhole server (its own socket per test) in front of the
real PoCL through the real ICD loader, and the C test clients built from tests/c."""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# WORMHOLE_WH lets a developer run the tests against another build (e.g. target/debug/wh).
WH = pathlib.Path(os.environ.get("WORMHOLE_WH", ROOT / "target" / "release" / "wh"))
C_DIR = ROOT / "tests" / "c"


@pytest.fixture(scope="session")
def c_programs(tmp_path_factory):
    """Every tests/c/*.c program, compiled against the system's libOpenCL."""
    out = tmp_path_factory.mktemp("cbin")
    progs = {}
    for src in sorted(C_DIR.glob("*.c")):
        exe = out / src.stem
        subprocess.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(src), "-lOpenCL", "-lpthread"], check=True)
        progs[src.stem] = str(exe)
    return progs


class Server:
    """`wh serve` on a private socket, in its own process group (workers included)."""

    def __init__(self, tmp: pathlib.Path, extra_env=None, tcp=False, config=None, metrics=False, tls=False, guest=False,
                 program_cache="own", wh=None, state_dir=None):
        self.dir = tmp
        self.wh = str(wh or WH)
        # Each server keeps built programs in a directory of its own ("own"), so no test sees
        # another's; None leaves it to the config file, False turns the cache off.
        self.program_cache = str(tmp / "programs") if program_cache == "own" else program_cache
        # A guest region (the backing file of an ivshmem device), reached here from the host
        # by mapping the file itself: the same transport a VM guest uses through the BAR.
        self.region = str(tmp / "guest.region") if guest else None
        # Tenants made at run time are kept here (never in the user's own state directory).
        self.state_dir = str(state_dir or tmp / "state")
        self.socket = str(tmp / "wh.sock")
        self.tcp = f"127.0.0.1:{free_port()}" if tcp else None
        self.log = tmp / "server.log"
        # The server's stdout (its workers' too, where they leave it): nothing of a session's
        # should land there.
        self.out = tmp / "server.out"
        self.extra_env = extra_env or {}
        self.config = config
        self.metrics = f"127.0.0.1:{free_port()}" if metrics else None
        self.tls = tls
        if tls:
            self.tcp = self.tcp or f"127.0.0.1:{free_port()}"
            subprocess.run([str(WH), "gen-cert", "--dir", str(tmp)], check=True, capture_output=True)
        self.proc = None

    def env(self, **kw):
        e = dict(os.environ)
        e.update(self.extra_env)
        e["WORMHOLE_SOCKET"] = self.socket
        if self.tcp:
            e["WORMHOLE_SERVER"] = f"{'tls' if self.tls else 'tcp'}://{self.tcp}"
        if self.region:
            e["WORMHOLE_SERVER"] = f"ivshmem:{self.region}"
        if self.tls:
            e["WORMHOLE_CA"] = str(self.dir / "cert.pem")
        e.update(kw)
        return {k: v for k, v in e.items() if v != ""}

    def start(self):
        # The socket's appearance says "ready": a killed predecessor's must not count.
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.proc = subprocess.Popen(
            [self.wh, "serve", "--socket", self.socket, "--state-dir", self.state_dir]
            + (["--tcp", self.tcp] if self.tcp else [])
            + (["--config", str(self.config)] if self.config else [])
            + (["--metrics", self.metrics] if self.metrics else [])
            + (["--guest-region", self.region] if self.region else [])
            + (["--program-cache", self.program_cache] if self.program_cache else [])
            + (["--no-program-cache"] if self.program_cache is False else [])
            + (["--tls-cert", str(self.dir / "cert.pem"), "--tls-key", str(self.dir / "key.pem")] if self.tls else []),
            stdout=open(self.out, "w"),
            stderr=open(self.log, "w"),
            env=self.env(),
            start_new_session=True,
        )
        deadline = time.time() + 10
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.time() < deadline, "server did not start"
            time.sleep(0.05)
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.keep_log()

    def keep_log(self):
        """With WH_KEEP_LOGS=DIR (scripts/gpu-test.sh sets it), the server's log is kept there
        under the test's name: on a machine lent for minutes, what failed is read later."""
        keep = os.environ.get("WH_KEEP_LOGS")
        if keep and self.log.exists():
            test = os.environ.get("PYTEST_CURRENT_TEST", "no-test").split(" ")[0]
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test.split("::", 1)[-1])[:150]
            path = pathlib.Path(keep) / f"{name}.server.log"
            n = 1
            while path.exists():
                n += 1
                path = pathlib.Path(keep) / f"{name}.{n}.server.log"
            shutil.copyfile(self.log, path)

    def cmd(self, argv):
        return [str(WH), "run", "--"] + list(argv)

    def run(self, argv, timeout=600, **kw):
        """Runs `argv` through Wormhole and returns the CompletedProcess."""
        return subprocess.run(self.cmd(argv), env=self.env(**kw), capture_output=True, text=True, timeout=timeout)

    def popen(self, argv, **kw):
        return subprocess.Popen(self.cmd(argv), env=self.env(**kw), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def status(self, details=True):
        """`wh status` as JSON. A worker has 0.5 s to send its session's detail (a stuck one
        must not stall the answer), which one on a loaded machine may miss: with `details`,
        asks again for up to 3 s until every session has one (a worker that is ending or
        stopped still has none then)."""
        deadline = time.monotonic() + 3
        while True:
            out = subprocess.run([str(WH), "status", "--socket", self.socket], capture_output=True, text=True, timeout=10, check=True)
            st = json.loads(out.stdout)
            if not details or time.monotonic() > deadline or all(x.get("detail") is not None for x in st.get("sessions", [])):
                return st
            time.sleep(0.1)

    def tenant(self, *argv, check=True):
        """`wh tenant ARGV...` against this server: its JSON answer (check) or the CompletedProcess."""
        r = subprocess.run([str(WH), "tenant", *argv, "--socket", self.socket], capture_output=True, text=True, timeout=10)
        if not check:
            return r
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def worker_pids(self):
        return sorted(s["worker"] for s in self.status()["sessions"])


def wait_for(pred, timeout=10.0, what="condition", poll=0.05):
    """Polls `pred` until it returns something true (returned), or fails after `timeout` s
    saying what it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """A server reached over the local shared-memory transport."""
    s = Server(tmp_path).start()
    yield s
    s.stop()


@pytest.fixture(params=["shm", "tcp", "ivshmem"])
def any_server(request, tmp_path):
    """The same server, reached over shared memory, over TCP (loopback) and through a guest
    region (ivshmem transport, mapped from the host)."""
    s = Server(tmp_path, tcp=request.param == "tcp", guest=request.param == "ivshmem").start()
    yield s
    s.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (scripts/gpu-test.sh runs these on the GPU machine)")
