//! Delivers an info query's value into the application's buffer, turning session ids back
//! into the application's handles (see protocol::info).

use super::*;
use std::collections::HashMap;
use std::sync::Mutex;
use wormhole_opencl_proto::info::{cacheable, info_value, write_answer, InfoValue};

/// Answers that cannot change, keyed by the request that produced them (opcode, object ids,
/// parameter). Ids are never reused within a process, so an entry cannot go stale.
static CACHE: Mutex<Option<HashMap<Vec<u8>, Vec<u8>>>> = Mutex::new(None);
const CACHE_LIMIT: usize = 100_000;

/// Runs `change`, one of the few calls that change what was immutable (a queue's properties,
/// a device's default queue; rare), forgetting every kept answer before and after it.
pub fn changing(change: impl FnOnce() -> i32) -> i32 {
    let forget = || *CACHE.lock().unwrap_or_else(|p| p.into_inner()) = None;
    forget();
    let st = change();
    forget();
    st
}

/// Runs an info query: answered by the client when it knows the value (`local_answer`), from
/// the cache when the answer is immutable and already known, else by the server.
pub fn query(op: Op, obj: *mut c_void, param: u32, w: Writer) -> Result<Vec<u8>, ClErr> {
    if let Some(reply) = local_answer(op, obj, param) {
        return Ok(reply);
    }
    if !cacheable(op, param) {
        return call(w);
    }
    let mut key = (op as u16).to_le_bytes().to_vec();
    key.extend_from_slice(w.body());
    if let Some(hit) = CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|c| c.get(&key))
    {
        return Ok(hit.clone());
    }
    let reply = call(w)?;
    if Reader::new(&reply).i32() == Ok(CL_SUCCESS) {
        let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        let c = c.get_or_insert_with(HashMap::new);
        if c.len() >= CACHE_LIMIT {
            c.clear();
        }
        c.insert(key, reply.clone());
    }
    Ok(reply)
}

/// What the client knows without asking: a buffer's size (libraries ask it of every buffer
/// they make; CLBlast's tests did, a round trip per buffer). The reply is the server's form.
fn local_answer(op: Op, obj: *mut c_void, param: u32) -> Option<Vec<u8>> {
    if op != Op::clGetMemObjectInfo || param != CL_MEM_SIZE {
        return None;
    }
    // SAFETY: the stub validated the handle before building the request.
    let mem = unsafe { crate::objects::get(obj, HandleKind::Mem) }?.mem()?;
    // Images have no size here (0): the driver computes theirs.
    (mem.size > 0).then(|| {
        let mut w = Writer::new(0);
        write_answer(
            &mut w,
            &mem.size.to_le_bytes(),
            std::mem::size_of::<usize>(),
        );
        w.body().to_vec()
    })
}

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
    let bytes = r.bytes()?;
    let reported = r.usize()?;
    if !value.is_null() && cap < reported {
        return Err(ClErr(CL_INVALID_VALUE));
    }
    if !value.is_null() {
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
                // Only USE_HOST_PTR makes the application's pointer the object's host pointer
                // (COPY_HOST_PTR only reads it once): otherwise NULL, as natively.
                let host = unsafe { crate::objects::get(obj, HandleKind::Mem) }
                    .and_then(|o| o.mem())
                    .filter(|m| m.flags & CL_MEM_USE_HOST_PTR != 0)
                    .map_or(0, |m| m.host_ptr);
                let b = (host as u64).to_le_bytes();
                // SAFETY: cap >= the reported 8 bytes (checked above).
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
                if (op, param) == (Op::clGetEventInfo, CL_EVENT_REFERENCE_COUNT) && v.len() == 4 {
                    // Without the references its pending callbacks hold (custom/events.rs).
                    let holds = crate::custom::callback_holds(obj);
                    let n = u32::from_le_bytes(v[..4].try_into().unwrap_or([0; 4]));
                    v.copy_from_slice(&n.saturating_sub(holds).to_le_bytes());
                }
                let n = v.len().min(cap);
                // SAFETY: n <= cap.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), value as *mut u8, n) };
            }
        }
    }
    if !size_ret.is_null() {
        // SAFETY: per the contract.
        unsafe { *size_ret = reported };
    }
    Ok(())
}
