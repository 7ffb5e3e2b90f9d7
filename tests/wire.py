"""Wormhole's wire vocabulary for tests that speak the protocol by hand, read at import time from
the sources that define it, so that nothing is copied here: the frame constants and the control
opcodes from crates/wire/src/frame.rs, the OpenCL opcodes (ICD slots) from the API description
crates/opencl/proto/api/opencl.api, the OpenCL constants from crates/opencl/proto/src/cl.rs and
the API name from crates/opencl/proto/src/lib.rs."""

import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
FRAME_RS = ROOT / "crates" / "wire" / "src" / "frame.rs"
API_FILE = ROOT / "crates" / "opencl" / "proto" / "api" / "opencl.api"
CL_RS = ROOT / "crates" / "opencl" / "proto" / "src" / "cl.rs"
PROTO_LIB_RS = ROOT / "crates" / "opencl" / "proto" / "src" / "lib.rs"

_CONST = re.compile(r"^\s*pub const (\w+): [\w&']+ = (.+);\s*$", re.M)
_VALUE = re.compile(r"^-?(0x[0-9a-fA-F_]+|\d[\d_]*)$")


def _int(text):
    """An integer literal, or `a << b` of two (the only forms these files use)."""
    parts = [p.strip() for p in text.split("<<")]
    if not 1 <= len(parts) <= 2 or not all(_VALUE.match(p) for p in parts):
        raise ValueError(f"not an integer constant: {text!r}")
    vals = [int(p.replace("_", ""), 0) for p in parts]
    return vals[0] << vals[1] if len(vals) == 2 else vals[0]


def _consts(text):
    """The integer constants `pub const NAME: T = VALUE;` of a Rust source text."""
    out = {}
    for name, value in _CONST.findall(text):
        try:
            out[name] = _int(value)
        except ValueError:
            pass  # not an integer (a string, an expression): not wanted here
    return out


def _split_module(text, name):
    """(the text outside `pub mod NAME { ... }`, the text inside it)."""
    start = text.index(f"pub mod {name} {{")
    end = text.index("\n}\n", start)
    return text[:start] + text[end:], text[start:end]


def _opcodes(text):
    """Entry point name -> opcode, from the API description (`<opcode> <name> <mode> ...`)."""
    ops = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+)\s+(\w+)\s", line)
        if m:
            ops[m.group(2)] = int(m.group(1))
    return ops


_frame_text, _control_text = _split_module(FRAME_RS.read_text(), "control")
FRAME = _consts(_frame_text)
CONTROL = _consts(_control_text)
OP = _opcodes(API_FILE.read_text())
CL = _consts(CL_RS.read_text())
API = re.search(r'pub const API: &str = "([^"]+)";', PROTO_LIB_RS.read_text()).group(1)

MAGIC, VERSION, HEADER_LEN = FRAME["MAGIC"], FRAME["VERSION"], FRAME["HEADER_LEN"]
FLAG_REPLY, FLAG_ASYNC = FRAME["FLAG_REPLY"], FRAME["FLAG_ASYNC"]
HELLO, WELCOME = CONTROL["HELLO"], CONTROL["WELCOME"]

# `magic u16 | version u8 | flags u8 | opcode u16 | lane u16 | len u32 | seq u32`, little-endian
# (FrameHeader in frame.rs).
HEADER = struct.Struct("<HBBHHII")
assert HEADER.size == HEADER_LEN, "frame.rs changed the header: update HEADER here"


def header(op, length, flags=0, lane=0, seq=1):
    return HEADER.pack(MAGIC, VERSION, flags, op, lane, length, seq)


def hello_body(token=None):
    """HELLO's body (handshake.rs): protocol version, API name, optional token."""
    api = API.encode()
    body = struct.pack("<B", VERSION) + struct.pack("<Q", len(api)) + api
    if token is None:
        return body + b"\x00"
    return body + b"\x01" + struct.pack("<Q", len(token)) + token
