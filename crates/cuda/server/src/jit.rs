//! JIT options as the server's driver takes them: the program's numbers in the value slots,
//! and buffers of the worker's own for the logs (a program's buffer is in its own process), of
//! the size the program gave, up to `MAX_JIT_LOG`. After the call, what the driver left goes
//! back to the client (`wormhole_cuda_proto::jit`).

use std::ffi::c_void;
use wormhole_cuda_proto::cu::CUDA_ERROR_NOT_SUPPORTED;
use wormhole_cuda_proto::jit::{slot, JitOption, JitOut, Slot, MAX_JIT_LOG};

pub struct JitArrays {
    options: Vec<u32>,
    values: Vec<*mut c_void>,
    /// Per option: the log buffer the driver writes (empty for other options).
    logs: Vec<Vec<u8>>,
}

// SAFETY: the value slots hold numbers or point into the arrays' own log buffers, which move
// with them (a Vec's heap buffer stays where it is); nothing else aliases them.
unsafe impl Send for JitArrays {}

impl JitArrays {
    /// The arrays for `sent`; an option whose slot the driver would read as a pointer of the
    /// program's is refused (the client never sends one).
    pub fn new(sent: &[JitOption]) -> Result<JitArrays, i32> {
        let size_of = |size_option: u32| {
            sent.iter()
                .find(|o| o.option == size_option)
                .map_or(0, |o| (o.value as u32 as usize).min(MAX_JIT_LOG))
        };
        let mut arrays = JitArrays {
            options: Vec::with_capacity(sent.len()),
            values: Vec::with_capacity(sent.len()),
            logs: Vec::with_capacity(sent.len()),
        };
        for o in sent {
            let (value, log) = match slot(o.option) {
                Slot::NotForwarded => {
                    tracing::warn!("JIT option {} is not forwarded", o.option);
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                Slot::Log { size_option } => {
                    (std::ptr::null_mut(), vec![0u8; size_of(size_option)])
                }
                // A log's room is what its buffer here has.
                Slot::ValueOut
                    if sent.iter().any(|l| {
                        slot(l.option)
                            == (Slot::Log {
                                size_option: o.option,
                            })
                    }) =>
                {
                    (size_of(o.option) as *mut c_void, Vec::new())
                }
                Slot::Value | Slot::ValueOut => (o.value as usize as *mut c_void, Vec::new()),
            };
            arrays.options.push(o.option);
            arrays.values.push(value);
            arrays.logs.push(log);
        }
        for (value, log) in arrays.values.iter_mut().zip(&mut arrays.logs) {
            if !log.is_empty() {
                *value = log.as_mut_ptr().cast();
            }
        }
        Ok(arrays)
    }

    /// Bytes of the log buffers.
    pub fn log_bytes(&self) -> usize {
        self.logs.iter().map(Vec::len).sum()
    }

    pub fn len(&self) -> u32 {
        self.options.len() as u32
    }

    /// The arrays the driver reads (and writes: the value slots and the logs).
    pub fn pointers(&mut self) -> (*mut u32, *mut *mut c_void) {
        if self.options.is_empty() {
            return (std::ptr::null_mut(), std::ptr::null_mut());
        }
        (self.options.as_mut_ptr(), self.values.as_mut_ptr())
    }

    /// What the driver left, per option: its slot and, for a log, the text before its NUL.
    pub fn outputs(&self) -> Vec<JitOut> {
        self.options
            .iter()
            .zip(&self.values)
            .zip(&self.logs)
            .map(|((&option, &value), log)| match slot(option) {
                Slot::Log { .. } => JitOut {
                    value: 0,
                    log: log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())].to_vec(),
                },
                _ => JitOut {
                    value: value as u64,
                    log: Vec::new(),
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_cuda_proto::jit::*;

    #[test]
    fn logs_get_buffers_of_the_programs_size_within_the_bound() {
        let sent = [
            JitOption {
                option: 7,
                value: 2,
            },
            JitOption {
                option: CU_JIT_ERROR_LOG_BUFFER,
                value: 0,
            },
            JitOption {
                option: CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                value: 1 << 30,
            },
            JitOption {
                option: CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                value: 16,
            },
        ];
        let mut a = JitArrays::new(&sent).unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(
            a.logs[1].len(),
            MAX_JIT_LOG,
            "a program's huge buffer is bounded"
        );
        assert_eq!(a.values[2] as usize, MAX_JIT_LOG, "and the driver told so");
        assert_eq!(
            a.values[3] as usize, 16,
            "a size without its buffer is a number"
        );
        let (_, values) = a.pointers();
        // What a driver would do: write the log and the count of bytes written.
        // SAFETY: four slots; slot 1 is the log buffer.
        unsafe {
            let log = *values.add(1) as *mut u8;
            std::ptr::copy_nonoverlapping(c"ptxas fatal".as_ptr().cast::<u8>(), log, 12);
            *values.add(2) = 12 as *mut c_void;
        }
        let out = a.outputs();
        assert_eq!(out[1].log, b"ptxas fatal");
        assert_eq!(out[2].value, 12);
        assert_eq!(out[0].value, 2);
    }

    #[test]
    fn pointer_options_are_refused() {
        let sent = [JitOption {
            option: 18,
            value: 0x1000,
        }];
        assert!(JitArrays::new(&sent).is_err());
        let mut none = JitArrays::new(&[]).unwrap();
        assert_eq!(none.pointers().0, std::ptr::null_mut());
    }

    #[test]
    fn a_sessions_kept_logs_are_bounded() {
        let session = crate::session::Session::default();
        let sent = [
            JitOption {
                option: CU_JIT_INFO_LOG_BUFFER,
                value: 0,
            },
            JitOption {
                option: CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                value: MAX_JIT_LOG as u64,
            },
        ];
        let fits = crate::session::MAX_JIT_ARRAYS / MAX_JIT_LOG;
        for id in 0..fits as u64 {
            assert!(session
                .keep_jit_arrays(id, JitArrays::new(&sent).unwrap())
                .is_ok());
        }
        let over = session.keep_jit_arrays(999, JitArrays::new(&sent).unwrap());
        assert_eq!(
            over.err().map(|(st, _)| st),
            Some(wormhole_cuda_proto::cu::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert!(
            session
                .keep_jit_arrays(0, JitArrays::new(&[]).unwrap())
                .is_err(),
            "an id's arrays are never replaced"
        );
        session.forget(1);
        assert!(
            session
                .keep_jit_arrays(999, JitArrays::new(&sent).unwrap())
                .is_ok(),
            "an object's arrays go with it"
        );
    }
}
