#!/usr/bin/env bash
# The main job: install everything, start a Wormhole server, and run real OpenCL programs
# through it (a C vector addition, then clinfo's platform list), printing their results.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export PATH="$HOME/.cargo/bin:$PATH"

WH=target/release/wh
export WORMHOLE_SOCKET="${WORMHOLE_SOCKET:-/tmp/wormhole-demo/wormhole.sock}"
mkdir -p target/demo
gcc -O2 -o target/demo/vector_add tests/c/vector_add.c -lOpenCL

# A socket left by an earlier run (a killed server does not remove it) would pass the
# readiness check below before this server has bound its own.
rm -f "$WORMHOLE_SOCKET"
"$WH" serve --socket "$WORMHOLE_SOCKET" 2> target/demo/server.log &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -S "$WORMHOLE_SOCKET" ] && break; sleep 0.1; done

echo "== a C program, unmodified, through Wormhole (server pid $server)"
"$WH" run -- target/demo/vector_add
echo
echo "== clinfo through Wormhole"
"$WH" run -- clinfo -l
echo
echo "== the server's view (wh status) while a session is open"
"$WH" run -- .venv/bin/python -c "
import pyopencl as cl, subprocess, json, os
ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
import numpy as np
a = np.arange(16, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
prg = cl.Program(ctx, '__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2; }').build()
prg.twice(q, a.shape, None, buf)
cl.enqueue_copy(q, a, buf)
print('PyOpenCL result:', a[:8], '...')
print(subprocess.run(['$WH', 'status'], capture_output=True, text=True).stdout)
"
