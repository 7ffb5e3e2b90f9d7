//! Wormhole's wire protocol, shared by client and server: frame header, a bounds-checked
//! encoder/decoder, the opcode table generated from the API description, and the API-level
//! vocabulary both sides agree on (handle kinds, callback kinds, which info values carry handles).
//!
//! See `docs/PROTOCOL.md` for the wire format in prose.

pub mod cl;
mod frame;
pub mod geometry;
pub mod info;
mod kinds;
mod wire;

pub use frame::*;
pub use kinds::*;
pub use wire::*;

mod opcodes {
    include!(concat!(env!("OUT_DIR"), "/opcodes.rs"));
}
pub use opcodes::{Op, OP_COUNT};

/// Where the server listens and clients connect unless told otherwise (`WORMHOLE_SOCKET`).
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("WORMHOLE_SOCKET") {
        Some(p) if !p.is_empty() => p.into(),
        _ => std::path::PathBuf::from("/tmp/wormhole/wormhole.sock"),
    }
}

/// The API a session speaks (sent in HELLO).
pub const API_OPENCL: &str = "opencl";
