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

#[derive(Default)]
struct Facts {
    /// Context → (generation, device).
    device: HashMap<usize, (u64, u32)>,
    /// Context → (generation, id).
    id: HashMap<usize, (u64, u64)>,
    /// Device → ((generation, primary generation), flags, active).
    primary: HashMap<i32, ((u64, u64), u32, u32)>,
    /// (attribute, device) → value.
    attribute: HashMap<(i32, i32), u32>,
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

/// `ctx`'s device (NULL: the current context's), from the server the first time.
///
/// # Safety
/// `device` NULL or a writable `CUdevice`.
unsafe fn device_of(device: *mut u32, ctx: *mut c_void, ask: impl FnOnce() -> i32) -> i32 {
    let key = named(ctx);
    if let (Some(key), false, Ok(())) = (key, device.is_null(), rt::check_initialized()) {
        let generation = current::generation();
        if let Some(&(g, dev)) = facts().device.get(&key) {
            if g == generation {
                // SAFETY: per the contract.
                unsafe { *device = dev };
                return CUDA_SUCCESS;
            }
        }
        let status = ask();
        if status == CUDA_SUCCESS {
            // SAFETY: the call succeeded, so it wrote the device.
            let dev = unsafe { *device };
            facts().device.insert(key, (generation, dev));
        }
        return status;
    }
    ask()
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
    let ask = || {
        // SAFETY: per the contract.
        unsafe { generated::wire_cuCtxGetId(ctx.cast(), id) }
    };
    let key = named(ctx);
    let (Some(key), false, Ok(())) = (key, id.is_null(), rt::check_initialized()) else {
        return ask();
    };
    let generation = current::generation();
    if let Some(&(g, known)) = facts().id.get(&key) {
        if g == generation {
            // SAFETY: per the contract.
            unsafe { *id = known };
            return CUDA_SUCCESS;
        }
    }
    let status = ask();
    if status == CUDA_SUCCESS {
        // SAFETY: the call succeeded, so it wrote the id.
        let known = unsafe { *id };
        facts().id.insert(key, (generation, known));
    }
    status
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
    if flags.is_null() || active.is_null() || rt::check_initialized().is_err() {
        return ask();
    }
    let generation = primary_generation();
    if let Some(&(g, f, a)) = facts().primary.get(&dev) {
        if g == generation {
            // SAFETY: per the contract.
            unsafe { (*flags, *active) = (f, a) };
            return CUDA_SUCCESS;
        }
    }
    let status = ask();
    if status == CUDA_SUCCESS {
        // SAFETY: the call succeeded, so it wrote both.
        let (f, a) = unsafe { (*flags, *active) };
        facts().primary.insert(dev, (generation, f, a));
    }
    status
}

/// `cuDevicePrimaryCtxRetain`: the first retain activates the context.
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`.
pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: i32) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxRetain(pctx, dev) };
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
    let ask = || {
        // SAFETY: per the contract.
        unsafe { generated::wire_cuDeviceGetAttribute(pi, attrib, dev) }
    };
    if pi.is_null() || attrib == ATTRIBUTE_COMPUTE_MODE || rt::check_initialized().is_err() {
        return ask();
    }
    if let Some(&v) = facts().attribute.get(&(attrib, dev)) {
        // SAFETY: per the contract.
        unsafe { *pi = v };
        return CUDA_SUCCESS;
    }
    let status = ask();
    if status == CUDA_SUCCESS {
        // SAFETY: the call succeeded, so it wrote the value.
        let v = unsafe { *pi };
        facts().attribute.insert((attrib, dev), v);
    }
    status
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
