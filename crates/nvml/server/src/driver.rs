//! The real NVML, opened at run time: the system's `libnvidia-ml.so.1` (never Wormhole's own,
//! which a server started inside `wh run` finds first on the library path), loaded once on a
//! worker's first use and initialised, its entry points kept in a table the generated `ffi`
//! wrappers read. `wh` links no NVML: on a machine without NVIDIA's driver NVML sessions are
//! refused with the reason (the program's `nvmlInit` says the driver is not loaded).

use crate::generated::ffi::Table;
use wormhole_nvml_proto::nv;
use wormhole_server::driver_table::DriverTable;
use wormhole_server::vendor_library::VendorLibrary;

/// NVIDIA's NVML, by its soname and where distributions install it.
pub(crate) const LIBRARY: VendorLibrary = VendorLibrary {
    soname: "libnvidia-ml.so.1",
    what: "NVIDIA's driver",
    paths: &[
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    ],
    marker: "wormhole_nvml_client",
    ours: "libwormhole_nvml",
};

/// The driver, opened on first use; the generated wrappers read its table. A worker refuses
/// its session when `DRIVER.load()` says why there is none.
pub(crate) static DRIVER: DriverTable<Table> =
    DriverTable::new("NVML", "NVML_ERROR_NOT_SUPPORTED", open, Table::EMPTY);

fn open() -> Result<(libloading::Library, Table), String> {
    let (lib, name) = LIBRARY
        .open()
        .map_err(|e| format!("the server cannot load NVML (libnvidia-ml.so.1): {e}"))
        .inspect_err(|reason| tracing::warn!("{reason}"))?;
    // SAFETY: `lib` is NVIDIA's NVML, whose nvmlInit_v2 has nvml.h's signature.
    let init = match unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"nvmlInit_v2\0") } {
        // SAFETY: no arguments.
        Ok(init) => unsafe { init() },
        Err(_) => nv::NVML_ERROR_FUNCTION_NOT_FOUND,
    };
    if init != nv::NVML_SUCCESS {
        let reason = format!(
            "NVML ({name}) cannot start: nvmlInit_v2 returned {init} ({})",
            nv::error_string(init).to_string_lossy()
        );
        tracing::warn!("{reason}");
        return Err(reason);
    }
    // SAFETY: `lib` is NVIDIA's NVML: its symbols have the signatures of nvml.h.
    let table = unsafe { Table::load(&lib) };
    tracing::info!(library = name, "NVML loaded");
    Ok((lib, table))
}
