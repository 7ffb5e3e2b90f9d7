//! What the generated stubs and the hand-written entry points share: error plumbing, handle
//! conversion, argument encoding, reply decoding.

pub mod abi;
pub mod callbacks;
pub mod info;
pub mod pending;
pub mod props;

use crate::connection;
use crate::objects;
use std::borrow::Cow;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use wormhole_opencl_proto::{cl::*, DecodeError, HandleKind, Op, Reader, Writer};
pub use wormhole_session::trace::{returned as trace_return, Returned};
use wormhole_session::{host_memory, marshal};

pub use objects::alloc_id;

/// An OpenCL error code on its way out of an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClErr(pub i32);

/// The name generated stubs use for an entry point's error, whatever the API.
pub use ClErr as ApiErr;

impl From<DecodeError> for ClErr {
    fn from(e: DecodeError) -> Self {
        connection::log(&format!("malformed reply from the server: {e}"));
        ClErr(CL_OUT_OF_RESOURCES)
    }
}

/// Runs an entry point that returns a status; a panic becomes CL_OUT_OF_HOST_MEMORY.
pub fn entry_status(f: impl FnOnce() -> Result<i32, ClErr>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(st)) => st,
        Ok(Err(ClErr(code))) => code,
        Err(_) => CL_OUT_OF_HOST_MEMORY,
    }
}

/// Runs an entry point that returns an object and reports through `errcode_ret`.
// `errcode_ret` comes straight from the application's call, which OpenCL requires to be a valid
// `cl_int *` or NULL; every caller is itself an `unsafe extern "C"` entry point.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn entry_handle(
    errcode_ret: *mut i32,
    f: impl FnOnce() -> Result<*mut c_void, ClErr>,
) -> *mut c_void {
    let (h, code) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(h)) => (h, CL_SUCCESS),
        Ok(Err(ClErr(code))) => (std::ptr::null_mut(), code),
        Err(_) => (std::ptr::null_mut(), CL_OUT_OF_HOST_MEMORY),
    };
    if !errcode_ret.is_null() {
        // SAFETY: the application passed a valid `cl_int *` or NULL.
        unsafe { *errcode_ret = code };
    }
    h
}

pub fn request(op: Op) -> Writer {
    Writer::new(op as u16)
}

