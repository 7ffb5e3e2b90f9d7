"""A private Kubernetes control plane for tests: Debian's etcd and Kubernetes' own
kube-apiserver, kube-scheduler and kube-controller-manager (built by scripts/k8s/build.sh), on
loopback ports of their own, with fake Node objects for the scheduler to place pods on. No
kubelet runs (cgroup v1, no container images): pods are scheduled and their claims allocated,
never started; the kubelet's side of DRA is played by kubelet-sim."""

import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from conftest import ROOT, free_port, wait_for

BIN = ROOT / "target" / "k8s" / "bin"
COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "wh-dra", "kubelet-sim")

# Users of the static token file: the test's admin, and the DRA driver's two parts under the
# service account names the deploy manifests bind their roles to (so the test runs the driver
# with exactly the rights the manifests grant).
ADMIN_TOKEN = "wh-test-admin"
CONTROLLER_TOKEN = "wh-test-controller"
PLUGIN_TOKEN = "wh-test-plugin"
SA = "system:serviceaccount:wormhole-system"


def missing():
    """What this machine lacks to run the cluster (empty: nothing)."""
    lack = [str(BIN / c) for c in COMPONENTS if not (BIN / c).exists()]
    if not shutil.which("etcd"):
        lack.append("etcd")
    if not shutil.which("openssl"):
        lack.append("openssl")
    return lack


class Api:
    """The API server's REST interface, as one user."""

    def __init__(self, url, token):
        self.url = url
        self.token = token
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def call(self, method, path, body=None, ok_missing=False, content_type="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as r:
                raw = r.read()
                return json.loads(raw or b"null") if r.headers.get_content_type() == "application/json" else raw.decode()
        except urllib.error.HTTPError as e:
            if ok_missing and e.code == 404:
                return None
            raise AssertionError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def create(self, path, obj):
        return self.call("POST", path, obj)

    def delete(self, path, body=None):
        return self.call("DELETE", path, body, ok_missing=True)

    def patch(self, path, patch):
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")

    def patch_status(self, path, patch):
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")


class Cluster:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager under `dir`."""

    def __init__(self, dir: pathlib.Path):
        self.dir = dir
        self.procs = {}
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.admin = Api(self.url, ADMIN_TOKEN)

    def kubeconfig(self, name, token):
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
            "current-context": "test",
        }))
        return path

    def spawn(self, name, argv):
        log = open(self.dir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def log(self, name):
        p = self.dir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def start(self):
        d = self.dir
        client, peer = free_port(), free_port()
        self.spawn("etcd", [
            "etcd", "--name", "test", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{peer}",
        ])
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")], check=True, capture_output=True)
        (d / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
            f'{CONTROLLER_TOKEN},{SA}:wh-dra-controller,controller-uid,"system:serviceaccounts"\n'
            f'{PLUGIN_TOKEN},{SA}:wh-dra-plugin,plugin-uid,"system:serviceaccounts"\n')
        self.spawn("kube-apiserver", [
            str(BIN / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{client}",
            "--bind-address", "127.0.0.1", "--secure-port", str(self.port), "--cert-dir", str(d / "certs"),
            "--token-auth-file", str(d / "tokens.csv"), "--authorization-mode", "Node,RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", str(d / "sa.pub"),
            "--service-account-signing-key-file", str(d / "sa.key"), "--service-cluster-ip-range", "10.96.0.0/16",
            "--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
            "--allow-privileged=true",  # as clusters that run device plugins allow
        ])
        self.wait(lambda: self.ready(), 120, "kube-apiserver")
        admin = self.kubeconfig("admin", ADMIN_TOKEN)
        self.spawn("kube-scheduler", [str(BIN / "kube-scheduler"), "--kubeconfig", str(admin),
                                      "--authentication-kubeconfig", str(admin), "--authorization-kubeconfig", str(admin),
                                      "--leader-elect=false", "--secure-port", str(free_port()), "--bind-address", "127.0.0.1"])
        # Only what this test needs: default service accounts (pods need them to be admitted),
        # claims made from templates (and freed with their pods), and garbage collection.
        self.spawn("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), "--kubeconfig", str(admin),
            "--authentication-kubeconfig", str(admin), "--authorization-kubeconfig", str(admin),
            "--leader-elect=false", "--secure-port", str(free_port()), "--bind-address", "127.0.0.1",
            "--controllers", "serviceaccount-controller,resourceclaim-controller,garbage-collector-controller",
            "--use-service-account-credentials=false",
        ])
        return self

    def ready(self):
        try:
            self.admin.get("/readyz")
            return True
        except (AssertionError, OSError):
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited:\n{self.log(name)[-3000:]}")
            return False

    def wait(self, pred, timeout, what):
        return wait_for(pred, timeout, what, poll=0.2)

    def add_node(self, name):
        node = self.admin.create("/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        })
        # What a kubelet would report: room for pods, and ready.
        self.admin.patch_status(f"/api/v1/nodes/{name}/status", {"status": {
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}],
        }})
        # Admission taints a new node not-ready until the node lifecycle controller sees its
        # kubelet ready; there is no kubelet, so the test stands in for that controller.
        return self.admin.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    def stop(self):
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
