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

/// What is done to a primary context.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Primary {
    /// Reset: it ends.
    Reset,
    /// Released: the last release ends it.
    Release,
}

/// A primary context reset or release (`v2`: by the `_v2` entry point) on the tenant's device
/// `dev`; if the context ended, its allocations go.
fn primary_context(s: &Call<'_>, dev: i32, what: Primary, v2: bool, w: &mut Writer) {
    let dev = match crate::rt::driver_device(s, dev) {
        Ok(dev) => dev,
        Err(st) => return w.i32(st),
    };
    let primary = crate::export_tables::driver_primary_context(dev).ok();
    // A warm context the program has not retained is not there for it (`warm`).
    crate::warm::before_primary_change(dev);
    // SAFETY: a device of the driver's.
    let st = unsafe {
        match (what, v2) {
            (Primary::Reset, true) => ffi::cuDevicePrimaryCtxReset_v2(dev),
            (Primary::Reset, false) => ffi::cuDevicePrimaryCtxReset(dev),
            (Primary::Release, true) => ffi::cuDevicePrimaryCtxRelease_v2(dev),
            (Primary::Release, false) => ffi::cuDevicePrimaryCtxRelease(dev),
        }
    };
    let ended_now = st == CUDA_SUCCESS
        && (what == Primary::Reset || {
            let (mut flags, mut active) = (0u32, 1u32);
            // SAFETY: a device of the driver's and valid outputs.
            let asked = unsafe { ffi::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
            asked == CUDA_SUCCESS && active == 0
        });
    if let (true, Some(primary)) = (ended_now, primary) {
        ended(s, primary);
    }
    if st == CUDA_SUCCESS && what == Primary::Reset {
        // A program that resets its device recovers from what failed before (a sticky fault):
        // failures of requests it did not wait for are the old context's, not the new one's.
        s.deferred.forget(|_| true);
    }
    w.i32(st);
}

/// The primary context entry points, each a handler of its own that calls the shared one
/// with what it does and its driver entry point (`_v2` or not).
macro_rules! primary_context_ends {
    ($($name:ident => $shared:ident, $v2:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        pub fn $name(s: &Call<'_>, a: args::$name, w: &mut Writer) -> Result<(), DecodeError> {
            primary_context(s, a.dev, Primary::$shared, $v2, w);
            Ok(())
        }
    )*};
}

primary_context_ends! {
    cuDevicePrimaryCtxReset => Reset, false;
    cuDevicePrimaryCtxReset_v2 => Reset, true;
    cuDevicePrimaryCtxRelease => Release, false;
    cuDevicePrimaryCtxRelease_v2 => Release, true;
}
