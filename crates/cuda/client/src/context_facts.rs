//! What the client knows of contexts without asking: a context's device and id (fixed for
//! the context's life), each device's primary context state (its flags and whether it is
//! active: only this process's own calls change it, since a primary context is per process)
//! and the device's attributes (fixed for a device). cudart and PyTorch ask these around
//! nearly every launch: on the H200, 9 in 10 of a PyTorch MLP training step's 237 round trips
//! were `cuCtxGetDevice_v2` and `cuDevicePrimaryCtxGetState`. Each is asked of the server
//! once and then answered here.
//!
//! An answer is kept under the generation it was learnt in (`current::generation`, bumped
//! when a context may have gone: destroyed, reset, released) and, for the primary contexts'
//! state, under this module's own generation, bumped by every call that may change that
//! state (retain, release, reset, flags set).

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::current;
use crate::generated;
use crate::rt;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use wormhole_cuda_proto::cu::CUDA_SUCCESS;

/// Bumped by every call that may change a primary context's state.
static PRIMARY_GENERATION: AtomicU64 = AtomicU64::new(0);

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`: the one attribute an administrator changes while
/// programs run (`nvidia-smi -c`): always asked.
const ATTRIBUTE_COMPUTE_MODE: i32 = 20;

/// Answers the client keeps, by what they are about: the generation each was learnt in, and
/// the answer.
type Kept<K, G, V> = HashMap<K, (G, V)>;

#[derive(Default)]
struct Facts {
    /// Context → its device.
    device: Kept<usize, u64, u32>,
    /// Context → its id.
    id: Kept<usize, u64, u64>,
    /// Device → its primary context's flags and whether it is active.
    primary: Kept<i32, (u64, u64), (u32, u32)>,
    /// (attribute, device) → its value (for the device's life).
    attribute: Kept<(i32, i32), (), u32>,
}

fn facts() -> MutexGuard<'static, Facts> {
    static FACTS: OnceLock<Mutex<Facts>> = OnceLock::new();
    FACTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A call changed (or may have changed) a primary context's state.
pub fn primary_changed() {
    PRIMARY_GENERATION.fetch_add(1, Ordering::AcqRel);
}

fn primary_generation() -> (u64, u64) {
    (
        current::generation(),
        PRIMARY_GENERATION.load(Ordering::Acquire),
    )
}

/// The context a call names: `ctx`, or for NULL this thread's current one, if known.
fn named(ctx: *mut c_void) -> Option<usize> {
    match ctx as usize {
        0 => current::known().map(|c| c as usize).filter(|&c| c != 0),
        c => Some(c),
    }
}

/// The answer kept in `table` under `key` for `generation` (written with `give`), or else
/// the server's (`ask`), kept when it succeeds (read back from the caller's outputs with
/// `got`). Without a key (nothing to name the answer by), or before `cuInit`, the server is
/// asked.
fn remembered<K: std::hash::Hash + Eq, G: Copy + PartialEq, V: Copy>(
    table: impl Fn(&mut Facts) -> &mut Kept<K, G, V>,
    key: Option<K>,
    generation: G,
    give: impl FnOnce(V),
    got: impl FnOnce() -> V,
    ask: impl FnOnce() -> i32,
) -> i32 {
    let Some(key) = key.filter(|_| rt::check_initialized().is_ok()) else {
        return ask();
    };
    let known = table(&mut facts()).get(&key).copied();
    if let Some((_, v)) = known.filter(|(g, _)| *g == generation) {
        give(v);
        return CUDA_SUCCESS;
    }
    let status = ask();
    if status == CUDA_SUCCESS {
        let v = got();
        table(&mut facts()).insert(key, (generation, v));
    }
    status
}

/// `ctx`'s device (NULL: the current context's), from the server the first time.
///
/// # Safety
/// `device` NULL or a writable `CUdevice`.
unsafe fn device_of(device: *mut u32, ctx: *mut c_void, ask: impl FnOnce() -> i32) -> i32 {
    let key = named(ctx).filter(|_| !device.is_null());
    remembered(
        |f| &mut f.device,
        key,
        current::generation(),
        // SAFETY: per the contract (a key means `device` is not NULL).
        |dev| unsafe { *device = dev },
        // SAFETY: the call succeeded, so it wrote the device.
        || unsafe { *device },
        ask,
    )
}

/// `cuCtxGetDevice`: the current context's device.
///
/// # Safety
/// `device` NULL or a writable `CUdevice`.
pub unsafe fn cuCtxGetDevice(device: *mut u32) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        device_of(device, std::ptr::null_mut(), || {
            generated::wire_cuCtxGetDevice(device)
        })
    }
}

/// `cuCtxGetDevice_v2`: `ctx`'s device (NULL: the current context's).
///
/// # Safety
/// `device` NULL or a writable `CUdevice`.
pub unsafe fn cuCtxGetDevice_v2(device: *mut u32, ctx: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        device_of(device, ctx, || {
            generated::wire_cuCtxGetDevice_v2(device, ctx.cast())
        })
    }
}

/// `cuCtxGetId`: `ctx`'s id (NULL: the current context's), unique for the process's life.
///
/// # Safety
/// `id` NULL or a writable `unsigned long long`.
pub unsafe fn cuCtxGetId(ctx: *mut c_void, id: *mut u64) -> i32 {
    remembered(
        |f| &mut f.id,
        named(ctx).filter(|_| !id.is_null()),
        current::generation(),
        // SAFETY: per the contract (a key means `id` is not NULL).
        |v| unsafe { *id = v },
        // SAFETY: the call succeeded, so it wrote the id.
        || unsafe { *id },
        // SAFETY: per the contract.
        || unsafe { generated::wire_cuCtxGetId(ctx.cast(), id) },
    )
}

/// `cuDevicePrimaryCtxGetState`: `dev`'s primary context's flags and whether it is active.
///
/// # Safety
/// `flags` and `active` NULL or writable `unsigned int`s.
pub unsafe fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut u32) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        primary_state(dev, flags, active, || {
            generated::wire_cuDevicePrimaryCtxGetState(dev, flags, active)
        })
    }
}

/// `dev`'s primary context's state, from the server (`ask`) while the client does not know it.
///
/// # Safety
/// `flags` and `active` NULL or writable `unsigned int`s.
unsafe fn primary_state(
    dev: i32,
    flags: *mut u32,
    active: *mut u32,
    ask: impl FnOnce() -> i32,
) -> i32 {
    remembered(
        |f| &mut f.primary,
        Some(dev).filter(|_| !flags.is_null() && !active.is_null()),
        primary_generation(),
        // SAFETY: per the contract (a key means neither is NULL).
        |(f, a)| unsafe { (*flags, *active) = (f, a) },
        // SAFETY: the call succeeded, so it wrote both.
        || unsafe { (*flags, *active) },
        ask,
    )
}

/// `cuDevicePrimaryCtxRetain`: the first retain activates the context, which after its last
/// release is one anew, with an id of its own: what was known of contexts goes (retains are
/// rare: cudart's come once per device).
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`.
pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: i32) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxRetain(pctx, dev) };
    current::contexts_changed();
    primary_changed();
    status
}

