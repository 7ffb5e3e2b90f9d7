//! What the generated entry points and the hand-written ones share: error plumbing, handle
//! conversion, argument encoding, reply decoding.

use crate::connection;
use crate::objects;
use std::borrow::Cow;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{
    DecodeError, HandleKind, Op, Reader, Writer, STREAM_LEGACY_ID, STREAM_PER_THREAD_ID,
};
pub use wormhole_session::trace::{returned as trace_return, Returned};
// What the stubs of `@forgets(...)` calls make the client ask again.
pub use crate::context_facts::{
    forget_contexts, forget_functions, forget_primary_contexts, forget_unloads,
};
use wormhole_session::{host_memory, marshal};

pub use objects::alloc_id;

/// A CUDA status on its way out of an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiErr(pub i32);

impl From<DecodeError> for ApiErr {
    fn from(e: DecodeError) -> Self {
        connection::log(&format!("malformed reply from the server: {e}"));
        ApiErr(CUDA_ERROR_UNKNOWN)
    }
}

/// Runs an entry point; a panic becomes CUDA_ERROR_UNKNOWN (never an unwind into C).
pub fn entry_status(f: impl FnOnce() -> Result<i32, ApiErr>) -> i32 {
    let st = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(st)) => st,
        Ok(Err(ApiErr(code))) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    };
    if is_sticky(st) {
        STICKY.store(true, Ordering::Release);
    }
    st
}

/// Whether the program met a fault that leaves the process "in an inconsistent state" where
/// "any further CUDA work will return the same error" (cuda.h, of these codes): from then on
/// the server's driver answers every call, not what the client kept (`answerable_here`).
static STICKY: AtomicBool = AtomicBool::new(false);

fn is_sticky(st: i32) -> bool {
    matches!(
        st,
        CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTAINED
            | CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_TENSOR_MEMORY_LEAK
            | CUDA_ERROR_EXTERNAL_DEVICE
    )
}

/// A primary context's reset succeeded: the driver took it as a recovery, and so does the
/// client (the server forgets the failures of before too).
pub fn recovered() {
    STICKY.store(false, Ordering::Release);
}

pub fn request(op: Op) -> Writer {
    Writer::new(op as u16)
}

/// The session, or the status a call gets without one: the driver has no device.
fn session() -> Result<&'static connection::Connection, ApiErr> {
    connection::get().map_err(|_| ApiErr(CUDA_ERROR_NO_DEVICE))
}

/// Whether `cuInit` succeeded: until it has, the driver answers every call but the few that
/// need no initialisation (`cuInit`, `cuDriverGetVersion`, the lookups and status texts)
/// with CUDA_ERROR_NOT_INITIALIZED, and so does Wormhole (the server's driver is initialised
/// for its own reasons; the program's must not seem to be).
static INITIALIZED: AtomicBool = AtomicBool::new(false);

pub fn set_initialized() {
    INITIALIZED.store(true, Ordering::Release);
}

/// CUDA_ERROR_NOT_INITIALIZED before a successful `cuInit`.
pub fn check_initialized() -> Result<(), ApiErr> {
    match INITIALIZED.load(Ordering::Acquire) {
        true => Ok(()),
        false => Err(ApiErr(CUDA_ERROR_NOT_INITIALIZED)),
    }
}

/// Whether the client may answer a call from what it keeps (`context_facts`) as the server
/// would: after `cuInit`, outside host functions, with a session that can still carry calls
/// (not gone, not a fork's child's: every call fails there). Otherwise the call goes the
/// server's way, which answers what it gets. (What is kept came from a session: without one
/// opened there is nothing kept to answer from.)
pub fn answerable_here() -> bool {
    check_initialized().is_ok()
        && !STICKY.load(Ordering::Acquire)
        && !crate::host_functions::in_host_function()
        && connection::opened().is_none_or(|c| c.usable())
}

/// CUDA_ERROR_NOT_PERMITTED inside a host function (see `host_functions`).
fn check_permitted() -> Result<(), ApiErr> {
    match crate::host_functions::in_host_function() {
        false => Ok(()),
        true => {
            connection::log(
                "a CUDA call inside a host function: answering CUDA_ERROR_NOT_PERMITTED",
            );
            Err(ApiErr(CUDA_ERROR_NOT_PERMITTED))
        }
    }
}

/// Sends a request and waits for its reply body.
pub fn call(w: Writer) -> Result<Vec<u8>, ApiErr> {
    let op = w.opcode();
    if op != Op::cuInit as u16 && op != Op::cuDriverGetVersion as u16 {
        check_initialized()?;
    }
    check_permitted()?;
    session()?.call(w).map_err(call_failed)
}

/// The status a reply begins with, as an error unless it is success.
pub fn status_of(reply: &[u8]) -> Result<(), ApiErr> {
    match Reader::new(reply).i32()? {
        CUDA_SUCCESS => Ok(()),
        st => Err(ApiErr(st)),
    }
}

