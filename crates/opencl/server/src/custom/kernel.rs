use crate::generated::ffi;
use crate::session::{Handle, Session};
use std::ffi::c_void;
use wormhole_opencl_proto::{cl::*, DecodeError, HandleKind, Reader, Writer};

/// How the client sent a kernel argument's value.
pub const ARG_NULL: u8 = 0;
pub const ARG_BYTES: u8 = 1;
pub const ARG_HANDLE: u8 = 2;

pub fn clSetKernelArg(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let kernel = r.u64()?;
    let index = r.u32()?;
    let size = r.usize()?;
    let mode = r.u8()?;
    let (bytes, handle) = match mode {
        ARG_NULL => (None, None),
        ARG_BYTES => (Some(r.bytes()?), None),
        ARG_HANDLE => {
            let kind = HandleKind::from_u8(r.u8()?).ok_or(DecodeError::BadValue("handle kind"))?;
            (None, Some((kind, r.u64()?)))
        }
        _ => return Err(DecodeError::BadValue("kernel argument mode")),
    };
    r.finish()?;
    let run = || -> Result<i32, i32> {
        let kernel = s.resolve(kernel, HandleKind::Kernel, false)?;
        crate::rt::check_slot(kernel, wormhole_opencl_proto::Op::clSetKernelArg)?;
        // A handle argument is passed as a pointer to the real object, which must outlive the call.
        let obj: Handle = match handle {
            Some((kind, id)) => s
                .resolve(id, kind, true)
                .map_err(|_| CL_INVALID_ARG_VALUE)?,
            None => std::ptr::null_mut(),
        };
        let value: *const c_void = match (bytes, handle) {
            (Some(b), _) => {
                if b.len() != size {
                    return Err(CL_INVALID_VALUE);
                }
                b.as_ptr() as *const c_void
            }
            (_, Some(_)) => &obj as *const Handle as *const c_void,
            _ => std::ptr::null(),
        };
        // SAFETY: `value` points to `size` readable bytes (checked above) or to a local handle.
        Ok(unsafe { ffi::clSetKernelArg(kernel, index, size, value as *mut c_void) })
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}
