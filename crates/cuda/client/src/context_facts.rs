//! What the client knows without asking, kept from the server's first answer: a context's
//! device and id (fixed for the context's life), each device's primary context state (its
//! flags and whether it is active: only this process's own calls change it, since a primary
//! context is per process), the device's attributes (fixed for a device), and of functions
//! and kernels their function in a context, their attributes and their occupancy. cudart,
//! cuBLAS and PyTorch ask these around nearly every launch: on the H200, 9 in 10 of a PyTorch
//! MLP training step's 237 round trips were `cuCtxGetDevice_v2` and
//! `cuDevicePrimaryCtxGetState`, and most of the rest `cuKernelGetFunction` and
//! `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
//!
//! An answer is kept under the generation it was learnt in (`current::generation`, bumped
//! when a context may have gone: destroyed, reset, released) and under its own kind's
//! generation, bumped by every call that may change such answers (the description's
//! `@forgets(...)`: for primary contexts retain, flags set; for functions their attributes and
//! cache settings, the context's, and unloads).

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
use wormhole_cuda_proto::HandleKind;

/// Bumped by every call that may change a primary context's state.
static PRIMARY_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Bumped by every call that may change what a function or kernel answers (its attributes,
/// cache and shared memory settings, the context's) or end it (unloads).
static FUNCTION_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Bumped by the unloads alone: a kernel's function in a context changes only when its
/// library goes (or the context: `current::generation`), not when an attribute is set.
/// CUTLASS and flash-attention kernels set their shared memory size before every launch.
static UNLOAD_GENERATION: AtomicU64 = AtomicU64::new(0);

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
    /// (kernel, context) → the kernel's function in the context (the program's handle).
    function: Kept<(u64, usize), (u64, u64), usize>,
    /// (function or kernel, where, attribute) → its value.
    function_attribute: Kept<(u64, Where, i32), (u64, u64), u32>,
    /// (function or kernel, context, block size, dynamic shared memory, flags if given) →
    /// active blocks per multiprocessor.
    occupancy: Kept<OccupancyOf, (u64, u64), u32>,
}

/// What an occupancy answer is of: the function (or kernel), the context, the block size,
/// the dynamic shared memory and the flags (None: the call without).
type OccupancyOf = (u64, usize, i32, usize, Option<u32>);

/// Where a function's attribute is asked: a function's (or a kernel's as a function) in the
/// current context, a kernel's on a device.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Where {
    Context(usize),
    Device(i32),
}

fn facts() -> MutexGuard<'static, Facts> {
    static FACTS: OnceLock<Mutex<Facts>> = OnceLock::new();
    FACTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A call may have changed a primary context's state.
