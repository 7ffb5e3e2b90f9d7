"""Wormhole under Kubernetes' Dynamic Resource Allocation, with Kubernetes' own control plane
(etcd, kube-apiserver, kube-scheduler, kube-controller-manager; tests/k8s_cluster.py):

- two `wh serve` publish their devices through `wh-dra controller` (one a node's local pool,
  one a network pool for every node), each device shareable with 1 GiB of consumable memory;
- the real scheduler places pods by the memory their claims ask for: two 600 MiB claims fit
  (one per server), a third stays pending;
- each allocated claim becomes a tenant with exactly the claimed quota, whose token reaches
  the kubelet plugin (driven through its gRPC sockets by kubelet-sim, with the kubelet's own
  messages, as no kubelet runs here) and from there a client, which gets exactly that quota;
- deleting a pod frees its claim: the tenant is removed (its token refused) and the pending
  pod is scheduled into the freed memory.
"""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest
import wire
import yaml
from conftest import ROOT, WH, Server
from k8s_cluster import BIN, CONTROLLER_TOKEN, PLUGIN_TOKEN, Cluster, missing

CL_SUCCESS = wire.CL["CL_SUCCESS"]
CL_MEM_OBJECT_ALLOCATION_FAILURE = wire.CL["CL_MEM_OBJECT_ALLOCATION_FAILURE"]
DEPLOY = ROOT / "kubernetes" / "deploy" / "wormhole-dra.yaml"
NS = "team"

if missing():
    # CI builds everything (scripts/install.sh): there a missing piece is a failure, not a skip.
    if os.environ.get("CI"):
        raise RuntimeError(f"the Kubernetes test needs {missing()}: scripts/install.sh should have built them")
    pytest.skip(f"needs {', '.join(missing())} (scripts/k8s/build.sh)", allow_module_level=True)

PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
}


@pytest.fixture(scope="module")
def cluster():
    # Not pytest's tmp_path: socket paths must stay short.
    d = pathlib.Path(tempfile.mkdtemp(prefix="whk8s-"))
    c = Cluster(d)
    try:
        c.start()
        # The operator's manifests as shipped (the DaemonSets are stored, never run: no kubelet).
        for doc in yaml.safe_load_all(DEPLOY.read_text()):
            path = PATHS[doc["kind"]].format(ns=doc["metadata"].get("namespace", ""))
            c.admin.create(path, doc)
        c.add_node("node-a")
        c.add_node("node-b")
        c.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        # Pods are admitted only once their namespace's default service account exists.
        c.wait(lambda: c.admin.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default", ok_missing=True), 60,
               "the namespace's service account")
        yield c
    finally:
        c.stop()
        # WORMHOLE_KEEP_K8S=1 keeps the components' logs for a look after a failure.
        if not os.environ.get("WORMHOLE_KEEP_K8S"):
            shutil.rmtree(d, ignore_errors=True)


def closed_server(d: pathlib.Path, tcp=False):
    """A server that knows sessions by token only, its session socket alone in its directory,
    and tenant administration on an admin socket of its own (as deployed)."""
    (d / "sock").mkdir(parents=True)
    admin = d / "admin.sock"
    cfg = d / "server.toml"
    cfg.write_text(f'admin_socket = "{admin}"\ntokens_only = true\n')
    s = Server(d, tcp=tcp, config=cfg)
    s.socket = str(d / "sock" / "wh.sock")
    s.start()
    s.admin = str(admin)
    return s


def pod(name):
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [{"name": "app", "image": "app:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
        },
    }


def claim_of(c, pod_name):
    """The pod's claim (made from the template by the controller manager), or None yet."""
    p = c.admin.get(f"/api/v1/namespaces/{NS}/pods/{pod_name}")
    for s in p.get("status", {}).get("resourceClaimStatuses", []):
        if s.get("resourceClaimName"):
            return c.admin.get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{s['resourceClaimName']}",
                               ok_missing=True)
    return None


def scheduled(c, pod_name):
    return c.admin.get(f"/api/v1/namespaces/{NS}/pods/{pod_name}")["spec"].get("nodeName")


