//! The real CUDA driver, opened at run time: the system's `libcuda.so.1` (never Wormhole's own,
//! which a server started inside `wh run` finds first on the library path), loaded once on a
//! worker's first use and initialised, its entry points kept in a table the generated `ffi`
//! wrappers read. `wh` links no libcuda: it starts on machines without NVIDIA's driver, and
//! there CUDA sessions are refused with the reason (the program sees no device).

use crate::generated::ffi::Table;
use wormhole_cuda_proto::cu;
use wormhole_server::driver_table::DriverTable;
use wormhole_server::vendor_library::VendorLibrary;

/// NVIDIA's driver, by its soname and where distributions install it.
pub(crate) const LIBRARY: VendorLibrary = VendorLibrary {
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

/// The driver, opened on first use; the generated wrappers read its table. A worker refuses
/// its session when `DRIVER.load()` says why there is none.
pub(crate) static DRIVER: DriverTable<Table> = DriverTable::new(
    "the CUDA driver",
    "CUDA_ERROR_NOT_SUPPORTED",
    open,
    Table::EMPTY,
);

/// `cuGetExportTable` of the driver: the real tables, for the slots the client asks the server
/// for (see `crate::export_tables`).
pub(crate) type ExportTableFn = unsafe extern "C" fn(*mut *const usize, *const [u8; 16]) -> i32;
pub(crate) static EXPORT_TABLE: std::sync::OnceLock<Option<ExportTableFn>> =
    std::sync::OnceLock::new();

fn open() -> Result<(libloading::Library, Table), String> {
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
    // SAFETY: as above; cuGetExportTable(const void **table, const CUuuid *id).
    let export = unsafe { lib.get::<ExportTableFn>(b"cuGetExportTable\0") }
        .ok()
        .map(|f| *f);
    let _ = EXPORT_TABLE.set(export);
    tracing::info!(library = name, "CUDA driver loaded");
    Ok((lib, table))
}
