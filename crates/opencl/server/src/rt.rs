//! Small helpers the generated handlers call: length checks, bounded output buffers, the
//! null-dispatch-slot guard, and the bookkeeping of newly created objects.

use crate::generated::ffi;
use crate::session::{Handle, Session};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use wormhole_opencl_proto::{cl::*, HandleKind, Op};

/// Largest output buffer a single query may ask the server to allocate.
const MAX_OUT: usize = 64 << 20;
/// Largest handle array a single call may ask for.
const MAX_HANDLES: u32 = 1 << 16;

/// An input the client sent must have exactly the length the call's own arguments imply.
pub fn check_len(actual: Option<usize>, expected: Option<usize>) -> Result<(), i32> {
    match (actual, expected) {
        (None, _) => Ok(()),
        (Some(a), Some(e)) if a == e => Ok(()),
        _ => Err(CL_INVALID_VALUE),
    }
}

pub fn out_buffer(len: Option<usize>) -> Result<Vec<u8>, i32> {
    match len {
        None => Err(CL_INVALID_VALUE),
        Some(n) if n > MAX_OUT => Err(CL_OUT_OF_HOST_MEMORY),
        Some(n) => Ok(vec![0; n]),
    }
}

/// A whole info value through the two-call protocol: its size first, then its bytes.
pub fn info_bytes(call: impl Fn(usize, *mut c_void, *mut usize) -> i32) -> Result<Vec<u8>, i32> {
    let mut size = 0usize;
    let st = call(0, std::ptr::null_mut(), &mut size);
    if st != CL_SUCCESS {
        return Err(st);
    }
    let mut buf = out_buffer(Some(size))?;
    if size > 0 {
        let st = call(size, buf.as_mut_ptr() as *mut c_void, std::ptr::null_mut());
        if st != CL_SUCCESS {
            return Err(st);
        }
    }
    Ok(buf)
}

/// Info values of objects the caller knows to be live (from the session's table, or returned
/// by the driver just now).
pub fn program_info(program: Handle, param: u32) -> Result<Vec<u8>, i32> {
    // SAFETY: a live program; `info_bytes` passes a buffer of the size it gives.
    info_bytes(|n, p, r| unsafe { ffi::clGetProgramInfo(program, param, n, p, r) })
}

pub fn program_build_info(program: Handle, device: Handle, param: u32) -> Result<Vec<u8>, i32> {
    // SAFETY: as above.
    info_bytes(|n, p, r| unsafe { ffi::clGetProgramBuildInfo(program, device, param, n, p, r) })
}

pub fn device_info(device: Handle, param: u32) -> Result<Vec<u8>, i32> {
    // SAFETY: as above.
    info_bytes(|n, p, r| unsafe { ffi::clGetDeviceInfo(device, param, n, p, r) })
}

pub fn platform_info(platform: Handle, param: u32) -> Result<Vec<u8>, i32> {
    // SAFETY: as above.
    info_bytes(|n, p, r| unsafe { ffi::clGetPlatformInfo(platform, param, n, p, r) })
}

/// Whether live queue `q` runs its commands in order (None: the driver would not say).
pub fn queue_in_order(q: Handle) -> Option<bool> {
    let mut props = 0u64;
    // SAFETY: a live queue; the value goes to a local of its size.
    let st = unsafe {
        ffi::clGetCommandQueueInfo(
            q,
            CL_QUEUE_PROPERTIES,
            8,
            &mut props as *mut u64 as *mut c_void,
            std::ptr::null_mut(),
        )
    };
    (st == CL_SUCCESS).then_some(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE == 0)
}

/// An info value that is one handle (CL_PROGRAM_CONTEXT, CL_DEVICE_PLATFORM, ...).
pub fn handle_value(v: &[u8]) -> Option<Handle> {
    Some(u64::from_le_bytes(v.get(..8)?.try_into().ok()?) as Handle)
}

/// The binaries of a built program, one per device in the order of CL_PROGRAM_DEVICES (empty
/// where the driver has none).
pub fn program_binaries(program: Handle) -> Result<Vec<Vec<u8>>, i32> {
    let sizes = program_info(program, CL_PROGRAM_BINARY_SIZES)?;
    let mut bins: Vec<Vec<u8>> = Vec::new();
    for sz in sizes.chunks_exact(8) {
        let sz = u64::from_le_bytes(sz.try_into().unwrap_or([0; 8]));
        bins.push(out_buffer(usize::try_from(sz).ok())?);
    }
    let mut ptrs: Vec<*mut u8> = bins
        .iter_mut()
        .map(|b| {
            if b.is_empty() {
                std::ptr::null_mut()
            } else {
                b.as_mut_ptr()
            }
        })
        .collect();
    // SAFETY: one pointer per device, each to a buffer of the size the driver reported (NULL
    // where that size is 0, which the driver skips).
    let st = unsafe {
        ffi::clGetProgramInfo(
            program,
            CL_PROGRAM_BINARIES,
            ptrs.len() * 8,
            ptrs.as_mut_ptr() as *mut c_void,
            std::ptr::null_mut(),
        )
    };
    if st != CL_SUCCESS {
        return Err(st);
    }
    Ok(bins)
}

