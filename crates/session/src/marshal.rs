//! What every API's client does with the program's arguments and the server's replies alike:
//! C strings in, output values and returned objects out. Each API's runtime wraps these with
//! its own error type (a malformed reply is a `DecodeError` either way).

use std::ffi::{c_char, c_void, CStr};
use wormhole_wire::{DecodeError, Reader};

/// The bytes of a C string (NULL → absent), without its NUL.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub unsafe fn cstr_in<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Copies an output value of the reply into the program's buffer of `cap` bytes (what does
/// not fit is left out, as the driver leaves it).
///
/// # Safety
/// `dst` must point to `cap` writable bytes.
pub unsafe fn copy_out(
    r: &mut Reader<'_>,
    dst: *mut u8,
    cap: Option<usize>,
) -> Result<(), DecodeError> {
    let b = r.bytes()?;
    let n = b.len().min(cap.unwrap_or(0));
    // SAFETY: n <= cap.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, n) };
    Ok(())
}

/// Reads the objects a reply returns (a count, then an id each) into the program's array of
/// `cap` entries, each id made the program's handle by `object`.
///
/// # Safety
/// `dst` must point to `cap` writable handles.
pub unsafe fn read_objects(
    r: &mut Reader<'_>,
    dst: *mut *mut c_void,
    cap: usize,
    object: impl Fn(u64) -> *mut c_void,
) -> Result<(), DecodeError> {
    let n = r.u32()? as usize;
    for i in 0..n {
        let id = r.u64()?;
        if i < cap {
            // SAFETY: i < cap.
            unsafe { *dst.add(i) = object(id) };
        }
    }
    Ok(())
}