/// `cuDevicePrimaryCtxSetFlags`.
///
/// # Safety
/// None (value parameters).
pub unsafe fn cuDevicePrimaryCtxSetFlags(dev: i32, flags: u32) -> i32 {
    // SAFETY: value parameters.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxSetFlags(dev, flags) };
    primary_changed();
    status
}

/// `cuDevicePrimaryCtxSetFlags_v2`.
///
/// # Safety
/// None (value parameters).
pub unsafe fn cuDevicePrimaryCtxSetFlags_v2(dev: i32, flags: u32) -> i32 {
    // SAFETY: value parameters.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxSetFlags_v2(dev, flags) };
    primary_changed();
    status
}

/// `cuCtxSetFlags`: the current context's flags (a primary context's among them).
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuCtxSetFlags(flags: u32) -> i32 {
    // SAFETY: a value parameter.
    let status = unsafe { generated::wire_cuCtxSetFlags(flags) };
    primary_changed();
    status
}

/// `cuDeviceGetAttribute`: fixed for a device (but its compute mode), asked once.
///
/// # Safety
/// `pi` NULL or a writable `int`.
pub unsafe fn cuDeviceGetAttribute(pi: *mut u32, attrib: i32, dev: i32) -> i32 {
    remembered(
        |f| &mut f.attribute,
        Some((attrib, dev)).filter(|_| !pi.is_null() && attrib != ATTRIBUTE_COMPUTE_MODE),
        (),
        // SAFETY: per the contract (a key means `pi` is not NULL).
        |v| unsafe { *pi = v },
        // SAFETY: the call succeeded, so it wrote the value.
        || unsafe { *pi },
        // SAFETY: per the contract.
        || unsafe { generated::wire_cuDeviceGetAttribute(pi, attrib, dev) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A context's device is asked once, and again after contexts may have changed.
    #[test]
    fn a_contexts_device_is_asked_once_per_generation() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let asked = Cell::new(0);
        let ctx = 0x7777_0000 as *mut c_void;
        let mut dev = 0u32;
        let p = &mut dev as *mut u32;
        let ask = || {
            asked.set(asked.get() + 1);
            // SAFETY: `p` is the test's.
            unsafe { *p = 3 };
            CUDA_SUCCESS
        };
        for _ in 0..3 {
            // SAFETY: `p` is writable.
            assert_eq!(unsafe { device_of(p, ctx, ask) }, CUDA_SUCCESS);
            assert_eq!(dev, 3);
        }
        assert_eq!(asked.get(), 1);
        current::contexts_changed();
        // SAFETY: as above.
        unsafe { device_of(p, ctx, ask) };
        assert_eq!(asked.get(), 2);
        // A failure is not remembered.
        let other = 0x7777_1000 as *mut c_void;
        for _ in 0..2 {
            // SAFETY: as above.
            let st = unsafe { device_of(p, other, || 201) };
            assert_eq!(st, 201);
        }
    }

    /// A primary context's state is asked again after every call that may change it.
    #[test]
    fn a_primary_contexts_state_is_asked_again_after_changes() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let asked = Cell::new(0);
        let (mut flags, mut active) = (0u32, 0u32);
        let (f, a) = (&mut flags as *mut u32, &mut active as *mut u32);
        let ask = || {
            asked.set(asked.get() + 1);
            // SAFETY: the test's.
            unsafe { (*f, *a) = (4, asked.get()) };
            CUDA_SUCCESS
        };
        let dev = 9_999;
        // SAFETY: writable pointers.
        unsafe { primary_state(dev, f, a, ask) };
        // SAFETY: as above.
        unsafe { primary_state(dev, f, a, ask) };
        assert_eq!((asked.get(), flags, active), (1, 4, 1));
        primary_changed();
        // SAFETY: as above.
        unsafe { primary_state(dev, f, a, ask) };
        assert_eq!((asked.get(), active), (2, 2));
        current::contexts_changed();
        // SAFETY: as above.
        unsafe { primary_state(dev, f, a, ask) };
        assert_eq!(asked.get(), 3);
    }
}
