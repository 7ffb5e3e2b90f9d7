//! What the generated handlers share: output buffers.

use crate::session::Handle;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::Op;

/// The largest value one output parameter may carry back (a name, a version string: small).
const MAX_OUT: usize = 1 << 16;

pub fn out_buffer(len: Option<usize>) -> Result<Vec<u8>, i32> {
    match len {
        None => Err(NVML_ERROR_INVALID_ARGUMENT),
        Some(n) if n > MAX_OUT => {
            tracing::warn!(bytes = n, "refused an output buffer larger than NVML fills");
            Err(NVML_ERROR_MEMORY)
        }
        Some(n) => Ok(vec![0; n]),
    }
}

/// Per-object dispatch checks (OpenCL's driver slots): NVML has none.
pub fn check_slot(_obj: Handle, _op: Op) -> Result<(), i32> {
    Ok(())
}
