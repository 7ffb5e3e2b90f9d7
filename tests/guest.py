"""A real QEMU guest that runs this host's own binaries (stdlib only).

The guest boots the Debian kernel and initramfs made by scripts/vm/prepare.sh (target/vm/),
mounts the host root filesystem read-only over virtio-9p, mounts tmpfs on /tmp and /run, mounts
the host work directory read-write at the same path, and runs a shell script chrooted into the
host root with the repository root as working directory. The script's output comes back over the
serial console (ttyS0); afterwards the guest powers off.

    g = Guest(workdir, ivshmem=[(path, size)], net=True)
    status, output = g.run("python3 -c 'print(1)'")

Inside the guest:
  * ivshmem entry N is the PCI device $WH_IVSHMEM<N> (/sys/bus/pci/devices/0000:00:1<N>.0,
    vendor 0x1af4, device 0x1110); `wh_ivshmem N` enables it and prints the path of its
    BAR2 file (resource2), which can be mmapped read/write. $WH_IVSHMEM<N>_SIZE is its size.
  * with net=True, eth0 is 10.0.2.15/24 behind QEMU user networking (slirp): the host's
    loopback services are reachable at 10.0.2.2 ($WH_HOST).

Device-event counting (run(..., count_events=True)): the script brackets phases with
`wh_phase NAME` (ends the running phase, if any, and starts NAME) and `wh_phase_end`. Each call
is a handshake with the host over the second serial port (ttyS1): the host switches QEMU's trace
events on or off via QMP (trace-event-set-state) before it acknowledges, so the trace log holds
exactly the events of the phases and none of the boot or of the script between phases. Other
guest programs can use the same protocol: write "B NAME\\n" or "E\\n" to $WH_CTL_TTY (already in
raw mode) and read one line back. The result's .phases is {phase: {event: count}}, where the
events memory_region_ops_read/write are split by memory region ("memory_region_ops_write:serial")
and virtio_* events by device ("virtio_queue_notify:net", ":9p-root", ":9p-work").
Every phase includes a small constant overhead of the handshake itself (the ttyS1 interrupt and
register accesses): measure an empty phase and subtract it (see summarize()).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
VM_DIR = ROOT / "target" / "vm"
QEMU = os.environ.get("WH_QEMU", "qemu-system-x86_64")

# Trace events counted by count_events=True (all exist in Debian 12's QEMU 7.2, "log" backend).
DEFAULT_EVENTS = (
    "virtio_queue_notify",      # a guest kick of a virtqueue reached the device (any transport)
    "virtio_notify",            # a virtio device asks to interrupt the guest (used-buffer notification)
    "apic_deliver_irq",         # an external interrupt (MSI or IOAPIC) delivered to a local APIC
    "apic_local_deliver",       # a local APIC interrupt (LVT: in practice the APIC timer)
    "ioapic_set_irq",           # an ISA/INTx line changed at the IOAPIC (serial ports, PIT, ...)
    "memory_region_ops_read",   # a guest MMIO/PIO read dispatched to a device model
    "memory_region_ops_write",  # a guest MMIO/PIO write dispatched to a device model
)


class GuestError(RuntimeError):
    """The guest could not be booted or did not finish; .console holds the whole console log."""

    def __init__(self, msg, console=""):
        super().__init__(msg + ("\n--- console (tail) ---\n" + console[-4000:] if console else ""))
        self.console = console


def vm_missing() -> str | None:
    """Why a guest cannot be booted here (None if it can)."""
    if not (VM_DIR / "vmlinuz").exists() or not (VM_DIR / "initramfs.cpio.gz").exists():
        return f"{VM_DIR} is missing (run scripts/vm/prepare.sh)"
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (run scripts/vm/prepare.sh)"
    return None


def _kernel_cmd(workdir, nonce, extra):
    # vmlinux (uncompressed, booted through PVH) saves decompressing the bzImage under TCG.
    kernel = VM_DIR / "vmlinux" if (VM_DIR / "vmlinux").exists() else VM_DIR / "vmlinuz"
    return ["-kernel", str(kernel), "-initrd", str(VM_DIR / "initramfs.cpio.gz"),
            "-append", f"console=ttyS0 panic=-1 quiet tsc=reliable ipv6.disable=1 wh.work={workdir} wh.nonce={nonce} {extra}".strip()]


def _kvm_probe(tmpdir: pathlib.Path, timeout=20.0) -> bool:
    """Boots the initramfs under KVM until userspace prints a marker. A /dev/kvm that opens but
    cannot run an ordinary kernel (e.g. a paravirtual variant) hangs or fails here."""
    con = tmpdir / "kvm-probe.log"
    con.unlink(missing_ok=True)
    cmd = [QEMU, "-accel", "kvm", "-machine", "q35", "-cpu", "host", "-m", "256", "-nodefaults",
           "-no-user-config", "-display", "none", "-no-reboot",
           "-chardev", f"file,id=con0,path={con}", "-serial", "chardev:con0",
           *_kernel_cmd(tmpdir, "probe", "wh.probe=1")]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    ok = False
    try:
        while time.monotonic() < deadline:
            if con.exists() and "WH-PROBE-OK" in con.read_text(errors="replace"):
                ok = True
                break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return ok


def detect_accel() -> str:
    """"kvm" if KVM can really boot the guest, else "tcg". WH_VM_ACCEL=kvm|tcg overrides; the
    probe's answer is cached in target/vm/accel (keyed by host kernel, QEMU binary and /dev/kvm)."""
    forced = os.environ.get("WH_VM_ACCEL")
    if forced:
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    qemu = shutil.which(QEMU) or QEMU
    st_q, st_k = os.stat(qemu), os.stat("/dev/kvm")
    key = f"{os.uname().release} {qemu}:{st_q.st_mtime_ns} kvm:{st_k.st_rdev}"
    cache = VM_DIR / "accel"
    try:
        cached_key, answer = cache.read_text().rsplit("\n", 1)
        if cached_key == key and answer in ("kvm", "tcg"):
            return answer
    except (OSError, ValueError):
        pass
    answer = "kvm" if _kvm_probe(VM_DIR) else "tcg"
    (VM_DIR / "kvm-probe.log").unlink(missing_ok=True)
    try:
        cache.write_text(f"{key}\n{answer}")
    except OSError:
        pass
    return answer