pub fn forget_primary_contexts() {
    PRIMARY_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// A call may have changed or ended contexts (a primary context's retain: after its last
/// release the context is one anew, with a new id).
pub fn forget_contexts() {
    current::contexts_changed();
}

/// A call may have changed what functions answer, or ended some.
pub fn forget_functions() {
    FUNCTION_GENERATION.fetch_add(1, Ordering::AcqRel);
    // What no generation of now can answer from goes (kept answers would only grow:
    // occupancy is kept per block size and shared memory size).
    let function = function_generation();
    let mut f = facts();
    f.function_attribute.retain(|_, (g, _)| *g == function);
    f.occupancy.retain(|_, (g, _)| *g == function);
}

/// A module or library was unloaded: its kernels' functions went with it (torch.compile loads
/// and unloads many).
pub fn forget_unloads() {
    UNLOAD_GENERATION.fetch_add(1, Ordering::AcqRel);
    let unload = unload_generation();
    facts().function.retain(|_, (g, _)| *g == unload);
}

fn unload_generation() -> (u64, u64) {
    (
        current::generation(),
        UNLOAD_GENERATION.load(Ordering::Acquire),
    )
}

fn function_generation() -> (u64, u64) {
    (
        current::generation(),
        FUNCTION_GENERATION.load(Ordering::Acquire),
    )
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
/// `got`). Without a key (nothing to name the answer by), or where the client may not answer
/// (`rt::answerable_here`: before `cuInit`, in a host function, in a fork's child), the
/// server is asked.
fn remembered<K: std::hash::Hash + Eq, G: Copy + PartialEq, V: Copy>(
    table: impl Fn(&mut Facts) -> &mut Kept<K, G, V>,
    key: Option<K>,
    generation: G,
    give: impl FnOnce(V),
    got: impl FnOnce() -> V,
    ask: impl FnOnce() -> i32,
) -> i32 {
    let Some(key) = key.filter(|_| rt::answerable_here()) else {
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

/// `cuDeviceGetAttribute`: fixed for a device (but its compute mode), asked once.
///
/// # Safety
/// `pi` NULL or a writable `int`.
pub unsafe fn cuDeviceGetAttribute(pi: *mut u32, attrib: i32, dev: i32) -> i32 {
    remembered(
        |f| &mut f.attribute,
        Some((attrib, dev)).filter(|_| !pi.is_null() && kept_device_attribute(attrib)),
        (),
        // SAFETY: per the contract (a key means `pi` is not NULL).
        |v| unsafe { *pi = v },
        // SAFETY: the call succeeded, so it wrote the value.
        || unsafe { *pi },
        // SAFETY: per the contract.
        || unsafe { generated::wire_cuDeviceGetAttribute(pi, attrib, dev) },
    )
}

/// Whether the client keeps device attribute `attrib`: cuda.h's, which are fixed for a
/// device, but the compute mode (a newer driver's may not be: asked each time).
fn kept_device_attribute(attrib: i32) -> bool {
    (1..wormhole_cuda_proto::DEVICE_ATTRIBUTE_MAX).contains(&attrib)
        && attrib != ATTRIBUTE_COMPUTE_MODE
}

/// The id of `h`, an object of `kind` (for a function, a kernel standing in for one too), if
/// it is the program's (None: the server is asked, and answers what the driver answers).
fn object_id(h: *mut c_void, kind: HandleKind) -> Option<u64> {
    // SAFETY: `id_of` dereferences only registered objects.
    unsafe { rt::id_of(h, kind, false) }
        .ok()
        .filter(|&id| id != 0)
}

/// This thread's current context, if the client knows it.
fn current_context() -> Option<usize> {
    named(std::ptr::null_mut())
}

/// `cuKernelGetFunction`: the kernel's function in the current context, from the server
/// (`ask`) the first time.
///
/// # Safety
/// `pfunc` NULL or a writable `CUfunction`.
pub unsafe fn kernel_function(
    pfunc: *mut c_void,
    kernel: *mut c_void,
    ask: impl FnOnce() -> i32,
) -> i32 {
    let pfunc = pfunc as *mut usize;
    let key = object_id(kernel, HandleKind::Kernel)
        .zip(current_context())
        .filter(|_| !pfunc.is_null());
    remembered(
        |f| &mut f.function,
        key,
        unload_generation(),
        // SAFETY: per the contract (a key means `pfunc` is not NULL).
        |v| unsafe { *pfunc = v },
        // SAFETY: the call succeeded, so it wrote the function.
        || unsafe { *pfunc },
        ask,
    )
}

/// `cuFuncGetAttribute`: fixed for a function but for what `@forgets(functions)` calls set.
///
/// # Safety
/// `pi` NULL or a writable `int`.
pub unsafe fn cuFuncGetAttribute(pi: *mut u32, attrib: i32, hfunc: *mut c_void) -> i32 {
    let key = object_id(hfunc, HandleKind::Function)
        .zip(current_context())
        .map(|(f, c)| (f, Where::Context(c), attrib));
    // SAFETY: per the contract.
    unsafe {
        function_attribute(pi, key, || {
            generated::wire_cuFuncGetAttribute(pi, attrib, hfunc)
        })
    }
}

/// `cuKernelGetAttribute`: as `cuFuncGetAttribute`, of a kernel on a device.
///
/// # Safety
/// `pi` NULL or a writable `int`.
pub unsafe fn cuKernelGetAttribute(
    pi: *mut u32,
    attrib: i32,
    kernel: *mut c_void,
    dev: i32,
) -> i32 {
    let key = object_id(kernel, HandleKind::Kernel).map(|k| (k, Where::Device(dev), attrib));
    // SAFETY: per the contract.
    unsafe {
        function_attribute(pi, key, || {
            generated::wire_cuKernelGetAttribute(pi, attrib, kernel, dev)
        })
    }
}

/// # Safety
/// `pi` NULL or a writable `int`.
unsafe fn function_attribute(
    pi: *mut u32,
    key: Option<(u64, Where, i32)>,
    ask: impl FnOnce() -> i32,
) -> i32 {
    remembered(
        |f| &mut f.function_attribute,
        key.filter(|_| !pi.is_null()),
        function_generation(),
        // SAFETY: per the contract (a key means `pi` is not NULL).
        |v| unsafe { *pi = v },
        // SAFETY: the call succeeded, so it wrote the value.
        || unsafe { *pi },
        ask,
    )
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
///
/// # Safety
/// `num_blocks` NULL or a writable `int`.
pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    num_blocks: *mut u32,
    func: *mut c_void,
    block_size: i32,
    dynamic_smem: usize,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        occupancy(num_blocks, func, block_size, dynamic_smem, None, || {
            generated::wire_cuOccupancyMaxActiveBlocksPerMultiprocessor(
                num_blocks,
                func,
                block_size,
                dynamic_smem,
            )
        })
    }
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
///
/// # Safety
/// `num_blocks` NULL or a writable `int`.
pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    num_blocks: *mut u32,
    func: *mut c_void,
    block_size: i32,
    dynamic_smem: usize,
    flags: u32,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        occupancy(
            num_blocks,
            func,
            block_size,
            dynamic_smem,
            Some(flags),
            || {
                generated::wire_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                    num_blocks,
                    func,
                    block_size,
                    dynamic_smem,
                    flags,
                )
            },
        )
    }
}

/// The active blocks per multiprocessor of `func` in the current context, from the server
/// (`ask`) the first time for these settings.
///
/// # Safety
/// `num_blocks` NULL or a writable `int`.
unsafe fn occupancy(
    num_blocks: *mut u32,
    func: *mut c_void,
    block_size: i32,
    dynamic_smem: usize,
    flags: Option<u32>,
    ask: impl FnOnce() -> i32,
) -> i32 {
    let key = object_id(func, HandleKind::Function)
        .zip(current_context())
        .filter(|_| !num_blocks.is_null())
        .map(|(f, ctx)| (f, ctx, block_size, dynamic_smem, flags));
    remembered(
        |f| &mut f.occupancy,
        key,
        function_generation(),
        // SAFETY: per the contract (a key means `num_blocks` is not NULL).
        |v| unsafe { *num_blocks = v },
        // SAFETY: the call succeeded, so it wrote the count.
        || unsafe { *num_blocks },
        ask,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects;
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
        forget_primary_contexts();
        // SAFETY: as above.
        unsafe { primary_state(dev, f, a, ask) };
        assert_eq!((asked.get(), active), (2, 2));
        current::contexts_changed();
        // SAFETY: as above.
        unsafe { primary_state(dev, f, a, ask) };
        assert_eq!(asked.get(), 3);
    }

    /// Occupancy is asked once per function, context and settings, and again after a call
    /// that may change what functions answer; a kernel standing in for a function is one too.
    #[test]
    fn occupancy_is_asked_once_per_setting_until_functions_may_change() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        current::set(0x7777_2000 as *mut c_void);
        let func = objects::new_object(HandleKind::Function, objects::alloc_id());
        let kernel = objects::new_object(HandleKind::Kernel, objects::alloc_id());
        let asked = Cell::new(0);
        let mut blocks = 0u32;
        let p = &mut blocks as *mut u32;
        let ask = |n: u32| {
            asked.set(asked.get() + 1);
            // SAFETY: `p` is the test's.
            unsafe { *p = n };
            CUDA_SUCCESS
        };
        let occ = |f: *mut c_void, block: i32, flags: Option<u32>, n: u32| {
            // SAFETY: `p` is writable.
            unsafe { occupancy(p, f, block, 0, flags, || ask(n)) }
        };
        assert_eq!(occ(func, 128, Some(0), 8), CUDA_SUCCESS);
        assert_eq!(occ(func, 128, Some(0), 99), CUDA_SUCCESS);
        assert_eq!((asked.get(), blocks), (1, 8), "kept");
        occ(func, 256, Some(0), 4);
        occ(func, 128, None, 7);
        occ(kernel, 128, Some(0), 6);
        assert_eq!(
            asked.get(),
            4,
            "other settings, the flagless call, a kernel: asked"
        );
        occ(kernel, 128, Some(0), 99);
        assert_eq!((asked.get(), blocks), (4, 6));
        forget_functions();
        occ(func, 128, Some(0), 5);
        assert_eq!((asked.get(), blocks), (5, 5), "asked again after a change");
        current::set(0x7777_3000 as *mut c_void);
        occ(func, 128, Some(0), 3);
        assert_eq!(asked.get(), 6, "in another context: asked");
        // A failure is not kept, and a handle that is not the program's is the server's to
        // answer.
        // SAFETY: as above.
        let st = unsafe { occupancy(p, func, 512, 0, None, || 1) };
        assert_eq!(st, 1);
        occ(func, 512, None, 2);
        assert_eq!(asked.get(), 7);
        let stranger = 0x5555_0000 as *mut c_void;
        occ(stranger, 128, None, 1);
        occ(stranger, 128, None, 1);
        assert_eq!(asked.get(), 9);
        objects::destroy(func);
        objects::destroy(kernel);
        current::forget();
    }

    /// A kernel's function is asked once per context; without a known current context it is
    /// always asked.
    #[test]
    fn a_kernels_function_is_asked_once_per_context() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let kernel = objects::new_object(HandleKind::Kernel, objects::alloc_id());
        let asked = Cell::new(0);
        let mut out: *mut c_void = std::ptr::null_mut();
        let p = (&mut out as *mut *mut c_void).cast::<c_void>();
        let ask = |f: usize| {
            asked.set(asked.get() + 1);
            // SAFETY: `p` is the test's.
            unsafe { *(p as *mut usize) = f };
            CUDA_SUCCESS
        };
        let kf = |f: usize| {
            // SAFETY: `p` is writable.
            unsafe { kernel_function(p, kernel, || ask(f)) }
        };
        current::forget();
        kf(0x10);
        kf(0x10);
        assert_eq!(asked.get(), 2, "no context known: asked");
        current::set(0x7777_4000 as *mut c_void);
        kf(0x20);
        kf(0x30);
        assert_eq!((asked.get(), out as usize), (3, 0x20));
        current::contexts_changed();
        current::set(0x7777_4000 as *mut c_void);
        kf(0x40);
        assert_eq!(
            (asked.get(), out as usize),
            (4, 0x40),
            "contexts may have changed"
        );
        // An attribute set (CUTLASS sets one before every launch) leaves it known; an unload
        // does not.
        forget_functions();
        kf(0x50);
        assert_eq!(
            (asked.get(), out as usize),
            (4, 0x40),
            "an attribute was set"
        );
        forget_unloads();
        kf(0x60);
        assert_eq!((asked.get(), out as usize), (5, 0x60), "a module went");
        objects::destroy(kernel);
        current::forget();
    }

    #[test]
    fn after_a_sticky_fault_the_driver_answers_until_a_reset() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let asked = Cell::new(0);
        let mut v = 0u32;
        let p = &mut v as *mut u32;
        let attr = || {
            remembered(
                |f| &mut f.attribute,
                Some((2, 11)),
                (),
                // SAFETY: the test's.
                |x| unsafe { *p = x },
                // SAFETY: the test's.
                || unsafe { *p },
                || {
                    asked.set(asked.get() + 1);
                    CUDA_SUCCESS
                },
            )
        };
        attr();
        attr();
        assert_eq!(asked.get(), 1);
        let st = rt::entry_status(|| Ok(wormhole_cuda_proto::cu::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert_eq!(st, wormhole_cuda_proto::cu::CUDA_ERROR_ILLEGAL_ADDRESS);
        attr();
        attr();
        assert_eq!(
            asked.get(),
            3,
            "every call goes to the driver after the fault"
        );
        rt::recovered();
        attr();
        assert_eq!(asked.get(), 3, "kept again after a reset");
    }

    #[test]
    fn device_attributes_newer_than_cuda_h_are_always_asked() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let asked = Cell::new(0);
        let mut v = 0u32;
        let p = &mut v as *mut u32;
        let ask = || {
            asked.set(asked.get() + 1);
            CUDA_SUCCESS
        };
        let attr = |id: i32| {
            remembered(
                |f| &mut f.attribute,
                Some((id, 9)).filter(|_| kept_device_attribute(id)),
                (),
                // SAFETY: the test's.
                |x| unsafe { *p = x },
                // SAFETY: the test's.
                || unsafe { *p },
                ask,
            )
        };
        attr(1);
        attr(1);
        assert_eq!(asked.get(), 1, "cuda.h's: kept");
        attr(wormhole_cuda_proto::DEVICE_ATTRIBUTE_MAX + 52);
        attr(wormhole_cuda_proto::DEVICE_ATTRIBUTE_MAX + 52);
        assert_eq!(asked.get(), 3, "a newer driver's: asked each time");
        attr(ATTRIBUTE_COMPUTE_MODE);
        attr(ATTRIBUTE_COMPUTE_MODE);
        assert_eq!(asked.get(), 5, "the compute mode: asked each time");
    }
}
