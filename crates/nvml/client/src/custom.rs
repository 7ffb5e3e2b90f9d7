//! Entry points whose encoding is written by hand on both sides (`custom` in the
//! description): the compute processes running on a device, as the tenant may see them.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::rt::{self, entry_status, ApiErr};
use std::ffi::c_void;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{HandleKind, Op, Reader, PROCESS_INFO_SIZE, PROCESS_INFO_V1_SIZE};

/// The compute processes on `device` as a tenant sees them: its own only. The worker knows
/// what the tenant holds in device memory, not which of its processes holds it nor (with
/// several GPUs) on which, so the tenant's processes appear as one, the caller, holding all of
/// it on each of its GPUs (none while the tenant holds nothing, as NVML lists only processes
/// with a context). PyTorch asks when it reports an
/// out-of-memory error, and fails with an internal assertion on any status but success.
///
/// # Safety
/// `count` NULL or a writable `u32`; `infos` NULL or `*count` writable entries of `entry`
/// bytes.
unsafe fn running_processes(
    op: Op,
    device: *mut c_void,
    count: *mut c_void,
    infos: *mut c_void,
    entry: usize,
) -> i32 {
    entry_status(|| {
        // SAFETY: `device` is never dereferenced.
        let id = unsafe { rt::id_of(device, HandleKind::Device, false) }?;
        if count.is_null() {
            return Err(ApiErr(NVML_ERROR_INVALID_ARGUMENT));
        }
        let mut w = rt::request(op);
        w.u64(id);
        let reply = rt::call(w)?;
        let mut r = Reader::new(&reply);
        let status = r.i32()?;
        if status != NVML_SUCCESS {
            return Err(ApiErr(status));
        }
        let held = r.u64()?;
        let found = u32::from(held > 0);
        let count = count as *mut u32;
        // SAFETY: per the contract.
        let room = unsafe { count.read_unaligned() };
        // SAFETY: as above. NVML says how many there are whether or not they fit.
        unsafe { count.write_unaligned(found) };
        if found > room {
            return Err(ApiErr(NVML_ERROR_INSUFFICIENT_SIZE));
        }
        if found == 0 {
            return Ok(NVML_SUCCESS);
        }
        if infos.is_null() {
            return Err(ApiErr(NVML_ERROR_INVALID_ARGUMENT));
        }
        let mut info = [0u8; PROCESS_INFO_SIZE];
        info[..4].copy_from_slice(&std::process::id().to_le_bytes());
        info[8..16].copy_from_slice(&held.to_le_bytes());
        // Not a MIG instance: both instance ids are 0xFFFFFFFF, as NVML writes them.
        info[16..].fill(0xFF);
        // SAFETY: per the contract, room for one entry of `entry` bytes.
        unsafe { std::ptr::copy_nonoverlapping(info.as_ptr(), infos as *mut u8, entry) };
        Ok(NVML_SUCCESS)
    })
}

/// `nvmlDeviceGetComputeRunningProcesses` (`nvmlProcessInfo_v1_t` entries).
///
/// # Safety
/// As the C function.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses(
    device: *mut c_void,
    count: *mut c_void,
    infos: *mut c_void,
) -> i32 {
    let op = Op::nvmlDeviceGetComputeRunningProcesses;
    // SAFETY: per the contract.
    unsafe { running_processes(op, device, count, infos, PROCESS_INFO_V1_SIZE) }
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (`nvmlProcessInfo_t` entries).
///
/// # Safety
/// As the C function.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_void,
    infos: *mut c_void,
) -> i32 {
    let op = Op::nvmlDeviceGetComputeRunningProcesses_v2;
    // SAFETY: per the contract.
    unsafe { running_processes(op, device, count, infos, PROCESS_INFO_SIZE) }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` (`nvmlProcessInfo_t` entries).
///
/// # Safety
/// As the C function.
pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_void,
    infos: *mut c_void,
) -> i32 {
    let op = Op::nvmlDeviceGetComputeRunningProcesses_v3;
    // SAFETY: per the contract.
    unsafe { running_processes(op, device, count, infos, PROCESS_INFO_SIZE) }
}
