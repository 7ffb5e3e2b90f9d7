//! NVIDIA's private tables (`cuGetExportTable`): what cudart, cuBLAS(Lt) and cuDNN ask of the
//! driver beyond its documented API. Each table is memory of the client's holding the
//! client's functions (they are called in the program's process, on its threads); a slot
//! that needs the real driver asks the server (`export_tables::OP`) or calls the forwarded
//! API. What each slot does was learned from NVIDIA's binaries and from public forwarders and
//! emulators (docs/CUDA.md); a slot not known to be needed answers CUDA_ERROR_NOT_SUPPORTED
//! and logs its table and number, once: never a silent success.

use crate::generated;
use crate::rt::{self, ApiErr};
use std::cell::UnsafeCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::Mutex;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::export_tables::{self as ids, PRIMARY_CONTEXT};
use wormhole_cuda_proto::HandleKind;

type Slot = *const c_void;

/// A table as the driver hands it out: most start with their size in bytes.
#[repr(C)]
pub struct Table<const N: usize>([Slot; N]);

// SAFETY: the tables are never written; their slots are code addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn addr(&'static self) -> usize {
        self as *const Self as usize
    }
}

/// The size word of an `N`-slot table.
const fn size<const N: usize>() -> Slot {
    (N * 8) as Slot
}

/// The tables' names, for the log (index = the `T` of [`unserved`]).
const NAMES: [&str; 6] = [
    "CUDART_INTERFACE",
    "TOOLS_TLS",
    "CONTEXT_CHECKS",
    "INTEGRITY_CHECK",
    "TOOLS_CONTEXT",
    "CONTEXT_LOCAL_STORAGE",
];

/// A slot's status, written to the trace (`WORMHOLE_TRACE`): the slots are called through the
/// tables, never as exported symbols, so this is where the trace learns of them.
fn traced(slot: &'static str, st: i32) -> i32 {
    wormhole_session::trace::note(wormhole_cuda_proto::API, || {
        format!("export table {slot} = {st}")
    });
    st
}

/// A slot of table `T` whose meaning is not known: CUDA_ERROR_NOT_SUPPORTED and a log line
/// naming it, once.
extern "C" fn unserved<const T: usize, const S: usize>() -> i32 {
    static LOGGED: Mutex<Option<HashSet<(usize, usize)>>> = Mutex::new(None);
    let first = LOGGED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert((T, S));
    if first {
        crate::connection::log(&format!(
            "export table {} slot {S} is not served by Wormhole; returning CUDA_ERROR_NOT_SUPPORTED",
            NAMES[T]
        ));
    }
    wormhole_session::trace::note(wormhole_cuda_proto::API, || {
        format!("export table {} slot {S}: not served", NAMES[T])
    });
    CUDA_ERROR_NOT_SUPPORTED
}

/// A table's slots, in order, for table number `T`: `(expr)` is a slot's value, `~S` marks
/// slot `S` as [`unserved`].
macro_rules! slots {
    ($t:literal; $($rest:tt)*) => { slots!(@acc [] $t; $($rest)*) };
    (@acc [$($done:expr),*] $t:literal;) => { [$($done),*] };
    (@acc [$($done:expr),*] $t:literal; ~$s:literal $($rest:tt)*) => {
        slots!(@acc [$($done,)* unserved::<$t, $s> as Slot] $t; $($rest)*)
    };
    (@acc [$($done:expr),*] $t:literal; ($e:expr) $($rest:tt)*) => {
        slots!(@acc [$($done,)* $e] $t; $($rest)*)
    };
}

// ---- CUDART_INTERFACE: modules from fatbins (older runtimes) and primary contexts ----

/// cudart 12.9 and 13.0 use slot 2 only; slots 1, 6 and 8 load modules for older runtimes.
pub static CUDART_INTERFACE: Table<13> = Table(slots!(0;
    (size::<13>()) (module_from_wrapper as Slot) (primary_context as Slot) ~3 ~4 ~5
    (module_from_wrapper_ext as Slot) (ignore_size as Slot) (module_from_header_ext as Slot) ~9
    ~10 ~11 (load_compilers as Slot)
));