class _Qmp:
    """A minimal QMP client (one command at a time, asynchronous events skipped)."""

    def __init__(self, path, timeout=30.0):
        self.sock = _connect_unix(path, timeout)
        self.file = self.sock.makefile("rwb", buffering=0)
        self._read()                          # greeting
        self.execute("qmp_capabilities")

    def _read(self):
        while True:
            line = self.file.readline()
            if not line:
                raise GuestError("QMP connection closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def execute(self, cmd, **args):
        self.file.write(json.dumps({"execute": cmd, "arguments": args}).encode() + b"\n")
        reply = self._read()
        if "error" in reply:
            raise GuestError(f"QMP {cmd} {args}: {reply['error']}")
        return reply.get("return")

    def close(self):
        self.sock.close()


def _connect_unix(path, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


_TRACE_PREFIX = re.compile(r"^\d+@\d+\.\d+:")
_REGION = re.compile(r"^cpu (-?\d+) .* name '([^']*)'")
# Memory regions whose guest reads are timekeeping, not device work (the guest's clocksource is
# the TSC with tsc=reliable, so these should stay near zero).
CLOCK_REGIONS = ("hpet", "acpi-tmr", "pit")
LAPIC_REGION = "apic-msi"   # QEMU's name of the local APIC's MMIO page (0xfee00000)


_VDEV = re.compile(r"^vdev (\S+)")


def virtio_device_names(boot_trace: str, net=True) -> dict:
    """{vdev pointer: name} from the boot's virtio_set_status lines: the guest acknowledges
    (status 1) the virtio devices in PCI slot order, which Guest.command fixes (9p root,
    9p work directory, net); QEMU's own resets (status 0) come in no particular order."""
    order = []
    for line in boot_trace.splitlines():
        line = _TRACE_PREFIX.sub("", line)
        if line.startswith("virtio_set_status ") and line.endswith(" val 1"):   # ACKNOWLEDGE
            m = _VDEV.match(line.split(" ", 1)[1])
            if m and m.group(1) not in order:
                order.append(m.group(1))
    names = ["9p-root", "9p-work"] + (["net"] if net else [])
    return dict(zip(order, names)) if len(order) == len(names) else {}


def count_trace_lines(text: str, vdev_names: dict | None = None) -> dict:
    """{event: count} of QEMU "log" trace-backend lines. memory_region_ops_read/write are split
    by memory region ("memory_region_ops_write:apic-msi"); accesses not made by a vCPU (a device
    writing an MSI message, DMA) get a "[dma]" mark: "memory_region_ops_write[dma]:apic-msi".
    virtio_* events are split by device when vdev_names knows it ("virtio_queue_notify:net")."""
    counts: dict = {}
    for line in text.splitlines():
        line = _TRACE_PREFIX.sub("", line)
        if not line:
            continue
        name, _, rest = line.partition(" ")
        if name.startswith("memory_region_ops_"):
            m = _REGION.match(rest)
            if m:
                name = f"{name}{'[dma]' if m.group(1) == '-1' else ''}:{m.group(2)}"
        elif name.startswith("virtio_") and vdev_names:
            m = _VDEV.match(rest)
            if m:
                name = f"{name}:{vdev_names.get(m.group(1), m.group(1))}"
        counts[name] = counts.get(name, 0) + 1
    return counts


def summarize(counts: dict, baseline: dict | None = None) -> dict:
    """Groups a phase's {event: count} into categories, optionally minus the counts of a
    baseline phase (an empty phase: the handshake's own cost):
      kicks     virtqueue notifications that reached a virtio device (virtio_queue_notify),
                except the 9p devices
      irqs      interrupts delivered to the guest from devices: MSI/MSI-X or IOAPIC
                (apic_deliver_irq), except those of the 9p devices
      fs        kicks and interrupts of the 9p devices: the guest reading host files (a phase
                that runs a program for the first time, or a cold import, shows up here)
      mmio_pio  vCPU accesses to device registers (memory_region_ops_*), without the local
                APIC and clock reads; virtio kicks are handled as ioeventfds and appear only as kicks
      lapic     vCPU accesses to the local APIC: EOIs, IPIs (ICR), timer programming
      timer     local APIC interrupts (apic_local_deliver: the guest's timer ticks)
      clock     vCPU reads of clock devices (HPET, ACPI PM timer, PIT)
      device    kicks + irqs + mmio_pio;  all: device + lapic + timer + clock + fs"""
    base = baseline or {}
    c = {k: counts.get(k, 0) - base.get(k, 0) for k in set(counts) | set(base)}
    out = dict.fromkeys(("kicks", "irqs", "mmio_pio", "lapic", "timer", "clock", "fs"), 0)
    for k, v in c.items():
        if k.startswith(("virtio_queue_notify:9p", "virtio_notify:9p")):
            out["fs"] += v            # host files read over 9p (by the test, not the call)
            if k.startswith("virtio_notify:"):
                out["irqs"] -= v      # ... and their interrupts
        elif k == "virtio_queue_notify" or k.startswith("virtio_queue_notify:"):
            out["kicks"] += v
        elif k == "apic_deliver_irq":
            out["irqs"] += v
        elif k == "apic_local_deliver":
            out["timer"] += v
        elif k.startswith("memory_region_ops_") and "[dma]" not in k:
            region = k.split(":", 1)[1] if ":" in k else ""
            if region == LAPIC_REGION:
                out["lapic"] += v
            elif region in CLOCK_REGIONS or region.startswith("acpi-tmr"):
                out["clock"] += v
            else:
                out["mmio_pio"] += v
    if baseline is not None:   # background noise can make a category dip below the baseline
        out = {k: max(0, v) for k, v in out.items()}
    out["device"] = out["kicks"] + out["irqs"] + out["mmio_pio"]
    out["all"] = out["device"] + out["lapic"] + out["timer"] + out["clock"] + out["fs"]
    return out


class RunResult(tuple):
    """(status, output), plus .phases ({phase: {event: count}} with count_events), .phase_seconds,
    .boot_seconds (QEMU start to the script's first line), .script_seconds and .console (all)."""

    def __new__(cls, status, output, **attrs):
        self = super().__new__(cls, (status, output))
        self.status, self.output = status, output
        self.__dict__.update(attrs)
        return self


class _PhaseController(threading.Thread):
    """Serves the guest's wh_phase handshakes on ttyS1: switches trace events via QMP and
    remembers the trace log's offsets at each phase's start and end."""

    def __init__(self, ctl_path, qmp_path, trace_log, events):
        super().__init__(daemon=True)
        self.ctl = _connect_unix(ctl_path, 30)   # the chardev waits for us (wait=on)
        self.qmp_path, self.trace_log, self.events = qmp_path, trace_log, events
        self.spans = []          # (name, start_offset, end_offset, seconds)
        self.error = None
        self.qmp = None

    def _size(self):
        try:
            return self.trace_log.stat().st_size
        except FileNotFoundError:
            return 0

    def _set(self, enable):
        for ev in self.events:
            self.qmp.execute("trace-event-set-state", name=ev, enable=enable)

    def _settled_size(self):
        # Lines of events fired just before the switch may still be in flight: wait until the
        # (line-buffered) log stops growing.
        size = self._size()
        while True:
            time.sleep(0.02)
            now = self._size()
            if now == size:
                return size
            size = now

    def run(self):
        current = None           # (name, start_offset, t0)
        buf = b""
        try:
            self.qmp = _Qmp(self.qmp_path)
            while True:
                data = self.ctl.recv(4096)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.decode(errors="replace").strip()
                    if not line:
                        continue
                    if current is not None:
                        self._set(False)
                        end = self._settled_size()
                        self.spans.append((current[0], current[1], end, time.monotonic() - current[2]))
                        current = None
                    if line.startswith("B "):
                        start = self._settled_size()
                        self._set(True)
                        current = (line[2:].strip(), start, time.monotonic())
                    self.ctl.sendall(b"ok\n")
        except Exception as e:   # reported by Guest.run
            self.error = e
        finally:
            if current is not None:
                self.spans.append((current[0], current[1], self._size(), time.monotonic() - current[2]))

    def phases(self, net):
        data = self.trace_log.read_bytes() if self.trace_log.exists() else b""
        first = self.spans[0][1] if self.spans else len(data)
        vdevs = virtio_device_names(data[:first].decode(errors="replace"), net)
        phases, seconds = {}, {}
        for name, start, end, secs in self.spans:
            counts = count_trace_lines(data[start:end].decode(errors="replace"), vdevs)
            if name in phases:   # a repeated phase name accumulates
                for k, v in counts.items():
                    phases[name][k] = phases[name].get(k, 0) + v
                seconds[name] += secs
            else:
                phases[name], seconds[name] = counts, secs
        return phases, seconds

    def close(self):
        for s in (self.ctl, self.qmp):
            try:
                s and s.close()
            except OSError:
                pass


class Guest:
    def __init__(self, workdir, ivshmem=(), net=True, mem_mib=1024, smp=2, accel=None,
                 repo=ROOT, cache="loose", msize=512000):
        """workdir: a host directory for this guest's files (mounted read-write at the same path
        in the guest). ivshmem: [(backing file path, size in bytes)], each shared with the guest
        as an ivshmem-plain PCI device (the file is created/extended to size if needed).
        cache/msize: 9p options of the read-only host root."""
        self.workdir = pathlib.Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ivshmem = [(pathlib.Path(p).resolve(), int(size)) for p, size in ivshmem]
        if len(self.ivshmem) > 8:
            raise ValueError("at most 8 ivshmem devices")
        self.net, self.mem_mib, self.smp = net, mem_mib, smp
        self.accel = accel or detect_accel()
        self.repo = pathlib.Path(repo)
        self.cache, self.msize = cache, msize
        self.last_command = None

    def command(self, nonce, count_events=False):
        """The QEMU command line of one run."""
        w = self.workdir
        cpu = "host" if self.accel == "kvm" else "max"
        cmd = [QEMU, "-accel", self.accel, "-machine", "q35", "-cpu", cpu, "-smp", str(self.smp),
               "-m", str(self.mem_mib), "-nodefaults", "-no-user-config", "-display", "none",
               "-no-reboot",
               "-chardev", f"file,id=con0,path={w / 'console.log'}", "-serial", "chardev:con0",
               "-fsdev", "local,id=fs0,path=/,security_model=none,readonly=on,multidevs=remap",
               "-device", "virtio-9p-pci,fsdev=fs0,mount_tag=hostroot,addr=0x2",
               "-fsdev", f"local,id=fs1,path={w},security_model=none,multidevs=remap",
               "-device", "virtio-9p-pci,fsdev=fs1,mount_tag=whwork,addr=0x3"]
        if self.net:
            cmd += ["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile=,addr=0x4"]
        for i, (path, size) in enumerate(self.ivshmem):
            cmd += ["-object", f"memory-backend-file,id=wh{i},share=on,mem-path={path},size={size}",
                    "-device", f"ivshmem-plain,memdev=wh{i},addr=0x{0x10 + i:x}"]
        if count_events:
            cmd += ["-chardev", f"socket,id=ctl,path={w / 'ctl.sock'},server=on,wait=on",
                    "-serial", "chardev:ctl",
                    "-qmp", f"unix:{w / 'qmp.sock'},server=on,wait=off",
                    "-D", str(w / "trace.log"),
                    # Only at boot and power-off: tells which vdev pointer is which device.
                    "-trace", "enable=virtio_set_status"]
        extra = (f"wh.msize={self.msize} wh.cache={self.cache} wh.repo={self.repo.resolve()}"
                 + (" wh.net=1" if self.net else ""))
        cmd += _kernel_cmd(w, nonce, extra)
        return cmd

    def _write_scripts(self, script, env, count_events):
        w = self.workdir
        exports = {"WH_WORK": str(w), "WH_HOST": "10.0.2.2", "WH_REPO": str(self.repo),
                   "WH_CTL_TTY": "/dev/ttyS1" if count_events else ""}
        for i, (_, size) in enumerate(self.ivshmem):
            exports[f"WH_IVSHMEM{i}"] = f"/sys/bus/pci/devices/0000:00:{0x10 + i:02x}.0"
            exports[f"WH_IVSHMEM{i}_SIZE"] = str(size)
        exports.update({k: str(v) for k, v in (env or {}).items()})
        lines = ["# generated by tests/guest.py"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
        lines += [
            'wh_ivshmem() { _d=$(eval echo "\\$WH_IVSHMEM$1"); echo 1 > "$_d/enable"; echo "$_d/resource2"; }',
            'if [ -n "$WH_CTL_TTY" ]; then',
            '    stty -F "$WH_CTL_TTY" raw -echo -hupcl',
            '    exec 9<>"$WH_CTL_TTY"',
            '    wh_phase() { printf "B %s\\n" "$1" >&9; read -r _wh_ack <&9; }',
            '    wh_phase_end() { printf "E\\n" >&9; read -r _wh_ack <&9; }',
            "else",
            "    wh_phase() { :; }",
            "    wh_phase_end() { :; }",
            "fi",
            f"cd {shlex.quote(str(self.repo))}",
            f'. {shlex.quote(str(w / "script.sh"))}',
        ]
        (w / "run.sh").write_text("\n".join(lines) + "\n")
        (w / "script.sh").write_text(script if script.endswith("\n") else script + "\n")

    def run(self, script: str, timeout=300, env: dict | None = None, count_events=False,
            events=DEFAULT_EVENTS) -> RunResult:
        """Boots the guest, runs `script` (sh, sourced by a wrapper; `exit N` works) chrooted into
        the host root with /proc, /sys, /dev, /tmp (tmpfs), /run (tmpfs) and the work directory
        mounted, cwd = the repository root, `env` exported. Returns RunResult (status, output)."""
        w = self.workdir
        for name in ("console.log", "qemu.log", "trace.log", "ctl.sock", "qmp.sock"):
            (w / name).unlink(missing_ok=True)
        for path, size in self.ivshmem:
            if not path.exists() or path.stat().st_size < size:
                with open(path, "ab") as f:
                    f.truncate(size)
        self._write_scripts(script, env, count_events)
        nonce = secrets.token_hex(6)
        cmd = self.command(nonce, count_events)
        self.last_command = cmd
        console_path = w / "console.log"
        begin, end = f"WH-BEGIN-{nonce}", f"WH-EXIT-{nonce} "
        t0 = time.monotonic()
        with open(w / "qemu.log", "wb") as qlog:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qlog, stderr=qlog,
                                    start_new_session=True)
        ctl = None
        t_begin = t_end = None
        status = None
        console = ""
        try:
            if count_events:
                ctl = _PhaseController(w / "ctl.sock", w / "qmp.sock", w / "trace.log", events)
                ctl.start()
            deadline = t0 + timeout
            while True:
                exited = proc.poll() is not None
                console = console_path.read_text(errors="replace") if console_path.exists() else ""
                if t_begin is None and begin in console:
                    t_begin = time.monotonic()
                if status is None:
                    m = re.search(re.escape(end) + r"(\d+)", console)
                    if m:
                        status, t_end = int(m.group(1)), time.monotonic()
                        deadline = min(deadline, t_end + 15)   # then the guest powers off
                if f"WH-INIT-ERROR-{nonce}" in console:
                    raise GuestError("guest init failed", console + _tail(w / "qemu.log"))
                if exited:
                    break
                if time.monotonic() > deadline:
                    if status is not None:
                        break        # the script finished; only the power-off hung
                    raise GuestError(f"guest timed out after {timeout}s", console + _tail(w / "qemu.log"))
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if ctl is not None:
                ctl.close()
                ctl.join(5)
        if status is None:
            raise GuestError(f"guest exited (QEMU status {proc.returncode}) before the script finished",
                             console + _tail(w / "qemu.log"))
        console = console.replace("\r\n", "\n")
        output = console.split(begin + "\n", 1)[-1].split(end, 1)[0]
        phases, phase_seconds = ({}, {})
        if ctl is not None:
            if ctl.error:
                raise GuestError(f"event counting failed: {ctl.error!r}", console)
            phases, phase_seconds = ctl.phases(self.net)
        return RunResult(status, output, phases=phases, phase_seconds=phase_seconds,
                         boot_seconds=(t_begin or t_end) - t0, script_seconds=t_end - (t_begin or t_end),
                         console=console, command=cmd)


def _tail(path, n=3000):
    try:
        return "\n--- qemu.log ---\n" + path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


_DEMO_GUEST = r"""
import mmap, os, socket, struct, sys, time
bar, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctl = os.open(os.environ["WH_CTL_TTY"], os.O_RDWR | os.O_NOCTTY)
def handshake(line):
    os.write(ctl, line)
    while os.read(ctl, 1) != b"\n":
        pass
secs = {}
def phase(name, fn):
    handshake(b"B %s\n" % name.encode())
    t = time.perf_counter(); fn(); secs[name] = time.perf_counter() - t
    handshake(b"E\n")
s = socket.create_connection((os.environ["WH_HOST"], port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def tcp():
    for _ in range(n):
        s.sendall(b"x" * 64)
        got = 0
        while got < 64:
            got += len(s.recv(4096))
m = mmap.mmap(os.open(bar, os.O_RDWR), 0)
def shm():   # a round trip through the BAR: request sequence at 0, the host echoes it at 64
    for i in range(1, n + 1):
        struct.pack_into("<Q", m, 0, i)
        while struct.unpack_from("<Q", m, 64)[0] != i:
            pass
def spin():
    x = 0
    for _ in range(n):
        x += m[128]
tcp()  # warm up the connection
for name, fn in (("empty", lambda: None), ("tcp", tcp), ("shm", shm), ("spin", spin), ("empty2", lambda: None)):
    phase(name, fn)
print("guest seconds:", {k: round(v, 3) for k, v in secs.items()})
"""


def events_demo(n=1000, workdir=None):
    """Counts the device events of n TCP round trips over virtio-net (to a host echo server) and
    of n round trips through an ivshmem BAR (a host thread polls and answers) and n plain polls
    of the BAR; prints per-call figures net of an empty phase."""
    import mmap
    import struct
    import tempfile
    d = pathlib.Path(workdir or tempfile.mkdtemp(prefix="wh-events-"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "demo_guest.py").write_text(_DEMO_GUEST)
    shm = d / "shm"
    with open(shm, "wb") as f:
        f.truncate(1 << 20)
    srv = socket.create_server(("127.0.0.1", 0))

    def echo():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=lambda c=c: [c.sendall(b) for b in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    stop = threading.Event()

    def responder():
        with open(shm, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            last = 0
            while not stop.is_set():
                v = struct.unpack_from("<Q", m, 0)[0]
                if v != last:
                    struct.pack_into("<Q", m, 64, v)
                    last = v

    threading.Thread(target=echo, daemon=True).start()
    threading.Thread(target=responder, daemon=True).start()
    g = Guest(d, ivshmem=[(shm, 1 << 20)])
    try:
        r = g.run(f"/root/.pyenv/versions/3.11.7/bin/python3 $WH_WORK/demo_guest.py $(wh_ivshmem 0) "
                  f"{srv.getsockname()[1]} {n}", count_events=True)
    finally:
        stop.set()
        srv.close()
    print(" ".join(shlex.quote(a) for a in r.command))
    print(f"status {r.status}, boot {r.boot_seconds:.1f}s, script {r.script_seconds:.1f}s; {r.output.strip()}")
    print(json.dumps(r.phases, indent=1, sort_keys=True))
    base = r.phases.get("empty", {})
    print("empty phase (subtracted):", summarize(base))
    for name in ("tcp", "shm", "spin", "empty2"):
        tot = summarize(r.phases.get(name, {}), base)
        print(f"{name:7s} per call:", {k: round(v / n, 2) for k, v in tot.items()})
    return r


if __name__ == "__main__":
    # python3 tests/guest.py accel              -> kvm|tcg (probed once, cached in target/vm/accel)
    # python3 tests/guest.py run 'SCRIPT'       -> boots a guest in a temporary directory
    # python3 tests/guest.py events-demo [N]    -> device events per TCP vs shared-memory round trip
    import tempfile
    if len(sys.argv) >= 2 and sys.argv[1] == "accel":
        print(detect_accel())
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        with tempfile.TemporaryDirectory(prefix="wh-guest-") as d:
            r = Guest(d).run(sys.argv[2])
            sys.stdout.write(r.output)
            print(f"[guest: status {r.status}, boot {r.boot_seconds:.1f}s, script {r.script_seconds:.1f}s]",
                  file=sys.stderr)
            sys.exit(r.status)
    elif len(sys.argv) >= 2 and sys.argv[1] == "events-demo":
        events_demo(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
    else:
        print(__doc__)
        sys.exit(2)
