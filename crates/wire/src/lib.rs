//! Wormhole's wire format, the same for every forwarded API: the frame header, the
//! bounds-checked body codec, and the session-control messages (HELLO, WELCOME, REFUSED ...)
//! that open a session before any API call travels. An API's own vocabulary (opcodes, handle
//! kinds, status codes) lives in that API's `proto` crate (e.g. `wormhole-opencl-proto`).
//!
//! See `docs/PROTOCOL.md` for the wire format in prose.

mod codec;
mod frame;
pub mod handshake;
pub mod message;

pub use codec::*;
pub use frame::*;

/// Where the server listens and clients connect unless told otherwise (`WORMHOLE_SOCKET`).
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("WORMHOLE_SOCKET") {
        Some(p) if !p.is_empty() => p.into(),
        _ => std::path::PathBuf::from("/tmp/wormhole/wormhole.sock"),
    }
}

/// A handle travels as a u64 id, meaningful only inside its session (0 = NULL). Ids the server
/// assigns (objects the client learns of from a reply) have the top bit set; ids the client
/// allocates for objects it creates do not. The two never collide.
pub const SERVER_ID_BIT: u64 = 1 << 63;
