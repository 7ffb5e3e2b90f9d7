//! Entry points answered in the client: status names and messages, the version-aware
//! entry-point lookup (`cuGetProcAddress`, through which cudart finds every other entry point),
//! the export tables, and the two calls that decide whether the program has a device
//! (`cuInit`, `cuDriverGetVersion`), which must answer even with no server.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

pub use crate::capture::*;
use crate::connection;
pub use crate::context_facts::{
    cuCtxGetDevice, cuCtxGetDevice_v2, cuCtxGetId, cuDeviceGetAttribute,
    cuDevicePrimaryCtxGetState, cuFuncGetAttribute, cuKernelGetAttribute,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
};
pub use crate::copies::*;
use crate::current;
use crate::generated;
pub use crate::host_memory_pinned::{
    cuMemAllocHost_v2, cuMemFreeHost, cuMemHostAlloc, cuMemHostGetDevicePointer_v2,
    cuMemHostGetFlags, cuMemHostRegister, cuMemHostRegister_v2, cuMemHostUnregister,
};
pub use crate::memory::{
    cuMemAddressFree, cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocPitch_v2, cuMemAlloc_v2,
    cuMemFreeAsync, cuMemFreeAsync_ptsz, cuMemFree_v2, cuMemGetAddressRange_v2, cuMemMap,
    cuMemPoolGetAttribute, cuMemPoolSetAttribute, cuMemUnmap, cuMemcpy, cuMemcpyAsync,
    cuMemcpyAsync_ptsz, cuMemcpy_ptds,
};
use crate::rt::{self, entry_status, ApiErr};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, OnceLock};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::CUDA_VERSION;

/// `cuGetErrorName`.
///
/// # Safety
/// `p_str` must be NULL or point to a writable `const char *`.
pub unsafe fn cuGetErrorName(error: u32, p_str: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { error_text(error, p_str, error_name) }
}

/// `cuGetErrorString`.
///
/// # Safety
/// As [`cuGetErrorName`].
pub unsafe fn cuGetErrorString(error: u32, p_str: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { error_text(error, p_str, error_string) }
}

