//! The program's JIT options (`cuModuleLoadDataEx`, `cuLibraryLoad*`): read from its arrays
//! into what travels, and what the server's driver left in their slots written back: numbers
//! into the slots, logs into the program's buffers (`wormhole_cuda_proto::jit` says which).

use crate::rt::ApiErr;
use std::ffi::c_void;
use wormhole_cuda_proto::cu::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED};
use wormhole_cuda_proto::jit::{slot, JitOption, JitOut, Slot, MAX_JIT_OPTIONS};

/// The program's option arrays: `n` options and their value slots.
#[derive(Clone, Copy)]
pub struct ProgramOptions {
    n: usize,
    options: *const u32,
    values: *mut *mut c_void,
}

impl ProgramOptions {
    /// No options.
    pub const fn none() -> Self {
        ProgramOptions {
            n: 0,
            options: std::ptr::null(),
            values: std::ptr::null_mut(),
        }
    }

    /// # Safety
    /// When `n` is not 0, `options` and `values` are NULL or hold `n` entries each.
    pub unsafe fn new(n: u32, options: *const c_void, values: *mut c_void) -> Self {
        ProgramOptions {
            n: n as usize,
            options: options.cast(),
            values: values.cast(),
        }
    }

    fn entries(&self) -> (&[u32], &[*mut c_void]) {
        if self.n == 0 {
            return (&[], &[]);
        }
        // SAFETY: checked non-NULL by `read` (the only way to a non-empty use), `n` entries by
        // the contract of `new`.
        unsafe {
            (
                std::slice::from_raw_parts(self.options, self.n),
                std::slice::from_raw_parts(self.values, self.n),
            )
        }
    }

    /// The options as they travel, and what writing back will need, copied now: cuda.h lets
    /// the program free its option array once the call returns, and keep its value array
    /// only while output options are in it. Options whose slots the server cannot read
    /// (arrays of the program's pointers, options newer than this library) are refused,
    /// named in a log line.
    pub fn read(&self) -> Result<ReadOptions, ApiErr> {
        if self.n == 0 {
            return Ok(ReadOptions::default());
        }
        if self.options.is_null() || self.values.is_null() || self.n > MAX_JIT_OPTIONS {
            crate::connection::log(&format!(
                "JIT options: {} of them, at {:?} and {:?}; answering CUDA_ERROR_INVALID_VALUE",
                self.n, self.options, self.values
            ));
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (options, values) = self.entries();
        let mut read = ReadOptions {
            options: options.to_vec(),
            slots: values.iter().map(|&v| v as usize).collect(),
            rooms: vec![0; options.len()],
            values: std::ptr::null_mut(),
            sent: Vec::with_capacity(options.len()),
        };
        for (i, &option) in options.iter().enumerate() {
            let value = match slot(option) {
                Slot::Value | Slot::ValueOut => values[i] as u64,
                Slot::Log { size_option } => {
                    // The room the program gave, as it was before the driver writes the
                    // count of bytes it filled into the same slot.
                    read.rooms[i] = options
                        .iter()
                        .position(|&o| o == size_option)
                        .map_or(0, |j| values[j] as usize as u32 as usize);
                    0
                }
                Slot::NotForwarded => {
                    crate::connection::log(&format!(
                        "JIT option {option} (arrays of the program's pointers, or unknown) is not forwarded; answering CUDA_ERROR_NOT_SUPPORTED"
                    ));
                    return Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED));
                }
            };
            read.sent.push(JitOption { option, value });
        }
        // Only where the driver writes back is the program's value array used again.
        if options.iter().any(|&o| slot(o) == Slot::ValueOut) {
            read.values = self.values;
        }
        Ok(read)
    }
}

/// A program's JIT options as read at the call: what travels, and what writing back needs
/// (the option numbers, the log buffers and their rooms), with the program's value array only
/// where some option's slot is written back.
pub struct ReadOptions {
    options: Vec<u32>,
    slots: Vec<usize>,
    rooms: Vec<usize>,
    values: *mut *mut c_void,
    sent: Vec<JitOption>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            options: Vec::new(),
            slots: Vec::new(),
            rooms: Vec::new(),
            values: std::ptr::null_mut(),
            sent: Vec::new(),
        }
    }
}

// SAFETY: the buffers and the value array are the program's, which it keeps valid while the
// driver may write them (cuda.h's contract); they are written only by `write_back`.
unsafe impl Send for ReadOptions {}

impl ReadOptions {
    /// The options as they travel.
    pub fn sent(&self) -> Vec<JitOption> {
        self.sent.clone()
    }