thread_local! {
    static NEXT_ASYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The next `call` of this thread goes out without waiting (see `call_async`): for hand-written
/// entry points that validated a generated stub's call completely.
pub fn send_next_async() {
    NEXT_ASYNC.with(|a| a.set(true));
}

/// Sends a request and waits for its reply body.
pub fn call(w: Writer) -> Result<Vec<u8>, ClErr> {
    if NEXT_ASYNC.with(|a| a.replace(false)) {
        return call_async(w);
    }
    crate::custom::push_fine();
    let conn = connection::get().ok_or(ClErr(CL_OUT_OF_RESOURCES))?;
    conn.call(w).map_err(call_failed)
}

/// A call with bulk data (see `Connection::call_bulk`).
pub fn call_bulk(
    w: Writer,
    payload: &[u8],
    sink: Option<(usize, &mut [u8])>,
) -> Result<(Vec<u8>, bool), ClErr> {
    crate::custom::push_fine();
    let conn = connection::get().ok_or(ClErr(CL_OUT_OF_RESOURCES))?;
    conn.call_bulk(w, payload, sink).map_err(call_failed)
}

/// Sends a request whose every error the client has already ruled out, without waiting: the
/// reply is CL_SUCCESS by construction. The lane keeps it in order with the thread's later
/// calls; the server logs (and counts) a failure it did not expect.
pub fn call_async(w: Writer) -> Result<Vec<u8>, ClErr> {
    call_async_bulk(w, &[])
}

/// `call_async` with bulk data that follows the request straight from the application's
/// memory (copied into the lane before this returns).
pub fn call_async_bulk(w: Writer, payload: &[u8]) -> Result<Vec<u8>, ClErr> {
    crate::custom::push_fine();
    let conn = connection::get().ok_or(ClErr(CL_OUT_OF_RESOURCES))?;
    conn.send_async_bulk(w, payload).map_err(call_failed)?;
    Ok(CL_SUCCESS.to_le_bytes().to_vec())
}

pub fn log_unsupported(what: &str) {
    connection::log(&format!(
        "{what} is not forwarded by Wormhole; returning CL_INVALID_OPERATION"
    ));
}

/// The id of an application handle. NULL travels as 0 (the server's driver then reports what
/// native OpenCL reports for NULL); anything that is not a live object of `kind` is refused
/// here with the native code.
///
/// # Safety
/// `h` must be NULL or a handle the application got from an OpenCL call.
pub unsafe fn id_of(h: *mut c_void, kind: HandleKind, _nullable: bool) -> Result<u64, ClErr> {
    if h.is_null() {
        return Ok(0);
    }
    // SAFETY: per the contract.
    unsafe { objects::get(h, kind) }
        .map(|o| o.id)
        .ok_or(ClErr(kind.invalid_code()))
}

/// Encodes an array of `count` handles (absent when the pointer is NULL).
///
/// # Safety
/// `list` must be NULL or point to `count` handles.
pub unsafe fn encode_handles(
    w: &mut Writer,
    list: *const *mut c_void,
    count: usize,
    kind: HandleKind,
    code: i32,
) -> Result<(), ClErr> {
    // SAFETY: per the contract.
    let ids = unsafe { handle_ids(list, count, kind, code) }?;
    w.opt_u64s(ids.as_deref());
    Ok(())
}

/// The ids of an array of `count` handles (None when the pointer is NULL); `code` for a bad
/// handle.
///
/// # Safety
/// `list` must be NULL or point to `count` handles.
pub unsafe fn handle_ids(
    list: *const *mut c_void,
    count: usize,
    kind: HandleKind,
    code: i32,
) -> Result<Option<Vec<u64>>, ClErr> {
    if list.is_null() {
        return Ok(None);
    }
    if count > 1 << 20 {
        return Err(ClErr(CL_INVALID_VALUE));
    }
    let mut ids = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: `list` holds `count` handles.
        let h = unsafe { *list.add(i) };
        // SAFETY: each element is a handle the application got from OpenCL.
        let o = unsafe { objects::get(h, kind) }.ok_or(ClErr(code))?;
        ids.push(o.id);
    }
    Ok(Some(ids))
}

/// `len` bytes at `p` (NULL → absent). A range the application's memory does not hold (a
/// length the driver would refuse before reading) is CL_INVALID_VALUE, not a crash (see
/// `wormhole_session::host_memory`).
///
/// # Safety
/// `p` must be NULL or point to memory (see [`host_memory::copy_in`]).
pub unsafe fn bytes_in<'a>(
    p: *const u8,
    len: Option<usize>,
) -> Result<Option<Cow<'a, [u8]>>, ClErr> {
    if p.is_null() {
        return Ok(None);
    }
    let len = len.ok_or(ClErr(CL_INVALID_VALUE))?;
    // SAFETY: per the contract.
    unsafe { app_bytes(p, len, CL_INVALID_VALUE) }.map(Some)
}

/// `len` bytes of the application's memory at `p` (see [`host_memory::copy_in`]); a range it
/// does not hold is `refusal`, the driver's answer to such a length, with a log line.
///
/// # Safety
/// As [`host_memory::copy_in`].
pub unsafe fn app_bytes<'a>(
    p: *const u8,
    len: usize,
    refusal: i32,
) -> Result<Cow<'a, [u8]>, ClErr> {
    // SAFETY: per the contract.
    unsafe { host_memory::copy_in(p, len) }.ok_or_else(|| {
        connection::log(&format!(
            "{len} bytes at {p:?} are not the application's memory: answering {refusal}"
        ));
        ClErr(refusal)
    })
}

