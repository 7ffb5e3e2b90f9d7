//! JIT options (`CUjit_option`) of module loads (`cuModuleLoadDataEx`, `cuLibraryLoad*`):
//! which travel, and how. Each option's value is a pointer-sized slot in the program's array,
//! read as a number, a buffer of the program's, or written back by the driver, so the client
//! and the server must agree, option by option, what a slot means.

use crate::requests::count;
use crate::{DecodeError, Reader, Writer};

pub const CU_JIT_THREADS_PER_BLOCK: u32 = 1;
pub const CU_JIT_WALL_TIME: u32 = 2;
pub const CU_JIT_INFO_LOG_BUFFER: u32 = 3;
pub const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: u32 = 4;
pub const CU_JIT_ERROR_LOG_BUFFER: u32 = 5;
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;
/// Options from here on are not in cuda.h 13.0 (`CU_JIT_NUM_OPTIONS`).
pub const CU_JIT_NUM_OPTIONS: u32 = 35;

/// Most options one load may carry (cuda.h has 35; a program repeating them gains nothing).
pub const MAX_JIT_OPTIONS: usize = 64;
/// Most bytes of a log the server gives its driver room for (a program's larger buffer gets
/// this much of it).
pub const MAX_JIT_LOG: usize = 1 << 20;

/// What an option's value slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A number the driver reads.
    Value,
    /// A number the driver reads and replaces (threads per block, a log's size: given as room,
    /// answered as bytes written) or only writes (the wall time, a float).
    ValueOut,
    /// The program's buffer for a log, its size in option `size_option`.
    Log { size_option: u32 },
    /// Arrays of the program's pointers (symbol names and addresses, referenced names): the
    /// server's driver cannot read them.
    NotForwarded,
}

/// The meaning of option `option`'s slot (options after cuda.h 13.0's are not forwarded: their
/// slots might be pointers).
pub fn slot(option: u32) -> Slot {
    match option {
        CU_JIT_THREADS_PER_BLOCK
        | CU_JIT_WALL_TIME
        | CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
        | CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => Slot::ValueOut,
        CU_JIT_INFO_LOG_BUFFER => Slot::Log {
            size_option: CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        },
        CU_JIT_ERROR_LOG_BUFFER => Slot::Log {
            size_option: CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        },
        // Global symbol names, addresses and their count; referenced kernel and variable names
        // and their counts.
        17..=19 | 25..=28 => Slot::NotForwarded,
        o if o < CU_JIT_NUM_OPTIONS => Slot::Value,
        _ => Slot::NotForwarded,
    }
}

/// One option as it travels: its number and its slot's value (for a log buffer, 0: the server
/// gives its driver a buffer of the size its size option says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JitOption {
    pub option: u32,
    pub value: u64,
}

/// What the driver left in one option's slot: the slot's value and, for a log, the log's text
/// (without its NUL).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JitOut {
    pub value: u64,
    pub log: Vec<u8>,
}

pub(crate) fn encode_options(w: &mut Writer, options: &[JitOption]) {
    w.u32(options.len() as u32);
    for o in options {
        w.u32(o.option);
        w.u64(o.value);
    }
}

pub(crate) fn decode_options(r: &mut Reader<'_>) -> Result<Vec<JitOption>, DecodeError> {
    let n = count(r, 12, MAX_JIT_OPTIONS)?;
    (0..n)
        .map(|_| {
            Ok(JitOption {
                option: r.u32()?,
                value: r.u64()?,
            })
        })
        .collect()
}

pub(crate) fn encode_outs(w: &mut Writer, outs: &[JitOut]) {
    w.u32(outs.len() as u32);
    for o in outs {
        w.u64(o.value);
        w.bytes(&o.log);
    }
}

pub(crate) fn decode_outs(r: &mut Reader<'_>) -> Result<Vec<JitOut>, DecodeError> {
    let n = count(r, 12, MAX_JIT_OPTIONS)?;
    (0..n)
        .map(|_| {
            let value = r.u64()?;
            let log = r.bytes()?;
            if log.len() > MAX_JIT_LOG {
                return Err(DecodeError::BadValue("a JIT log is at most 1 MiB"));
            }
            Ok(JitOut {
                value,
                log: log.to_vec(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_of_cuda_h_has_a_meaning() {
        assert_eq!(slot(0), Slot::Value, "max registers");
        assert_eq!(slot(CU_JIT_WALL_TIME), Slot::ValueOut);
        assert_eq!(
            slot(CU_JIT_ERROR_LOG_BUFFER),
            Slot::Log {
                size_option: CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
            }
        );
        assert_eq!(slot(17), Slot::NotForwarded, "global symbol names");
        assert_eq!(slot(34), Slot::Value, "split compile");
        assert_eq!(slot(CU_JIT_NUM_OPTIONS), Slot::NotForwarded, "unknown");
    }

    #[test]
    fn options_and_outputs_survive_the_wire_and_bounds_hold() {
        let options = vec![
            JitOption {
                option: 7,
                value: 3,
            },
            JitOption {
                option: CU_JIT_INFO_LOG_BUFFER,
                value: 0,
            },
        ];
        let mut w = Writer::new(0);
        encode_options(&mut w, &options);
        let body = w.body().to_vec();
        assert_eq!(decode_options(&mut Reader::new(&body)).unwrap(), options);

        let outs = vec![JitOut {
            value: 12,
            log: b"ptxas info".to_vec(),
        }];
        let mut w = Writer::new(0);
        encode_outs(&mut w, &outs);
        let body = w.body().to_vec();
        assert_eq!(decode_outs(&mut Reader::new(&body)).unwrap(), outs);

        let mut w = Writer::new(0);
        w.u32(MAX_JIT_OPTIONS as u32 + 1);
        for _ in 0..=MAX_JIT_OPTIONS {
            w.u32(0);
            w.u64(0);
        }
        let body = w.body().to_vec();
        assert!(decode_options(&mut Reader::new(&body)).is_err());
    }
}
