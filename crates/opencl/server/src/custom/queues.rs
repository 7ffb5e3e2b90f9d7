//! Command queues. A device-side queue (`CL_QUEUE_ON_DEVICE`) on a device without device-side
//! enqueue is refused with `CL_INVALID_QUEUE_PROPERTIES`, as the spec says: PoCL 3.1 aborts the
//! process instead ("Device side queue is unimplemented"), which here would end the tenant's
//! session (Boost.Compute's tests ask for one). Everything else goes to the driver as is.

use super::*;
use crate::generated::{args, ffi};
use wormhole_opencl_proto::{cl::*, Op, Props, Writer};

const CL_QUEUE_ON_DEVICE: u64 = 1 << 2;
const CL_INVALID_QUEUE_PROPERTIES: i32 = -35;
const CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE: u32 = 0x1050;
const CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES: u32 = 0x1070;
const CL_DEVICE_QUEUE_SUPPORTED: u64 = 1 << 0;

/// Whether `device` says it has no device-side queues (OpenCL 3.0's capabilities, else 2.x's
/// maximum queue size). A device that answers neither is left to its driver.
fn lacks_device_queues(device: Handle) -> bool {
    let word = |param| {
        crate::rt::device_info(device, param).ok().map(|v| {
            let mut b = [0u8; 8];
            let n = v.len().min(8);
            b[..n].copy_from_slice(&v[..n]);
            u64::from_le_bytes(b)
        })
    };
    match word(CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES) {
        Some(caps) => caps & CL_DEVICE_QUEUE_SUPPORTED == 0,
        None => word(CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE) == Some(0),
    }
}

/// The `CL_QUEUE_PROPERTIES` bits of a property list.
fn queue_properties(props: &[u64]) -> u64 {
    props
        .chunks_exact(2)
        .take_while(|kv| kv[0] != 0)
        .find(|kv| kv[0] == u64::from(CL_QUEUE_PROPERTIES))
        .map_or(0, |kv| kv[1])
}

pub fn clCreateCommandQueueWithProperties(
    s: &Session,
    a: args::clCreateCommandQueueWithProperties,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let args::clCreateCommandQueueWithProperties {
        new_id,
        context_id: context,
        device_id: device,
        properties_props: props,
    } = a;
    let run = || -> Result<i32, i32> {
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        let device = s.resolve(device, HandleKind::Device, false)?;
        let props = crate::props::resolve(s, Props::Plain, props)?;
        crate::rt::check_slot(context, Op::clCreateCommandQueueWithProperties)?;
        let wanted = props.as_deref().map_or(0, queue_properties);
        if wanted & CL_QUEUE_ON_DEVICE != 0 && lacks_device_queues(device) {
            tracing::info!(
                "a device-side queue on a device without device-side enqueue: refused with \
                 CL_INVALID_QUEUE_PROPERTIES"
            );
            return Err(CL_INVALID_QUEUE_PROPERTIES);
        }
        let mut err = CL_SUCCESS;
        // SAFETY: live handles; a zero-terminated property list or NULL.
        let queue = unsafe {
            ffi::clCreateCommandQueueWithProperties(
                context,
                device,
                props.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                &mut err,
            )
        };
        Ok(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Queue,
            queue,
            err,
        ))
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}
