//! The server must reach the real OpenCL platforms and never Wormhole's own ICD (that would
//! forward to itself). Workers get `OCL_ICD_VENDORS` pointing at a copy of the system's vendor
//! directory without Wormhole's entries.

use std::path::{Path, PathBuf};

pub const SYSTEM_VENDORS: &str = "/etc/OpenCL/vendors";

/// Whether an .icd entry names Wormhole's client library.
fn is_wormhole(entry: &str) -> bool {
    entry.to_ascii_lowercase().contains("wormhole")
}

/// Writes the filtered vendor directory under `dir` and returns it.
pub fn filtered_vendor_dir(dir: &Path) -> std::io::Result<PathBuf> {
    let source = match std::env::var_os("OCL_ICD_VENDORS") {
        Some(v) if Path::new(&v).is_dir() => PathBuf::from(v),
        _ => PathBuf::from(SYSTEM_VENDORS),
    };
    let out = dir.join(".wormhole-server-vendors");
    if out == source {
        return Ok(out);
    }
    std::fs::create_dir_all(&out)?;
    for old in std::fs::read_dir(&out)? {
        std::fs::remove_file(old?.path())?;
    }
    let mut kept = 0;
    if let Ok(entries) = std::fs::read_dir(&source) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("icd") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if is_wormhole(&text) || is_wormhole(&e.file_name().to_string_lossy()) {
                tracing::debug!(entry = %path.display(), "skipping Wormhole's own ICD");
                continue;
            }
            std::fs::write(out.join(e.file_name()), text)?;
            kept += 1;
        }
    }
    if kept == 0 {
        tracing::warn!(source = %source.display(), "no OpenCL platform found for the server to use");
    }
    Ok(out)
}
