//! What the generated handlers share: length checks, output buffers, device-address checks.

use crate::generated::ffi;
use crate::session::{Handle, Session};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{HandleKind, Op};

/// The largest value one output parameter may carry back (a name, a UUID: small; copies to
/// the host larger than a frame take another path).
const MAX_OUT: usize = 64 << 20;
const MAX_HANDLES: u32 = 1 << 16;

pub fn check_len(actual: Option<usize>, expected: Option<usize>) -> Result<(), i32> {
    match (actual, expected) {
        (None, _) => Ok(()),
        (Some(a), Some(e)) if a == e => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn out_buffer(len: Option<usize>) -> Result<Vec<u8>, i32> {
    match len {
        None => Err(CUDA_ERROR_INVALID_VALUE),
        Some(n) if n > MAX_OUT => {
            tracing::warn!(
                bytes = n,
                "an output larger than a reply frame is not forwarded yet"
            );
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
        Some(n) => Ok(vec![0; n]),
    }
}

pub fn handle_buffer(count: u32) -> Result<Vec<Handle>, i32> {
    if count > MAX_HANDLES {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(vec![std::ptr::null_mut(); count as usize])
}

/// A driver status as a result: success, or the status as the error.
pub fn status(st: i32) -> Result<(), i32> {
    match st {
        CUDA_SUCCESS => Ok(()),
        st => Err(st),
    }
}

/// A device address from the wire: the call may touch `len` bytes there only if the session
/// allocated them (another session's memory is another process's, but the worker's own host
/// memory is addressable through unified addressing too).
pub fn check_device(s: &Session, addr: u64, len: Option<usize>) -> Result<(), i32> {
    let len = len.ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
    if s.owns(addr, len.max(1)) {
        return Ok(());
    }
    tracing::warn!(
        addr = format_args!("{addr:#x}"),
        len,
        "refused a device range the session did not allocate"
    );
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// Per-object checks before the driver sees a call (OpenCL's driver slots). CUDA's: an
/// asynchronous copy whose host bytes travel in the request or the reply is not captured
/// into a graph. The driver would record the worker's buffer of them, which is gone when the
/// request is done: every replay would read (to the device) or write (to the host) whatever
/// lies there then, and a copy to the host would answer bytes never copied (a copy of the
/// session's page-locked memory names the program's own range and is captured as natively).
pub fn check_slot(obj: Handle, op: Op) -> Result<(), i32> {
    let per_thread = match op {
        Op::cuMemcpyHtoDAsync_v2 | Op::cuMemcpyDtoHAsync_v2 => false,
        Op::cuMemcpyHtoDAsync_v2_ptsz | Op::cuMemcpyDtoHAsync_v2_ptsz => true,
        _ => return Ok(()),
    };
    if crate::capture::is_capturing(obj, per_thread) {
        tracing::warn!(
            "an asynchronous copy of pageable host memory on a capturing stream: its bytes cannot outlive the request in a graph; answering CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (copy page-locked memory, cuMemHostAlloc, to capture it)"
        );
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Where the driver writes an output the program asked for: `v`, or NULL where it passed
/// NULL (the driver then answers what it answers for NULL).
pub fn out_ptr<T>(present: bool, v: &mut T) -> *mut T {
    match present {
        true => v,
        false => std::ptr::null_mut(),
    }
}

/// The calling (lane) thread's current context in the driver: the one its allocations belong
/// to (NULL if none, or if the driver cannot say).
pub fn current_context() -> Handle {
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: a valid output pointer.
    if unsafe { ffi::cuCtxGetCurrent(&mut ctx) } != CUDA_SUCCESS {
        return std::ptr::null_mut();
    }
    ctx
}

/// An object the driver made but the session could not bind (its id was taken meanwhile):
/// destroyed again, so nothing leaks.
pub fn release(kind: HandleKind, obj: Handle) {
    // SAFETY: `obj` was just made by the driver, is of `kind`, and nobody else knows it.
    let st = unsafe {
        match kind {
            HandleKind::Context => ffi::cuCtxDestroy_v2(obj),
            HandleKind::Module => ffi::cuModuleUnload(obj),
            HandleKind::Stream => ffi::cuStreamDestroy_v2(obj),
            HandleKind::Event => ffi::cuEventDestroy_v2(obj),
            HandleKind::Library => ffi::cuLibraryUnload(obj),
            HandleKind::Graph => ffi::cuGraphDestroy(obj),
            HandleKind::GraphExec => ffi::cuGraphExecDestroy(obj),
            HandleKind::LinkState => ffi::cuLinkDestroy(obj),
            // A function belongs to its module, a kernel to its library, a node to its graph;
            // a device's memory pools are its own.
            HandleKind::Function
            | HandleKind::Kernel
            | HandleKind::GraphNode
            | HandleKind::MemPool => CUDA_SUCCESS,
        }
    };
    if st != CUDA_SUCCESS {
        tracing::warn!(?kind, status = st, "could not destroy an unbound object");
    }
}

/// The driver's devices the tenant may use (those whose name its `devices` filter lets
/// through), in the driver's order: the tenant's device `n` is the `n`-th of them, as
/// `CUDA_VISIBLE_DEVICES` numbers what it leaves. Found once, when a session first needs
/// them (its driver is loaded by then).
pub fn visible_devices(s: &Session) -> &[i32] {
    s.visible.get_or_init(|| {
        let mut count = 0u32;
        // SAFETY: a valid output pointer.
        if unsafe { ffi::cuDeviceGetCount(&mut count) } != CUDA_SUCCESS {
            return Vec::new();
        }
        (0..count as i32)
            .filter_map(|ordinal| {
                let mut dev = 0u32;
                // SAFETY: a valid output pointer.
                let st = unsafe { ffi::cuDeviceGet(&mut dev, ordinal) };
                (st == CUDA_SUCCESS).then_some(dev as i32)
            })
            .filter(|&dev| s.limits().may_use_device(&device_name(dev)))
            .collect()
    })
}

/// The driver's name of device `dev` (what tenants' `devices` filters match).
pub fn device_name(dev: i32) -> String {
    let mut name = [0u8; 256];
    // SAFETY: `name` holds the length passed.
    unsafe { ffi::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as i32, dev) };
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// The driver's device for the tenant's device number `n` (a `devno` parameter).
pub fn driver_device(s: &Session, n: i32) -> Result<i32, i32> {
    tenant_to_driver(visible_devices(s), n)
}

/// The tenant's number of the driver's device `dev`, if the tenant may use it.
pub fn tenant_device(s: &Session, dev: i32) -> Option<i32> {
    driver_to_tenant(visible_devices(s), dev)
}

fn tenant_to_driver(visible: &[i32], n: i32) -> Result<i32, i32> {
    usize::try_from(n)
        .ok()
        .and_then(|i| visible.get(i).copied())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn driver_to_tenant(visible: &[i32], dev: i32) -> Option<i32> {
    visible.iter().position(|&d| d == dev).map(|i| i as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant allowed the driver's devices 1 and 3 numbers them 0 and 1; the others do not
    /// exist for it.
    #[test]
    fn a_tenant_numbers_only_the_devices_it_may_use() {
        let visible = [1, 3];
        assert_eq!(tenant_to_driver(&visible, 0), Ok(1));
        assert_eq!(tenant_to_driver(&visible, 1), Ok(3));
        assert_eq!(
            tenant_to_driver(&visible, 2),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(
            tenant_to_driver(&visible, -1),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(driver_to_tenant(&visible, 3), Some(1));
        assert_eq!(driver_to_tenant(&visible, 0), None);
    }
}
