//! What the generated handlers share: length checks, output buffers, device-address checks.

use crate::generated::ffi;
use crate::session::{Handle, Session};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{HandleKind, Op};

/// The largest value one output parameter may carry back (a name, a UUID: small; copies to
/// the host larger than a frame take another path).
const MAX_OUT: usize = 64 << 20;
const MAX_HANDLES: u32 = 1 << 16;

pub fn check_len(actual: Option<usize>, expected: Option<usize>) -> Result<(), i32> {
    match (actual, expected) {
        (None, _) => Ok(()),
        (Some(a), Some(e)) if a == e => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn out_buffer(len: Option<usize>) -> Result<Vec<u8>, i32> {
    match len {
        None => Err(CUDA_ERROR_INVALID_VALUE),
        Some(n) if n > MAX_OUT => {
            tracing::warn!(
                bytes = n,
                "an output larger than a reply frame is not forwarded yet"
            );
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
        Some(n) => Ok(vec![0; n]),
    }
}

pub fn handle_buffer(count: u32) -> Result<Vec<Handle>, i32> {
    if count > MAX_HANDLES {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(vec![std::ptr::null_mut(); count as usize])
}

/// A device address from the wire: the call may touch `len` bytes there only if the session
/// allocated them (another session's memory is another process's, but the worker's own host
/// memory is addressable through unified addressing too).
pub fn check_device(s: &Session, addr: u64, len: Option<usize>) -> Result<(), i32> {
    let len = len.ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
    if s.owns(addr, len.max(1)) {
        return Ok(());
    }
    tracing::warn!(
        addr = format_args!("{addr:#x}"),
        len,
        "refused a device range the session did not allocate"
    );
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// Per-object dispatch checks (OpenCL's driver slots): CUDA has none.
pub fn check_slot(_obj: Handle, _op: Op) -> Result<(), i32> {
    Ok(())
}

/// An object the driver made but the session could not bind (its id was taken meanwhile):
/// destroyed again, so nothing leaks.
pub fn release(kind: HandleKind, obj: Handle) {
    // SAFETY: `obj` was just made by the driver, is of `kind`, and nobody else knows it.
    let st = unsafe {
        match kind {
            HandleKind::Context => ffi::cuCtxDestroy_v2(obj),
            HandleKind::Module => ffi::cuModuleUnload(obj),
            HandleKind::Stream => ffi::cuStreamDestroy_v2(obj),
            HandleKind::Event => ffi::cuEventDestroy_v2(obj),
            // A function belongs to its module.
            HandleKind::Function => CUDA_SUCCESS,
        }
    };
    if st != CUDA_SUCCESS {
        tracing::warn!(?kind, status = st, "could not destroy an unbound object");
    }
}
