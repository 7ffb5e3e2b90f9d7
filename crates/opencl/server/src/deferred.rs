//! Where OpenCL reports the failure of a pipelined call (see the core's `deferred` module):
//! at the next `clFinish` of its queue, or `clWaitForEvents` on an event of that queue.
//! Failures of calls that name no queue (kernel arguments, retain/release) go to the next
//! synchronisation point of the session, whichever queue it names.

use crate::generated::ffi;
use crate::session::{Handle, Session};
use std::ffi::c_void;
use wormhole_opencl_proto::{cl::*, HandleKind, Op, Reader};
use wormhole_server::deferred::SESSION;

/// The key a failed pipelined call `opcode` is kept under, given its first argument.
pub fn key(opcode: u16, first: u64) -> u64 {
    match Op::from_u16(opcode) {
        Some(Op::clFlush | Op::clEnqueueNDRangeKernel) => first,
        _ => SESSION,
    }
}

/// The queues (by id) of the events a `clWaitForEvents` request waits for.
pub fn event_queues(s: &Session, mut r: Reader<'_>) -> Vec<u64> {
    let Ok(n) = r.u32() else { return Vec::new() };
    let Ok(Some(ids)) = r.opt_u64s() else {
        return Vec::new();
    };
    ids.iter()
        .take(n as usize)
        .filter_map(|id| s.resolve(*id, HandleKind::Event, false).ok())
        .filter_map(|ev| {
            let mut q: Handle = std::ptr::null_mut();
            // SAFETY: a live event of this session; the output is one handle.
            let st = unsafe {
                ffi::clGetEventInfo(
                    ev,
                    CL_EVENT_COMMAND_QUEUE,
                    std::mem::size_of::<Handle>(),
                    &mut q as *mut Handle as *mut c_void,
                    std::ptr::null_mut(),
                )
            };
            (st == CL_SUCCESS && !q.is_null()).then(|| s.export(HandleKind::Queue, q))
        })
        .collect()
}
