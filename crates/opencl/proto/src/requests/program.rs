//! Program creation from sources and binaries.

use super::*;

fn parts<'a>(r: &mut Reader<'a>) -> Result<Vec<&'a [u8]>, DecodeError> {
    let n = count(r, 8, MAX_PARTS)?;
    (0..n).map(|_| r.bytes()).collect()
}

fn put_parts(w: &mut Writer, parts: &[&[u8]]) {
    w.u32(parts.len() as u32);
    for p in parts {
        w.bytes(p);
    }
}

/// `clCreateProgramWithSource`: every string with its length (no terminating NUL); answered
/// by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateProgramWithSource<'a> {
    pub new_id: u64,
    pub context: u64,
    pub sources: Vec<&'a [u8]>,
}

impl<'a> Message<'a> for CreateProgramWithSource<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        w.u64(self.context);
        put_parts(w, &self.sources);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(CreateProgramWithSource {
            new_id: r.u64()?,
            context: r.u64()?,
            sources: parts(r)?,
        })
    }
}

/// `clCreateProgramWithBinary`: one binary per device; answered by a
/// [`CreateProgramWithBinaryReply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateProgramWithBinary<'a> {
    pub new_id: u64,
    pub context: u64,
    pub devices: Option<Vec<u64>>,
    pub binaries: Vec<&'a [u8]>,
    /// The application wants each binary's status (`binary_status` not NULL).
    pub want_status: bool,
}

impl<'a> Message<'a> for CreateProgramWithBinary<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        w.u64(self.context);
        w.opt_u64s(self.devices.as_deref());
        put_parts(w, &self.binaries);
        w.bool(self.want_status);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(CreateProgramWithBinary {
            new_id: r.u64()?,
            context: r.u64()?,
            devices: r.opt_u64s()?,
            binaries: parts(r)?,
            want_status: r.bool()?,
        })
    }
}

/// The status of a creation from binaries and, if asked for, one status per binary (as many
/// as the request sent: they fill the rest of the reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateProgramWithBinaryReply {
    pub status: i32,
    pub binary_status: Option<Vec<i32>>,
}

impl Message<'_> for CreateProgramWithBinaryReply {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        w.bool(self.binary_status.is_some());
        for st in self.binary_status.iter().flatten() {
            w.i32(*st);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let status = r.i32()?;
        let binary_status = if r.bool()? {
            if !r.remaining().is_multiple_of(4) {
                return Err(DecodeError::TrailingBytes(r.remaining() % 4));
            }
            Some(
                (0..r.remaining() / 4)
                    .map(|_| r.i32())
                    .collect::<Result<_, _>>()?,
            )
        } else {
            None
        };
        Ok(CreateProgramWithBinaryReply {
            status,
            binary_status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn sources_roundtrip() {
        roundtrip(&CreateProgramWithSource {
            new_id: 1,
            context: 2,
            sources: vec![b"__kernel void k() {}", b"", b"x"],
        });
        // A count beyond the limit is refused before anything is read for it.
        let mut w = Writer::new(0);
        w.u64(1);
        w.u64(2);
        w.u32(MAX_PARTS as u32 + 1);
        assert!(matches!(
            CreateProgramWithSource::decode_all(w.body()),
            Err(DecodeError::TooLarge(_))
        ));
    }

    #[test]
    fn binaries_roundtrip() {
        roundtrip(&CreateProgramWithBinary {
            new_id: 1,
            context: 2,
            devices: Some(vec![3, 4]),
            binaries: vec![b"elf", b"elf2"],
            want_status: true,
        });
        roundtrip(&CreateProgramWithBinary {
            new_id: 1,
            context: 2,
            devices: None,
            binaries: vec![],
            want_status: false,
        });
        roundtrip_open_ended(&CreateProgramWithBinaryReply {
            status: 0,
            binary_status: Some(vec![0, -42]),
        });
        roundtrip(&CreateProgramWithBinaryReply {
            status: -42,
            binary_status: None,
        });
    }
}

/// Most headers one INCLUDES carries, and most bytes of them all.
pub const MAX_INCLUDED_FILES: usize = 512;
pub const MAX_INCLUDED_BYTES: usize = 16 << 20;

/// One header a build includes: the index of the `-I` directory it was found in (see
/// [`crate::build_options::include_dirs`]), its path below that directory, and its bytes;
/// None where the file is there but the application may not read it (natively the build
/// then says "Permission denied").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncludedFile<'a> {
    pub dir: u32,
    pub path: &'a [u8],
    pub data: Option<&'a [u8]>,
}

/// INCLUDES: for the next build of `program`, the application's working directory (what its
/// relative `-I` directories are relative to) and the headers the build includes, read on
/// the application's side; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Includes<'a> {
    pub program: u64,
    pub cwd: &'a [u8],
    pub files: Vec<IncludedFile<'a>>,
}

impl<'a> Message<'a> for Includes<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.program);
        w.bytes(self.cwd);
        w.u32(self.files.len() as u32);
        for f in &self.files {
            w.u32(f.dir);
            w.bytes(f.path);
            w.opt_bytes(f.data);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let program = r.u64()?;
        let cwd = r.bytes()?;
        let n = count(r, 13, MAX_INCLUDED_FILES)?;
        let files = (0..n)
            .map(|_| {
                Ok(IncludedFile {
                    dir: r.u32()?,
                    path: r.bytes()?,
                    data: r.opt_bytes_ref()?,
                })
            })
            .collect::<Result<_, DecodeError>>()?;
        Ok(Includes {
            program,
            cwd,
            files,
        })
    }
}
