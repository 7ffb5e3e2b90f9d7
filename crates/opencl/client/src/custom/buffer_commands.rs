//! Buffer copies and fills on the device, pipelined when they repeat what the driver accepted:
//! the same queue and buffers (so the same contexts, and sub-buffer alignments the driver
//! judged already), a range the client can check against the sizes it knows, and no wait list.
//! OpenCV copies and fills its images this way; hashcat copies between its buffers.

use super::*;
use crate::generated;
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// (opcode, queue, buffer, buffer or pattern size) the driver accepted a command for: copies
/// and fills here, non-blocking writes (`transfer`).
pub(super) type Accepted = (u16, u64, u64, u64);

fn accepted() -> std::sync::MutexGuard<'static, HashSet<Accepted>> {
    static A: OnceLock<Mutex<HashSet<Accepted>>> = OnceLock::new();
    A.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether the driver accepted a command like `key` before.
pub(super) fn was_accepted(key: Accepted) -> bool {
    accepted().contains(&key)
}

/// The driver accepted a command like `key`: repeats may be pipelined.
pub(super) fn remember_accepted(key: Accepted) {
    let mut a = accepted();
    // Objects the application released stay named here; ids are never reused.
    if a.len() >= 4096 {
        a.clear();
    }
    a.insert(key);
}

/// Runs `call`, pipelined when the command repeats an accepted one (`key`) in a range the
/// client checked and with no wait list; a new combination the driver accepts is remembered.
fn forward(
    key: Option<Accepted>,
    in_range: bool,
    n: u32,
    list: *const Handle,
    call: impl FnOnce() -> i32,
) -> i32 {
    let known = in_range && n == 0 && list.is_null() && key.is_some_and(was_accepted);
    if known {
        rt::send_next_async();
    }
    let st = call();
    if let (CL_SUCCESS, false, Some(k)) = (st, known, key) {
        remember_accepted(k);
    }
    st
}

/// A buffer the client made: its id, size, and where it lies (the buffer it is part of, and
/// its origin there). None for images and objects it knows no size of.
#[derive(Clone, Copy)]
struct Sized {
    id: u64,
    size: usize,
    root: u64,
    origin: usize,
}

/// The id of a live queue of the application's.
///
/// # Safety
/// `h` is the application's handle (NULL or anything: only looked up).
unsafe fn queue_id(h: Handle) -> Option<u64> {
    // SAFETY: per the contract.
    unsafe { objects::get(h, HandleKind::Queue) }.map(|q| q.id)
}

/// # Safety
/// `h` is the application's handle (NULL or anything: only looked up).
unsafe fn sized(h: Handle) -> Option<Sized> {
    // SAFETY: the application's handle, only looked up.
    let o = unsafe { objects::get(h, HandleKind::Mem) }?;
    let m = o.mem()?;
    let (root, origin) = m.parent.unwrap_or((o.id, 0));
    (m.size > 0).then_some(Sized {
        id: o.id,
        size: m.size,
        root,
        origin,
    })
}

fn within(offset: usize, len: usize, size: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

pub unsafe extern "C" fn clEnqueueCopyBuffer(
    queue: Handle,
    src: Handle,
    dst: Handle,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    // SAFETY: the application's handles, only looked up.
    let (q, s, d) = unsafe { (queue_id(queue), sized(src), sized(dst)) };
    let key = match (q, s, d) {
        (Some(q), Some(s), Some(d)) => Some((Op::clEnqueueCopyBuffer as u16, q, s.id, d.id)),
        _ => None,
    };
    let in_range = match (s, d) {
        (Some(s), Some(d)) => {
            // Parts of one buffer must not overlap (CL_MEM_COPY_OVERLAP).
            let (a, b) = (s.origin + src_offset, d.origin + dst_offset);
            size > 0
                && within(src_offset, size, s.size)
                && within(dst_offset, size, d.size)
                && (s.root != d.root || a + size <= b || b + size <= a)
        }
        _ => false,
    };
    // SAFETY: forwarded with the caller's guarantees.
    forward(key, in_range, n, list, || unsafe {
        generated::wire_clEnqueueCopyBuffer(
            queue, src, dst, src_offset, dst_offset, size, n, list, event,
        )
    })
}

pub unsafe extern "C" fn clEnqueueFillBuffer(
    queue: Handle,
    buffer: Handle,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    // SAFETY: the application's handles, only looked up.
    let (q, b) = unsafe { (queue_id(queue), sized(buffer)) };
    let key = match (q, b) {
        (Some(q), Some(b)) => Some((Op::clEnqueueFillBuffer as u16, q, b.id, pattern_size as u64)),
        _ => None,
    };
    // The pattern size the driver accepted before; offset and size multiples of it, in range.
    let in_range = b.is_some_and(|b| {
        !pattern.is_null()
            && pattern_size > 0
            && size > 0
            && offset.is_multiple_of(pattern_size)
            && size.is_multiple_of(pattern_size)
            && within(offset, size, b.size)
    });
    // SAFETY: forwarded with the caller's guarantees.
    forward(key, in_range, n, list, || unsafe {
        generated::wire_clEnqueueFillBuffer(
            queue,
            buffer,
            pattern,
            pattern_size,
            offset,
            size,
            n,
            list,
            event,
        )
    })
}