def tenants(server):
    r = subprocess.run([str(WH), "tenant", "list", "--socket", server.admin], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return {t["name"]: t for t in json.loads(r.stdout)["tenants"] if t["name"].startswith("k8s-")}


def one(ts, uid):
    """The tenant of claim `uid` among `ts` (its name is k8s-<pool hash>-<uid>)."""
    found = [t for n, t in ts.items() if n.endswith("-" + uid)]
    assert len(found) <= 1, ts
    return found[0] if found else None


def client_env(spec_file, device_name):
    """The environment a container of the CDI device gets, with paths inside the container
    turned into the host paths mounted there (the test runs the client on the host)."""
    spec = json.loads(pathlib.Path(spec_file).read_text())
    dev = next(d for d in spec["devices"] if d["name"] == device_name)
    edits = dev["containerEdits"]
    host = {m["containerPath"]: m["hostPath"] for m in edits.get("mounts", [])}
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORMHOLE_")}
    for kv in edits["env"]:
        k, v = kv.split("=", 1)
        env[k] = host.get(v, v)
    return env, edits


def run_alloc(c_programs, env, *sizes):
    r = subprocess.run([str(WH), "run", "--", c_programs["alloc"], *map(str, sizes)],
                       env=env, capture_output=True, text=True, timeout=120)
    return r


def test_claims_are_placed_by_memory_and_become_tenants_with_that_quota(cluster, c_programs):
    c = cluster
    d = c.dir
    controller_cfg = c.kubeconfig("controller", CONTROLLER_TOKEN)
    plugin_cfg = c.kubeconfig("plugin", PLUGIN_TOKEN)
    (d / "server-a").mkdir()
    (d / "server-b").mkdir()
    a = closed_server(d / "server-a")
    b = closed_server(d / "server-b", tcp=True)
    servers = {"server-a": a, "server-b": b}
    procs = []
    try:
        # Tenant administration is refused on a session socket beside an admin socket, and a
        # local session without a token is refused whoever its uid (a container's root too).
        r = a.tenant("list", check=False)
        assert r.returncode != 0 and "admin socket only" in r.stderr
        r = a.run([c_programs["alloc"], "8"], WORMHOLE_SERVER="")
        assert r.returncode != 0 and "token only" in r.stderr
        common = ["--kubeconfig", str(controller_cfg), "--wh", str(WH), "--memory", "1Gi"]
        ctl_a = [str(BIN / "wh-dra"), "controller", "--pool", "server-a", "--socket", a.admin, "--node", "node-a", *common]
        procs.append(c.spawn("ctl-a", ctl_a))
        procs.append(c.spawn("ctl-b", [str(BIN / "wh-dra"), "controller", "--pool", "server-b", "--socket", b.admin,
                                       *common]))

        # Both pools published: shareable devices with 1 GiB of memory each.
        def slices():
            items = c.admin.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
            return items if {s["spec"]["pool"]["name"] for s in items} == set(servers) else None
        published = {s["spec"]["pool"]["name"]: s for s in c.wait(slices, 60, "the two pools' ResourceSlices")}
        for name, s in published.items():
            assert s["spec"]["driver"] == "wormhole.dev"
            dev = s["spec"]["devices"][0]
            assert dev["allowMultipleAllocations"] is True
            assert dev["capacity"]["memory"]["value"] == "1Gi"
            assert dev["attributes"]["api"]["string"] == "opencl"
        assert published["server-a"]["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
        assert published["server-b"]["spec"]["allNodes"] is True
        assert published["server-b"]["spec"]["devices"][0]["attributes"]["endpoint"]["string"] == f"tcp://{b.tcp}"

        c.admin.create(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "share", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "wormhole.dev", "capacity": {"requests": {"memory": "600Mi"}}}}]}}},
        })
        # Two 600 MiB claims fit, one per server; a third fits nowhere and waits.
        for p in ("p1", "p2"):
            c.admin.create(f"/api/v1/namespaces/{NS}/pods", pod(p))
            c.wait(lambda: scheduled(c, p), 90, f"pod {p} to be scheduled")
        c.admin.create(f"/api/v1/namespaces/{NS}/pods", pod("p3"))

        def unschedulable():
            conds = c.admin.get(f"/api/v1/namespaces/{NS}/pods/p3").get("status", {}).get("conditions", [])
            return any(x["type"] == "PodScheduled" and x["status"] == "False" for x in conds)
        c.wait(unschedulable, 60, "p3 to be found unschedulable")
        assert not scheduled(c, "p3")
        claim3 = claim_of(c, "p3")
        assert claim3 is None or not claim3.get("status", {}).get("allocation")

        claims = {p: claim_of(c, p) for p in ("p1", "p2")}
        results = {p: cl["status"]["allocation"]["devices"]["results"][0] for p, cl in claims.items()}
        assert {r["pool"] for r in results.values()} == set(servers)
        for p, r in results.items():
            assert r["consumedCapacity"]["memory"] == "600Mi"
            if r["pool"] == "server-a":
                assert scheduled(c, p) == "node-a"

        # Each claim is a tenant of the server it was given, with exactly the claimed quota.
        for p, cl in claims.items():
            server = servers[results[p]["pool"]]
            uid = cl["metadata"]["uid"]
            t = c.wait(lambda: one(tenants(server), uid), 30, f"the tenant of {p}'s claim")
            assert t["mem_quota_mib"] == 600 and t["max_sessions"] == 1 and t["added_at_run_time"]
            other = [s for s in servers.values() if s is not server][0]
            assert one(tenants(other), uid) is None
        # The grants are the driver's, not in the claims' namespace, where its users could edit them.
        grants = c.admin.get("/api/v1/namespaces/wormhole-system/secrets?labelSelector=wormhole.dev%2Fpool")["items"]
        assert {g["metadata"]["labels"]["wormhole.dev/claim-uid"] for g in grants} == {
            cl["metadata"]["uid"] for cl in claims.values()}
        assert not c.admin.get(f"/api/v1/namespaces/{NS}/secrets?labelSelector=wormhole.dev%2Fpool")["items"]

        # The kubelet's side: each node's plugin, registered and called as the kubelet does.
        plugins = {}
        for node in ("node-a", "node-b"):
            pd = d / f"plugin-{node}"
            plugins[node] = pd
            procs.append(c.spawn(f"plugin-{node}", [
                str(BIN / "wh-dra"), "kubelet-plugin", "--kubeconfig", str(plugin_cfg), "--node", node,
                "--registry-dir", str(pd / "registry"), "--plugin-dir", str(pd / "plugin"),
                "--cdi-dir", str(pd / "cdi"), "--state-dir", str(pd / "claims"),
                "--client-lib", str(ROOT / "target" / "release" / "libwormhole_opencl.so"),
                "--cuda-lib", str(ROOT / "target" / "release" / "libwormhole_cuda.so"),
                "--nvml-lib", str(ROOT / "target" / "release" / "libwormhole_nvml.so")]))

        def kubelet(node, verb, cl):
            reg = plugins[node] / "registry" / "wormhole.dev-reg.sock"
            c.wait(lambda: reg.exists(), 30, f"the plugin of {node} to register")
            m = cl["metadata"]
            r = subprocess.run([str(BIN / "kubelet-sim"), "-registration", str(reg), verb,
                                f"{m['namespace']}/{m['name']}/{m['uid']}"], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr + c.log(f"plugin-{node}")[-3000:]
            return json.loads(r.stdout)

        used = {}
        for p, cl in claims.items():
            node, uid, pool = scheduled(c, p), cl["metadata"]["uid"], results[p]["pool"]
            answer = kubelet(node, "prepare", cl)
            assert answer["versions"] and "v1.DRAPlugin" in answer["versions"]
            prepared = answer["answer"]["claims"][uid]
            assert not prepared.get("error"), prepared
            dev = prepared["devices"][0]
            assert dev["cdi_device_ids"] == [f"wormhole.dev/client={uid}-{pool}"]
            assert dev["pool_name"] == pool and dev["device_name"] == results[p]["device"]
            spec_file = plugins[node] / "cdi" / f"wormhole.dev-{uid}.json"
            env, edits = client_env(spec_file, f"{uid}-{pool}")
            mounts = {m["containerPath"] for m in edits["mounts"]}
            assert {"/etc/OpenCL/vendors/wormhole.icd", "/usr/lib/wormhole/libwormhole_opencl.so"} <= mounts
            # CUDA programs find Wormhole's libcuda.so.1 and libnvidia-ml.so.1 where they look
            # for NVIDIA's (the dynamic linker's default directory), by soname and by the
            # unversioned name; Triton is told that directory (ldconfig's cache lacks it).
            stand_ins = {m["containerPath"]: m for m in edits["mounts"] if m["containerPath"].startswith("/usr/lib/x86_64")}
            cuda, nvml = (str(ROOT / "target" / "release" / f) for f in ("libwormhole_cuda.so", "libwormhole_nvml.so"))
            assert {p: m["hostPath"] for p, m in stand_ins.items()} == {
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1": cuda, "/usr/lib/x86_64-linux-gnu/libcuda.so": cuda,
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": nvml, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so": nvml}
            assert env["TRITON_LIBCUDA_PATH"] == "/usr/lib/x86_64-linux-gnu"
            assert all("ro" in m["options"] for m in stand_ins.values())
            token_file = pathlib.Path(env["WORMHOLE_TOKEN_FILE"])
            assert oct(token_file.stat().st_mode & 0o777) == "0o444"
            if pool == "server-b":
                assert env["WORMHOLE_SERVER"] == f"tcp://{b.tcp}"
            else:
                assert env["WORMHOLE_SOCKET"] == a.socket
                # The socket's directory, read-only: the container cannot replace the socket,
                # and finds nothing there but it and the server's list of ICD vendor files.
                (sock_mount,) = [m for m in edits["mounts"] if m["containerPath"] == os.path.dirname(a.socket)]
                assert "ro" in sock_mount["options"]
                assert set(os.listdir(sock_mount["hostPath"])) == {"wh.sock", ".wormhole-server-vendors"}
            # No mount but the token's own file shows the plugin's state.
            state = str(plugins[node] / "claims")
            assert [m for m in edits["mounts"] if m["hostPath"].startswith(state)
                    and not m["hostPath"].endswith(("/token", "wormhole.icd"))] == []
            # The client gets exactly the claimed 600 MiB: 512 + 64 fit, 64 more do not.
            r = run_alloc(c_programs, env, 512, 64, 64)
            assert r.returncode == 0, r.stderr
            assert [int(x.split()[1]) for x in r.stdout.split("\n") if x] == [
                CL_SUCCESS, CL_SUCCESS, CL_MEM_OBJECT_ALLOCATION_FAILURE]
            used[p] = (node, env, spec_file)

        # A controller restarted finds its tenants in place: nothing is minted again, and the
        # tokens handed out keep working.
        before = {**tenants(a), **tenants(b)}
        c.procs["ctl-a"].terminate()
        c.procs["ctl-a"].wait(timeout=10)
        procs.append(c.spawn("ctl-a", ctl_a))
        c.wait(lambda: "Publishing the server's devices" in c.log("ctl-a"), 60, "the restarted controller")
        time.sleep(3)
        assert {**tenants(a), **tenants(b)}.keys() == before.keys()
        for p, (node, env, spec_file) in used.items():
            r = run_alloc(c_programs, env, 512)
            assert r.returncode == 0 and r.stdout.split() == ["512", "0"], r.stdout + r.stderr

        # The pod goes: its claim is freed, the tenant removed, and its token refused.
        gone = claims["p1"]
        gone_server = servers[results["p1"]["pool"]]
        c.admin.delete(f"/api/v1/namespaces/{NS}/pods/p1", {"gracePeriodSeconds": 0})
        uid1 = gone["metadata"]["uid"]
        c.wait(lambda: one(tenants(gone_server), uid1) is None, 60, "the freed claim's tenant to be removed")
        secret = f"/api/v1/namespaces/wormhole-system/secrets/wormhole-{uid1}-{results['p1']['pool']}"
        c.wait(lambda: c.admin.get(secret, ok_missing=True) is None, 60, "the freed claim's Secret to go")
        node, env, spec_file = used["p1"]
        r = run_alloc(c_programs, env, 8)
        assert r.returncode != 0 and "unknown token" in r.stderr
        # The kubelet unprepares the claim: what the plugin wrote on the node is gone.
        kubelet(node, "unprepare", gone)
        assert not spec_file.exists() and not pathlib.Path(env["WORMHOLE_TOKEN_FILE"]).exists()

        # The waiting pod now fits into the freed memory, and its claim becomes a tenant.
        c.wait(lambda: scheduled(c, "p3"), 120, "p3 to be scheduled into the freed memory")
        claim3 = c.wait(lambda: (cl := claim_of(c, "p3")) and cl.get("status", {}).get("allocation") and cl, 30,
                        "p3's claim")
        pool3 = claim3["status"]["allocation"]["devices"]["results"][0]["pool"]
        assert pool3 == results["p1"]["pool"]
        c.wait(lambda: one(tenants(servers[pool3]), claim3["metadata"]["uid"]), 30, "p3's tenant")
        # The driver did all this with the rights the shipped roles grant, no more.
        for log in ("ctl-a", "ctl-b", "plugin-node-a", "plugin-node-b"):
            assert "forbidden" not in c.log(log), c.log(log)[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        a.stop()
        b.stop()
