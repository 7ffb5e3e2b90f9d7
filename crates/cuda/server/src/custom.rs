//! The hand-written handlers (`@server_entry`): device memory, which the tenant's quota bounds
//! and whose ranges later calls may name, and the memory figures a tenant sees (its quota is
//! its device's size).

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::Call;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{DecodeError, Writer};

/// `cuMemAlloc_v2`: reserved against the tenant's quota first; the range is the session's
/// until `cuMemFree_v2`.
pub fn cuMemAlloc_v2(
    s: &Call<'_>,
    a: args::cuMemAlloc_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let bytes = a.bytesize as u64;
    if !s.limits().reserve(bytes) {
        w.i32(CUDA_ERROR_OUT_OF_MEMORY);
        return Ok(());
    }
    let mut dptr = 0u64;
    // SAFETY: a valid output pointer.
    let st = unsafe { ffi::cuMemAlloc_v2(&mut dptr, a.bytesize) };
    if st != CUDA_SUCCESS {
        s.limits().release(bytes);
        w.i32(st);
        return Ok(());
    }
    s.allocated(dptr, bytes);
    w.i32(CUDA_SUCCESS);
    if a.dptr_present {
        w.u64(dptr);
    }
    Ok(())
}

/// `cuMemFree_v2`: only the start of an allocation of this session.
pub fn cuMemFree_v2(
    s: &Call<'_>,
    a: args::cuMemFree_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let Some(len) = s.freed(a.dptr) else {
        if a.dptr != 0 {
            tracing::warn!(
                dptr = format_args!("{:#x}", a.dptr),
                "cuMemFree of an address the session did not allocate"
            );
        }
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    };
    // SAFETY: a value argument: an allocation of this session.
    let st = unsafe { ffi::cuMemFree_v2(a.dptr) };
    if st == CUDA_SUCCESS {
        s.limits().release(len);
    } else {
        // Still allocated as far as the driver is concerned.
        s.allocated(a.dptr, len);
    }
    w.i32(st);
    Ok(())
}

/// The device memory a tenant may use: its quota, where that is less than the device's.
fn quota_view(s: &Call<'_>, total: u64, free: u64) -> (u64, u64) {
    match s.limits().mem_quota {
        Some(q) => {
            let held = s.limits().tenant_bytes().max(0) as u64;
            (total.min(q), free.min(q.saturating_sub(held)))
        }
        None => (total, free),
    }
}

/// `cuMemGetInfo_v2`, as the tenant sees it.
pub fn cuMemGetInfo_v2(
    s: &Call<'_>,
    a: args::cuMemGetInfo_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid output pointers.
    let st = unsafe { ffi::cuMemGetInfo_v2(&mut free, &mut total) };
    w.i32(st);
    if st == CUDA_SUCCESS {
        let (total, free) = quota_view(s, total as u64, free as u64);
        if a.free_present {
            w.u64(free);
        }
        if a.total_present {
            w.u64(total);
        }
    }
    Ok(())
}

/// `cuDeviceTotalMem_v2`, as the tenant sees it.
pub fn cuDeviceTotalMem_v2(
    s: &Call<'_>,
    a: args::cuDeviceTotalMem_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let mut bytes = 0usize;
    // SAFETY: a valid output pointer.
    let st = unsafe { ffi::cuDeviceTotalMem_v2(&mut bytes, a.dev) };
    w.i32(st);
    if st == CUDA_SUCCESS && a.bytes_present {
        w.u64(quota_view(s, bytes as u64, bytes as u64).0);
    }
    Ok(())
}
