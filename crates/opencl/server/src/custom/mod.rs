#![allow(non_snake_case)]
//! Hand-written handlers for entry points whose arguments need more than the generator knows:
//! host pointers, arrays of strings and binaries, kernel arguments that may be handles, data
//! transfers and mappings. Each decodes its request with the struct of
//! `wormhole_opencl_proto::requests` that the matching client function in
//! `crates/opencl/client/src/custom` encodes, and answers with the reply struct it decodes.

mod devices;
mod kernel;
mod memory;
mod program;
mod queues;
mod svm;
mod transfer;

pub use devices::*;
pub use kernel::*;
pub use memory::*;
pub use program::*;
pub use queues::*;
pub use svm::*;
pub use transfer::*;

use crate::generated::ffi;
use crate::session::{Handle, Session};
use wormhole_opencl_proto::{DecodeError, HandleKind, Reader};

/// An event wait list as sent by the client: optional list of event ids.
pub(crate) struct WaitList(pub(crate) Option<Vec<u64>>);

impl WaitList {
    pub fn resolve(&self, s: &Session) -> Result<(u32, Option<Vec<Handle>>), i32> {
        let n = self.0.as_ref().map_or(0, |v| v.len());
        let list = s.resolve_list(
            self.0.as_deref(),
            n,
            HandleKind::Event,
            wormhole_opencl_proto::cl::CL_INVALID_EVENT_WAIT_LIST,
        )?;
        Ok((n as u32, list))
    }
}

pub(crate) fn list_ptr(l: &Option<Vec<Handle>>) -> *const Handle {
    l.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())
}

/// The `cl_event *event` output of an enqueue, under the id the client chose (0: none).
pub(crate) struct EventOut {
    id: u64,
    ev: Handle,
}

impl EventOut {
    pub(crate) fn new(s: &Session, id: u64) -> Result<EventOut, i32> {
        if id != 0 {
            s.check_new_id(id)?;
        }
        Ok(EventOut {
            id,
            ev: std::ptr::null_mut(),
        })
    }
    /// The pointer to hand the driver; `force` asks for an event even if the client wants none.
    pub(crate) fn ptr(&mut self, force: bool) -> *mut Handle {
        if self.id != 0 || force {
            &mut self.ev
        } else {
            std::ptr::null_mut()
        }
    }
    /// Publishes the event to the client; returns the event if the client did not ask for it
    /// (the caller owns that reference).
    pub(crate) fn finish(self, s: &Session) -> Handle {
        if self.id != 0 && !self.ev.is_null() {
            // The id was checked before the enqueue; only a client racing itself on two
            // lanes with one id loses it here, and then its event is unknown to it (logged).
            if s.bind(self.id, HandleKind::Event, self.ev).is_ok() {
                // SAFETY: a live event; the caller's extra reference is released by whoever
                // keeps it.
                unsafe { ffi::clRetainEvent(self.ev) };
            }
        }
        self.ev
    }
}

pub(crate) struct Target {
    pub(crate) queue: Handle,
    pub(crate) mem: Handle,
}

pub(crate) fn target(s: &Session, queue: u64, mem: u64) -> Result<Target, i32> {
    Ok(Target {
        queue: s.resolve(queue, HandleKind::Queue, false)?,
        mem: s.resolve(mem, HandleKind::Mem, false)?,
    })
}

/// Drops the extra reference `EventOut::finish` leaves when nobody keeps the event.
pub(crate) fn release_own(_event_id: u64, ev: Handle) {
    if !ev.is_null() {
        // SAFETY: we hold one reference to this live event and give it up.
        unsafe { ffi::clReleaseEvent(ev) };
    }
}