/// The most values one size_t array of a request carries (work sizes, origins, regions: no
/// device has more than a few dimensions).
pub const MAX_USIZES: usize = 64;

/// # Safety
/// `p` must be NULL or point to `count` size_t values.
pub unsafe fn usizes_in(p: *const usize, count: Option<usize>) -> Result<Option<Vec<u64>>, ClErr> {
    if p.is_null() {
        return Ok(None);
    }
    let n = count.ok_or(ClErr(CL_INVALID_VALUE))?;
    if n > MAX_USIZES {
        return Err(ClErr(CL_INVALID_VALUE));
    }
    // SAFETY: per the contract.
    Ok(Some((0..n).map(|i| unsafe { *p.add(i) } as u64).collect()))
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub unsafe fn cstr_in<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: per the contract.
    unsafe { marshal::cstr_in(p) }
}

/// # Safety
/// `p` must be NULL or point to `count` strings (each NULL or NUL-terminated).
pub unsafe fn encode_strs(
    w: &mut Writer,
    p: *const *const c_char,
    count: usize,
) -> Result<(), ClErr> {
    w.bool(!p.is_null());
    if p.is_null() {
        return Ok(());
    }
    w.u32(count as u32);
    for i in 0..count {
        // SAFETY: per the contract.
        let s = unsafe { *p.add(i) };
        if s.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        w.bytes(unsafe { CStr::from_ptr(s) }.to_bytes());
    }
    Ok(())
}

/// Copies an output value into the program's buffer of `cap` bytes.
///
/// # Safety
/// `dst` must point to `cap` writable bytes.
pub unsafe fn copy_out(r: &mut Reader<'_>, dst: *mut u8, cap: Option<usize>) -> Result<(), ClErr> {
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
) -> Result<(), ClErr> {
    // SAFETY: per the contract.
    Ok(unsafe { marshal::read_objects(r, dst, cap, |id| objects::object_for_id(kind, id)) }?)
}

pub fn new_object(kind: HandleKind, id: u64) -> *mut c_void {
    objects::new_object(kind, id, None)
}

/// # Safety
/// `h` was validated by `id_of` in the same call.
pub unsafe fn retained(h: *mut c_void, kind: HandleKind) {
    // SAFETY: per the contract.
    if let Some(o) = unsafe { objects::get(h, kind) } {
        objects::retained(o);
    }
}

/// # Safety
/// As `retained`.
pub unsafe fn release_begin(h: *mut c_void, kind: HandleKind) -> bool {
    // SAFETY: per the contract.
    unsafe { objects::get(h, kind) }.is_some_and(objects::release_begin)
}

/// # Safety
/// As `retained`.
pub unsafe fn release_end(h: *mut c_void, kind: HandleKind, last: bool, status: i32) {
    // SAFETY: per the contract.
    if unsafe { objects::get(h, kind) }.is_some() {
        objects::release_end(h, last, status);
    }
}

/// A synchronisation point passed: fetch the data of non-blocking reads that completed.
pub fn after_sync() {
    pending::collect();
    crate::custom::pull_fine();
}

/// The status an OpenCL call returns when its request could not be carried.
fn call_failed(e: crate::connection::CallError) -> ClErr {
    use crate::connection::CallError;
    ClErr(match e {
        // Not sent; the session goes on, as after any allocation failure.
        CallError::TooLarge => CL_OUT_OF_HOST_MEMORY,
        CallError::Unavailable | CallError::Broken => CL_OUT_OF_RESOURCES,
    })
}

/// A call of the program's, for the trace (`WORMHOLE_TRACE`; None when it is off).
pub fn trace_enter(name: &'static str) -> Option<wormhole_session::trace::Call> {
    wormhole_session::trace::enter(wormhole_opencl_proto::API, name)
}
