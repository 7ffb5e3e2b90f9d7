#![allow(non_snake_case)]
//! Hand-written handlers for entry points whose arguments need more than the generator knows:
//! host pointers, arrays of strings and binaries, kernel arguments that may be handles, data
//! transfers and mappings. Each reads exactly what the matching client function in
//! `crates/client/src/custom` writes.

mod kernel;
mod memory;
mod program;
mod transfer;

pub use kernel::*;
pub use memory::*;
pub use program::*;
pub use transfer::*;

use crate::session::{Handle, Session};
use wormhole_protocol::{DecodeError, HandleKind, Reader};

/// An event wait list as sent by the client: optional list of event ids.
pub(crate) struct WaitList(Option<Vec<u64>>);

impl WaitList {
    pub fn decode(r: &mut Reader<'_>) -> Result<WaitList, DecodeError> {
        Ok(WaitList(r.opt_u64s()?))
    }

    pub fn resolve(&self, s: &Session) -> Result<(u32, Option<Vec<Handle>>), i32> {
        let n = self.0.as_ref().map_or(0, |v| v.len());
        let list = s.resolve_list(
            self.0.as_deref(),
            n,
            HandleKind::Event,
            wormhole_protocol::cl::CL_INVALID_EVENT_WAIT_LIST,
        )?;
        Ok((n as u32, list))
    }
}

pub(crate) fn list_ptr(l: &Option<Vec<Handle>>) -> *const Handle {
    l.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())
}

/// Reads three size_t values.
pub(crate) fn triple(r: &mut Reader<'_>) -> Result<[usize; 3], DecodeError> {
    Ok([r.usize()?, r.usize()?, r.usize()?])
}
