//! Finding a vendor's library that a Wormhole client library stands in for (NVIDIA's
//! `libcuda.so.1`, `libnvidia-ml.so.1`): a worker opens the vendor's own, never Wormhole's,
//! which a server started inside `wh run` finds first on the library path under the same
//! soname; the supervisor only asks whether the library is installed, from files alone (it
//! loads no driver).

use std::path::{Path, PathBuf};

/// A library by its soname and where distributions install it.
pub struct VendorLibrary {
    /// The soname (`libcuda.so.1`).
    pub soname: &'static str,
    /// What it is, for messages (`NVIDIA's driver`).
    pub what: &'static str,
    /// Where distributions install it, tried when the soname finds Wormhole's own first.
    pub paths: &'static [&'static str],
    /// A symbol only Wormhole's stand-in exports (`wormhole_cuda_client`).
    pub marker: &'static str,
    /// How the file of Wormhole's stand-in is named (`libwormhole_cuda`).
    pub ours: &'static str,
}

impl VendorLibrary {
    /// Opens the vendor's library: the soname, then the usual paths, skipping Wormhole's own
    /// (recognised by its marker symbol). Err says why none is: briefly when there is no such
    /// library at all (the common case on a machine without the vendor's driver), in full
    /// when some candidate exists but could not be used. The name opened comes back too.
    pub fn open(&self) -> Result<(libloading::Library, &'static str), String> {
        let mut problems = Vec::new();
        let marker = format!("{}\0", self.marker);
        for name in std::iter::once(&self.soname).chain(self.paths) {
            // SAFETY: loading a vendor's driver library runs its initialisers, which expect
            // nothing of us.
            match unsafe { libloading::Library::new(name) } {
                // SAFETY: only the symbol's presence is asked for.
                Ok(lib) if unsafe { lib.get::<*const u8>(marker.as_bytes()) }.is_ok() => {
                    problems.push(format!("{name} is Wormhole's own client library"));
                }
                Ok(lib) => return Ok((lib, name)),
                Err(e) if e.to_string().contains("No such file") => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
        Err(if problems.is_empty() {
            format!(
                "no {} on the library path or in {}",
                self.soname,
                self.dirs()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            problems.join("; ")
        })
    }

    fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.paths.iter().filter_map(|p| Path::new(p).parent())
    }

    /// Whether the vendor's library is on this machine, judged from files alone: in the
    /// library path, the dynamic linker's cache, or where distributions install it, and not
    /// Wormhole's own library under that name.
    pub fn installed(&self) -> Result<(), String> {
        let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        dirs.extend(self.dirs().map(PathBuf::from));
        let mut paths: Vec<PathBuf> = dirs.iter().map(|d| d.join(self.soname)).collect();
        paths.extend(linker_cache_entries(self.soname));
        let ours = |p: &Path| {
            std::fs::canonicalize(p).is_ok_and(|real| {
                real.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(self.ours))
            })
        };
        match paths.iter().find(|p| p.exists() && !ours(p)) {
            Some(_) => Ok(()),
            None => Err(format!(
                "no {} ({}) on this machine",
                self.soname, self.what
            )),
        }
    }
}

/// The paths `/etc/ld.so.cache` holds for a library of this name (its entries are
/// NUL-terminated strings: the name, and the full path ending in it).
fn linker_cache_entries(name: &str) -> Vec<PathBuf> {
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
            found.push(PathBuf::from(
                String::from_utf8_lossy(&cache[start..end]).into_owned(),
            ));
        }
        at = end;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The linker's cache names libraries by full path: what it gives for a library every
    /// machine running the tests has (the C library) is such a path.
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

    const NONE: VendorLibrary = VendorLibrary {
        soname: "libno-such-vendor.so.1",
        what: "NVIDIA's driver",
        paths: &["/usr/lib/x86_64-linux-gnu/libno-such-vendor.so.1"],
        marker: "wormhole_no_such_client",
        ours: "libwormhole_no_such",
    };

    #[test]
    fn a_missing_library_is_named_with_where_it_was_looked_for() {
        let why = NONE.open().err().unwrap();
        assert_eq!(
            why,
            "no libno-such-vendor.so.1 on the library path or in /usr/lib/x86_64-linux-gnu"
        );
        assert_eq!(
            NONE.installed(),
            Err("no libno-such-vendor.so.1 (NVIDIA's driver) on this machine".into())
        );
    }

    /// A library present on every machine (the C library) is installed and opens.
    #[test]
    fn a_present_library_is_installed_and_opens() {
        let libc = VendorLibrary {
            soname: "libc.so.6",
            what: "the C library",
            paths: &[],
            marker: "wormhole_no_such_client",
            ours: "libwormhole_no_such",
        };
        assert!(libc.installed().is_ok());
        assert_eq!(libc.open().map(|(_, n)| n).ok(), Some("libc.so.6"));
    }
}
