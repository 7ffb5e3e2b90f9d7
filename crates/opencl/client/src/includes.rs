//! The headers a build includes, found and read on the application's side, as a native build
//! reads them: a build that may not read the server's files (the server's build sandbox) is
//! given these copies instead. Only headers found below the options' `-I` directories travel;
//! an absolute `#include` path, or one a macro computes, is the server's to resolve.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use wormhole_opencl_proto::requests::{MAX_INCLUDED_BYTES, MAX_INCLUDED_FILES};

/// A header: the index of the `-I` directory it was found in, its path below it, its bytes
/// (None: it is there, but the application may not read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub dir: u32,
    pub path: PathBuf,
    pub data: Option<Vec<u8>>,
}

/// The headers the `sources` include from `dirs`, transitively, in the order they are found,
/// within the bounds of one INCLUDES request.
pub fn find(sources: &[Vec<u8>], dirs: &[PathBuf]) -> Vec<Header> {
    let mut found: Vec<Header> = Vec::new();
    let mut seen: HashSet<(u32, PathBuf)> = HashSet::new();
    let mut bytes = 0usize;
    // The texts to scan, each with where it was found (None: the program's own source).
    let mut todo: Vec<(Option<usize>, Vec<u8>)> =
        sources.iter().rev().map(|s| (None, s.clone())).collect();
    while let Some((from, text)) = todo.pop() {
        for (name, quoted) in directives(&text) {
            let name =
                Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name));
            // A quoted name is looked for beside the header that names it first.
            let beside = from
                .filter(|_| quoted)
                .and_then(|i| {
                    let h: &Header = &found[i];
                    Some((h.dir, h.path.parent()?.join(name)))
                })
                .into_iter();
            let candidates = beside.chain((0..dirs.len()).map(|k| (k as u32, name.to_path_buf())));
            for (dir, path) in candidates {
                let Some(path) = below(&path) else { continue };
                if seen.contains(&(dir, path.clone())) {
                    break;
                }
                // A file the application may not read ends the search as natively, where
                // the compiler finds it and cannot open it.
                let data = match std::fs::read(dirs[dir as usize].join(&path)) {
                    Ok(data) => Some(data),
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => None,
                    Err(_) => continue,
                };
                let size = data.as_ref().map_or(0, |d| d.len());
                if found.len() >= MAX_INCLUDED_FILES || bytes + size > MAX_INCLUDED_BYTES {
                    return found;
                }
                bytes += size;
                seen.insert((dir, path.clone()));
                if let Some(data) = &data {
                    todo.push((Some(found.len()), data.clone()));
                }
                found.push(Header { dir, path, data });
                break;
            }
        }
    }
    found
}

/// A relative path with no way out of its directory, made plain (`a/./b` → `a/b`); None for
/// absolute paths and paths that climb out.
fn below(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// The literal names of a text's include directives (`#include "a.h"`, `%:include <b.h>`,
/// `#include_next`, `#import`), with whether each was quoted.
fn directives(text: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let joined = wormhole_opencl_proto::build_options::join_line_splices(text);
    let mut out = Vec::new();
    for line in joined.split(|&c| c == b'\n') {
        let line = line.trim_ascii_start();
        let Some(rest) = line.strip_prefix(b"#").or_else(|| line.strip_prefix(b"%:")) else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        let Some(rest) = [&b"include_next"[..], b"include", b"import"]
            .iter()
            .find_map(|d| rest.strip_prefix(*d))
        else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        let (close, quoted) = match rest.first() {
            Some(b'"') => (b'"', true),
            Some(b'<') => (b'>', false),
            _ => continue, // a computed include
        };
        if let Some(end) = rest[1..].iter().position(|&c| c == close) {
            out.push((rest[1..1 + end].to_vec(), quoted));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_read_as_the_preprocessor_sees_them() {
        let src = b"#include \"a.h\"\n  %:  include <b/c.h>\n#inc\\\nlude \"d.h\"\n#include NAME\n\
                    #include_next <e.h>\nint include = 1; // #include \"no.h\"\n";
        let names: Vec<(String, bool)> = directives(src)
            .into_iter()
            .map(|(n, q)| (String::from_utf8(n).unwrap(), q))
            .collect();
        assert_eq!(
            names,
            [
                ("a.h".into(), true),
                ("b/c.h".into(), false),
                ("d.h".into(), true),
                ("e.h".into(), false)
            ]
        );
    }

    #[test]
    fn headers_are_found_below_the_directories_transitively_and_never_above() {
        let root = std::env::temp_dir().join(format!("wh-includes-{}", std::process::id()));
        let (one, two) = (root.join("one"), root.join("two"));
        std::fs::create_dir_all(one.join("sub")).unwrap();
        std::fs::create_dir_all(&two).unwrap();
        std::fs::write(one.join("sub/a.h"), "#include \"b.h\"\n#include <c.h>\n").unwrap();
        std::fs::write(one.join("sub/b.h"), "#define B 1\n").unwrap();
        std::fs::write(
            two.join("c.h"),
            "#include \"../secret\"\n#include <sub/a.h>\n",
        )
        .unwrap();
        std::fs::write(two.join("d.h"), "#define D 1\n").unwrap();
        std::fs::write(root.join("secret"), "no").unwrap();
        let src = b"#include <sub/a.h>\n#include \"/etc/passwd\"\n".to_vec();
        // An embedded header (clCompileProgram's input headers) is scanned too.
        let embedded = b"#include \"d.h\"\n".to_vec();
        let found = find(&[src, embedded], &[one.clone(), two.clone()]);
        let names: Vec<(u32, &str)> = found
            .iter()
            .map(|h| (h.dir, h.path.to_str().unwrap()))
            .collect();
        // Not ../secret (above its directory), not /etc/passwd (absolute), a.h once.
        assert_eq!(
            names,
            [(0, "sub/a.h"), (0, "sub/b.h"), (1, "c.h"), (1, "d.h")]
        );
        assert_eq!(found[1].data.as_deref(), Some(&b"#define B 1\n"[..]));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
