//! What client and server must read alike of a build. The include directories of its options
//! (`-I dir`, `-Idir`, quoted or not), found by the client (which reads the headers a build
//! includes from them, on the application's side) and by the server (which points them at its
//! copies of those headers): one parser, so the two sides always agree on which directory is
//! the k-th. And a source's lines as the preprocessor sees them (`join_line_splices`).

use std::ops::Range;

/// One `-I` directory of a build's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncludeDir {
    /// The directory, unquoted.
    pub dir: Vec<u8>,
    /// The text that names it: the directory's own token (`-I dir`), or the whole `-Idir`.
    pub text: Range<usize>,
    /// Whether `text` holds the `-I` too.
    pub joined: bool,
}

/// Each `-I` directory of `options`, in order.
pub fn include_dirs(options: &[u8]) -> Vec<IncludeDir> {
    let tokens = tokens(options);
    let mut dirs = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let (range, text) = &tokens[i];
        if text.as_slice() == b"-I" {
            if let Some((r, dir)) = tokens.get(i + 1) {
                dirs.push(IncludeDir {
                    dir: dir.clone(),
                    text: r.clone(),
                    joined: false,
                });
                i += 1;
            }
        } else if let Some(dir) = text.strip_prefix(b"-I") {
            dirs.push(IncludeDir {
                dir: dir.to_vec(),
                text: range.clone(),
                joined: true,
            });
        }
        i += 1;
    }
    dirs
}

/// `options` with the k-th `-I` directory replaced by `dirs[k]` (quoted only if it holds
/// whitespace: drivers differ in what they make of quotes), the rest unchanged.
pub fn with_include_dirs(options: &[u8], dirs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(options.len());
    let mut at = 0;
    for (old, new) in include_dirs(options).iter().zip(dirs) {
        out.extend_from_slice(&options[at..old.text.start]);
        if old.joined {
            out.extend_from_slice(b"-I");
        }
        let quote = new.iter().any(u8::is_ascii_whitespace);
        if quote {
            out.push(b'"');
        }
        out.extend_from_slice(new);
        if quote {
            out.push(b'"');
        }
        at = old.text.end;
    }
    out.extend_from_slice(&options[at..]);
    out
}

/// `text` without its line splices (a backslash ending a line joins it to the next), as the
/// preprocessor reads directives and words: `#inc\<newline>lude` is an include.
pub fn join_line_splices(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i..] {
            [b'\\', b'\n', ..] => i += 2,
            [b'\\', b'\r', b'\n', ..] => i += 3,
            _ => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whitespace-separated tokens; a double-quoted stretch belongs to its token, quotes removed.
fn tokens(options: &[u8]) -> Vec<(Range<usize>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < options.len() {
        if options[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let mut text = Vec::new();
        let mut quoted = false;
        while i < options.len() && (quoted || !options[i].is_ascii_whitespace()) {
            if options[i] == b'"' {
                quoted = !quoted;
            } else {
                text.push(options[i]);
            }
            i += 1;
        }
        out.push((start..i, text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(o: &str) -> Vec<String> {
        include_dirs(o.as_bytes())
            .into_iter()
            .map(|d| String::from_utf8(d.dir).unwrap())
            .collect()
    }

    #[test]
    fn every_spelling_of_an_include_directory_is_found_in_order() {
        assert_eq!(
            dirs(r#"-DX=1 -I /a -I/b -I "/c d" -I"/e f" -cl-mad-enable"#),
            ["/a", "/b", "/c d", "/e f"]
        );
        assert!(dirs("-DINCLUDE -cl-std=CL2.0").is_empty());
        // A trailing -I with nothing after it names nothing.
        assert!(dirs("-I").is_empty());
    }

    #[test]
    fn line_splices_vanish() {
        assert_eq!(
            join_line_splices(b"#inc\\\nlude a\\\r\nb\\c"),
            b"#include ab\\c"
        );
    }

    #[test]
    fn directories_are_replaced_in_place() {
        let o = br#"-DX=1 -I /a -I/b -I "/c d" -I"/e f" "-I/g" -w"#;
        let new: Vec<Vec<u8>> = (0..5).map(|k| format!("/s p/{k}").into_bytes()).collect();
        let out = with_include_dirs(o, &new);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            r#"-DX=1 -I "/s p/0" -I"/s p/1" -I "/s p/2" -I"/s p/3" -I"/s p/4" -w"#
        );
        assert_eq!(
            dirs(std::str::from_utf8(&out).unwrap()),
            ["/s p/0", "/s p/1", "/s p/2", "/s p/3", "/s p/4"]
        );
        let plain = with_include_dirs(b"-I /a -I/b", &[b"/x".to_vec(), b"/y".to_vec()]);
        assert_eq!(plain, b"-I /x -I/y");
    }
}
