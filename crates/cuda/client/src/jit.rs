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

    /// The options as they travel; those whose slots the server cannot read (arrays of the
    /// program's pointers, options newer than this library) are refused, named in a log line.
    pub fn read(&self) -> Result<Vec<JitOption>, ApiErr> {
        if self.n == 0 {
            return Ok(Vec::new());
        }
        if self.options.is_null() || self.values.is_null() || self.n > MAX_JIT_OPTIONS {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (options, values) = self.entries();
        options
            .iter()
            .zip(values)
            .map(|(&option, &value)| match slot(option) {
                Slot::Value | Slot::ValueOut => Ok(JitOption {
                    option,
                    value: value as u64,
                }),
                Slot::Log { .. } => Ok(JitOption { option, value: 0 }),
                Slot::NotForwarded => {
                    crate::connection::log(&format!(
                        "JIT option {option} (arrays of the program's pointers, or unknown) is not forwarded; answering CUDA_ERROR_NOT_SUPPORTED"
                    ));
                    Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED))
                }
            })
            .collect()
    }

    /// Writes what the driver left: each log into the program's buffer (at most its size
    /// option's bytes with the NUL, read before that slot is replaced), then the slots the
    /// driver writes. An answer not of one entry per option writes nothing.
    pub fn write_back(&self, outs: &[JitOut]) {
        let (options, values) = self.entries();
        if outs.len() != options.len() {
            return;
        }
        for (i, &option) in options.iter().enumerate() {
            let Slot::Log { size_option } = slot(option) else {
                continue;
            };
            let room = options
                .iter()
                .position(|&o| o == size_option)
                .map_or(0, |j| values[j] as usize as u32 as usize);
            let buf = values[i].cast::<u8>();
            if buf.is_null() || room == 0 {
                continue;
            }
            let n = outs[i].log.len().min(room - 1);
            // SAFETY: the program gave a buffer of `room` bytes for this log.
            unsafe {
                std::ptr::copy_nonoverlapping(outs[i].log.as_ptr(), buf, n);
                *buf.add(n) = 0;
            }
        }
        for (i, &option) in options.iter().enumerate() {
            if slot(option) == Slot::ValueOut {
                // SAFETY: `values` has `n` writable slots (the driver writes them natively).
                unsafe { *self.values.add(i) = outs[i].value as usize as *mut c_void };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_cuda_proto::jit::*;

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
        let sent = p.read().unwrap();
        assert_eq!(sent[0].value, 3);
        assert_eq!(sent[1].value, 0, "a buffer's address does not travel");
        assert_eq!(sent[2].value, 8);

        let out = |value: u64, log: &[u8]| JitOut {
            value,
            log: log.to_vec(),
        };
        p.write_back(&[
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
    }

    #[test]
    fn pointer_arrays_and_bad_arrays_are_refused() {
        let options = [17u32];
        let mut values = [std::ptr::null_mut::<c_void>()];
        // SAFETY: one entry each.
        let p =
            unsafe { ProgramOptions::new(1, options.as_ptr().cast(), values.as_mut_ptr().cast()) };
        assert_eq!(p.read().unwrap_err().0, CUDA_ERROR_NOT_SUPPORTED);
        // SAFETY: NULL arrays, which `read` refuses.
        let p = unsafe { ProgramOptions::new(2, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(p.read().unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        // SAFETY: no options.
        let p = unsafe { ProgramOptions::new(0, std::ptr::null(), std::ptr::null_mut()) };
        assert!(p.read().unwrap().is_empty());
        p.write_back(&[]);
    }
}