pub fn handle_buffer(count: u32) -> Result<Vec<Handle>, i32> {
    if count > MAX_HANDLES {
        return Err(CL_OUT_OF_HOST_MEMORY);
    }
    Ok(vec![std::ptr::null_mut(); count as usize])
}

/// Some drivers leave ICD dispatch slots empty (PoCL: clSetCommandQueueProperty); the loader
/// would jump to address 0. Answer such calls with CL_INVALID_OPERATION instead.
pub fn check_slot(obj: Handle, op: Op) -> Result<(), i32> {
    if obj.is_null() {
        return Ok(());
    }
    // SAFETY: `obj` came from this session's handle table, so it is a live ICD object whose
    // first field is its dispatch table (the Khronos ICD contract), and the table has a slot
    // for every opcode of the description (it follows cl_icd.h).
    let slot = unsafe {
        let table = *(obj as *const *const *const c_void);
        if table.is_null() {
            return Err(CL_INVALID_OPERATION);
        }
        *table.add(op as usize)
    };
    if slot.is_null() {
        tracing::debug!(op = op.name(), "driver leaves this entry point empty");
        return Err(CL_INVALID_OPERATION);
    }
    Ok(())
}

/// Registers an object a call just created under the id the client chose.
pub fn bind_created(s: &Session, id: u64, kind: HandleKind, obj: Handle, errcode: i32) -> i32 {
    if obj.is_null() {
        return if errcode == CL_SUCCESS {
            CL_OUT_OF_RESOURCES
        } else {
            errcode
        };
    }
    if errcode != CL_SUCCESS {
        // Some drivers return an object together with an error (PoCL's clCreateContextFromType
        // without matching devices); the spec says NULL, and the error is what matters.
        return errcode;
    }
    if let Err(code) = s.bind(id, kind, obj) {
        release(kind, obj);
        return code;
    }
    if kind == HandleKind::Context {
        crate::staging::context_created(obj);
    }
    if kind == HandleKind::Mem {
        if let Err(code) = track_memory(s, obj) {
            s.forget(id);
            // SAFETY: the object was just created and nobody else knows it.
            unsafe { ffi::clReleaseMemObject(obj) };
            return code;
        }
    }
    CL_SUCCESS
}

/// Counts a memory object's bytes against the session and its tenant's quota until the driver
/// destroys it; an object that would exceed the quota is refused.
fn track_memory(s: &Session, mem: Handle) -> Result<(), i32> {
    let mut parent: Handle = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: `mem` is a live memory object; the outputs are local variables of the right size.
    unsafe {
        ffi::clGetMemObjectInfo(
            mem,
            CL_MEM_ASSOCIATED_MEMOBJECT,
            8,
            &mut parent as *mut Handle as *mut c_void,
            std::ptr::null_mut(),
        );
        if !parent.is_null() {
            return Ok(()); // a sub-buffer shares its parent's memory
        }
        if ffi::clGetMemObjectInfo(
            mem,
            CL_MEM_SIZE,
            8,
            &mut size as *mut usize as *mut c_void,
            std::ptr::null_mut(),
        ) != CL_SUCCESS
        {
            return Ok(());
        }
    }
    if !s.limits().reserve(size as u64) {
        return Err(CL_MEM_OBJECT_ALLOCATION_FAILURE);
    }
    s.mem_bytes.fetch_add(size as i64, Ordering::Relaxed);
    let limits = s.limits_handle();
    crate::callbacks::on_mem_destroyed(mem, move || {
        crate::session()
            .mem_bytes
            .fetch_sub(size as i64, Ordering::Relaxed);
        limits.release(size as u64);
    });
    Ok(())
}

/// Drops the reference a create call returned, for an object that could not be bound.
pub fn release(kind: HandleKind, obj: Handle) {
    // SAFETY: `obj` was just created by the driver, is of `kind`, and nobody else knows it.
    unsafe {
        match kind {
            HandleKind::Context => ffi::clReleaseContext(obj),
            HandleKind::Queue => ffi::clReleaseCommandQueue(obj),
            HandleKind::Mem => ffi::clReleaseMemObject(obj),
            HandleKind::Sampler => ffi::clReleaseSampler(obj),
            HandleKind::Program => ffi::clReleaseProgram(obj),
            HandleKind::Kernel => ffi::clReleaseKernel(obj),
            HandleKind::Event => ffi::clReleaseEvent(obj),
            HandleKind::Device => ffi::clReleaseDevice(obj),
            HandleKind::Platform => CL_SUCCESS,
        }
    };
}
