//! Device discovery under tenant restrictions: a tenant configured with `devices = [...]` sees
//! (and can build contexts on) only devices whose name contains one of those strings. Without
//! a restriction these behave exactly like the driver's own calls.

use super::*;
use crate::generated::{args, ffi};
use wormhole_opencl_proto::{cl::*, CallbackKind, Props, Writer};

fn device_name(d: Handle) -> String {
    let name = crate::rt::device_info(d, CL_DEVICE_NAME).unwrap_or_default();
    String::from_utf8_lossy(&name)
        .trim_end_matches('\0')
        .to_string()
}

/// The devices of `platform` of `device_type` that this tenant may use.
fn allowed_devices(s: &Session, platform: Handle, device_type: u64) -> Result<Vec<Handle>, i32> {
    let mut n = 0u32;
    // SAFETY: count query; the output is a local.
    let st = unsafe { ffi::clGetDeviceIDs(platform, device_type, 0, std::ptr::null_mut(), &mut n) };
    if st != CL_SUCCESS {
        return Err(st);
    }
    let mut all: Vec<Handle> = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `all` holds n entries.
    let st = unsafe {
        ffi::clGetDeviceIDs(
            platform,
            device_type,
            n,
            all.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if st != CL_SUCCESS {
        return Err(st);
    }
    if !s.limits().devices.is_empty() {
        all.retain(|d| s.limits().may_use_device(&device_name(*d)));
    }
    if all.is_empty() {
        return Err(CL_DEVICE_NOT_FOUND);
    }
    Ok(all)
}

pub fn clGetDeviceIDs(
    s: &Session,
    a: args::clGetDeviceIDs,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let args::clGetDeviceIDs {
        platform_id: platform,
        device_type,
        num_entries,
        devices_present,
        num_devices_present: num_present,
    } = a;
    let run = |w: &mut Writer| -> Result<(), i32> {
        let platform = s.resolve(platform, HandleKind::Platform, true)?;
        if (devices_present && num_entries == 0) || (!devices_present && !num_present) {
            return Err(CL_INVALID_VALUE);
        }
        let devices = allowed_devices(s, platform, device_type)?;
        w.i32(CL_SUCCESS);
        if devices_present {
            let n = devices.len().min(num_entries as usize);
            s.export_list(w, HandleKind::Device, &devices[..n]);
        }
        if num_present {
            w.u32(devices.len() as u32);
        }
        Ok(())
    };
    if let Err(e) = run(w) {
        w.i32(e);
    }
    Ok(())
}

pub fn clCreateContextFromType(
    s: &Session,
    a: args::clCreateContextFromType,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let args::clCreateContextFromType {
        new_id,
        properties_props: props,
        device_type,
        pfn_notify_cb: cb,
    } = a;
    let run = || -> Result<i32, i32> {
        s.check_new_id(new_id)?;
        let props = crate::props::resolve(s, Props::Context, props)?;
        let (notify, ud) = crate::callbacks::make(CallbackKind::ContextNotify, cb, 0);
        let props_ptr = props.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        let mut err = CL_SUCCESS;
        if s.limits().devices.is_empty() {
            // SAFETY: a zero-terminated property list (or NULL) and a trampoline for `cb`.
            let ctx = unsafe {
                ffi::clCreateContextFromType(props_ptr, device_type, notify, ud, &mut err)
            };
            return Ok(crate::rt::bind_created(
                s,
                new_id,
                HandleKind::Context,
                ctx,
                err,
            ));
        }
        // Restricted tenant: a context on exactly the devices of that type it may use.
        let platform = match props.as_ref().and_then(|v| {
            v.chunks(2)
                .find(|kv| kv[0] == CL_CONTEXT_PLATFORM)
                .map(|kv| kv[1])
        }) {
            Some(p) => p as Handle,
            None => {
                let mut p: Handle = std::ptr::null_mut();
                // SAFETY: one platform into a local.
                unsafe { ffi::clGetPlatformIDs(1, &mut p, std::ptr::null_mut()) };
                p
            }
        };
        let devices = allowed_devices(s, platform, device_type)?;
        // SAFETY: as above, with a device list of devices.len() entries.
        let ctx = unsafe {
            ffi::clCreateContext(
                props_ptr,
                devices.len() as u32,
                devices.as_ptr(),
                notify,
                ud,
                &mut err,
            )
        };
        Ok(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Context,
            ctx,
            err,
        ))
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// What a standby worker does before any tenant waits for it: load the driver and let it find
/// its devices, the slow part of a session's start (tens of milliseconds for PoCL).
pub fn warm_up() {
    use std::ptr::null_mut;
    // SAFETY: plain queries into local buffers of the sizes given.
    unsafe {
        let mut n = 0u32;
        if ffi::clGetPlatformIDs(0, null_mut(), &mut n) != CL_SUCCESS || n == 0 {
            return;
        }
        let mut platforms = vec![null_mut(); n as usize];
        ffi::clGetPlatformIDs(n, platforms.as_mut_ptr(), null_mut());
        for p in platforms {
            let mut devices = 0u32;
            ffi::clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, null_mut(), &mut devices);
        }
    }
}

/// Every device of every platform the driver offers, for `wh devices` (no tenant filter: the
/// operator asks, in an inventory worker of its own).
pub fn inventory() -> Result<Vec<wormhole_server::backend::DeviceInventory>, String> {
    use std::ptr::null_mut;
    let text = |v: Result<Vec<u8>, i32>| {
        String::from_utf8_lossy(&v.unwrap_or_default())
            .trim_end_matches('\0')
            .trim()
            .to_string()
    };
    let number = |v: Result<Vec<u8>, i32>| {
        v.ok()
            .and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
            .unwrap_or(0)
    };
    let mut n = 0u32;
    // SAFETY: count query into a local.
    let st = unsafe { ffi::clGetPlatformIDs(0, null_mut(), &mut n) };
    if st == CL_PLATFORM_NOT_FOUND_KHR || (st == CL_SUCCESS && n == 0) {
        return Ok(Vec::new());
    }
    if st != CL_SUCCESS {
        return Err(format!("clGetPlatformIDs failed ({st})"));
    }
    let mut platforms = vec![null_mut(); n as usize];
    // SAFETY: `platforms` holds n entries.
    unsafe { ffi::clGetPlatformIDs(n, platforms.as_mut_ptr(), null_mut()) };
    let mut found = Vec::new();
    for p in platforms {
        let platform = text(crate::rt::platform_info(p, CL_PLATFORM_NAME));
        let mut count = 0u32;
        // SAFETY: count query into a local.
        if unsafe { ffi::clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, null_mut(), &mut count) }
            != CL_SUCCESS
        {
            continue;
        }
        let mut devices: Vec<Handle> = vec![null_mut(); count as usize];
        // SAFETY: `devices` holds count entries.
        unsafe {
            ffi::clGetDeviceIDs(
                p,
                CL_DEVICE_TYPE_ALL,
                count,
                devices.as_mut_ptr(),
                null_mut(),
            )
        };
        for d in devices {
            let kind = number(crate::rt::device_info(d, CL_DEVICE_TYPE));
            found.push(wormhole_server::backend::DeviceInventory {
                name: device_name(d),
                vendor: text(crate::rt::device_info(d, CL_DEVICE_VENDOR)),
                kind: if kind & CL_DEVICE_TYPE_GPU != 0 {
                    "gpu"
                } else if kind & CL_DEVICE_TYPE_ACCELERATOR != 0 {
                    "accelerator"
                } else if kind & CL_DEVICE_TYPE_CPU != 0 {
                    "cpu"
                } else {
                    "other"
                }
                .to_string(),
                memory_bytes: number(crate::rt::device_info(d, CL_DEVICE_GLOBAL_MEM_SIZE)),
                version: text(crate::rt::device_info(d, CL_DEVICE_VERSION)),
                platform: platform.clone(),
            });
        }
    }
    Ok(found)
}