/// # Safety
/// As [`cuGetErrorName`].
unsafe fn error_text(
    error: u32,
    p_str: *mut c_void,
    text: fn(i32) -> Option<&'static CStr>,
) -> i32 {
    if p_str.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (s, status) = match text(error as i32) {
        Some(s) => (s.as_ptr(), CUDA_SUCCESS),
        // The driver's answer for a value that is no status: NULL and INVALID_VALUE.
        None => (std::ptr::null(), CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: per the contract, `p_str` points to a `const char *`.
    unsafe { *(p_str as *mut *const c_char) = s };
    status
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: the `_ptds`/`_ptsz` symbol is asked for.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CUdriverProcAddressQueryResult`.
const SYMBOL_SUCCESS: i32 = 0;
const SYMBOL_NOT_FOUND: i32 = 1;
const VERSION_NOT_SUFFICIENT: i32 = 2;

/// The entry point's name without its ABI suffixes (`cuMemcpyHtoD_v2_ptds` → `cuMemcpyHtoD`).
fn base_name(symbol: &str) -> &str {
    let s = symbol
        .strip_suffix("_ptds")
        .or_else(|| symbol.strip_suffix("_ptsz"))
        .unwrap_or(symbol);
    match s.rsplit_once("_v") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => s,
    }
}

fn per_thread(symbol: &str) -> bool {
    symbol.ends_with("_ptds") || symbol.ends_with("_ptsz")
}

/// The symbol `cuGetProcAddress(name, version, flags)` answers: of the symbols of that entry
/// point, the newest whose ABI (`@since`) is no newer than `version`, the per-thread
/// default-stream one if asked for and there is one. Err is the query result to report.
pub fn resolve(name: &str, version: i32, per_thread_stream: bool) -> Result<&'static str, i32> {
    // cudart looks up every entry point at start-up (over 600 lookups): each finds its
    // symbols in a map made once, not in a scan of every symbol.
    static BY_BASE_NAME: OnceLock<HashMap<&'static str, Vec<(&'static str, u32)>>> =
        OnceLock::new();
    let by_base_name = BY_BASE_NAME.get_or_init(|| {
        let mut m: HashMap<_, Vec<_>> = HashMap::new();
        for &(symbol, since) in generated::SINCE {
            m.entry(base_name(symbol))
                .or_default()
                .push((symbol, since));
        }
        m
    });
    let candidates = by_base_name.get(name).ok_or(SYMBOL_NOT_FOUND)?;
    let fitting: Vec<(&'static str, u32)> = candidates
        .iter()
        .filter(|(_, since)| i64::from(*since) <= i64::from(version))
        .copied()
        .collect();
    let newest = |pt: bool| {
        fitting
            .iter()
            .filter(|(s, _)| per_thread(s) == pt)
            .max_by_key(|(_, since)| *since)
            .map(|(s, _)| *s)
    };
    let chosen = if per_thread_stream {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    chosen.ok_or(VERSION_NOT_SUFFICIENT)
}

/// `cuGetProcAddress` (CUDA 11.3 ABI, without the query result).
///
/// # Safety
/// `symbol` NULL or a C string, `pfn` NULL or a writable `void *`.
pub unsafe fn cuGetProcAddress(
    symbol: *mut c_void,
    pfn: *mut c_void,
    cuda_version: i32,
    flags: u64,
) -> i32 {
    // SAFETY: per the contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

/// `cuGetProcAddress_v2`: how cudart (static or shared) finds every entry point.
///
/// # Safety
/// As [`cuGetProcAddress`]; `symbol_status` NULL or a writable int.
pub unsafe fn cuGetProcAddress_v2(
    symbol: *mut c_void,
    pfn: *mut c_void,
    cuda_version: i32,
    flags: u64,
    symbol_status: *mut c_void,
) -> i32 {
    entry_status(|| {
        if symbol.is_null() || pfn.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let pfn = pfn as *mut *mut c_void;
        // SAFETY: per the contract.
        let name = unsafe { CStr::from_ptr(symbol as *const c_char) };
        let found = name
            .to_str()
            .map_err(|_| SYMBOL_NOT_FOUND)
            .and_then(|n| resolve(n, cuda_version, flags & PER_THREAD_DEFAULT_STREAM != 0));
        wormhole_session::trace::note(wormhole_cuda_proto::API, || {
            let answer = match found {
                Ok(s) => s.to_string(),
                Err(q) => format!("none (query result {q})"),
            };
            format!("lookup {name:?} for CUDA {cuda_version}, flags {flags:#x}: {answer}")
        });
        let (ptr, query, status) = match found {
            Ok(s) => (
                generated::lookup(s.as_bytes()),
                SYMBOL_SUCCESS,
                CUDA_SUCCESS,
            ),
            Err(q) => (std::ptr::null_mut(), q, CUDA_ERROR_NOT_FOUND),
        };
        // SAFETY: per the contract.
        unsafe { *pfn = ptr };
        if !symbol_status.is_null() {
            // SAFETY: per the contract.
            unsafe { *(symbol_status as *mut i32) = query };
        }
        Ok(status)
    })
}

/// An export table's id as the log and the trace name it: its bytes in hex.
fn table_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// `cuGetExportTable`: NVIDIA's private tables (what cudart, cuBLAS and cuDNN ask of the
/// driver beyond its documented API), served by `export_tables`. The runtimes' optional
/// shortcut table is absent (CUDA_ERROR_NOT_FOUND); any other table asked for is named once in
/// the log, and the call fails with the table NULL (what callers of an optional table expect
/// of a driver that lacks it).
///
/// # Safety
/// `pp_table` NULL or a writable pointer, `table_id` NULL or 16 readable bytes.
pub unsafe fn cuGetExportTable(pp_table: *mut c_void, table_id: *mut c_void) -> i32 {
    entry_status(|| {
        if pp_table.is_null() || table_id.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let uuid = unsafe { *(table_id as *const [u8; 16]) };
        let table = crate::export_tables::find(&uuid);
        // SAFETY: per the contract.
        unsafe { *(pp_table as *mut *const c_void) = table.unwrap_or(std::ptr::null()) };
        wormhole_session::trace::note(wormhole_cuda_proto::API, || {
            let served = if table.is_some() {
                "served"
            } else {
                "not served"
            };
            format!("export table {}: {served}", table_hex(&uuid))
        });
        if table.is_some() {
            return Ok(CUDA_SUCCESS);
        }
        if uuid == wormhole_cuda_proto::export_tables::RUNTIME_SHORTCUT {
            // Known and optional: every runtime asks, and starts the ordinary way without it.
            return Err(ApiErr(CUDA_ERROR_NOT_FOUND));
        }
        let hex = table_hex(&uuid);
        static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
        let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
        if logged.get_or_insert_with(HashSet::new).insert(hex.clone()) {
            connection::log(&format!(
                "cuGetExportTable({hex}): this export table is not served by Wormhole; returning CUDA_ERROR_NOT_SUPPORTED"
            ));
        }
        Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED))
    })
}

/// `cuCtxDestroy_v2`: what the program's libraries keep with the context goes to their
/// destructors first (see `export_tables`), then the server destroys it.
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuCtxDestroy_v2(ctx: *mut c_void) -> i32 {
    // SAFETY: a live context object is dereferenced only when registered.
    if unsafe { crate::objects::get(ctx, wormhole_cuda_proto::HandleKind::Context) }.is_some() {
        crate::export_tables::context_ending(ctx);
    }
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxDestroy_v2(ctx.cast()) };
    current::contexts_changed();
    if status == CUDA_SUCCESS {
        crate::allocations::context_ended();
    }
    status
}

/// `cuDevicePrimaryCtxReset_v2`: as `cuCtxDestroy_v2`, for the device's primary context
/// (which keeps its handle: cudart's state must not outlive the reset).
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuDevicePrimaryCtxReset_v2(dev: i32) -> i32 {
    // SAFETY: a value parameter.
    reset(dev, || unsafe {
        generated::wire_cuDevicePrimaryCtxReset_v2(dev)
    })
}

/// A primary context's reset (`forward` sends it): the destructors first, then the reset.
fn reset(dev: i32, forward: impl FnOnce() -> i32) -> i32 {
    if rt::check_initialized().is_ok() {
        crate::export_tables::primary_context_ending(dev);
    }
    let status = forward();
    current::contexts_changed();
    if status == CUDA_SUCCESS {
        rt::recovered();
        crate::allocations::context_ended();
    }
    status
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release deactivates the context.
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuDevicePrimaryCtxRelease_v2(dev: i32) -> i32 {
    // SAFETY: a value parameter.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxRelease_v2(dev) };
    released(dev, status)
}

/// After a primary context's release: the thread's current context is the driver's to say
/// again, and after the last release (the context is inactive) what the program's libraries
/// kept with it goes to their destructors, as when it is reset (a later retain must not find
/// state of the context that was).
fn released(dev: i32, status: i32) -> i32 {
    current::contexts_changed();
    if status == CUDA_SUCCESS {
        let (mut flags, mut active) = (0u32, 1u32);
        // SAFETY: valid out-pointers.
        let st = unsafe { generated::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
        if st == CUDA_SUCCESS && active == 0 {
            crate::export_tables::primary_context_ending(dev);
            crate::allocations::context_ended();
        }
    }
    status
}

/// `cuDevicePrimaryCtxReset` (the symbol cudart asks for at version 7000): as `_v2`.
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuDevicePrimaryCtxReset(dev: i32) -> i32 {
    // SAFETY: a value parameter.
    reset(dev, || unsafe {
        generated::wire_cuDevicePrimaryCtxReset(dev)
    })
}

/// `cuDevicePrimaryCtxRelease` (cudart's at version 7000, called at every program's exit): as
/// `_v2`.
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuDevicePrimaryCtxRelease(dev: i32) -> i32 {
    // SAFETY: a value parameter.
    let status = unsafe { generated::wire_cuDevicePrimaryCtxRelease(dev) };
    released(dev, status)
}

/// `cuCtxGetCurrent`: from the client when it knows (see `current`), else from the server.
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`.
pub unsafe fn cuCtxGetCurrent(pctx: *mut *mut c_void) -> i32 {
    // Not in a fork's child, a host function or after a sticky fault (`rt::answerable_here`).
    if let (Some(ctx), false, true) = (current::known(), pctx.is_null(), rt::answerable_here()) {
        // SAFETY: per the contract.
        unsafe { *pctx = ctx };
        return CUDA_SUCCESS;
    }
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxGetCurrent(pctx.cast()) };
    if status == CUDA_SUCCESS && !pctx.is_null() {
        // SAFETY: the call succeeded, so it wrote the context.
        current::set(unsafe { *pctx });
    }
    status
}

/// `cuCtxSetCurrent`: the client then knows the answer (unless it was NULL, which pops).
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuCtxSetCurrent(ctx: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxSetCurrent(ctx.cast()) };
    match (status, ctx.is_null()) {
        (CUDA_SUCCESS, false) => current::set(ctx),
        // NULL pops the thread's context stack: what is current is the driver's to say.
        (CUDA_SUCCESS, true) => current::forget(),
        _ => {}
    }
    status
}

/// `cuCtxPushCurrent_v2`: as `cuCtxSetCurrent`.
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxPushCurrent_v2(ctx.cast()) };
    if status == CUDA_SUCCESS {
        current::set(ctx);
    }
    status
}

