//! The real CUDA driver, opened at run time: the system's `libcuda.so.1` (never Wormhole's own,
//! which a server started inside `wh run` finds first on the library path), loaded once on a
//! worker's first use and initialised, its entry points kept in a table the generated `ffi`
//! wrappers read. `wh` links no libcuda: it starts on machines without NVIDIA's driver, and
//! there CUDA sessions are refused with the reason (the program sees no device).

use crate::generated::ffi::Table;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use wormhole_cuda_proto::cu;
use wormhole_server::vendor_library::VendorLibrary;

/// NVIDIA's driver, by its soname and where distributions install it.
const LIBRARY: VendorLibrary = VendorLibrary {
    soname: "libcuda.so.1",
    what: "NVIDIA's driver",
    paths: &[
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ],
    marker: "wormhole_cuda_client",
    ours: "libwormhole_cuda",
};

struct Driver {
    // Kept open for the life of the process: the table's pointers point into it.
    _lib: libloading::Library,
    table: Table,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

fn open() -> Result<Driver, String> {
    let (lib, name) = LIBRARY
        .open()
        .map_err(|e| format!("the server cannot load the CUDA driver (libcuda.so.1): {e}"))
        .inspect_err(|reason| tracing::warn!("{reason}"))?;
    // A driver without a usable device is no driver for our purpose: say why, once.
    // SAFETY: `lib` is NVIDIA's driver, whose cuInit has cuda.h's signature.
    let init = match unsafe { lib.get::<unsafe extern "C" fn(u32) -> i32>(b"cuInit\0") } {
        // SAFETY: cuInit(0) has no pointer arguments.
        Ok(cu_init) => unsafe { cu_init(0) },
        Err(_) => cu::CUDA_ERROR_NOT_SUPPORTED,
    };
    if init != cu::CUDA_SUCCESS {
        let what = cu::error_name(init).map_or(String::from("?"), |n| n.to_string_lossy().into());
        let reason = format!(
            "the CUDA driver ({name}) has no usable device: cuInit(0) returned {what} ({init})"
        );
        tracing::warn!("{reason}");
        return Err(reason);
    }
    // SAFETY: `lib` is a CUDA driver (NVIDIA's): its symbols have the signatures of cuda.h.
    let table = unsafe { Table::load(&lib) };
    tracing::info!(library = name, "CUDA driver loaded");
    Ok(Driver { _lib: lib, table })
}

/// Whether NVIDIA's `libcuda.so.1` is on this machine, judged from files alone (the
/// supervisor loads no driver).
pub fn installed() -> Result<(), String> {
    LIBRARY.installed()
}

/// Loads and initialises the driver if no call did yet; Err says why there is none (logged
/// once). A worker refuses its session on Err.
pub fn load() -> Result<(), &'static str> {
    match DRIVER.get_or_init(open) {
        Ok(_) => Ok(()),
        Err(reason) => Err(reason),
    }
}

/// The entry points: one atomic load after the first call.
#[inline]
pub(crate) fn table() -> &'static Table {
    static EMPTY: Table = Table::EMPTY;
    match DRIVER.get_or_init(open) {
        Ok(d) => &d.table,
        Err(_) => &EMPTY,
    }
}

/// A wrapper found no entry point `name` (a driver older than the description): logs it once.
#[cold]
pub(crate) fn missing(name: &str, logged: &AtomicBool) {
    if matches!(DRIVER.get(), Some(Ok(_))) && !logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "the CUDA driver has no {name}: calls to it answer CUDA_ERROR_NOT_SUPPORTED"
        );
    }
}
