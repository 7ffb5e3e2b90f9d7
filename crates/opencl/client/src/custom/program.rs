use super::*;
use std::ffi::{c_char, CStr};
use wormhole_opencl_proto::{Op, Reader};

pub unsafe extern "C" fn clCreateProgramWithSource(
    context: Handle,
    count: u32,
    strings: *const *const c_char,
    lengths: *const usize,
    errcode_ret: *mut i32,
) -> Handle {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handle.
        let ctx = unsafe { obj(context, HandleKind::Context) }?;
        if count == 0 || strings.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let new_id = rt::alloc_id();
        let mut sources = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: `strings` (and `lengths` if given) hold `count` entries.
            let s = unsafe { *strings.add(i) };
            if s.is_null() {
                return Err(ClErr(CL_INVALID_VALUE));
            }
            let len = if lengths.is_null() {
                0
            } else {
                // SAFETY: `lengths` holds `count` entries.
                unsafe { *lengths.add(i) }
            };
            // A zero length means NUL-terminated.
            let bytes = if len == 0 {
                // SAFETY: per the API, a NUL-terminated string.
                unsafe { CStr::from_ptr(s) }.to_bytes()
            } else {
                // SAFETY: per the API, `len` bytes.
                unsafe { std::slice::from_raw_parts(s as *const u8, len) }
            };
            sources.push(bytes);
        }
        let w = encode(
            Op::clCreateProgramWithSource,
            &req::CreateProgramWithSource {
                new_id,
                context: ctx.id,
                sources,
            },
        );
        let reply = rt::call(w)?;
        match Reader::new(&reply).i32()? {
            CL_SUCCESS => Ok(rt::new_object(HandleKind::Program, new_id)),
            e => Err(ClErr(e)),
        }
    })
}

pub unsafe extern "C" fn clCreateProgramWithBinary(
    context: Handle,
    num_devices: u32,
    device_list: *const Handle,
    lengths: *const usize,
    binaries: *const *const u8,
    binary_status: *mut i32,
    errcode_ret: *mut i32,
) -> Handle {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handle.
        let ctx = unsafe { obj(context, HandleKind::Context) }?;
        if num_devices == 0 || device_list.is_null() || lengths.is_null() || binaries.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let n = num_devices as usize;
        let new_id = rt::alloc_id();
        // SAFETY: `device_list` holds `n` devices.
        let devices =
            unsafe { rt::handle_ids(device_list, n, HandleKind::Device, CL_INVALID_DEVICE) }?;
        let mut bins = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `lengths` and `binaries` hold `n` entries.
            let (len, b) = unsafe { (*lengths.add(i), *binaries.add(i)) };
            if len == 0 || b.is_null() {
                if !binary_status.is_null() {
                    // SAFETY: `binary_status` holds `n` entries.
                    unsafe { *binary_status.add(i) = CL_INVALID_VALUE };
                }
                return Err(ClErr(CL_INVALID_VALUE));
            }
            // SAFETY: binary `i` has `len` bytes.
            bins.push(unsafe { std::slice::from_raw_parts(b, len) });
        }
        let w = encode(
            Op::clCreateProgramWithBinary,
            &req::CreateProgramWithBinary {
                new_id,
                context: ctx.id,
                devices,
                binaries: bins,
                want_status: !binary_status.is_null(),
            },
        );
        let reply = rt::call(w)?;
        let req::CreateProgramWithBinaryReply {
            status,
            binary_status: statuses,
        } = req::CreateProgramWithBinaryReply::decode_all(&reply)?;
        if let Some(statuses) = statuses {
            // The server answers one status per binary sent, and only when asked to.
            if statuses.len() != n || binary_status.is_null() {
                return Err(ClErr(CL_OUT_OF_RESOURCES));
            }
            for (i, st) in statuses.into_iter().enumerate() {
                // SAFETY: `binary_status` holds `n` entries.
                unsafe { *binary_status.add(i) = st };
            }
        }
        match status {
            CL_SUCCESS => Ok(rt::new_object(HandleKind::Program, new_id)),
            e => Err(ClErr(e)),
        }
    })
}
