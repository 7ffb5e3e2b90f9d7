//! Delivers an info query's value into the application's buffer, turning session ids back
//! into the application's handles (see protocol::info).

use super::*;
use wormhole_protocol::info::{info_value, InfoValue};

/// # Safety
/// `value` must be NULL or point to `cap` writable bytes (for CL_PROGRAM_BINARIES: an array of
/// pointers to buffers of the binaries' sizes); `size_ret` NULL or writable; `obj` a handle
/// validated earlier in the call.
pub unsafe fn deliver(
    op: Op,
    param: u32,
    obj: *mut c_void,
    r: &mut Reader<'_>,
    value: *mut c_void,
    cap: usize,
    size_ret: *mut usize,
) -> Result<(), ClErr> {
    if !value.is_null() {
        let bytes = r.bytes()?;
        match info_value(op, param) {
            InfoValue::Binaries => {
                let mut b = Reader::new(bytes);
                let n = b.u32()? as usize;
                for i in 0..n.min(cap / 8) {
                    let bin = b.bytes()?;
                    // SAFETY: the application's array holds cap/8 pointers.
                    let dst = unsafe { *(value as *const *mut u8).add(i) };
                    if !dst.is_null() {
                        // SAFETY: the application sized each buffer by CL_PROGRAM_BINARY_SIZES.
                        unsafe { std::ptr::copy_nonoverlapping(bin.as_ptr(), dst, bin.len()) };
                    }
                }
            }
            InfoValue::ClientHostPtr => {
                // SAFETY: `obj` is a memory object validated by the stub.
                let host = unsafe { crate::objects::get(obj, HandleKind::Mem) }
                    .and_then(|o| o.mem)
                    .map_or(0, |m| m.host_ptr);
                let b = (host as u64).to_le_bytes();
                // SAFETY: cap >= 8 was checked by the server (it reported 8 bytes).
                unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), value as *mut u8, b.len().min(cap))
                };
            }
            kind => {
                let mut v = bytes.to_vec();
                match kind {
                    InfoValue::Handles(k) => {
                        for c in v.chunks_exact_mut(8) {
                            let id = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                            c.copy_from_slice(
                                &(crate::objects::object_for_id(k, id) as u64).to_le_bytes(),
                            );
                        }
                    }
                    InfoValue::ContextProps => {
                        let mut i = 0;
                        while i + 16 <= v.len() {
                            let key = u64::from_le_bytes(v[i..i + 8].try_into().unwrap_or([0; 8]));
                            if key == 0 {
                                break;
                            }
                            if key == CL_CONTEXT_PLATFORM {
                                let id = u64::from_le_bytes(
                                    v[i + 8..i + 16].try_into().unwrap_or([0; 8]),
                                );
                                let h =
                                    crate::objects::object_for_id(HandleKind::Platform, id) as u64;
                                v[i + 8..i + 16].copy_from_slice(&h.to_le_bytes());
                            }
                            i += 16;
                        }
                    }
                    _ => {}
                }
                let n = v.len().min(cap);
                // SAFETY: n <= cap.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), value as *mut u8, n) };
            }
        }
    }
    if !size_ret.is_null() {
        // SAFETY: per the contract.
        unsafe { *size_ret = r.usize()? };
    }
    Ok(())
}
