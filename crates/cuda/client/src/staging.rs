//! Copies between the device and pageable host memory, staged through page-locked memory in
//! the session's arena (local sessions): the client copies each piece between the program's
//! memory and the staging range, and the worker's driver copies between that range and the
//! device by DMA, as a copy of the program's own page-locked memory is made
//! (`copies::through_arena`). Through the rings a piece was read into a new vector, copied
//! into the request, carried into the worker's buffer and handed to the driver as pageable
//! memory: on the H200, 0.38 GB/s for 16 MiB to the device against 11.4 natively.
//!
//! Asynchronous copies are staged too, each piece answered once its stream has done it (the
//! range is reused for the next): the driver's own asynchronous copies of pageable memory
//! wait as long (to the device, for the stream's earlier work and the bytes to be out of the
//! program's memory; from it, for the copy to complete). Not once the program has begun a
//! stream capture: a captured copy is the graph's to make, at launch.
//!
//! One staging range serves the session, taken by one copy at a time: a copy that finds it
//! taken (another thread's), or a session without an arena or without the range (the worker
//! refused it: the tenant's quota, a full arena), travels through the rings as before. The
//! range counts against the tenant's page-locked memory like the program's own; the program's
//! comes first (`give_back`).

use crate::host_memory_pinned;
use crate::rt;
use std::ffi::c_void;
use std::sync::Mutex;
use wormhole_cuda_proto::cu::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use wormhole_cuda_proto::requests::{Message, PinnedCopy, PinnedFree};
use wormhole_cuda_proto::{pinned, HandleKind, Writer};
use wormhole_session::host_memory;

/// The staging range's size: the largest piece (DMA reaches most of its speed from 1 MiB).
const STAGING: usize = 4 << 20;
/// Copies smaller than this travel through the rings: a copy to the device there is not
/// waited for, which costs less than a round trip.
pub const STAGED_FROM: usize = 256 << 10;

enum Range {
    /// Not asked for yet.
    Unasked,
    /// The worker refused it (or the session has no arena): the rings carry every copy.
    Refused,
    /// The program's address of the range, and its offset in the arena.
    Held { host: usize, offset: u64 },
}

static RANGE: Mutex<Range> = Mutex::new(Range::Unasked);

/// The copy of `n` bytes between device address `device` and the program's pageable memory
/// at `host` (`to_device`: from the host), on `stream` (None: the synchronous entry point;
/// `per_thread`: its NULL stream is the thread's), staged; None when it cannot be (see the
/// module's comment): the caller sends it through the rings.
///
/// # Safety
/// `host` points to `n` bytes of the program's that the caller may read (`to_device`) or
/// write.
pub unsafe fn copy(
    to_device: bool,
    device: u64,
    host: *mut u8,
    n: usize,
    stream: Option<*mut c_void>,
    per_thread: bool,
) -> Option<i32> {
    // In a fork's child the range is the parent's memory still: never written there (the
    // rings' path then fails the call, as every call of a child fails).
    if n < STAGED_FROM
        || (stream.is_some() && crate::capture::ever_begun())
        || !crate::connection::get().is_ok_and(|c| c.usable())
    {
        return None;
    }
    let stream = match stream {
        // SAFETY: `id_of` dereferences only registered objects.
        Some(h) => match unsafe { rt::id_of(h, HandleKind::Stream, true) } {
            Ok(id) => Some(id),
            Err(e) => return Some(e.0),
        },
        None => None,
    };
    let Ok(mut range) = RANGE.try_lock() else {
        return None;
    };
    if matches!(*range, Range::Unasked) {
        *range = take_range();
    }
    // Unasked still: not now (see `take_range`).
    let Range::Held {
        host: staging,
        offset,
    } = *range
    else {
        return None;
    };
    // A range the program does not have is refused, as the rings' path refuses it (never a
    // fault in the program's process). Reading one byte a page says it is mapped.
    if !host_memory::readable(host, n) {
        crate::connection::log(&format!(
            "{n} bytes at {host:?} are not the program's memory: answering CUDA_ERROR_INVALID_VALUE"
        ));
        return Some(CUDA_ERROR_INVALID_VALUE);
    }
    let staging = staging as *mut u8;
    let mut at = 0;
    while at < n {
        let len = STAGING.min(n - at);
        if to_device {
            // SAFETY: `host` holds `n` bytes (the contract), the staging range STAGING bytes;
            // they do not overlap (the range is the worker's, never the program's).
            unsafe { std::ptr::copy_nonoverlapping(host.add(at), staging, len) };
        }
        let status = rt::entry_status(|| {
            crate::copies::arena_copy(PinnedCopy {
                to_device,
                device: device.wrapping_add(at as u64),
                offset,
                len: len as u64,
                stream,
                per_thread,
                complete: true,
            })
        });
        if status != CUDA_SUCCESS {
            return Some(status);
        }
        if !to_device {
            // SAFETY: as above, the other way.
            unsafe { std::ptr::copy_nonoverlapping(staging, host.add(at), len) };
        }
        at += len;
    }
    Some(CUDA_SUCCESS)
}

/// Asks the worker for the staging range. A session without an arena, or one whose tenant
/// or arena has no room, goes without for good; another refusal (the calling thread has no
/// context for the worker to register the range in) is asked again at the next copy.
fn take_range() -> Range {
    let Some(arena) = host_memory_pinned::session_arena() else {
        return Range::Refused;
    };
    match host_memory_pinned::alloc_in_arena(arena, STAGING, 0) {
        Ok((host, in_arena)) => Range::Held {
            host: host as usize,
            offset: in_arena.offset,
        },
        // No context current on the calling thread for the worker to register it in.
        Err(e) if e.0 == CUDA_ERROR_INVALID_CONTEXT => Range::Unasked,
        Err(e) => {
            crate::connection::log(&format!(
                "no page-locked staging memory (status {}): copies of pageable memory go through the rings",
                e.0
            ));
            Range::Refused
        }
    }
}

/// Gives the staging range back to the worker, if the session holds it, so that its room
/// (the tenant's quota of page-locked memory, the arena) is the program's: true if it did.
/// Later copies go through the rings. `cuMemHostAlloc` calls this when refused for want of
/// room, then asks again.
pub fn give_back() -> bool {
    // A copy holding the range is running: the program's allocation fails as it would have.
    let Ok(mut range) = RANGE.try_lock() else {
        return false;
    };
    let Range::Held { offset, .. } = *range else {
        return false;
    };
    *range = Range::Refused;
    let mut w = Writer::new(pinned::FREE);
    PinnedFree { offset }.encode(&mut w);
    rt::call(w).and_then(|reply| rt::status_of(&reply)).is_ok()
}
