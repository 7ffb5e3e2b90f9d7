//! Entry points answered in the client: the platform list (fetched once per process) and the
//! extension-function lookup.

use crate::generated;
use crate::rt::{entry_status, ClErr};
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;
use wormhole_opencl_proto::cl::*;

struct Platforms(Vec<usize>);

/// The server's platforms, asked for once; empty when no server is reachable.
fn platforms() -> &'static [usize] {
    static P: OnceLock<Platforms> = OnceLock::new();
    &P.get_or_init(|| {
        if crate::connection::get().is_none() {
            return Platforms(Vec::new());
        }
        let mut n = 0u32;
        // SAFETY: valid output pointers.
        let st = unsafe { generated::wire_clGetPlatformIDs(0, std::ptr::null_mut(), &mut n) };
        if st != CL_SUCCESS || n == 0 {
            return Platforms(Vec::new());
        }
        let mut v = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: `v` holds n entries.
        let st =
            unsafe { generated::wire_clGetPlatformIDs(n, v.as_mut_ptr(), std::ptr::null_mut()) };
        if st != CL_SUCCESS {
            return Platforms(Vec::new());
        }
        Platforms(v.into_iter().map(|p| p as usize).collect())
    })
    .0
}

/// # Safety
/// Pointers valid for `num_entries` entries, or NULL.
pub unsafe fn icd_platforms(num_entries: u32, out: *mut *mut c_void, num: *mut u32) -> i32 {
    entry_status(|| {
        if (num_entries == 0 && !out.is_null()) || (out.is_null() && num.is_null()) {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let p = platforms();
        if !num.is_null() {
            // SAFETY: per the contract.
            unsafe { *num = p.len() as u32 };
        }
        if p.is_empty() {
            return Ok(CL_PLATFORM_NOT_FOUND_KHR);
        }
        if !out.is_null() {
            for (i, h) in p.iter().take(num_entries as usize).enumerate() {
                // SAFETY: i < num_entries.
                unsafe { *out.add(i) = *h as *mut c_void };
            }
        }
        Ok(CL_SUCCESS)
    })
}

/// # Safety
/// As `clGetPlatformIDs`.
#[allow(non_snake_case)]
pub unsafe extern "C" fn clGetPlatformIDs(
    num_entries: u32,
    out: *mut *mut c_void,
    num: *mut u32,
) -> i32 {
    // SAFETY: forwarded.
    unsafe { icd_platforms(num_entries, out, num) }
}

/// # Safety
/// `name` must be NULL or NUL-terminated.
#[allow(non_snake_case)]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    if name == b"clIcdGetPlatformIDsKHR" {
        return crate::clIcdGetPlatformIDsKHR as *mut c_void;
    }
    generated::lookup(name)
}

/// # Safety
/// As above.
#[allow(non_snake_case)]
pub unsafe extern "C" fn clGetExtensionFunctionAddressForPlatform(
    _platform: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { clGetExtensionFunctionAddress(name) }
}

pub use crate::custom::clCreateSubBuffer;
/// Builds send the headers their `-I` options name first (custom/program.rs).
pub use crate::custom::{clBuildProgram, clCompileProgram};
/// Pipelined when they repeat what the driver accepted or the client can vouch for them
/// (custom/kernel.rs, custom/buffer_commands.rs, custom/events.rs).
pub use crate::custom::{
    clCreateKernel, clEnqueueCopyBuffer, clEnqueueFillBuffer, clEnqueueNDRangeKernel,
    clSetEventCallback,
};

/// Changes a queue's properties (OpenCL 1.0): the kept info answers may name the old ones.
///
/// # Safety
/// As `clSetCommandQueueProperty`.
#[allow(non_snake_case)]
pub unsafe extern "C" fn clSetCommandQueueProperty(
    queue: *mut c_void,
    properties: u64,
    enable: u32,
    old: *mut u64,
) -> i32 {
    // SAFETY: forwarded with the caller's guarantees.
    crate::rt::info::changing(|| unsafe {
        generated::wire_clSetCommandQueueProperty(queue, properties, enable, old)
    })
}

/// Changes a device's default queue: the kept info answers may name the old one.
///
/// # Safety
/// As `clSetDefaultDeviceCommandQueue`.
#[allow(non_snake_case)]
pub unsafe extern "C" fn clSetDefaultDeviceCommandQueue(
    context: *mut c_void,
    device: *mut c_void,
    queue: *mut c_void,
) -> i32 {
    // SAFETY: forwarded with the caller's guarantees.
    crate::rt::info::changing(|| unsafe {
        generated::wire_clSetDefaultDeviceCommandQueue(context, device, queue)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_opencl_proto::extensions::OFFERED_COMMANDS;

    /// The server advertises a registry extension only when the client offers its commands
    /// (proto's build script decides from the description): each must resolve here.
    #[test]
    fn every_advertised_extension_has_its_commands() {
        for (extension, commands) in OFFERED_COMMANDS {
            for command in *commands {
                // The ICD-2 entry points are optional: the loader does without them.
                if *extension == "cl_khr_icd" && *command != "clIcdGetPlatformIDsKHR" {
                    continue;
                }
                let name = std::ffi::CString::new(*command).unwrap();
                // SAFETY: a NUL-terminated name.
                let f = unsafe { clGetExtensionFunctionAddress(name.as_ptr()) };
                assert!(!f.is_null(), "{extension} is advertised, {command} missing");
            }
        }
        assert!(OFFERED_COMMANDS
            .iter()
            .any(|(e, _)| *e == "cl_khr_subgroups"));
    }
}
