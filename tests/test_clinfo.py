"""`wh run -- clinfo` lists the server's devices with the native properties: the only
differences are the forwarded device name and the capabilities Wormhole does not forward
(SVM atomics, native kernels) and the extensions whose functions it does not forward
(PoCL's cl_khr_command_buffer and cl_pocl_content_size, test_extensions.py), as the README
says."""

import os
import pathlib
import re
import subprocess


def test_clinfo_matches_native(server):
    native = subprocess.run(["clinfo"], capture_output=True, text=True, timeout=120).stdout.splitlines()
    r = server.run(["clinfo"])
    assert r.returncode == 0, r.stderr
    forwarded = r.stdout.splitlines()
    hidden = {"cl_khr_command_buffer", "cl_pocl_content_size"}
    # Without the extension, clinfo leaves out its capability block and its version lines.
    if any("Command buffer capabilities" in n for n in native):
        at = next(i for i, n in enumerate(native) if "Command buffer capabilities" in n)
        del native[at : at + 4]
    native = [n for n in native if n.split()[:1] not in ([h] for h in hidden)]
    assert len(native) == len(forwarded)
    allowed = re.compile(r"(Atomics|Run native kernels)\s+(Yes|No)$")
    devices = 0
    for n, f in zip(native, forwarded):
        if n == f:
            continue
        if "Global memory size" in n:
            # PoCL derives this from the memory free when it starts: close, not equal.
            a, b = int(n.split()[3]), int(f.split()[3])
            assert abs(a - b) <= 0.25 * max(a, b), f"{n} vs {f}"
            continue
        if "Extensions  " in n:
            label, names = n.split("Extensions", 1)
            assert f.startswith(label + "Extensions"), f
            assert set(f.split("Extensions", 1)[1].split()) == set(names.split()) - hidden
            continue
        if "Device Name" in n:
            assert f.replace("Wormhole \u2192 ", "") == n
            devices += 1
            continue
        assert allowed.search(n.strip()) and allowed.search(f.strip()), f"differs:\n  native: {n}\n  wormhole: {f}"
    assert devices >= 1


def test_a_native_icd_named_by_file_is_not_passed_on(server):
    """`wh run` drops OCL_ICD_FILENAMES (how the GPU machine names NVIDIA's OpenCL): the
    program must not reach a native platform beside Wormhole's."""
    pocl = pathlib.Path("/etc/OpenCL/vendors/pocl.icd").read_text().strip()
    native = subprocess.run(["clinfo", "-l"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "OCL_ICD_FILENAMES": pocl})
    assert "Portable Computing Language" in native.stdout, native.stdout + native.stderr
    r = server.run(["clinfo", "-l"], OCL_ICD_FILENAMES=pocl)
    assert "OCL_ICD_FILENAMES is not passed on" in r.stderr
    devices = [l for l in r.stdout.splitlines() if "Device #" in l]
    assert devices and all("Wormhole" in l for l in devices), r.stdout


def test_no_server_means_no_platforms_quickly(tmp_path):
    from conftest import Server

    s = Server(tmp_path)  # never started
    r = s.run(["clinfo", "-l"], timeout=30)
    assert "cannot reach the Wormhole server" in r.stderr
    assert "Platform #" not in r.stdout


def test_no_server_answers_within_a_second(tmp_path, c_programs):
    import time

    from conftest import Server

    s = Server(tmp_path)
    start = time.monotonic()
    r = s.run([c_programs["vector_add"]], timeout=30)
    # The bound is 1 s for the call; the margin covers starting two processes.
    assert time.monotonic() - start < 1.5
    assert r.returncode != 0
    assert "-1001" in r.stderr  # CL_PLATFORM_NOT_FOUND_KHR from clGetPlatformIDs