    /// Writes what the driver left: each log into the program's buffer (at most its room with
    /// the NUL), then the slots the driver writes. An answer
    /// not of one entry per option writes nothing.
    pub fn write_back(&self, outs: &[JitOut]) {
        if outs.len() != self.options.len() {
            return;
        }
        for (i, out) in outs.iter().enumerate() {
            let buf = self.slots[i] as *mut u8;
            let room = self.rooms[i];
            if buf.is_null() || room == 0 {
                continue;
            }
            let n = out.log.len().min(room - 1);
            // SAFETY: the program gave a buffer of `room` bytes for this log (kept valid, as
            // cuda.h asks, while the driver may write it).
            unsafe {
                std::ptr::copy_nonoverlapping(out.log.as_ptr(), buf, n);
                *buf.add(n) = 0;
            }
        }
        if self.values.is_null() {
            return;
        }
        for (i, &option) in self.options.iter().enumerate() {
            if slot(option) == Slot::ValueOut {
                // SAFETY: the program's value array, valid while output options are used.
                unsafe { *self.values.add(i) = outs[i].value as usize as *mut c_void };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_cuda_proto::jit::*;

    fn out(value: u64, log: &[u8]) -> JitOut {
        JitOut {
            value,
            log: log.to_vec(),
        }
    }

    #[test]
    fn logs_land_in_the_programs_buffers_and_sizes_come_back() {
        let mut info = [0xffu8; 8];
        let mut error = [0xffu8; 64];
        let options = [
            7, // optimisation level
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 5] = [
            3 as *mut c_void,
            info.as_mut_ptr().cast(),
            info.len() as *mut c_void,
            error.as_mut_ptr().cast(),
            error.len() as *mut c_void,
        ];
        // SAFETY: five entries each.
        let p =
            unsafe { ProgramOptions::new(5, options.as_ptr().cast(), values.as_mut_ptr().cast()) };
        let read = p.read().unwrap();
        let sent = read.sent();
        assert_eq!(sent[0].value, 3);
        assert_eq!(sent[1].value, 0, "a buffer's address does not travel");
        assert_eq!(sent[2].value, 8);

        read.write_back(&[
            out(3, b""),
            out(0, b"a long info log"),
            out(16, b""),
            out(0, b"bad ptx"),
            out(8, b""),
        ]);
        assert_eq!(
            &info, b"a long \0",
            "cut to the program's room, NUL-terminated"
        );
        assert_eq!(&error[..8], b"bad ptx\0");
        assert_eq!(values[0] as usize, 3, "an input slot is left alone");
        assert_eq!(
            values[2] as usize, 16,
            "the driver's count of bytes written"
        );
        assert_eq!(values[4] as usize, 8);

        // A link writes back after every step: the room is the program's, not the count the
        // previous step left in the size slot.
        read.write_back(&[
            out(3, b""),
            out(0, b"longer"),
            out(7, b""),
            out(0, b"unresolved extern"),
            out(18, b""),
        ]);
        assert_eq!(&error[..18], b"unresolved extern\0");
    }

    #[test]
    fn only_output_options_keep_the_programs_value_array() {
        let options = [7u32, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES];
        let mut values = [2 as *mut c_void, std::ptr::null_mut()];
        // SAFETY: two entries each.
        let p =
            unsafe { ProgramOptions::new(2, options.as_ptr().cast(), values.as_mut_ptr().cast()) };
        assert!(
            !p.read().unwrap().values.is_null(),
            "a size slot is written back"
        );
        // SAFETY: one entry each.
        let p =
            unsafe { ProgramOptions::new(1, options.as_ptr().cast(), values.as_mut_ptr().cast()) };
        let read = p.read().unwrap();
        assert!(
            read.values.is_null(),
            "nothing to write: the program may free its arrays"
        );
        read.write_back(&[out(9, b"")]);
        assert_eq!(values[0] as usize, 2);
    }

    #[test]
    fn pointer_arrays_and_bad_arrays_are_refused() {
        let options = [17u32];
        let mut values = [std::ptr::null_mut::<c_void>()];
        // SAFETY: one entry each.
        let p =
            unsafe { ProgramOptions::new(1, options.as_ptr().cast(), values.as_mut_ptr().cast()) };
        assert_eq!(p.read().err().unwrap().0, CUDA_ERROR_NOT_SUPPORTED);
        // SAFETY: NULL arrays, which `read` refuses.
        let p = unsafe { ProgramOptions::new(2, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(p.read().err().unwrap().0, CUDA_ERROR_INVALID_VALUE);
        // SAFETY: no options.
        let p = unsafe { ProgramOptions::new(0, std::ptr::null(), std::ptr::null_mut()) };
        let read = p.read().unwrap();
        assert!(read.sent().is_empty());
        read.write_back(&[]);
    }
}
