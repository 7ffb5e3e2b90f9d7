"""A real VM guest (QEMU; TCG where KVM cannot boot a kernel) runs OpenCL programs through the
ivshmem transport against the server on the host: the guest maps the region as the BAR of an
ivshmem-plain device, the server maps its backing file. The guest runs this host's own
binaries (host root over 9p, read-only; see tests/guest.py and scripts/vm/)."""

import os
import pathlib
import shutil

import pytest
from conftest import ROOT, WH, Server
from guest import Guest, vm_missing

REGION_SIZE = 16 << 20

PYOPENCL_SCRIPT = """
import numpy as np
import pyopencl as cl
import pyopencl.array as cla

ctx = cl.create_some_context(interactive=False)
print("device:", ctx.devices[0].name)
q = cl.CommandQueue(ctx)
a = np.arange(100000, dtype=np.float32)
da = cla.to_device(q, a)
prg = cl.Program(ctx, "__kernel void twice(__global float *x) { int i = get_global_id(0); x[i] = 2 * x[i] + 1; }").build()
prg.twice(q, a.shape, None, da.data)
out = da.get()
assert np.array_equal(out, 2 * a + 1), "wrong result"
print("pyopencl in the guest: OK", float(out.sum()))
"""


@pytest.fixture(scope="module")
def vm_ready():
    missing = vm_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"guest image missing in CI: {missing} (scripts/vm/prepare.sh)")
        pytest.skip(missing)


def test_opencl_programs_in_a_vm_guest(vm_ready, tmp_path, c_programs):
    server = Server(tmp_path, tcp=True, guest=True).start()
    try:
        vm = tmp_path / "vm"
        bindir = vm / "bin"
        bindir.mkdir(parents=True)
        for name in ("vector_add", "callbacks", "multithread", "block_forever"):
            shutil.copy(c_programs[name], bindir / name)
        (vm / "twice.py").write_text(PYOPENCL_SCRIPT)
        python = ROOT / ".venv" / "bin" / "python"
        port = server.tcp.rsplit(":", 1)[1]
        script = f"""
set -e
WH={WH}
B={bindir}
export WORMHOLE_SERVER=ivshmem XDG_CACHE_HOME=/tmp/cache
echo "== vector_add"; $WH run -- $B/vector_add
echo "== callbacks"; $WH run -- $B/callbacks
echo "== multithread"; $WH run -- $B/multithread
echo "== killed client"
$WH run -- $B/block_forever > /tmp/bf.out 2>&1 &
sleep 3
kill -9 $!
wait $! || true
cat /tmp/bf.out
echo "== after the kill"; $WH run -- $B/vector_add
echo "== pyopencl"; $WH run -- {python} {vm / "twice.py"}
echo "== tcp from the same guest"; WORMHOLE_SERVER=tcp://$WH_HOST:{port} $WH run -- $B/vector_add
"""
        status, out = Guest(vm, ivshmem=[(server.region, REGION_SIZE)], net=True).run(script, timeout=900)
        log = server.log.read_text()
        assert status == 0, out + log[-3000:]
        sections = {s.split("\n", 1)[0].strip(): s for s in out.split("== ")[1:]}
        for name in ("vector_add", "after the kill", "tcp from the same guest"):
            assert "OK, checksum 1649265868800" in sections[name], out
            assert "Wormhole \u2192" in sections[name], out
        assert "callbacks and user events OK" in sections["callbacks"], out
        assert "6 threads x 50 rounds OK" in sections["multithread"], out
        assert "waiting" in sections["killed client"], out
        assert "pyopencl in the guest: OK" in sections["pyopencl"], out
        # The guest's sessions went through the region, the last one over TCP.
        assert log.count("guest session started") >= 5, log
        assert "stopped its heartbeat" in log, log
    finally:
        server.stop()
