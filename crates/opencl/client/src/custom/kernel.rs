use super::*;
use crate::generated;

/// How a setting is remembered (with its size) to tell settings the driver accepted before:
/// NULL, plain bytes, or a handle of a kind.
const ARG_NULL: u8 = 0;
const ARG_BYTES: u8 = 1;
const ARG_HANDLE: u8 = 2;

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
        // accepted for this kernel before is accepted again, so it need not be waited for.
        let sig = (size, class);
        let state = k.kernel.as_ref().expect("kernels carry state");
        let known = state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .args
            .get(&index)
            == Some(&sig);
        if known {
            rt::call_async(w)?;
            return Ok(CL_SUCCESS);
        }
        let reply = rt::call(w)?;
        let st = wormhole_opencl_proto::Reader::new(&reply).i32()?;
        if st == CL_SUCCESS {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            s.args.insert(index, sig);
            // Launches were validated against the old arguments.
            s.launches.clear();
        }
        Ok(st)
    })
}

/// Launches repeat the geometry of one the driver accepted with the same arguments: such a
/// launch is pipelined. Anything new (geometry, wait list) waits for the driver's verdict.
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
    let known = match (&sig, state) {
        (Some((_, s)), Some(st)) if n == 0 && list.is_null() => st
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .launches
            .contains(s),
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
        if let (Some((_, s)), Some(state)) = (sig, state) {
            let mut k = state.lock().unwrap_or_else(|p| p.into_inner());
            if k.launches.len() >= 64 {
                k.launches.remove(0);
            }
            k.launches.push(s);
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
