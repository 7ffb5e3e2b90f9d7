use super::*;
use crate::generated::ffi;
use std::ffi::{c_char, c_void};
use wormhole_protocol::{cl::*, Writer};

const MAX_PARTS: usize = 1 << 16;

pub fn clCreateProgramWithSource(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let new_id = r.u64()?;
    let context = r.u64()?;
    let count = r.u32()? as usize;
    if count > MAX_PARTS {
        return Err(DecodeError::TooLarge(count as u64));
    }
    let parts: Vec<&[u8]> = (0..count).map(|_| r.bytes()).collect::<Result<_, _>>()?;
    r.finish()?;
    let mut run = || -> Result<(), i32> {
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        crate::rt::check_slot(context, wormhole_protocol::Op::clCreateProgramWithSource)?;
        let ptrs: Vec<*const c_char> = parts.iter().map(|p| p.as_ptr() as *const c_char).collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let mut err = CL_SUCCESS;
        // SAFETY: `count` strings with explicit lengths, all borrowed from the request.
        let p = unsafe {
            ffi::clCreateProgramWithSource(
                context,
                count as u32,
                ptrs.as_ptr() as *mut c_void,
                lens.as_ptr() as *mut c_void,
                &mut err,
            )
        };
        w.i32(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Program,
            p,
            err,
        ));
        Ok(())
    };
    if let Err(e) = run() {
        w.i32(e);
    }
    Ok(())
}

pub fn clCreateProgramWithBinary(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let new_id = r.u64()?;
    let context = r.u64()?;
    let devices = r.opt_u64s()?;
    let count = r.u32()? as usize;
    if count > MAX_PARTS {
        return Err(DecodeError::TooLarge(count as u64));
    }
    let bins: Vec<&[u8]> = (0..count).map(|_| r.bytes()).collect::<Result<_, _>>()?;
    let want_status = r.bool()?;
    r.finish()?;
    let mut statuses = vec![CL_SUCCESS; count];
    let run = |statuses: &mut Vec<i32>| -> Result<i32, i32> {
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        let n = devices.as_ref().map_or(0, |d| d.len());
        let devs = s.resolve_list(devices.as_deref(), n, HandleKind::Device, CL_INVALID_DEVICE)?;
        let ptrs: Vec<*const u8> = bins.iter().map(|b| b.as_ptr()).collect();
        let lens: Vec<usize> = bins.iter().map(|b| b.len()).collect();
        let mut err = CL_SUCCESS;
        // SAFETY: the device list, lengths, binaries and statuses all hold `count` entries
        // (the client sends one binary per device; the driver checks `n` against the lists).
        let p = unsafe {
            ffi::clCreateProgramWithBinary(
                context,
                n as u32,
                list_ptr(&devs) as *mut c_void,
                lens.as_ptr() as *mut c_void,
                ptrs.as_ptr() as *mut c_void,
                if want_status && count >= n {
                    statuses.as_mut_ptr() as *mut c_void
                } else {
                    std::ptr::null_mut()
                },
                &mut err,
            )
        };
        Ok(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Program,
            p,
            err,
        ))
    };
    let status = run(&mut statuses).unwrap_or_else(|e| e);
    w.i32(status);
    w.bool(want_status);
    if want_status {
        for st in statuses {
            w.i32(st);
        }
    }
    Ok(())
}
