//! The real driver stack, opened at run time: the system ICD loader (`libOpenCL.so.1`) is
//! loaded once, on a worker's first use, and its entry points are kept in a table that the
//! generated `ffi` wrappers read. Nothing links libOpenCL, so `wh` starts (and the supervisor,
//! `wh run` and `wh status` work) whatever loader comes first on the library path, and a loader
//! that lacks some entry point costs only that entry point.

use crate::generated::ffi::Table;
use wormhole_server::driver_table::DriverTable;

/// The library the entry points come from: the ICD loader, by its soname.
pub const LIBRARY: &str = "libOpenCL.so.1";

/// The driver, opened on first use; the generated wrappers read its table. A worker refuses
/// its session when `DRIVER.load()` says why there is none.
pub(crate) static DRIVER: DriverTable<Table> = DriverTable::new(
    "the OpenCL driver (libOpenCL.so.1)",
    "CL_INVALID_OPERATION",
    open,
    Table::EMPTY,
);

fn open() -> Result<(libloading::Library, Table), String> {
    // SAFETY: loading the ICD loader runs its initialisers, which expect nothing of us; the
    // library's symbols are OpenCL's, as `Table::load` requires.
    let loaded = unsafe { libloading::Library::new(LIBRARY) }.map(|lib| {
        // SAFETY: as above: `lib` is the OpenCL ICD loader.
        let table = unsafe { Table::load(&lib) };
        (lib, table)
    });
    match loaded {
        Ok(d) => {
            tracing::info!(library = LIBRARY, "OpenCL driver loaded");
            Ok(d)
        }
        Err(e) => {
            let reason = format!("the server cannot load the OpenCL driver ({LIBRARY}): {e}");
            tracing::error!("{reason}");
            Err(reason)
        }
    }
}
