//! The real CUDA driver, opened at run time: the system's `libcuda.so.1` (never Wormhole's own,
//! which a server started inside `wh run` finds first on the library path), loaded once on a
//! worker's first use and initialised, its entry points kept in a table the generated `ffi`
//! wrappers read. `wh` links no libcuda: it starts on machines without NVIDIA's driver, and
//! there CUDA sessions are refused with the reason (the program sees no device).

use crate::generated::ffi::Table;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use wormhole_cuda_proto::cu;

/// The driver by its soname, then where distributions install it (when the soname found
/// Wormhole's own library first).
const CANDIDATES: &[&str] = &[
    "libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

struct Driver {
    // Kept open for the life of the process: the table's pointers point into it.
    _lib: libloading::Library,
    table: Table,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// Opens the first candidate that is NVIDIA's driver and not Wormhole's client. Err says why
/// none is: briefly when there is no driver at all (the common case on a machine without
/// NVIDIA's), in full when some candidate exists but could not be used.
fn open_library() -> Result<(libloading::Library, &'static str), String> {
    let mut problems = Vec::new();
    for name in CANDIDATES {
        // SAFETY: loading a CUDA driver runs its initialisers, which expect nothing of us.
        match unsafe { libloading::Library::new(name) } {
            // SAFETY: only the symbol's presence is asked for.
            Ok(lib) if unsafe { lib.get::<*const u8>(b"wormhole_cuda_client\0") }.is_ok() => {
                problems.push(format!("{name} is Wormhole's own client library"));
            }
            Ok(lib) => return Ok((lib, name)),
            Err(e) if e.to_string().contains("No such file") => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    Err(if problems.is_empty() {
        format!(
            "no libcuda.so.1 on the library path or in {}",
            CANDIDATES[1..]
                .iter()
                .filter_map(|c| c.rsplit_once('/').map(|(dir, _)| dir))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        problems.join("; ")
    })
}

fn open() -> Result<Driver, String> {
    let (lib, name) = open_library()
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
/// supervisor loads no driver): in the library path, the dynamic linker's cache, or where
/// distributions install it, and not Wormhole's own library under that name.
pub fn installed() -> Result<(), String> {
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        CANDIDATES[1..]
            .iter()
            .filter_map(|c| std::path::Path::new(c).parent().map(Into::into)),
    );
    let mut paths: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.join("libcuda.so.1")).collect();
    paths.extend(linker_cache_entries("libcuda.so.1"));
    let ours = |p: &std::path::Path| {
        std::fs::canonicalize(p).is_ok_and(|real| {
            real.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libwormhole_cuda"))
        })
    };
    match paths.iter().find(|p| p.exists() && !ours(p)) {
        Some(_) => Ok(()),
        None => Err("no libcuda.so.1 (NVIDIA's driver) on this machine".into()),
    }
}

/// The paths `/etc/ld.so.cache` holds for a library of this name (its entries are
/// NUL-terminated strings: the name, and the full path ending in it).
fn linker_cache_entries(name: &str) -> Vec<std::path::PathBuf> {
    let Ok(cache) = std::fs::read("/etc/ld.so.cache") else {
        return Vec::new();
    };
    let tail = format!("/{name}\0");
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = cache[at..]
        .windows(tail.len())
        .position(|w| w == tail.as_bytes())
    {
        let end = at + i + tail.len() - 1;
        let start = cache[..end]
            .iter()
            .rposition(|&b| b == 0)
            .map_or(0, |z| z + 1);
        if cache[start] == b'/' {
            found.push(std::path::PathBuf::from(
                String::from_utf8_lossy(&cache[start..end]).into_owned(),
            ));
        }
        at = end;
    }
    found
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The linker's cache names libraries by full path: what it gives for a library every
    /// machine running the tests has (the ICD loader) is such a path.
    #[test]
    fn the_linker_cache_gives_full_paths() {
        for p in linker_cache_entries("libc.so.6") {
            assert!(
                p.is_absolute() && p.ends_with("libc.so.6"),
                "{}",
                p.display()
            );
        }
        assert!(linker_cache_entries("libno-such-library.so.9").is_empty());
    }
}
