"""An extension the application finds listed must be usable: Wormhole advertises a driver's
extension only when the client offers every host command it adds (the registry's list,
crates/opencl/proto/api/extensions.tsv). PoCL lists cl_khr_command_buffer and
cl_pocl_content_size, whose functions are not forwarded: natively they resolve, through
Wormhole they must then not be listed."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

# Reads what the ICD loader shows: the extensions listed (strings and name/version arrays)
# and, for each listed extension of the registry table, its commands that do not resolve.
PROBE = r"""
import ctypes, json, sys
cl = ctypes.CDLL("libOpenCL.so.1")
cl.clGetExtensionFunctionAddressForPlatform.restype = ctypes.c_void_p
cl.clGetExtensionFunctionAddressForPlatform.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
P, U, S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
cl.clGetPlatformIDs.argtypes = [U, P, P]
cl.clGetPlatformInfo.argtypes = cl.clGetDeviceInfo.argtypes = [P, U, S, P, P]
cl.clGetDeviceIDs.argtypes = [P, ctypes.c_uint64, U, P, P]
table = {}
for line in open(sys.argv[1]):
    if not line.startswith("#"):
        name, _, cmds = line.rstrip("\n").split("\t")
        table[name] = [] if cmds == "-" else cmds.split(",")

def info(fn, obj, param):
    size = ctypes.c_size_t()
    assert fn(obj, param, 0, None, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert fn(obj, param, size, buf, None) == 0
    return buf.raw[: size.value]

def names(s):
    return sorted(s.rstrip(b"\0").decode().split())

def versioned(raw):
    return sorted(raw[i + 4 : i + 68].split(b"\0")[0].decode() for i in range(0, len(raw), 68))

n = ctypes.c_uint()
assert cl.clGetPlatformIDs(0, None, ctypes.byref(n)) == 0
plats = (ctypes.c_void_p * n.value)()
cl.clGetPlatformIDs(n.value, plats, None)
out = []
for p in plats:
    ext = names(info(cl.clGetPlatformInfo, p, 0x0904))
    entry = {"platform": ext, "platform_versioned": versioned(info(cl.clGetPlatformInfo, p, 0x0907)), "devices": []}
    nd = ctypes.c_uint()
    cl.clGetDeviceIDs(p, 0xFFFFFFFF, 0, None, ctypes.byref(nd))
    devs = (ctypes.c_void_p * nd.value)()
    cl.clGetDeviceIDs(p, 0xFFFFFFFF, nd.value, devs, None)
    listed = set(ext)
    for d in devs:
        dext = names(info(cl.clGetDeviceInfo, d, 0x1030))
        entry["devices"].append({"extensions": dext, "versioned": versioned(info(cl.clGetDeviceInfo, d, 0x1060))})
        listed |= set(dext)
    entry["missing"] = {
        e: [c for c in table[e] if not cl.clGetExtensionFunctionAddressForPlatform(p, c.encode())]
        for e in sorted(listed & set(table)) if e != "cl_khr_icd"
    }
    out.append(entry)
print(json.dumps(out))
"""


def probe(run):
    table = REPO / "crates/opencl/proto/api/extensions.tsv"
    r = run([sys.executable, "-c", PROBE, str(table)])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_listed_extension_resolves_its_commands(server):
    native = probe(lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=120))
    forwarded = probe(server.run)
    assert len(native) == len(forwarded) == 1, "one PoCL platform natively and through Wormhole"
    n, f = native[0], forwarded[0]
    # Natively, PoCL's command buffers resolve (its 0.9.0 predates the SVM commands).
    assert "cl_khr_command_buffer" in n["devices"][0]["extensions"]
    assert "clCreateCommandBufferKHR" not in n["missing"]["cl_khr_command_buffer"]

    # Through Wormhole, nothing listed lacks a function ...
    assert all(not cmds for cmds in f["missing"].values()), f["missing"]
    # ... what went is exactly the registry extensions whose functions are not forwarded ...
    for nd, fd in zip(n["devices"], f["devices"]):
        gone = set(nd["extensions"]) - set(fd["extensions"])
        assert gone == {"cl_khr_command_buffer"}, gone
        assert set(fd["extensions"]) <= set(nd["extensions"])
        assert fd["versioned"] == fd["extensions"], "the two device queries agree"
    assert set(n["platform"]) - set(f["platform"]) == {"cl_pocl_content_size"}
    assert f["platform_versioned"] == f["platform"]
    # ... and the kernel language's extensions stay.
    assert "cl_khr_fp64" in f["devices"][0]["extensions"]
    assert "cl_khr_icd" in f["platform"]
