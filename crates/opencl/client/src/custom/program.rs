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
        let mut w = rt::request(Op::clCreateProgramWithSource);
        w.u64(new_id);
        w.u64(ctx.id);
        w.u32(count);
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
            w.bytes(bytes);
        }
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
        let mut w = rt::request(Op::clCreateProgramWithBinary);
        w.u64(new_id);
        w.u64(ctx.id);
        // SAFETY: `device_list` holds `n` devices.
        unsafe {
            rt::encode_handles(
                &mut w,
                device_list,
                n,
                HandleKind::Device,
                CL_INVALID_DEVICE,
            )
        }?;
        w.u32(num_devices);
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
            w.bytes(unsafe { std::slice::from_raw_parts(b, len) });
        }
        w.bool(!binary_status.is_null());
        let reply = rt::call(w)?;
        let mut r = Reader::new(&reply);
        let status = r.i32()?;
        if r.bool()? {
            for i in 0..n {
                let st = r.i32()?;
                // SAFETY: `binary_status` holds `n` entries (the server echoes our request).
                unsafe { *binary_status.add(i) = st };
            }
        }
        match status {
            CL_SUCCESS => Ok(rt::new_object(HandleKind::Program, new_id)),
            e => Err(ClErr(e)),
        }
    })
}
