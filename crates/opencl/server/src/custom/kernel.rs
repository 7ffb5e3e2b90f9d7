use crate::generated::ffi;
use crate::session::{Handle, Session};
use std::ffi::c_void;
use wormhole_opencl_proto::requests::{self as req, Message};
use wormhole_opencl_proto::{cl::*, DecodeError, HandleKind, Reader, Writer};

pub fn clSetKernelArg(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let req::SetKernelArg {
        kernel,
        index,
        size,
        value,
    } = req::SetKernelArg::decode(r)?;
    r.finish()?;
    let (bytes, handle) = match value {
        req::ArgValue::Null => (None, None),
        req::ArgValue::Bytes(b) => (Some(b), None),
        req::ArgValue::Handle(kind, id) => (None, Some((kind, id))),
    };
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
