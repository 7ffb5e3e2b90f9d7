//! The ends of contexts: a destroyed context, and a primary context reset or released for the
//! last time, take every allocation made in them with them (the driver frees them), so the
//! session forgets those ranges and gives their bytes back to the tenant's quota. Without
//! that a program that resets its device (`cudaDeviceReset`) and allocates again would find
//! its quota spent, and ranges it no longer has would still pass the session's checks.

// Handlers keep the C names of the entry points they answer.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::{Call, Handle};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{DecodeError, HandleKind, Writer};

/// Context `ctx` ended: its allocations are forgotten and their bytes given back.
fn ended(s: &Call<'_>, ctx: Handle) {
    let bytes = s.context_ended(ctx);
    if bytes > 0 {
        s.limits().release(bytes);
        tracing::info!(bytes, "a context ended: its device memory went with it");
    }
}

/// `cuCtxDestroy_v2`.
pub fn cuCtxDestroy_v2(
    s: &Call<'_>,
    a: args::cuCtxDestroy_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let ctx = match s.resolve(a.ctx_id, HandleKind::Context, false) {
        Ok(ctx) => ctx,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    // SAFETY: a context of the session's.
    let st = unsafe { ffi::cuCtxDestroy_v2(ctx) };
    if st == CUDA_SUCCESS {
        if a.last {
            s.forget(a.ctx_id);
        }
        ended(s, ctx);
    }
    w.i32(st);
    Ok(())
}

/// A primary context reset (`v2`: the `_v2` entry point) on the tenant's device `dev`.
fn reset(s: &Call<'_>, dev: i32, v2: bool, w: &mut Writer) {
    let dev = match crate::rt::driver_device(s, dev) {
        Ok(dev) => dev,
        Err(st) => return w.i32(st),
    };
    let primary = crate::export_tables::driver_primary_context(dev).ok();
    // SAFETY: a device of the driver's.
    let st = unsafe {
        match v2 {
            true => ffi::cuDevicePrimaryCtxReset_v2(dev),
            false => ffi::cuDevicePrimaryCtxReset(dev),
        }
    };
    if let (CUDA_SUCCESS, Some(primary)) = (st, primary) {
        ended(s, primary);
    }
    w.i32(st);
}

/// A primary context release on the tenant's device `dev`: the last one ends the context.
fn release(s: &Call<'_>, dev: i32, v2: bool, w: &mut Writer) {
    let dev = match crate::rt::driver_device(s, dev) {
        Ok(dev) => dev,
        Err(st) => return w.i32(st),
    };
    let primary = crate::export_tables::driver_primary_context(dev).ok();
    // SAFETY: a device of the driver's.
    let st = unsafe {
        match v2 {
            true => ffi::cuDevicePrimaryCtxRelease_v2(dev),
            false => ffi::cuDevicePrimaryCtxRelease(dev),
        }
    };
    if st == CUDA_SUCCESS {
        let (mut flags, mut active) = (0u32, 1u32);
        // SAFETY: a device of the driver's and valid outputs.
        let asked = unsafe { ffi::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
        if let (CUDA_SUCCESS, 0, Some(primary)) = (asked, active, primary) {
            ended(s, primary);
        }
    }
    w.i32(st);
}

/// `cuDevicePrimaryCtxReset`.
pub fn cuDevicePrimaryCtxReset(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxReset,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    reset(s, a.dev, false, w);
    Ok(())
}

/// `cuDevicePrimaryCtxReset_v2` (`cudaDeviceReset`).
pub fn cuDevicePrimaryCtxReset_v2(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxReset_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    reset(s, a.dev, true, w);
    Ok(())
}

/// `cuDevicePrimaryCtxRelease`.
pub fn cuDevicePrimaryCtxRelease(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxRelease,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    release(s, a.dev, false, w);
    Ok(())
}

/// `cuDevicePrimaryCtxRelease_v2`.
pub fn cuDevicePrimaryCtxRelease_v2(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxRelease_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    release(s, a.dev, true, w);
    Ok(())
}
