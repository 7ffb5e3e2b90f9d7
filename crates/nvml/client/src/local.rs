//! Entry points answered in the client: initialisation and shutdown (which open the session
//! and count, as NVML counts), status texts (which work with no server), and the version check
//! of `nvmlDeviceGetMemoryInfo_v2`'s struct.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::connection;
use crate::generated;
use crate::rt::{self, entry_status, ApiErr};
use std::ffi::c_void;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{
    HandleKind, FABRIC_INFO_V1_SIZE, FABRIC_INFO_V2_SIZE, FABRIC_INFO_V2_VERSION,
    FABRIC_INFO_V3_SIZE, FABRIC_INFO_V3_VERSION,
};

/// `nvmlInit_v2`: opens the session (the first call). Without a server, or with a server that
/// has no NVML, the answer is NVML_ERROR_DRIVER_NOT_LOADED, as NVIDIA's library answers on a
/// machine whose driver is not loaded, and the reason is logged.
///
/// # Safety
/// None (no pointer parameters).
pub unsafe fn nvmlInit_v2() -> i32 {
    entry_status(|| {
        connection::get().map_err(|_| ApiErr(NVML_ERROR_DRIVER_NOT_LOADED))?;
        rt::initialized();
        Ok(NVML_SUCCESS)
    })
}

/// `nvmlInit` (the first ABI): initialises as `nvmlInit_v2` does.
///
/// # Safety
/// None (no pointer parameters).
pub unsafe fn nvmlInit() -> i32 {
    // SAFETY: no pointer parameters.
    unsafe { nvmlInit_v2() }
}

/// `nvmlInitWithFlags`: the flags say which devices NVML may skip attaching to (those that
/// failed to attach, or all of them); the server's NVML attached as it needed, so they change
/// nothing that a tenant can see.
///
/// # Safety
/// None (no pointer parameters).
pub unsafe fn nvmlInitWithFlags(_flags: u32) -> i32 {
    // SAFETY: no pointer parameters.
    unsafe { nvmlInit_v2() }
}

/// `nvmlShutdown`: one initialisation fewer; NVML_ERROR_UNINITIALIZED if none was in force.
///
/// # Safety
/// None (no pointer parameters).
pub unsafe fn nvmlShutdown() -> i32 {
    match rt::shut_down() {
        true => NVML_SUCCESS,
        false => NVML_ERROR_UNINITIALIZED,
    }
}

/// `nvmlErrorString`: a static text for every status.
///
/// # Safety
/// None (no pointer parameters).
pub unsafe fn nvmlErrorString(result: i32) -> *mut c_void {
    error_string(result).as_ptr() as *mut c_void
}

/// `nvmlDeviceGetMemoryInfo_v2`: the caller names the struct's version in it; a version this
/// library does not know is refused as NVIDIA's library refuses it, before anything is sent.
///
/// # Safety
/// `memory` NULL or a writable `nvmlMemory_v2_t`.
pub unsafe fn nvmlDeviceGetMemoryInfo_v2(device: *mut c_void, memory: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if memory.is_null() {
            return Err(ApiErr(NVML_ERROR_INVALID_ARGUMENT));
        }
        // SAFETY: per the contract (the version is the struct's first field).
        let version = unsafe { (memory as *const u32).read_unaligned() };
        if version != wormhole_nvml_proto::MEMORY_V2_VERSION {
            // What driver 580's NVML answers (seen for version 1), not the
            // NVML_ERROR_ARGUMENT_VERSION_MISMATCH one might expect.
            return Err(ApiErr(NVML_ERROR_FUNCTION_NOT_FOUND));
        }
        // SAFETY: per the contract.
        Ok(unsafe { generated::wire_nvmlDeviceGetMemoryInfo_v2(device, memory) })
    })
}

/// The length of the fabric info struct whose first field is `version` (the versioned form),
/// if this library knows that version.
fn fabric_info_len(version: u32) -> Option<usize> {
    match version {
        FABRIC_INFO_V2_VERSION => Some(FABRIC_INFO_V2_SIZE),
        FABRIC_INFO_V3_VERSION => Some(FABRIC_INFO_V3_SIZE),
        _ => None,
    }
}

/// The fabric `device` is on, as a tenant may use it: none. Sharing memory across the fabric
/// (fabric handles) is not forwarded, so the answer is NVML's for a GPU on no fabric: success,
/// every field zero (`NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`) after the version. PyTorch asks
/// before choosing how its expandable segments may be shared, and fails on any other status.
///
/// # Safety
/// `info` NULL or `len` writable bytes.
unsafe fn no_fabric(device: *mut c_void, info: *mut c_void, versioned: bool) -> i32 {
    entry_status(|| {
        // SAFETY: `id_of` dereferences only registered objects.
        unsafe { rt::id_of(device, HandleKind::Device, false) }?;
        if info.is_null() {
            return Err(ApiErr(NVML_ERROR_INVALID_ARGUMENT));
        }
        let (skip, len) = match versioned {
            // SAFETY: per the contract (the version is the struct's first field).
            true => match fabric_info_len(unsafe { (info as *const u32).read_unaligned() }) {
                Some(len) => (4, len),
                None => return Err(ApiErr(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)),
            },
            false => (0, FABRIC_INFO_V1_SIZE),
        };
        // SAFETY: per the contract, the struct of that version is writable.
        unsafe { std::ptr::write_bytes((info as *mut u8).add(skip), 0, len - skip) };
        Ok(NVML_SUCCESS)
    })
}

/// `nvmlDeviceGetGpuFabricInfoV`: see `no_fabric`.
///
/// # Safety
/// `info` NULL or a writable `nvmlGpuFabricInfo_v2_t`/`_v3_t` of the version it names.
pub unsafe fn nvmlDeviceGetGpuFabricInfoV(device: *mut c_void, info: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { no_fabric(device, info, true) }
}

/// `nvmlDeviceGetGpuFabricInfo` (the unversioned struct): see `no_fabric`.
///
/// # Safety
/// `info` NULL or a writable `nvmlGpuFabricInfo_t`.
pub unsafe fn nvmlDeviceGetGpuFabricInfo(device: *mut c_void, info: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { no_fabric(device, info, false) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_info_versions_are_the_two_nvml_h_has() {
        assert_eq!(fabric_info_len(FABRIC_INFO_V2_VERSION), Some(36));
        assert_eq!(fabric_info_len(FABRIC_INFO_V3_VERSION), Some(40));
        assert_eq!(fabric_info_len(0), None);
        assert_eq!(fabric_info_len(40 | 4 << 24), None);
    }
}
