"""The VM part of the benchmark: one QEMU guest (KVM where it works, else TCG) runs the same
benchmark client through Wormhole over ivshmem and over TCP (QEMU user networking to the
host's server), and the host counts the guest's device events (virtio kicks, interrupts,
device register accesses; QEMU trace events switched on only around the measured calls).

    python3 bench/vm_bench.py            (scripts/bench.sh runs it after `wh bench`)

Per-call event figures are (events of N calls - events of 1 call) / (N - 1): what a call costs
beyond the constant cost of the measurement's own start/stop handshake."""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import guest  # noqa: E402  (tests/guest.py: the guest runner shared with the tests)

WH = ROOT / "target" / "release" / "wh"
CLIENT = ROOT / "target" / "release" / "wh-bench-client"
REGION_SIZE = 16 << 20
CALLS = int(os.environ.get("WH_VM_CALLS", "400"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text):
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def main():
    missing = guest.vm_missing()
    if missing:
        print(f"vm bench skipped: {missing}")
        return 0
    for f in (WH, CLIENT):
        if not f.exists():
            print(f"vm bench: {f} is missing (scripts/install.sh builds it)")
            return 1
    work = pathlib.Path(tempfile.mkdtemp(prefix="wh-vmbench-"))
    try:
        port = free_port()
        region = work / "guest.region"
        sock = work / "wh.sock"
        server = subprocess.Popen(
            [str(WH), "serve", "--socket", str(sock), "--tcp", f"127.0.0.1:{port}", "--guest-region", str(region)],
            stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"), start_new_session=True)
        deadline = time.time() + 10
        while not sock.exists():
            if time.time() > deadline or server.poll() is not None:
                print("vm bench: the server did not start:", (work / "server.log").read_text())
                return 1
            time.sleep(0.05)
        vm = work / "vm"
        vm.mkdir()
        transports = {"ivshmem": "ivshmem", "tcp": f"tcp://$WH_HOST:{port}"}
        lines = ["set -e", f"WH={WH}", f"C={CLIENT}"]
        for name, server_env in transports.items():
            # Warm-up outside any phase: binaries and libraries come over 9p, kernels compile.
            lines.append(f"WORMHOLE_SERVER={server_env} WH_CTL_TTY= WH_RTT_CALLS=20 $WH run -- $C rtt > /dev/null")
        for name, server_env in transports.items():
            for n in (1, CALLS):
                lines.append(f"WORMHOLE_SERVER={server_env} WH_PHASE={name}-{n} WH_RTT_CALLS={n} "
                             f"$WH run -- $C rtt > $WH_WORK/{name}-{n}.out")
        g = guest.Guest(vm, ivshmem=[(region, REGION_SIZE)], net=True)
        r = g.run("\n".join(lines) + "\n", timeout=1200, count_events=True)
        if r.status != 0:
            print("vm bench: the guest script failed:\n" + r.output)
            return 1
        figures = {}
        for name in transports:
            run = parse((vm / f"{name}-{CALLS}.out").read_text())
            per_call = guest.summarize(r.phases.get(f"{name}-{CALLS}", {}), r.phases.get(f"{name}-1", {}))
            figures[name] = {
                "median": run.get("roundtrip_median_us", float("nan")),
                "p99": run.get("roundtrip_p99_us", float("nan")),
                **{k: v / (CALLS - 1) for k, v in per_call.items()},
            }
        rows = [
            ("median", "guest round trip (clGetEventInfo), median µs"),
            ("p99", "guest round trip, p99 µs"),
            ("kicks", "virtio kicks per call"),
            ("irqs", "interrupts injected per call"),
            ("mmio_pio", "device register accesses (MMIO/PIO) per call"),
            ("device", "device events per call (kicks+irqs+MMIO/PIO)"),
            ("lapic", "local APIC accesses per call (EOI, IPI, timer)"),
            ("all", "all counted events per call (incl. APIC, timer)"),
        ]
        print()
        print(f"VM guest: QEMU {g.accel}, {g.smp} vCPUs, {CALLS} forwarded calls per transport, same guest")
        print(f"{'measurement':<52} {'ivshmem':>12} {'tcp':>12} {'tcp/ivshmem':>12}")
        for key, label in rows:
            a, b = figures["ivshmem"][key], figures["tcp"][key]
            ratio = f"{b / a:.1f}x" if a > 0.005 else "-"
            print(f"{label:<52} {a:>12.2f} {b:>12.2f} {ratio:>12}")
        print("(events: QEMU trace events switched on around the calls only, the cost of one call subtracted; "
              "kicks = virtio_queue_notify, interrupts = apic_deliver_irq, register accesses = memory_region_ops_*)")
        return 0
    finally:
        try:
            os.killpg(server.pid, 9)
            server.wait()
        except (NameError, ProcessLookupError):
            pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