/// Sends a request whose errors the client has ruled out, without waiting.
pub fn call_async(w: Writer) -> Result<Vec<u8>, ApiErr> {
    check_initialized()?;
    check_permitted()?;
    session()?.send_async(w).map_err(call_failed)?;
    Ok(CUDA_SUCCESS.to_le_bytes().to_vec())
}

/// The status a call gets when its request could not be carried.
fn call_failed(e: connection::CallError) -> ApiErr {
    use connection::CallError;
    ApiErr(match e {
        CallError::TooLarge => CUDA_ERROR_OUT_OF_MEMORY,
        CallError::Unavailable | CallError::Broken => CUDA_ERROR_DEVICE_UNAVAILABLE,
    })
}

/// A call of an entry point Wormhole does not forward: logged once per entry point (a program
/// may call one in a loop).
pub fn log_unsupported(what: &'static str) {
    wormhole_session::log_unsupported_once(what, "CUDA_ERROR_NOT_SUPPORTED");
}

/// The id of a handle. NULL travels as 0 (the driver then answers what it answers for NULL:
/// for a stream, the default stream); the special streams travel as their fixed ids; anything
/// else that is not a live object of `kind` is refused here with the driver's code.
///
/// # Safety
/// None: `h` is only dereferenced if it is a registered object.
pub unsafe fn id_of(h: *mut c_void, kind: HandleKind, _nullable: bool) -> Result<u64, ApiErr> {
    // Before cuInit the driver answers that, whatever the handle (the generated stubs name
    // their handles before the request goes, where the rest is checked).
    check_initialized()?;
    match (h as usize, kind) {
        (0, _) => Ok(0),
        (1, HandleKind::Stream) => Ok(STREAM_LEGACY_ID),
        (2, HandleKind::Stream) => Ok(STREAM_PER_THREAD_ID),
        // SAFETY: see `objects::get`.
        _ => unsafe { objects::get(h, kind) }
            // A CUkernel stands in for a CUfunction (the driver takes either: cudart passes
            // kernels to launches, occupancy and attribute calls).
            .or_else(|| match kind {
                // SAFETY: as above.
                HandleKind::Function => unsafe { objects::get(h, HandleKind::Kernel) },
                _ => None,
            })
            .map(|o| o.id)
            .ok_or(ApiErr(kind.invalid_code())),
    }
}

/// Waits for `stream` (NULL: the legacy default stream, or the calling thread's own where
/// `per_thread`): the driver's status.
///
/// # Safety
/// `stream` NULL, special, or a handle of the program's (checked by the server).
pub unsafe fn sync_stream(stream: *mut c_void, per_thread: bool) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        match per_thread {
            true => crate::generated::wire_cuStreamSynchronize_ptsz(stream),
            false => crate::generated::wire_cuStreamSynchronize(stream),
        }
    }
}

/// `len` bytes at `p` (NULL → absent). A range the program's memory does not hold is
/// CUDA_ERROR_INVALID_VALUE with a log line, not a crash (see `host_memory::copy_in`).
///
/// # Safety
/// `p` must be NULL or point to memory (see [`host_memory::copy_in`]).
pub unsafe fn bytes_in<'a>(
    p: *const u8,
    len: Option<usize>,
) -> Result<Option<Cow<'a, [u8]>>, ApiErr> {
    if p.is_null() {
        return Ok(None);
    }
    let len = len.ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
    // SAFETY: per the contract.
    unsafe { host_memory::copy_in(p, len) }
        .ok_or_else(|| {
            connection::log(&format!(
                "{len} bytes at {p:?} are not the program's memory: answering CUDA_ERROR_INVALID_VALUE"
            ));
            ApiErr(CUDA_ERROR_INVALID_VALUE)
        })
        .map(Some)
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

/// Reads handles the server returned into the program's array of `cap` entries.
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

pub fn new_object(kind: HandleKind, id: u64) -> *mut c_void {
    objects::new_object(kind, id)
}

/// A destroy call (`@release`): CUDA's destroys are final, so this is always the last one.
///
/// # Safety
/// None: `h` was checked by `id_of` in the same call.
pub unsafe fn release_begin(_h: *mut c_void, _kind: HandleKind) -> bool {
    true
}

/// The destroy's reply: the handle is gone if the driver destroyed the object.
///
/// # Safety
/// As [`release_begin`].
pub unsafe fn release_end(h: *mut c_void, kind: HandleKind, _last: bool, status: i32) {
    if status == CUDA_SUCCESS {
        if matches!(kind, HandleKind::Module | HandleKind::Library) {
            // SAFETY: see `objects::get`.
            if let Some(o) = unsafe { objects::get(h, kind) } {
                crate::allocations::unloaded(o.id);
            }
        }
        objects::destroy(h);
    }
}

/// A synchronisation point passed (nothing to collect yet: copies to the host come back in
/// their replies).
pub fn after_sync() {}

/// A call of the program's, for the trace (`WORMHOLE_TRACE`; None when it is off).
pub fn trace_enter(name: &'static str) -> Option<wormhole_session::trace::Call> {
    wormhole_session::trace::enter(wormhole_cuda_proto::API, name)
}
