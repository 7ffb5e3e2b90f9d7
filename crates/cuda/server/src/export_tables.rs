//! The slots of NVIDIA's export tables that only the real driver can answer. The client serves
//! the tables (their functions run in the program's process); for these it sends a request
//! here, and the worker calls the same slot of its driver's table.

use crate::driver::EXPORT_TABLE;
use crate::session::{Call, Handle};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::export_tables::{CUDART_INTERFACE, PRIMARY_CONTEXT};
use wormhole_cuda_proto::{DecodeError, HandleKind, Reader, Writer};

/// A request of `wormhole_cuda_proto::export_tables::OP`: the status, then what the slot
/// returns.
pub fn handle(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    match r.u32()? {
        PRIMARY_CONTEXT => {
            let dev = r.i32()?;
            r.finish()?;
            match primary_context(s, dev) {
                Ok(ctx) => {
                    w.i32(CUDA_SUCCESS);
                    w.u64(s.export(HandleKind::Context, ctx));
                }
                Err(st) => w.i32(st),
            }
            Ok(())
        }
        _ => Err(DecodeError::BadValue(
            "an export table slot the server does not serve",
        )),
    }
}

/// Slot `slot` of the driver's table `id`, if the driver has it.
fn real_slot(id: &[u8; 16], slot: usize) -> Option<usize> {
    let get = (*EXPORT_TABLE.get()?)?;
    let mut table: *const usize = std::ptr::null();
    // SAFETY: a valid output pointer and a 16-byte id, as the driver's contract asks.
    let st = unsafe { get(&mut table, id) };
    if st != CUDA_SUCCESS || table.is_null() {
        return None;
    }
    // SAFETY: the driver's table starts with its size in bytes; the slot is read only when
    // the size covers it.
    unsafe {
        let size = *table;
        (size >= (slot + 1) * 8)
            .then(|| *table.add(slot))
            .filter(|&f| f != 0)
    }
}

/// The device's primary context, as the driver hands it to cudart at start-up: not retained
/// (retaining would make a context on every device), and the same handle that
/// `cuDevicePrimaryCtxRetain` and `cuCtxGetCurrent` give later.
fn primary_context(s: &Call<'_>, dev: i32) -> Result<Handle, i32> {
    driver_primary_context(crate::rt::driver_device(s, dev)?)
}

/// The primary context of the driver's device `dev` (its handle whether active or not).
pub fn driver_primary_context(dev: i32) -> Result<Handle, i32> {
    let Some(f) = real_slot(&CUDART_INTERFACE, 2) else {
        tracing::warn!("the driver has no CUDART_INTERFACE table (slot 2): cudart cannot start");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    };
    // SAFETY: slot 2 of CUDART_INTERFACE is `CUresult (*)(CUcontext *, CUdevice)`.
    let f: unsafe extern "C" fn(*mut Handle, i32) -> i32 = unsafe { std::mem::transmute(f) };
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: a valid output pointer and a device of the driver's.
    crate::rt::status(unsafe { f(&mut ctx, dev) }).map(|()| ctx)
}
