//! The Wormhole server. A *supervisor* accepts sessions and gives each its own *worker*
//! process; the worker owns the tenant's OpenCL objects (through the system ICD loader, never
//! through Wormhole's own ICD), maps client handles to real objects in a per-session table,
//! and serves the session's lanes, one thread per lane.

mod arena;
mod callbacks;
pub mod config;
mod custom;
mod driver;
mod info;
pub mod program_cache;
mod props;
pub mod quota;
mod rt;
mod session;
pub mod supervisor;
pub mod vendors;
pub mod worker;

/// The generated decoders and dispatch (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_parens,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/server_gen.rs"));
}

pub use config::Config;

/// Runs one request made of untrusted bytes (`opcode u16 LE` + body) against a fresh session,
/// as a worker would; the fuzzing entry point (`fuzz/`). Must return normally for any input.
#[doc(hidden)]
pub fn fuzz_request(data: &[u8]) {
    use wormhole_protocol::{control, DecodeError, Op, Reader, Writer};
    let Some((op, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let op = u16::from_le_bytes(*op);
    let s = session::Session::default();
    let mut w = Writer::new(op);
    let mut r = Reader::new(body);
    let _ = if op == control::COLLECT {
        custom::collect(&s, &mut r, &mut w)
    } else if op == control::DIRECT {
        arena::direct(&s, &mut r, &mut w)
    } else {
        match Op::from_u16(op) {
            Some(o) => generated::dispatch(&s, o, &mut r, &mut w),
            None => Err(DecodeError::UnknownOp(op)),
        }
    };
    if let Some(t) = custom::take_trailer() {
        t.release();
    }
}
