//! Where a build looks for headers, as the application's side sees it (INCLUDES, see the
//! client's `includes.rs`): its working directory and the headers it read. A build that may
//! read the server's files (the same user, the same files) has its relative `-I` directories
//! made relative to the application's directory, not the worker's; a confined one (the build
//! sandbox) reads the application's copies, written to a directory of the worker's own that
//! its `-I` options are pointed at. Either way the program answers as natively: its build
//! options as given, its log naming the application's directories (`BuildPaths`).

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use wormhole_opencl_proto::cl::*;
use wormhole_opencl_proto::requests::{Includes, MAX_INCLUDED_BYTES};

/// One header: the index of the `-I` directory it was found in, its path below it, its bytes
/// (None: the application may not read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub dir: u32,
    pub path: PathBuf,
    pub data: Option<Vec<u8>>,
}

/// What INCLUDES said of the next build of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub cwd: PathBuf,
    pub headers: Vec<Header>,
}

/// The headers of a request, checked: each path relative and inside its directory, the
/// directory one the client could name, the whole within the bound.
pub fn accept(req: &Includes<'_>) -> Result<Sent, i32> {
    let cwd = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(req.cwd));
    if !cwd.is_absolute() || req.cwd.contains(&0) {
        tracing::warn!("INCLUDES refused: the working directory must be an absolute path");
        return Err(CL_INVALID_VALUE);
    }
    Ok(Sent {
        cwd,
        headers: headers(req)?,
    })
}

fn headers(req: &Includes<'_>) -> Result<Vec<Header>, i32> {
    let mut total = 0usize;
    req.files
        .iter()
        .map(|f| {
            let path =
                Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(f.path));
            let plain = !f.path.is_empty()
                && !f.path.contains(&0)
                && path
                    .components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            total += f.data.map_or(0, |d| d.len());
            if !plain || f.dir >= 4096 || total > MAX_INCLUDED_BYTES {
                tracing::warn!(
                    path = %path.display(),
                    "INCLUDES refused: a header path must stay inside its directory"
                );
                return Err(CL_INVALID_VALUE);
            }
            Ok(Header {
                dir: f.dir,
                path: path.to_path_buf(),
                data: f.data.map(|d| d.to_vec()),
            })
        })
        .collect()
}

/// The headers written out for one build; removed when dropped (the build has read them).
pub struct Materialized {
    pub root: PathBuf,
    /// The copies the build may read: not the stand-ins for headers the application may not
    /// read, which the build finds and cannot open, as natively.
    pub readable: Vec<PathBuf>,
}

