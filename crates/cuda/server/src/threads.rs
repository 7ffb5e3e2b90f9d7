//! The driver's per-thread state on the worker's threads, one per lane. A lane that a new
//! program thread takes after the thread that used it ended still carries that thread's state
//! (its context stack, its stream capture mode); natively a new thread starts without it.

use crate::generated::ffi;
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;

/// Contexts popped at the most: a stack deeper than this is not a program's.
const MOST_POPS: usize = 1024;

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`: a thread's mode until it exchanges it.
const CAPTURE_MODE_GLOBAL: u32 = 0;

/// Drops this worker thread's driver state (`threads::FRESH`): pops its contexts until none is
/// current, and sets its capture mode back to the default. Sent without waiting: what fails
/// here is logged, never reported to the program as its own call's error.
pub fn fresh_thread() -> i32 {
    let mut popped = 0;
    loop {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let st = unsafe { ffi::cuCtxGetCurrent(&mut ctx) };
        if st != CUDA_SUCCESS || ctx.is_null() {
            break;
        }
        if popped == MOST_POPS {
            tracing::warn!("a new thread's lane: {MOST_POPS} contexts popped, more remain current");
            break;
        }
        // SAFETY: a valid out-pointer; a context is current.
        let st = unsafe { ffi::cuCtxPopCurrent_v2(&mut ctx) };
        if st != CUDA_SUCCESS {
            tracing::warn!(status = st, "a new thread's lane: a context did not pop");
            break;
        }
        popped += 1;
    }
    let mut mode = CAPTURE_MODE_GLOBAL;
    // SAFETY: a valid in/out pointer to a CUstreamCaptureMode.
    let st = unsafe { ffi::cuThreadExchangeStreamCaptureMode((&mut mode as *mut u32).cast()) };
    if st != CUDA_SUCCESS {
        tracing::warn!(
            status = st,
            "a new thread's lane: the capture mode was not reset"
        );
    }
    tracing::debug!(
        popped,
        "a lane's worker thread starts afresh for a new thread"
    );
    CUDA_SUCCESS
}
