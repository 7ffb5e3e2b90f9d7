//! What the generated entry points and the hand-written ones share: error plumbing, the
//! initialisation count, handle conversion, reply decoding.

use crate::connection;
use crate::objects;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{DecodeError, HandleKind, Op, Reader, Writer};
use wormhole_session::marshal;
pub use wormhole_session::trace::{returned as trace_return, Returned};

/// An NVML status on its way out of an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiErr(pub i32);

impl From<DecodeError> for ApiErr {
    fn from(e: DecodeError) -> Self {
        connection::log(&format!("malformed reply from the server: {e}"));
        ApiErr(NVML_ERROR_UNKNOWN)
    }
}

/// Runs an entry point; a panic becomes NVML_ERROR_UNKNOWN (never an unwind into C).
pub fn entry_status(f: impl FnOnce() -> Result<i32, ApiErr>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(st)) => st,
        Ok(Err(ApiErr(code))) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

pub fn request(op: Op) -> Writer {
    Writer::new(op as u16)
}

/// How many `nvmlInit`s are not yet matched by an `nvmlShutdown`: NVML counts them, and
/// answers NVML_ERROR_UNINITIALIZED while the count is zero (the server's NVML is initialised
/// for its own reasons; the program's must not seem to be).
static INITS: AtomicU32 = AtomicU32::new(0);

pub fn initialized() {
    INITS.fetch_add(1, Ordering::AcqRel);
}

/// One `nvmlShutdown`: false if there was no `nvmlInit` to match.
pub fn shut_down() -> bool {
    INITS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// NVML_ERROR_UNINITIALIZED while no `nvmlInit` is in force.
pub fn check_initialized() -> Result<(), ApiErr> {
    match INITS.load(Ordering::Acquire) {
        0 => Err(ApiErr(NVML_ERROR_UNINITIALIZED)),
        _ => Ok(()),
    }
}

/// Sends a request and waits for its reply body.
pub fn call(w: Writer) -> Result<Vec<u8>, ApiErr> {
    check_initialized()?;
    let session = connection::get().map_err(|_| ApiErr(NVML_ERROR_DRIVER_NOT_LOADED))?;
    session.call(w).map_err(|e| {
        use connection::CallError;
        ApiErr(match e {
            CallError::TooLarge => NVML_ERROR_MEMORY,
            CallError::Unavailable | CallError::Broken => NVML_ERROR_GPU_IS_LOST,
        })
    })
}

/// A call of an entry point Wormhole does not forward: logged once per entry point (a tool
/// may call one for every device, every second).
pub fn log_unsupported(what: &'static str) {
    wormhole_session::log_unsupported_once(what, "NVML_ERROR_NOT_SUPPORTED");
}

/// The id of a device handle; anything that is not one the server returned is refused here
/// with NVML's code for a bad handle.
///
/// # Safety
/// None: `h` is never dereferenced.
pub unsafe fn id_of(h: *mut c_void, kind: HandleKind, _nullable: bool) -> Result<u64, ApiErr> {
    // Before nvmlInit (or after the last nvmlShutdown) NVML answers that, whatever the handle.
    check_initialized()?;
    objects::id_of(h, kind).ok_or(ApiErr(kind.invalid_code()))
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub unsafe fn cstr_in<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: per the contract.
    unsafe { marshal::cstr_in(p) }
}

/// Copies an output value into the program's buffer of `cap` bytes.
///
/// # Safety
/// `dst` must point to `cap` writable bytes.
pub unsafe fn copy_out(r: &mut Reader<'_>, dst: *mut u8, cap: Option<usize>) -> Result<(), ApiErr> {
    // SAFETY: per the contract.
    Ok(unsafe { marshal::copy_out(r, dst, cap) }?)
}

/// Reads the devices the server returned into the program's array of `cap` entries.
///
/// # Safety
/// `dst` must point to `cap` writable handles.
pub unsafe fn read_handles(
    r: &mut Reader<'_>,
    dst: *mut *mut c_void,
    cap: usize,
    kind: HandleKind,
) -> Result<(), ApiErr> {
    // SAFETY: per the contract.
    Ok(unsafe { marshal::read_objects(r, dst, cap, |id| objects::object_for_id(kind, id)) }?)
}

/// A call of the program's, for the trace (`WORMHOLE_TRACE`; None when it is off).
pub fn trace_enter(name: &'static str) -> Option<wormhole_session::trace::Call> {
    wormhole_session::trace::enter(wormhole_nvml_proto::API, name)
}
