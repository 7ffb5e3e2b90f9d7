use super::*;
use crate::generated;
use objects::KernelShape;
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::{Arc, Mutex, OnceLock};

/// How a setting is remembered (with its size) to tell settings the driver accepted before:
/// NULL, plain bytes, a handle of a kind, or an SVM pointer.
const ARG_NULL: u8 = 0;
const ARG_BYTES: u8 = 1;
const ARG_HANDLE: u8 = 2;
pub const ARG_SVM: u8 = 0xff;

type ShapeKey = (u64, Vec<u8>);

/// The kinds of kernel made so far, by program id and name, until the program is built again.
fn shapes() -> std::sync::MutexGuard<'static, HashMap<ShapeKey, Arc<Mutex<KernelShape>>>> {
    static SHAPES: OnceLock<Mutex<HashMap<ShapeKey, Arc<Mutex<KernelShape>>>>> = OnceLock::new();
    lock(SHAPES.get_or_init(Mutex::default))
}

/// A build request for `program`: its kernels may have other signatures after it.
pub fn forget_program(program: Handle) {
    // SAFETY: the application's handle, only looked up.
    if let Some(p) = unsafe { objects::get(program, HandleKind::Program) } {
        shapes().retain(|(id, _), _| *id != p.id);
    }
}

/// A lock of the client's own state (a panic while holding it left nothing half-done that
/// matters more than going on).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A kernel made by name from a program the driver made one of that name from before (and not
/// built since) succeeds again: pipelined, with the id the client chose. Kernels of one name
/// share what the driver accepted of their arguments and launches.
pub unsafe extern "C" fn clCreateKernel(
    program: Handle,
    name: *const c_char,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: the application's handle, only looked up; `name` a C string when not NULL.
    let key = unsafe { objects::get(program, HandleKind::Program) }
        .filter(|_| !name.is_null())
        .map(|p| (p.id, unsafe { CStr::from_ptr(name) }.to_bytes().to_vec()));
    let known = key.as_ref().and_then(|k| shapes().get(k).cloned());
    if known.is_some() {
        rt::send_next_async();
    }
    // SAFETY: forwarded with the caller's guarantees.
    let h = unsafe { generated::wire_clCreateKernel(program, name, errcode_ret) };
    // SAFETY: a handle the call just made, or NULL.
    let Some(state) =
        unsafe { objects::get(h, HandleKind::Kernel) }.and_then(|k| k.kernel.as_ref())
    else {
        return h;
    };
    let shape = match (known, key) {
        (Some(shape), _) => shape,
        (None, Some(key)) => {
            let mut all = shapes();
            // Programs the application released stay named here; ids are never reused.
            if all.len() >= 4096 {
                all.clear();
            }
            all.entry(key).or_default().clone()
        }
        (None, None) => return h,
    };
    lock(state).shape = shape;
    h
}

/// Records an argument setting the driver accepted on kernel `k` (an SVM pointer's, say).
pub fn note_setting(k: &objects::ClObject, index: u32, sig: objects::ArgSig) {
    if let Some(state) = k.kernel.as_ref() {
        lock(state).args.insert(index, sig);
    }
}

/// A kernel argument may be a memory object, sampler or queue handle (a pointer-sized value
/// that is the address of a live object of ours): those travel as ids.
pub unsafe extern "C" fn clSetKernelArg(
    kernel: Handle,
    index: u32,
    size: usize,
    value: *const c_void,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let k = unsafe { obj(kernel, HandleKind::Kernel) }?;
        // The value's bytes, when it travels as bytes (borrowed from the application or
        // copied out of it), kept alive for the request below.
        let mut bytes = None;
        let (handle, class) = if value.is_null() {
            (None, ARG_NULL)
        } else {
            let handle = if size == std::mem::size_of::<Handle>() {
                // SAFETY: `value` points to `size` (= pointer-size) readable bytes.
                let v = unsafe { *(value as *const usize) };
                objects::live_object(v).filter(|(k, _)| {
                    matches!(k, HandleKind::Mem | HandleKind::Sampler | HandleKind::Queue)
                })
            } else {
                None
            };
            match handle {
                Some((kind, id)) => (Some((kind, id)), ARG_HANDLE + kind as u8),
                None => {
                    // SAFETY: `value` is the application's memory; a size beyond it (larger
                    // than any argument's type: the driver refuses it unread) is refused here.
                    bytes = Some(unsafe {
                        rt::app_bytes(value as *const u8, size, CL_INVALID_ARG_SIZE)
                    }?);
                    (None, ARG_BYTES)
                }
            }
        };
        let arg = match (handle, &bytes) {
            (Some((kind, id)), _) => req::ArgValue::Handle(kind, id),
            (None, Some(b)) => req::ArgValue::Bytes(b),
            (None, None) => req::ArgValue::Null,
        };
        let w = encode(
            Op::clSetKernelArg,
            &req::SetKernelArg {
                kernel: k.id,
                index,
                size,
                value: arg,
            },
        );
        // The driver judges an argument by its index, size and kind of value; a setting it has
        // accepted for this kind of kernel before is accepted again, so it need not be waited
        // for.
        let sig = (size, class);
        let state = k.kernel.as_ref().expect("kernels carry state");
        let shape = lock(state).shape.clone();
        let known = lock(&shape).args.contains(&(index, sig));
        if known {
            rt::call_async(w)?;
            lock(state).args.insert(index, sig);
            return Ok(CL_SUCCESS);
        }
        let reply = rt::call(w)?;
        let st = wormhole_opencl_proto::Reader::new(&reply).i32()?;
        if st == CL_SUCCESS {
            lock(state).args.insert(index, sig);
            lock(&shape).args.insert((index, sig));
        }
        Ok(st)
    })
}

