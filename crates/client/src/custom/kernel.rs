use super::*;

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
        let mut w = rt::request(wormhole_protocol::Op::clSetKernelArg);
        w.u64(k.id);
        w.u32(index);
        w.usize(size);
        if value.is_null() {
            w.u8(ARG_NULL);
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
                Some((kind, id)) => {
                    w.u8(ARG_HANDLE);
                    w.u8(kind as u8);
                    w.u64(id);
                }
                None => {
                    w.u8(ARG_BYTES);
                    // SAFETY: `value` points to `size` readable bytes.
                    w.bytes(unsafe { std::slice::from_raw_parts(value as *const u8, size) });
                }
            }
        }
        let reply = rt::call(w)?;
        Ok(wormhole_protocol::Reader::new(&reply).i32()?)
    })
}