/// `cuCtxPopCurrent_v2`: what is current next is the driver's stack's to say.
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`.
pub unsafe fn cuCtxPopCurrent_v2(pctx: *mut *mut c_void) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxPopCurrent_v2(pctx.cast()) };
    current::forget();
    status
}

/// `cuCtxCreate_v2`: the new context is current.
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`.
pub unsafe fn cuCtxCreate_v2(pctx: *mut *mut c_void, flags: u32, dev: i32) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuCtxCreate_v2(pctx.cast(), flags, dev) };
    if status == CUDA_SUCCESS && !pctx.is_null() {
        // SAFETY: the call succeeded, so it wrote the context.
        current::set(unsafe { *pctx });
    }
    status
}

/// `cuCtxCreate_v4`, which CUDA 13's headers call `cuCtxCreate`: it takes creation parameters.
/// Without any (NULL, or no execution affinity and no CIG
/// parameters) it makes the context `cuCtxCreate_v2` makes; execution affinity (SM limits)
/// and CUDA-in-graphics contexts are not forwarded.
///
/// # Safety
/// `pctx` NULL or a writable `CUcontext`; `params` NULL or a `CUctxCreateParams`.
pub unsafe fn cuCtxCreate_v4(pctx: *mut c_void, params: *mut c_void, flags: u32, dev: i32) -> i32 {
    /// `CUctxCreateParams` as cuda.h lays it out.
    #[repr(C)]
    struct CreateParams {
        exec_affinity: *mut c_void,
        num_exec_affinity: i32,
        cig: *mut c_void,
    }
    // SAFETY: per the contract, `params` is NULL or points to the struct.
    if let Some(p) = unsafe { (params as *const CreateParams).as_ref() } {
        if p.num_exec_affinity != 0 || !p.cig.is_null() {
            rt::log_unsupported("cuCtxCreate_v4 with execution affinity or CIG parameters");
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    // SAFETY: per the contract.
    unsafe { cuCtxCreate_v2(pctx.cast(), flags, dev) }
}

/// `cuStreamGetCtx_v2`: the stream's context, and NULL for its green context (Wormhole makes
/// none: `cuGreenCtxCreate` is not forwarded).
///
/// # Safety
/// `pctx` and `pgreen` NULL or writable handles.
pub unsafe fn cuStreamGetCtx_v2(
    stream: generated::Handle,
    pctx: *mut c_void,
    pgreen: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe { stream_ctx(generated::wire_cuStreamGetCtx(stream, pctx.cast()), pgreen) }
}

/// `cuStreamGetCtx_v2_ptsz`.
///
/// # Safety
/// As `cuStreamGetCtx_v2`.
pub unsafe fn cuStreamGetCtx_v2_ptsz(
    stream: generated::Handle,
    pctx: *mut c_void,
    pgreen: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        stream_ctx(
            generated::wire_cuStreamGetCtx_ptsz(stream, pctx.cast()),
            pgreen,
        )
    }
}

/// Completes a `cuStreamGetCtx_v2` whose context query answered `status`.
///
/// # Safety
/// `pgreen` NULL or a writable `CUgreenCtx`.
unsafe fn stream_ctx(status: i32, pgreen: *mut c_void) -> i32 {
    if status == CUDA_SUCCESS && !pgreen.is_null() {
        // SAFETY: per the contract.
        unsafe { *(pgreen as *mut *mut c_void) = std::ptr::null_mut() };
    }
    status
}

/// `cuInit`: opens the session (the first call) and initialises the server's driver. Without
/// a server, or with a server that has no CUDA device, the answer is CUDA_ERROR_NO_DEVICE, as
/// the real driver answers on a machine without one, and the reason is logged.
///
/// # Safety
/// None (a value parameter).
pub unsafe fn cuInit(flags: u32) -> i32 {
    entry_status(|| {
        connection::get().map_err(|_| ApiErr(CUDA_ERROR_NO_DEVICE))?;
        // SAFETY: value parameters only.
        let status = unsafe { generated::wire_cuInit(flags) };
        if status == CUDA_SUCCESS {
            crate::rt::set_initialized();
        }
        Ok(status)
    })
}

/// `cuDriverGetVersion`: the server's driver version; with no server, the version of the
/// driver API this library implements (cudart requires one before it calls `cuInit`, which
/// then reports that there is no device).
///
/// # Safety
/// `driver_version` NULL or a writable int.
pub unsafe fn cuDriverGetVersion(driver_version: *mut u32) -> i32 {
    entry_status(|| {
        if driver_version.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        if connection::get().is_ok() {
            // SAFETY: per the contract.
            return Ok(unsafe { generated::wire_cuDriverGetVersion(driver_version) });
        }
        // SAFETY: per the contract.
        unsafe { *driver_version = CUDA_VERSION as u32 };
        Ok(CUDA_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_drop_the_abi_suffixes() {
        assert_eq!(base_name("cuMemcpyHtoD_v2_ptds"), "cuMemcpyHtoD");
        assert_eq!(base_name("cuCtxCreate_v4"), "cuCtxCreate");
        assert_eq!(base_name("cuLaunchKernel_ptsz"), "cuLaunchKernel");
        assert_eq!(base_name("cuInit"), "cuInit");
        assert_eq!(base_name("cuMemGetInfo_v2"), "cuMemGetInfo");
    }

    /// Every lookup cudart 13.0 makes through `cuGetProcAddress` (recorded with a logging
    /// driver), against the symbol the same cudart asks `dlsym` for on its fallback path: the
    /// two must agree, or cudart would call an entry point with another ABI than it expects.
    #[test]
    fn lookups_agree_with_what_cudart_expects() {
        let table = include_str!("../tests/cudart-13.0-procaddress.tsv");
        let mut checked = 0;
        for line in table.lines().filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split('\t').collect();
            let (name, version, flags, expected) = (
                f[0],
                f[1].parse::<i32>().unwrap(),
                f[2].parse::<u64>().unwrap(),
                f[3],
            );
            let got = resolve(name, version, flags & PER_THREAD_DEFAULT_STREAM != 0);
            assert_eq!(got, Ok(expected), "{name} {version} {flags}");
            checked += 1;
        }
        assert_eq!(checked, 436);
    }

    #[test]
    fn unknown_and_too_new_lookups_are_refused() {
        assert_eq!(
            resolve("cuNoSuchThing", 13000, false),
            Err(SYMBOL_NOT_FOUND)
        );
        assert_eq!(resolve("", 0, false), Err(SYMBOL_NOT_FOUND));
        assert_eq!(
            resolve("cuCtxCreate", 1000, false),
            Err(VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(resolve("cuCtxCreate", 13000, false), Ok("cuCtxCreate_v4"));
        assert_eq!(
            resolve("cuMemcpyHtoD", 13000, true),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(resolve("cuMemcpyHtoD", 13000, false), Ok("cuMemcpyHtoD_v2"));
    }
}