/// Launches repeat the geometry of one the driver accepted with the same argument settings
/// (for this kind of kernel): such a launch is pipelined. Anything new (geometry, settings, wait
/// list) waits for the driver's verdict.
pub unsafe extern "C" fn clEnqueueNDRangeKernel(
    queue: Handle,
    kernel: Handle,
    work_dim: u32,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    if work_dim as usize > rt::MAX_USIZES {
        // No device has that many dimensions: the driver's answer, without reading work_dim
        // entries of arrays that hold a few (a bad handle is reported first, as natively).
        // SAFETY: the application's handles, only looked up.
        return unsafe {
            if objects::get(queue, HandleKind::Queue).is_none() {
                CL_INVALID_COMMAND_QUEUE
            } else if objects::get(kernel, HandleKind::Kernel).is_none() {
                CL_INVALID_KERNEL
            } else {
                CL_INVALID_WORK_DIMENSION
            }
        };
    }
    // SAFETY: the application's handles and arrays (work_dim entries each).
    let sig = unsafe { launch_sig(queue, kernel, work_dim, offset, global, local) };
    let state = sig.as_ref().and_then(|(k, _)| k.kernel.as_ref());
    // The kernel's settings as they are at the launch, and what its kind accepted.
    let now = state.map(|st| {
        let st = lock(st);
        (st.settings(), st.shape.clone())
    });
    let known = match (&sig, &now) {
        (Some((_, s)), Some((settings, shape))) if n == 0 && list.is_null() => lock(shape)
            .launches
            .iter()
            .any(|(l, a)| l == s && a == settings),
        _ => false,
    };
    if known {
        rt::send_next_async();
    }
    // SAFETY: forwarded with the caller's guarantees.
    let st = unsafe {
        generated::wire_clEnqueueNDRangeKernel(
            queue, kernel, work_dim, offset, global, local, n, list, event,
        )
    };
    if st == CL_SUCCESS && !known {
        if let (Some((_, s)), Some((settings, shape))) = (sig, now) {
            let mut shape = lock(&shape);
            if shape.launches.len() >= 64 {
                shape.launches.remove(0);
            }
            shape.launches.push((s, settings));
        }
    }
    st
}

unsafe fn launch_sig<'a>(
    queue: Handle,
    kernel: Handle,
    work_dim: u32,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
) -> Option<(&'a objects::ClObject, objects::LaunchSig)> {
    // SAFETY: the application's handles.
    let (q, k) = unsafe {
        (
            objects::get(queue, HandleKind::Queue)?,
            objects::get(kernel, HandleKind::Kernel)?,
        )
    };
    if !(1..=3).contains(&work_dim) || global.is_null() {
        return None;
    }
    let d = work_dim as usize;
    let mut dims = Vec::with_capacity(3 * d + 3);
    for (tag, p) in [(0usize, offset), (1, global), (2, local)] {
        dims.push(if p.is_null() { usize::MAX - tag } else { tag });
        if !p.is_null() {
            // SAFETY: each non-NULL array holds work_dim values.
            dims.extend((0..d).map(|i| unsafe { *p.add(i) }));
        }
    }
    Some((k, objects::LaunchSig { queue: q.id, dims }))
}
