//! Wormhole's client: an OpenCL ICD (loaded by the system's ICD loader like any vendor driver)
//! that forwards every call of the application to a Wormhole server. Objects handed to the
//! application are small client-side structs whose first field is the ICD dispatch table; they
//! carry the session-local id the server knows the real object by.
//!
//! Nothing here may panic or abort inside the application: every entry point catches panics
//! and every failure becomes an OpenCL error code.

mod connection;
mod custom;
mod includes;
mod local;
mod objects;
pub mod rt;

/// The generated forwarding stubs and ICD dispatch table (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/client_gen.rs"));
}

use std::ffi::{c_char, c_void};

/// The ICD loader's entry point: the platforms this ICD provides.
///
/// # Safety
/// Called by the ICD loader with pointers valid for `num_entries` entries.
#[no_mangle]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    num_entries: u32,
    platforms: *mut *mut c_void,
    num_platforms: *mut u32,
) -> i32 {
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { local::icd_platforms(num_entries, platforms, num_platforms) }
}

/// How the ICD loader finds `clIcdGetPlatformIDsKHR` (and applications, extension functions).
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(name: *const c_char) -> *mut c_void {
    // SAFETY: as above.
    unsafe { local::clGetExtensionFunctionAddress(name) }
}

/// Some loaders ask the ICD directly for platform info before using the dispatch table.
///
/// # Safety
/// As `clGetPlatformInfo`.
#[no_mangle]
pub unsafe extern "C" fn clGetPlatformInfo(
    platform: *mut c_void,
    param_name: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> i32 {
    // SAFETY: as above.
    unsafe { generated::wire_clGetPlatformInfo(platform, param_name, size, value, size_ret) }
}