impl Drop for Materialized {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A build's `-I` directories pointed elsewhere, and what the program answers instead.
pub struct Redirect {
    /// The options the driver builds with.
    pub options: CString,
    /// The worker's copies of the headers (confined builds), removed when this is dropped.
    pub copies: Option<Materialized>,
    pub paths: BuildPaths,
}

/// What a program built through a `Redirect` answers as natively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildPaths {
    /// CL_PROGRAM_BUILD_OPTIONS: the options as the application gave them.
    pub options: Vec<u8>,
    /// Each directory the driver read from, and the application's name for it (the build
    /// log names the former).
    pub dirs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl BuildPaths {
    /// A build log with the driver's directories named as the application named them (a
    /// directory as a path's head only: `/app/inc/` is not the start of `/app/include/`).
    pub fn log(&self, log: &[u8]) -> Vec<u8> {
        let mut out = log.to_vec();
        for (theirs, ours) in &self.dirs {
            let slashed = |d: &[u8]| [d, b"/"].concat();
            out = replace(&out, &slashed(theirs), &slashed(ours));
        }
        out
    }
}

fn replace(text: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() {
        return text.to_vec();
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// Where a build of `options` reads its headers: the application's copies for a confined
/// build, its own directories (relative ones made relative to its working directory) for
/// one that may read them itself. None where nothing changes.
pub fn redirect(sent: &Sent, options: &[u8], confined: bool) -> std::io::Result<Option<Redirect>> {
    let dirs = wormhole_opencl_proto::build_options::include_dirs(options);
    let bytes = |p: &Path| std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec();
    let (copies, new_dirs): (Option<Materialized>, Vec<Vec<u8>>) = if confined {
        let m = materialize(&sent.headers, dirs.len())?;
        let new = (0..dirs.len())
            .map(|k| bytes(&m.root.join(k.to_string())))
            .collect();
        (Some(m), new)
    } else {
        let new =
            dirs.iter()
                .map(|d| {
                    bytes(&sent.cwd.join(
                        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&d.dir),
                    ))
                })
                .collect();
        (None, new)
    };
    let paths = BuildPaths {
        options: options.to_vec(),
        dirs: new_dirs
            .iter()
            .zip(&dirs)
            .filter(|(new, old)| **new != old.dir)
            .map(|(new, old)| (new.clone(), old.dir.clone()))
            .collect(),
    };
    if paths.dirs.is_empty() {
        return Ok(None);
    }
    let options = wormhole_opencl_proto::build_options::with_include_dirs(options, &new_dirs);
    Ok(Some(Redirect {
        options: CString::new(options).map_err(std::io::Error::other)?,
        copies,
        paths,
    }))
}

/// Writes `headers` below a new private directory, one subdirectory per `-I` option
/// (`root/k` for the k-th of `dirs`).
fn materialize(headers: &[Header], dirs: usize) -> std::io::Result<Materialized> {
    let root = private_dir()?;
    // Removed again if anything below fails.
    let mut made = Materialized {
        root: root.clone(),
        readable: Vec::new(),
    };
    let sub = |k: usize| root.join(k.to_string());
    for k in 0..dirs {
        std::fs::DirBuilder::new().mode(0o700).create(sub(k))?;
    }
    for h in headers {
        if h.dir as usize >= dirs {
            continue; // names a directory these options do not have
        }
        let file = sub(h.dir as usize).join(&h.path);
        if let Some(parent) = file.parent() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(parent)?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)?
            .write_all(h.data.as_deref().unwrap_or_default())?;
        if h.data.is_some() {
            made.readable.push(file);
        }
    }
    Ok(made)
}

/// A new directory only this worker may enter (a fresh name: nothing another user made can
/// stand in for it).
fn private_dir() -> std::io::Result<PathBuf> {
    let mut nonce = [0u8; 8];
    // SAFETY: fills the local buffer.
    let got = unsafe { libc::getrandom(nonce.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if got != 8 {
        return Err(std::io::Error::last_os_error());
    }
    let dir = std::env::temp_dir().join(format!(
        "wormhole-includes-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(nonce)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_opencl_proto::requests::IncludedFile;

    #[test]
    fn header_paths_must_stay_inside_their_directory() {
        for bad in [&b"../x.h"[..], b"/etc/passwd", b"a/../../x", b"", b"a\0b"] {
            let req = Includes {
                program: 1,
                cwd: b"/app",
                files: vec![IncludedFile {
                    dir: 0,
                    path: bad,
                    data: Some(b""),
                }],
            };
            assert_eq!(accept(&req), Err(CL_INVALID_VALUE), "{bad:?}");
        }
        let relative_cwd = Includes {
            program: 1,
            cwd: b"app",
            files: vec![],
        };
        assert_eq!(accept(&relative_cwd), Err(CL_INVALID_VALUE));
    }

    fn sent() -> Sent {
        Sent {
            cwd: "/app".into(),
            headers: vec![
                Header {
                    dir: 1,
                    path: "sub/a.h".into(),
                    data: Some(b"#define A 1\n".to_vec()),
                },
                Header {
                    dir: 0,
                    path: "private.h".into(),
                    data: None,
                },
                Header {
                    dir: 7,
                    path: "stray.h".into(),
                    data: Some(vec![]),
                },
            ],
        }
    }

    #[test]
    fn a_confined_build_reads_the_copies_and_answers_with_the_applications_names() {
        let options = b"-DX -I /app/one -Itwo";
        let r = redirect(&sent(), options, true).unwrap().unwrap();
        let root = r.copies.as_ref().unwrap().root.clone();
        let d = |k: u32| format!("{}/{k}", root.display());
        assert_eq!(
            r.options.to_str().unwrap(),
            format!("-DX -I {} -I{}", d(0), d(1))
        );
        assert_eq!(
            std::fs::read(root.join("1/sub/a.h")).unwrap(),
            b"#define A 1\n"
        );
        assert!(!root.join("7").exists());
        // The build may read the copies, and finds a header the application may not read
        // without being let read it.
        let copies = r.copies.as_ref().unwrap();
        assert_eq!(copies.readable, [root.join("1/sub/a.h")]);
        assert!(root.join("0/private.h").is_file());
        assert_eq!(r.paths.options, options);
        let log = format!("{}/sub/a.h:1: warning", d(1));
        assert_eq!(r.paths.log(log.as_bytes()), b"two/sub/a.h:1: warning");
        drop(r);
        assert!(!root.exists());
    }

    #[test]
    fn an_open_build_reads_relative_directories_from_the_applications_directory() {
        let r = redirect(&sent(), b"-I /abs -I rel", false)
            .unwrap()
            .unwrap();
        assert!(r.copies.is_none());
        assert_eq!(r.options.to_str().unwrap(), "-I /abs -I /app/rel");
        assert_eq!(r.paths.log(b"/app/rel/x.h: error"), b"rel/x.h: error");
        assert_eq!(r.paths.log(b"/app/relative/x.h"), b"/app/relative/x.h");
        // Nothing relative: nothing to change.
        assert!(redirect(&sent(), b"-I /abs", false).unwrap().is_none());
    }
}
