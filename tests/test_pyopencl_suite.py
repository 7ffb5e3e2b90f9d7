"""PyOpenCL's own test suite, run natively on PoCL and through Wormhole in the same run:
every test must end the same way."""

import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import ROOT

VERSION = "2026.1.4"
SUITE = ROOT / "target" / "pyopencl-src" / f"pyopencl-{VERSION}" / "test"


# Test ids name the device, which Wormhole marks as forwarded: compare without it.
DEVICE = re.compile(r"<pyopencl\.Device '.*?' on '.*?'>")


def outcomes(junit: pathlib.Path):
    res = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = DEVICE.sub("<device>", f'{case.get("classname")}::{case.get("name")}')
        kinds = [c.tag for c in case]
        if "skipped" in kinds:
            el = case.find("skipped")
            msg = (el.get("message") or "") + (el.text or "")
            res[name] = ("xfailed" if el.get("type") == "pytest.xfail" else "skipped", msg)
        elif "failure" in kinds or "error" in kinds:
            res[name] = ("failed", "")
        else:
            res[name] = ("passed", "")
    return res


def run_suite(cmd_prefix, junit, env):
    cmd = cmd_prefix + [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600", f"--junitxml={junit}", "."]
    # PoCL occasionally dies while spawning its linker when the suite's own tests change the
    # environment concurrently ("posix_spawn failed: Bad address"), natively as well: then
    # pytest writes no report at all. Such a crash of the whole run is retried once; test
    # outcomes are never retried.
    for attempt in range(2):
        r = subprocess.run(cmd, cwd=SUITE, env=env, capture_output=True, text=True, timeout=3000)
        tail = r.stdout.strip().splitlines()[-1:] if r.stdout else []
        print(" ".join(cmd_prefix) or "native", "->", tail)
        if junit.exists():
            return outcomes(junit)
        print(f"run {attempt + 1} crashed without a report:", r.stdout[-1500:], r.stderr[-1500:])
    raise AssertionError(r.stdout[-3000:] + r.stderr[-3000:])


def test_suite_matches_native(server, tmp_path):
    assert SUITE.is_dir(), "run scripts/install.sh (it fetches PyOpenCL's tests)"
    env = dict(os.environ)
    env.pop("WORMHOLE_SOCKET", None)
    native = run_suite([], tmp_path / "native.xml", env)
    forwarded = run_suite(server.cmd([]), tmp_path / "wormhole.xml", server.env())
    assert set(native) == set(forwarded)
    assert sum(1 for o, _ in native.values() if o == "passed") > 250
    differences = []
    for name, (o, _) in native.items():
        f, why = forwarded[name]
        if f == o:
            continue
        differences.append(f"{name}: native {o}, wormhole {f} {why}")
    assert not differences, "\n".join(differences)