/// Slot 1: a module from nvcc's fatbin wrapper (`__fatBinC_Wrapper_t`).
unsafe extern "C" fn module_from_wrapper(module: *mut c_void, wrapper: *mut c_void) -> i32 {
    // SAFETY: the caller passes a CUmodule out-pointer and a wrapper (the image code follows
    // it to its fatbin, refusing memory the program does not have).
    let st = unsafe { crate::custom::cuModuleLoadData(module, wrapper) };
    traced("CUDART_INTERFACE slot 1 (module from a fatbin wrapper)", st)
}

/// Whether the three extra arguments of slots 6 and 8 are the NULL/0 seen everywhere (what
/// else they may say is not known: refused, naming the slot).
fn no_extra_arguments(slot: u32, a: *mut c_void, b: *mut c_void, c: u32) -> bool {
    let none = a.is_null() && b.is_null() && c == 0;
    if !none {
        crate::connection::log(&format!(
            "export table CUDART_INTERFACE slot {slot} called with arguments Wormhole does not know; returning CUDA_ERROR_NOT_SUPPORTED"
        ));
    }
    none
}

/// Slot 6: as slot 1, with three more arguments that are always NULL/0 where seen.
unsafe extern "C" fn module_from_wrapper_ext(
    module: *mut c_void,
    wrapper: *mut c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: u32,
) -> i32 {
    if !no_extra_arguments(6, a, b, c) {
        return traced("CUDART_INTERFACE slot 6", CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: as slot 1.
    unsafe { module_from_wrapper(module, wrapper) }
}

/// Slot 8: a module from a fatbin (its header first, the module second).
unsafe extern "C" fn module_from_header_ext(
    fatbin: *mut c_void,
    module: *mut c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: u32,
) -> i32 {
    if !no_extra_arguments(8, a, b, c) {
        return traced("CUDART_INTERFACE slot 8", CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: as slot 1, with the fatbin itself.
    let st = unsafe { crate::custom::cuModuleLoadData(module, fatbin) };
    traced("CUDART_INTERFACE slot 8 (module from a fatbin)", st)
}

/// Slot 7: takes a size and does nothing the program can see.
extern "C" fn ignore_size(_size: usize) {}

/// Slot 12: "load the compilers" (PTX JIT, NVVM): the server's driver has its own.
extern "C" fn load_compilers() -> i32 {
    traced(
        "CUDART_INTERFACE slot 12 (load the compilers)",
        CUDA_SUCCESS,
    )
}

/// Slot 2: the device's primary context without retaining it (the real driver's answer,
/// from the server): cudart matches it against what `cuDevicePrimaryCtxRetain` and
/// `cuCtxGetCurrent` return later.
unsafe extern "C" fn primary_context(ctx: *mut c_void, dev: i32) -> i32 {
    let st = rt::entry_status(|| {
        if ctx.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let id = primary_context_id(dev)?;
        // SAFETY: the caller passes a CUcontext out-pointer.
        unsafe {
            *(ctx as *mut *mut c_void) = crate::objects::object_for_id(HandleKind::Context, id)
        };
        Ok(CUDA_SUCCESS)
    });
    traced("CUDART_INTERFACE slot 2 (primary context)", st)
}

/// The id of device `dev`'s primary context (not retained).
fn primary_context_id(dev: i32) -> Result<u64, ApiErr> {
    let mut w = wormhole_cuda_proto::Writer::new(ids::OP);
    w.u32(PRIMARY_CONTEXT);
    w.i32(dev);
    let reply = rt::call(w)?;
    let mut r = wormhole_cuda_proto::Reader::new(&reply);
    match r.i32()? {
        CUDA_SUCCESS => {
            let id = r.u64()?;
            r.finish()?;
            Ok(id)
        }
        st => Err(ApiErr(st)),
    }
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS: the profiler's switches, all off ----

/// Flags cudart reads before each traced call (by callback id) and a second set: all zero, so
/// cudart never takes its tracing paths (no profiler is attached through Wormhole). cudart
/// requires more than 522 (newer: 566) and more than 13 entries; they are read as u32, but
/// each is given 8 bytes, so a reader of wider entries stays inside them too.
struct Flags<const N: usize>(UnsafeCell<[u64; N]>);
// SAFETY: nothing in the client writes them; the program only reads them.
unsafe impl<const N: usize> Sync for Flags<N> {}
static TRACE_FLAGS: Flags<1024> = Flags(UnsafeCell::new([0; 1024]));
static TRACE_FLAGS_2: Flags<14> = Flags(UnsafeCell::new([0; 14]));

pub static TOOLS_RUNTIME_CALLBACK_HOOKS: Table<7> = Table([
    size::<7>(),
    hook_noop as Slot,
    trace_flags as Slot,
    hook_noop as Slot,
    hook_noop as Slot,
    hook_noop as Slot,
    trace_flags_2 as Slot,
]);

/// Slots 1, 3, 4, 5: the tracing callbacks, reached only with a flag set (never, here).
extern "C" fn hook_noop() {}

/// Slot 2: the first set of flags and its length in entries.
unsafe extern "C" fn trace_flags(ptr: *mut *mut u32, count: *mut usize) {
    // SAFETY: the caller passes two out-pointers (NULL ones are skipped).
    unsafe { give_flags(&TRACE_FLAGS, ptr, count) }
}

/// Slot 6: the second set.
unsafe extern "C" fn trace_flags_2(ptr: *mut *mut u32, count: *mut usize) {
    // SAFETY: as slot 2.
    unsafe { give_flags(&TRACE_FLAGS_2, ptr, count) }
}

/// # Safety
/// `ptr` and `count` NULL or writable.
unsafe fn give_flags<const N: usize>(
    flags: &'static Flags<N>,
    ptr: *mut *mut u32,
    count: *mut usize,
) {
    if !ptr.is_null() {
        // SAFETY: per the contract.
        unsafe { *ptr = flags.0.get().cast() };
    }
    if !count.is_null() {
        // SAFETY: per the contract.
        unsafe { *count = N };
    }
}

// ---- TOOLS_TLS: the thread's current context ----

pub static TOOLS_TLS: Table<4> = Table(slots!(1;
    (size::<4>()) ~1 (thread_context as Slot) ~3
));

/// Slot 2: the calling thread's current context (cuBLAS and cuBLASLt key their state by it).
unsafe extern "C" fn thread_context(ctx: *mut c_void) -> i32 {
    // SAFETY: the caller passes a CUcontext out-pointer.
    let st = unsafe { generated::cuCtxGetCurrent(ctx.cast()) };
    traced("TOOLS_TLS slot 2 (the thread's context)", st)
}

// ---- CONTEXT_CHECKS: no context is a wrapper of another ----

pub static CONTEXT_CHECKS: Table<4> = Table(slots!(2;
    (size::<4>()) ~1 (context_unwrapped as Slot) (no_flag as Slot)
));

/// Slot 2: whether `ctx` wraps another context (never, through Wormhole), and which.
unsafe extern "C" fn context_unwrapped(
    _ctx: *mut c_void,
    wrapped: *mut u32,
    inner: *mut *mut c_void,
) -> i32 {
    if !wrapped.is_null() {
        // SAFETY: the caller passes an out-pointer.
        unsafe { *wrapped = 0 };
    }
    if !inner.is_null() {
        // SAFETY: as above.
        unsafe { *inner = std::ptr::null_mut() };
    }
    traced(
        "CONTEXT_CHECKS slot 2 (not a wrapped context)",
        CUDA_SUCCESS,
    )
}

/// Slot 3: a flag cudart reads once at start-up; set (1) only in setups Wormhole is not.
extern "C" fn no_flag() -> u32 {
    0
}

// ---- CONTEXT_LOCAL_STORAGE: cudart's and cuBLAS's state per context, kept here ----

/// No size word: slot 0 is a function.
pub static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    storage_put as Slot,
    storage_delete as Slot,
    storage_get as Slot,
    std::ptr::null(),
]);

/// What the program's libraries keep with a context: (context, key) → (value, destructor).
type Destructor = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void);
type Stored = HashMap<(usize, usize), (usize, Option<Destructor>)>;
static STORAGE: Mutex<Option<Stored>> = Mutex::new(None);

fn storage() -> std::sync::MutexGuard<'static, Option<Stored>> {
    STORAGE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The context a slot names: NULL is the calling thread's current one.
fn context_of(ctx: *mut c_void) -> Result<usize, ApiErr> {
    if !ctx.is_null() {
        return Ok(ctx as usize);
    }
    let mut current: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    match unsafe { generated::cuCtxGetCurrent((&mut current as *mut *mut c_void).cast()) } {
        CUDA_SUCCESS if !current.is_null() => Ok(current as usize),
        CUDA_SUCCESS => Err(ApiErr(CUDA_ERROR_INVALID_CONTEXT)),
        st => Err(ApiErr(st)),
    }
}

/// Slot 0: keeps `value` under `key` for the context, to be given to `dtor` when the context
/// goes.
unsafe extern "C" fn storage_put(
    ctx: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<Destructor>,
) -> i32 {
    let st = rt::entry_status(|| {
        let ctx = context_of(ctx)?;
        storage()
            .get_or_insert_with(HashMap::new)
            .insert((ctx, key as usize), (value as usize, dtor));
        Ok(CUDA_SUCCESS)
    });
    traced("CONTEXT_LOCAL_STORAGE slot 0 (put)", st)
}

/// Slot 1: forgets `key` (its destructor is not called).
unsafe extern "C" fn storage_delete(ctx: *mut c_void, key: *mut c_void) -> i32 {
    let st = rt::entry_status(|| {
        let ctx = context_of(ctx)?;
        match storage()
            .get_or_insert_with(HashMap::new)
            .remove(&(ctx, key as usize))
        {
            Some(_) => Ok(CUDA_SUCCESS),
            None => Err(ApiErr(CUDA_ERROR_INVALID_HANDLE)),
        }
    });
    traced("CONTEXT_LOCAL_STORAGE slot 1 (delete)", st)
}

/// Slot 2: the value under `key`; an error when there is none (cudart then makes its state).
unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: *mut c_void,
    key: *mut c_void,
) -> i32 {
    let st = rt::entry_status(|| {
        if value.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let ctx = context_of(ctx)?;
        let found = storage()
            .get_or_insert_with(HashMap::new)
            .get(&(ctx, key as usize))
            .map(|&(v, _)| v);
        match found {
            Some(v) => {
                // SAFETY: checked non-NULL; the caller passes an out-pointer.
                unsafe { *value = v as *mut c_void };
                Ok(CUDA_SUCCESS)
            }
            None => Err(ApiErr(CUDA_ERROR_INVALID_HANDLE)),
        }
    });
    traced("CONTEXT_LOCAL_STORAGE slot 2 (get)", st)
}

/// The context `ctx` is about to be destroyed or reset: what the libraries kept with it goes
/// to their destructors first (they may still use the context), as the driver does.
pub fn context_ending(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    let ending: Vec<_> = {
        let mut guard = storage();
        let Some(map) = guard.as_mut() else {
            return;
        };
        let keys: Vec<_> = map
            .keys()
            .filter(|(c, _)| *c == ctx as usize)
            .copied()
            .collect();
        keys.into_iter()
            .filter_map(|k| map.remove(&k).map(|v| (k, v)))
            .collect()
    };
    // The lock is not held: a destructor may use the storage.
    for ((_, key), (value, dtor)) in ending {
        if let Some(dtor) = dtor {
            // SAFETY: the destructor the program's library gave with this value.
            unsafe { dtor(ctx, key as *mut c_void, value as *mut c_void) };
        }
    }
}

/// The primary context of device `dev` is about to be reset.
pub fn primary_context_ending(dev: i32) {
    if let Ok(id) = primary_context_id(dev) {
        context_ending(crate::objects::object_for_id(HandleKind::Context, id));
    }
}

// ---- INTEGRITY_CHECK: the hash cudart checks the driver by ----

pub static INTEGRITY_CHECK: Table<3> = Table(slots!(3; (size::<3>()) (integrity_check as Slot) ~2));

/// The key of the hash (HMAC-MD2).
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// What the hash covers besides the devices.
struct IntegrityInput {
    driver_version: u32,
    version: u32,
    pid: u32,
    thread: u32,
    cudart_table: u64,
    integrity_table: u64,
    check_fn: u64,
    unix_seconds: u64,
}

/// A device as the hash sees it: UUID, PCI domain, bus, device.
type DeviceId = ([u8; 16], i32, i32, i32);

fn integrity_digest(i: &IntegrityInput, devices: &[DeviceId]) -> [u64; 2] {
    use hmac::{Mac, SimpleHmac};
    let mut mac = SimpleHmac::<md2::Md2>::new_from_slice(&INTEGRITY_KEY).expect("any key length");
    for word in [i.driver_version, i.version, i.pid, i.thread] {
        mac.update(&word.to_le_bytes());
    }
    for word in [
        i.cudart_table,
        i.integrity_table,
        i.check_fn,
        i.unix_seconds,
    ] {
        mac.update(&word.to_le_bytes());
    }
    for (uuid, domain, bus, device) in devices {
        mac.update(uuid);
        for v in [domain, bus, device] {
            mac.update(&v.to_le_bytes());
        }
    }
    let d = mac.finalize().into_bytes();
    [
        u64::from_le_bytes(d[..8].try_into().expect("16 bytes")),
        u64::from_le_bytes(d[8..16].try_into().expect("16 bytes")),
    ]
}

/// Slot 1: cudart computes the same hash from what it saw (the driver version, its process
/// and thread, these tables' addresses, the time it passed, each device's UUID and PCI
/// address) and refuses a driver whose answer differs. Computed here, on the caller's thread,
/// from the very answers the program got through Wormhole (the server's driver would hash its
/// own process and tables).
unsafe extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> i32 {
    let st = rt::entry_status(|| {
        if out.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let answer = match version % 10 {
            // Fixed answers, which cudart does not compare.
            0 => [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
            1 => [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
            _ => {
                let mut driver_version = 0u32;
                // SAFETY: a valid out-pointer.
                status(unsafe { crate::local::cuDriverGetVersion(&mut driver_version) })?;
                let input = IntegrityInput {
                    driver_version,
                    version,
                    // SAFETY: no arguments.
                    pid: unsafe { libc::getpid() } as u32,
                    // SAFETY: no arguments. cudart hashes the low half of its thread id.
                    thread: unsafe { libc::pthread_self() } as u32,
                    cudart_table: CUDART_INTERFACE.addr() as u64,
                    integrity_table: INTEGRITY_CHECK.addr() as u64,
                    check_fn: INTEGRITY_CHECK.0[1] as u64,
                    unix_seconds,
                };
                integrity_digest(&input, &devices()?)
            }
        };
        // SAFETY: checked non-NULL; the caller passes two u64s.
        unsafe { *out = answer };
        Ok(CUDA_SUCCESS)
    });
    traced("INTEGRITY_CHECK slot 1", st)
}

fn status(st: i32) -> Result<(), ApiErr> {
    match st {
        CUDA_SUCCESS => Ok(()),
        st => Err(ApiErr(st)),
    }
}

/// Every device as the program sees it (through Wormhole's own entry points, so the same
/// numbering and values cudart got).
fn devices() -> Result<Vec<DeviceId>, ApiErr> {
    let mut count = 0u32;
    // SAFETY: valid out-pointers throughout.
    unsafe {
        status(generated::cuDeviceGetCount(&mut count))?;
        (0..count as i32)
            .map(|ordinal| {
                let mut dev = 0u32;
                status(generated::cuDeviceGet(&mut dev, ordinal))?;
                let dev = dev as i32;
                let mut uuid = [0u8; 16];
                status(generated::cuDeviceGetUuid(uuid.as_mut_ptr().cast(), dev))?;
                let attr = |a: i32| -> Result<i32, ApiErr> {
                    let mut v = 0u32;
                    status(generated::cuDeviceGetAttribute(&mut v, a, dev))?;
                    Ok(v as i32)
                };
                Ok((
                    uuid,
                    attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
                ))
            })
            .collect()
    }
}

/// CUdevice_attribute values the hash needs.
const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: i32 = 33;
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: i32 = 34;
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: i32 = 50;

// ---- TOOLS_CONTEXT (21318c60): context and stream ids for cuBLAS(Lt) and newer cudart ----

/// 95 slots, as the driver's: callers index far into it. Slots 4, 39 and 51 are used by
/// cuBLAS and cuBLASLt 13.0 (per context and per stream caches, the kernel registry).
pub static TOOLS_CONTEXT: Table<95> = Table(slots!(4;
    (size::<95>()) ~1 ~2 ~3 (context_id as Slot) ~5 ~6 ~7 ~8 ~9 ~10 ~11 ~12 ~13 ~14 ~15 ~16 ~17
    ~18 ~19 ~20 ~21 ~22 ~23 ~24 ~25 ~26 ~27 ~28 ~29 ~30 ~31 ~32 ~33 ~34 ~35 ~36 ~37 ~38
    (stream_id as Slot) ~40 ~41 ~42 ~43 ~44 ~45 ~46 ~47 ~48 ~49 ~50 (stream_handle as Slot) ~52
    ~53 ~54 ~55 ~56 ~57 ~58 ~59 ~60 ~61 ~62 ~63 ~64 ~65 ~66 ~67 ~68 ~69 ~70 ~71 ~72 ~73 ~74 ~75
    ~76 ~77 ~78 ~79 ~80 ~81 ~82 ~83 ~84 ~85 ~86 ~87 ~88 ~89 ~90 ~91 ~92 ~93 ~94
));

/// Slot 4: the context's unique id (`cuCtxGetId`).
unsafe extern "C" fn context_id(ctx: *mut c_void, id: *mut u64) -> i32 {
    // SAFETY: the caller passes a context and an out-pointer.
    let st = unsafe { generated::cuCtxGetId(ctx.cast(), id) };
    traced("TOOLS_CONTEXT slot 4 (context id)", st)
}

/// Slot 51: the stream object a stream handle (a special one too) stands for, for slot 39.
/// Through Wormhole the handle itself serves: slot 39 asks the driver of it.
unsafe extern "C" fn stream_handle(
    _ctx: *mut c_void,
    stream: *mut c_void,
    out: *mut *mut c_void,
    per_thread: i32,
) -> i32 {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let handle = if stream.is_null() && per_thread != 0 {
        2usize as *mut c_void // CU_STREAM_PER_THREAD
    } else {
        stream
    };
    // SAFETY: checked non-NULL; the caller passes an out-pointer.
    unsafe { *out = handle };
    CUDA_SUCCESS
}

/// Slot 39: the stream's unique id (`cuStreamGetId`), the key cuBLAS caches by.
unsafe extern "C" fn stream_id(_ctx: *mut c_void, stream: *mut c_void, id: *mut u64) -> i32 {
    // SAFETY: the caller passes a stream from slot 51 and an out-pointer.
    let st = unsafe { generated::cuStreamGetId(stream.cast(), id) };
    traced("TOOLS_CONTEXT slot 39 (stream id)", st)
}

/// The table with id `uuid`, if Wormhole serves it.
pub fn find(uuid: &[u8; 16]) -> Option<Slot> {
    let table: Slot = match *uuid {
        ids::CUDART_INTERFACE => &CUDART_INTERFACE as *const _ as Slot,
        ids::TOOLS_RUNTIME_CALLBACK_HOOKS => &TOOLS_RUNTIME_CALLBACK_HOOKS as *const _ as Slot,
        ids::TOOLS_TLS => &TOOLS_TLS as *const _ as Slot,
        ids::CONTEXT_LOCAL_STORAGE => &CONTEXT_LOCAL_STORAGE as *const _ as Slot,
        ids::CONTEXT_CHECKS => &CONTEXT_CHECKS as *const _ as Slot,
        ids::INTEGRITY_CHECK => &INTEGRITY_CHECK as *const _ as Slot,
        ids::TOOLS_CONTEXT => &TOOLS_CONTEXT as *const _ as Slot,
        _ => return None,
    };
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published sample of this hash (ZLUDA's test of its own implementation): one
    /// device, driver 12020.
    #[test]
    fn the_integrity_hash_matches_the_published_sample() {
        let input = IntegrityInput {
            driver_version: 12020,
            version: 0x2B4A,
            pid: 0x4D08,
            thread: 0x2B78,
            cudart_table: 0x7FF8_C807_17F0,
            integrity_table: 0x7FF8_C825_E4B0,
            check_fn: 0x7FF8_C7DD_0AD0,
            unix_seconds: 0x64A3_65EE,
        };
        let uuid = [
            0x67, 0x22, 0xCB, 0xCF, 0xC6, 0x61, 0xF2, 0x92, 0x74, 0xD6, 0xED, 0x23, 0x2A, 0x32,
            0x13, 0x1C,
        ];
        let [lo, hi] = integrity_digest(&input, &[(uuid, 0, 4, 0)]);
        assert_eq!(
            u128::from(lo) | u128::from(hi) << 64,
            0xEAF1_3133_42BF_CD84_A7C3_4628_F214_707A
        );
    }

    #[test]
    fn tables_have_the_sizes_callers_check() {
        assert_eq!(CUDART_INTERFACE.0[0] as usize, 13 * 8);
        // cudart requires more than 0x30 bytes of this one.
        assert!(TOOLS_RUNTIME_CALLBACK_HOOKS.0[0] as usize > 0x30);
        assert_eq!(TOOLS_CONTEXT.0[0] as usize, 95 * 8);
        assert!(TOOLS_CONTEXT.0.iter().skip(1).all(|s| !s.is_null()));
        assert!(find(&[0; 16]).is_none());
        let (mut p, mut n) = (std::ptr::null_mut(), 0usize);
        // SAFETY: valid out-pointers.
        unsafe { trace_flags(&mut p, &mut n) };
        assert!(!p.is_null() && n > 566);
        // SAFETY: as above.
        unsafe { trace_flags_2(&mut p, &mut n) };
        assert!(!p.is_null() && n > 13);
    }

    #[test]
    fn context_storage_keeps_values_until_the_context_ends() {
        unsafe extern "C" fn dtor(_ctx: *mut c_void, _key: *mut c_void, value: *mut c_void) {
            // SAFETY: the test's value is a counter.
            unsafe { *(value as *mut u32) += 1 };
        }
        let ctx = 0x5000 as *mut c_void;
        let (k1, k2) = (0x10 as *mut c_void, 0x20 as *mut c_void);
        let mut ended = 0u32;
        let mut got = std::ptr::null_mut();
        // SAFETY: valid pointers throughout; the counter outlives the storage entry.
        unsafe {
            assert_ne!(
                storage_get(&mut got, ctx, k1),
                CUDA_SUCCESS,
                "missing is an error"
            );
            let v = (&mut ended as *mut u32).cast();
            assert_eq!(storage_put(ctx, k1, v, Some(dtor)), CUDA_SUCCESS);
            assert_eq!(storage_put(ctx, k2, 7 as *mut c_void, None), CUDA_SUCCESS);
            assert_eq!(storage_get(&mut got, ctx, k1), CUDA_SUCCESS);
            assert_eq!(got, v);
            assert_eq!(storage_delete(ctx, k2), CUDA_SUCCESS);
            assert_ne!(storage_get(&mut got, ctx, k2), CUDA_SUCCESS);
        }
        context_ending(ctx);
        assert_eq!(ended, 1, "the destructor ran once");
        // SAFETY: as above.
        assert_ne!(unsafe { storage_get(&mut got, ctx, k1) }, CUDA_SUCCESS);
    }
}
