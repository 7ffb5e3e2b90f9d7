//! Hand-written entry points whose arguments need more than the generator knows. Requests and
//! replies are the structs of `wormhole_opencl_proto::requests`, which the matching handlers in
//! `crates/opencl/server/src/custom` decode: the two sides share one encoding.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod buffer_commands;
mod events;
mod kernel;
mod memory;
mod program;
mod svm;
mod transfer;

pub use buffer_commands::*;
pub use events::*;
pub use kernel::*;
pub use memory::*;
pub use program::*;
pub use svm::*;
pub use transfer::*;

use crate::objects;
use crate::rt::{self, ClErr};
use std::ffi::c_void;
use wormhole_opencl_proto::requests::{self as req, Message};
use wormhole_opencl_proto::{cl::*, HandleKind, Op, Writer};

pub type Handle = *mut c_void;

/// The object behind a handle or the native error for a bad one.
unsafe fn obj<'a>(h: Handle, kind: HandleKind) -> Result<&'a objects::ClObject, ClErr> {
    // SAFETY: the application's handle, per the OpenCL contract.
    unsafe { objects::get(h, kind) }.ok_or(ClErr(kind.invalid_code()))
}

/// The ids of an event wait list (CL_INVALID_EVENT_WAIT_LIST for a bad one, like native).
unsafe fn wait_ids(n: u32, list: *const Handle) -> Result<Option<Vec<u64>>, ClErr> {
    if (n == 0) != list.is_null() {
        return Err(ClErr(CL_INVALID_EVENT_WAIT_LIST));
    }
    // SAFETY: `list` holds `n` events.
    unsafe {
        rt::handle_ids(
            list,
            n as usize,
            HandleKind::Event,
            CL_INVALID_EVENT_WAIT_LIST,
        )
    }
}

/// The tail every enqueue shares: the wait list's ids, then the id of the event it returns
/// (0: the application wants none).
unsafe fn wait_and_event(
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> Result<(Option<Vec<u64>>, u64), ClErr> {
    // SAFETY: the caller passes the application's wait list.
    let wait = unsafe { wait_ids(n, list) }?;
    Ok((wait, event_id(event)))
}

/// Allocates the id of the event an enqueue returns (0: the application wants none).
fn event_id(event: *mut Handle) -> u64 {
    if event.is_null() {
        0
    } else {
        rt::alloc_id()
    }
}

/// Publishes the returned event to the application.
unsafe fn set_event(event: *mut Handle, id: u64) {
    if !event.is_null() {
        // SAFETY: the application's `cl_event *`.
        unsafe { *event = rt::new_object(HandleKind::Event, id) };
    }
}

unsafe fn triple(p: *const usize) -> Result<[usize; 3], ClErr> {
    if p.is_null() {
        return Err(ClErr(CL_INVALID_VALUE));
    }
    // SAFETY: the API passes three size_t values.
    Ok(unsafe { [*p, *p.add(1), *p.add(2)] })
}

/// A request of `op` that holds `m`.
fn encode<'a>(op: Op, m: &impl Message<'a>) -> Writer {
    let mut w = rt::request(op);
    m.encode(&mut w);
    w
}
