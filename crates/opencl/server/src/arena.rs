//! Buffers whose storage the tenant can reach. A local session's worker owns an arena (see
//! `wormhole_transport::arena`) that its client maps too. Large buffers of a device that
//! computes on host memory in place (a CPU device; checked by experiment, not assumed) are
//! created over arena pages (`CL_MEM_USE_HOST_PTR`), and the client learns where. A blocking
//! read or write of such a buffer then needs only a `DIRECT` request, which waits for what the
//! native call waits for, after which the client copies the bytes itself: one copy and no
//! driver command, where the ring costs two copies plus a map and an unmap.
//!
//! The application never sees the difference: the flags it reads back are the ones it asked
//! for, and every other path (kernels, maps, copies) goes through the driver as before.

use crate::generated::ffi;
use crate::session::{Handle, Session};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use wormhole_opencl_proto::requests::{Direct, Message, WAIT_ALL};
use wormhole_opencl_proto::{cl::*, DecodeError, HandleKind, Reader, Writer};
use wormhole_transport::{Arena, ArenaSpace};

/// Smaller buffers keep ordinary driver storage: arena space is handed out in whole pages.
pub const WINDOW_MIN: usize = 4096;

pub use wormhole_opencl_proto::requests::{DIRECT_DECLINED, NO_WINDOW};

/// Bytes of buffer storage in the arena now, and DIRECT requests granted so far (`wh status`).
pub static SHARED_BYTES: AtomicU64 = AtomicU64::new(0);
pub static DIRECT_TRANSFERS: AtomicU64 = AtomicU64::new(0);

const PAGE: u64 = ArenaSpace::PAGE;
const HOST_PTR_FLAGS: u64 = CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;

struct Shared {
    arena: Arena,
    /// Which of its pages are free.
    space: ArenaSpace,
    /// Live windowed buffers: driver handle -> the flags the application asked for.
    windows: Mutex<HashMap<usize, u64>>,
    /// Per device: whether it computes on host memory in place.
    in_place: Mutex<HashMap<usize, bool>>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Gives this session an arena (local sessions only; call once, before serving).
pub fn enable(arena: Arena) {
    let _ = SHARED.set(Shared::new(arena));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn new(arena: Arena) -> Shared {
        Shared {
            space: ArenaSpace::new(arena.len()),
            arena,
            windows: Mutex::default(),
            in_place: Mutex::default(),
        }
    }

    fn alloc(&self, size: usize) -> Option<u64> {
        self.space.alloc(size as u64)
    }

    fn release(&self, off: u64, size: usize) {
        self.arena.discard(off, ArenaSpace::pages_for(size as u64));
        self.space.release(off, size as u64);
    }

    /// Whether every device of `context` computes on host memory in place.
    fn in_place(&self, context: Handle) -> bool {
        if crate::staging::every_device_discrete() {
            return false;
        }
        let Some(devices) = context_devices(context) else {
            return false;
        };
        !devices.is_empty()
            && devices.iter().all(|&d| {
                if let Some(&known) = lock(&self.in_place).get(&(d as usize)) {
                    return known;
                }
                let ok = self.probe(context, d);
                tracing::debug!(device = ?d, in_place = ok, "probed device buffer storage");
                lock(&self.in_place).insert(d as usize, ok);
                ok
            })
    }

    /// The experiment: a buffer over an arena page must show bytes written to the page behind
    /// the driver's back, and its driver writes must land in the page, with no map between.
    fn probe(&self, context: Handle, device: Handle) -> bool {
        let Some(off) = self.alloc(PAGE as usize) else {
            return false;
        };
        let Some(p) = self.arena.range(off, PAGE) else {
            return false;
        };
        let n = PAGE as usize;
        let mut ok = false;
        // SAFETY: `p` is a page of the arena that nothing else uses until it is released below;
        // the driver calls get live handles and buffers of the right sizes.
        unsafe {
            std::ptr::write_bytes(p, 0xA5, n);
            let mut err = CL_SUCCESS;
            let mem = ffi::clCreateBuffer(
                context,
                CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                n,
                p as *mut c_void,
                &mut err,
            );
            let queue = if err == CL_SUCCESS {
                ffi::clCreateCommandQueueWithProperties(
                    context,
                    device,
                    std::ptr::null_mut(),
                    &mut err,
                )
            } else {
                std::ptr::null_mut()
            };
            if err == CL_SUCCESS {
                std::ptr::write_bytes(p, 0x5A, n);
                let mut seen = vec![0u8; n];
                let read = ffi::clEnqueueReadBuffer(
                    queue,
                    mem,
                    CL_TRUE,
                    0,
                    n,
                    seen.as_mut_ptr() as *mut c_void,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
                let fill = vec![0x3Cu8; n];
                let written = read == CL_SUCCESS
                    && seen.iter().all(|&b| b == 0x5A)
                    && ffi::clEnqueueWriteBuffer(
                        queue,
                        mem,
                        CL_TRUE,
                        0,
                        n,
                        fill.as_ptr() as *mut c_void,
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    ) == CL_SUCCESS;
                ok = written && std::slice::from_raw_parts(p, n).iter().all(|&b| b == 0x3C);
                ffi::clFinish(queue);
            }
            if !queue.is_null() {
                ffi::clReleaseCommandQueue(queue);
            }
            if !mem.is_null() {
                ffi::clReleaseMemObject(mem);
            }
        }
        // The probe buffer's page goes back only when the driver has let go of it.
        self.release(off, n);
        ok
    }
}

pub(crate) fn context_devices(context: Handle) -> Option<Vec<Handle>> {
    let mut size = 0usize;
    // SAFETY: size query, then a buffer of that size.
    unsafe {
        if ffi::clGetContextInfo(
            context,
            CL_CONTEXT_DEVICES,
            0,
            std::ptr::null_mut(),
            &mut size,
        ) != CL_SUCCESS
        {
            return None;
        }
        let mut v: Vec<Handle> = vec![std::ptr::null_mut(); size / std::mem::size_of::<Handle>()];
        if ffi::clGetContextInfo(
            context,
            CL_CONTEXT_DEVICES,
            size,
            v.as_mut_ptr() as *mut c_void,
            std::ptr::null_mut(),
        ) != CL_SUCCESS
        {
            return None;
        }
        Some(v)
    }
}

/// Arena storage reserved for a buffer being created; given back unless bound to the buffer.
pub struct Placement {
    off: u64,
    size: usize,
    ptr: *mut u8,
    /// The flags the application asked for.
    asked: u64,
}

impl Placement {
    /// Storage for a new buffer, if this session has an arena, the buffer qualifies (large, no
    /// host memory of the application's own) and its context's devices compute in place.
    /// `data` is the content of a COPY_HOST_PTR buffer, copied in here.
    pub fn new(
        context: Handle,
        flags: u64,
        size: usize,
        nonnull: bool,
        data: Option<&[u8]>,
    ) -> Option<Placement> {
        let shared = SHARED.get()?;
        let qualifies = size >= WINDOW_MIN
            && flags & CL_MEM_USE_HOST_PTR == 0
            && if flags & CL_MEM_COPY_HOST_PTR != 0 {
                data.is_some_and(|d| d.len() == size)
            } else {
                !nonnull
            };
        if !qualifies || !shared.in_place(context) {
            return None;
        }
        let off = shared.alloc(size)?;
        let ptr = shared.arena.range(off, size as u64)?;
        if let Some(d) = data.filter(|_| flags & CL_MEM_COPY_HOST_PTR != 0) {
            // SAFETY: the range holds `size` bytes, d.len() == size.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), ptr, size) };
        }
        Some(Placement {
            off,
            size,
            ptr,
            asked: flags,
        })
    }

    /// The flags and host pointer to create the buffer with.
    pub fn driver_args(&self) -> (u64, *mut c_void) {
        (
            (self.asked & !HOST_PTR_FLAGS) | CL_MEM_USE_HOST_PTR,
            self.ptr as *mut c_void,
        )
    }

    /// The buffer exists: its storage stays until the driver destroys it. Returns the offset
    /// the client is told.
    pub fn bind(self, mem: Handle) -> u64 {
        let (off, size, asked) = (self.off, self.size, self.asked);
        std::mem::forget(self);
        if let Some(shared) = SHARED.get() {
            let key = mem as usize;
            lock(&shared.windows).insert(key, asked);
            SHARED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
            crate::callbacks::on_mem_destroyed(mem, move || {
                lock(&shared.windows).remove(&key);
                SHARED_BYTES.fetch_sub(size as u64, Ordering::Relaxed);
                shared.release(off, size);
            });
        }
        off
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Some(shared) = SHARED.get() {
            shared.release(self.off, self.size);
        }
    }
}

/// Where `[ptr, ptr + len)` lies in the arena, if it does (a mapping of a windowed buffer:
/// for CL_MEM_USE_HOST_PTR the driver must map at the host pointer itself).
pub fn offset_of(ptr: *mut c_void, len: usize) -> Option<u64> {
    let shared = SHARED.get()?;
    let base = shared.arena.range(0, 0)? as usize;
    let off = (ptr as usize).checked_sub(base)? as u64;
    shared.arena.range(off, len as u64).map(|_| off)
}

/// CL_MEM_FLAGS as the application must see them: a windowed buffer (or a sub-buffer of one)
/// reports the host-pointer flags the application asked for, not the ones the driver got.
pub fn visible_flags(mem: Handle, flags: u64) -> u64 {
    let Some(shared) = SHARED.get() else {
        return flags;
    };
    let asked = |m: Handle| lock(&shared.windows).get(&(m as usize)).copied();
    let found = asked(mem).or_else(|| {
        let mut parent: Handle = std::ptr::null_mut();
        // SAFETY: `mem` is live (its info was just read); the output is a local handle.
        let st = unsafe {
            ffi::clGetMemObjectInfo(
                mem,
                CL_MEM_ASSOCIATED_MEMOBJECT,
                std::mem::size_of::<Handle>(),
                &mut parent as *mut Handle as *mut c_void,
                std::ptr::null_mut(),
            )
        };
        (st == CL_SUCCESS && !parent.is_null())
            .then(|| asked(parent))
            .flatten()
    });
    match found {
        Some(asked) => (flags & !HOST_PTR_FLAGS) | (asked & HOST_PTR_FLAGS),
        None => flags,
    }
}

/// `DIRECT` (queue, mem, wait): the client is about to copy a windowed buffer's bytes itself,
/// for a read or write without a wait list or event. Waits as a blocking call would (an
/// in-order queue: for every command before it), then answers CL_SUCCESS; a non-blocking
/// call's wait is bounded (`Direct::wait_ns`), so that one behind a busy queue is queued as
/// natively. Anything unusual answers DIRECT_DECLINED and the client takes the ordinary path.
pub fn direct(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let Direct {
        queue,
        mem,
        wait_ns,
    } = Direct::decode(r)?;
    r.finish()?;
    let ready = (|| -> Option<()> {
        let shared = SHARED.get()?;
        let q = s.resolve(queue, HandleKind::Queue, false).ok()?;
        let m = s.resolve(mem, HandleKind::Mem, false).ok()?;
        if q.is_null() || !lock(&shared.windows).contains_key(&(m as usize)) {
            return None;
        }
        let (mut qctx, mut mctx): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
        let hsize = std::mem::size_of::<Handle>();
        // SAFETY: live handles from the session's table; outputs are locals of the right size.
        let ok = unsafe {
            ffi::clGetCommandQueueInfo(
                q,
                CL_QUEUE_CONTEXT,
                hsize,
                &mut qctx as *mut Handle as *mut c_void,
                std::ptr::null_mut(),
            ) == CL_SUCCESS
                && ffi::clGetMemObjectInfo(
                    m,
                    CL_MEM_CONTEXT,
                    hsize,
                    &mut mctx as *mut Handle as *mut c_void,
                    std::ptr::null_mut(),
                ) == CL_SUCCESS
        };
        if !ok || qctx != mctx {
            return None;
        }
        // Out of order, a transfer with no wait list waits for nothing.
        if crate::rt::queue_in_order(q)? {
            // Read first: an enqueue from here on makes the answer stale.
            let enqueues = s.enqueues.load(Ordering::Acquire);
            let done = s.queue_known_idle(queue)
                || match wait_ns {
                    // SAFETY: live queue.
                    WAIT_ALL => (unsafe { ffi::clFinish(q) }) == CL_SUCCESS,
                    0 => false,
                    ns => finished_within(q, std::time::Duration::from_nanos(ns)),
                };
            if !done {
                return None;
            }
            s.queue_idle(queue, enqueues);
        }
        Some(())
    })();
    w.i32(if ready.is_some() {
        DIRECT_TRANSFERS.fetch_add(1, Ordering::Relaxed);
        CL_SUCCESS
    } else {
        DIRECT_DECLINED
    });
    Ok(())
}

/// Whether every command enqueued on in-order queue `q` so far finishes within `budget`: a
/// marker behind them, polled (a non-blocking transfer must not hold the application longer).
fn finished_within(q: Handle, budget: std::time::Duration) -> bool {
    let mut marker: Handle = std::ptr::null_mut();
    // SAFETY: live queue; the event goes to a local.
    if unsafe { ffi::clEnqueueMarkerWithWaitList(q, 0, std::ptr::null(), &mut marker) }
        != CL_SUCCESS
        || marker.is_null()
    {
        return false;
    }
    // SAFETY: live queue.
    unsafe { ffi::clFlush(q) };
    let deadline = std::time::Instant::now() + budget;
    let done = loop {
        let mut status: i32 = CL_SUBMITTED;
        // SAFETY: a live event; the status goes to a local of its size.
        let st = unsafe {
            ffi::clGetEventInfo(
                marker,
                CL_EVENT_COMMAND_EXECUTION_STATUS,
                4,
                &mut status as *mut i32 as *mut c_void,
                std::ptr::null_mut(),
            )
        };
        if st != CL_SUCCESS || status < 0 {
            break false;
        }
        if status == CL_COMPLETE {
            break true;
        }
        if std::time::Instant::now() >= deadline {
            break false;
        }
        std::thread::yield_now();
    };
    // SAFETY: created above, released once.
    unsafe { ffi::clReleaseEvent(marker) };
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_pages_reused_and_merged_back() {
        let s = Shared::new(Arena::create(16 * PAGE).unwrap());
        let a = s.alloc(1).unwrap();
        let b = s.alloc(PAGE as usize + 1).unwrap();
        let c = s.alloc(4 * PAGE as usize).unwrap();
        assert_eq!((a, b, c), (0, PAGE, 3 * PAGE));
        assert!(s.alloc(10 * PAGE as usize).is_none());
        s.release(b, PAGE as usize + 1);
        s.release(a, 1);
        assert_eq!(s.space.free_ranges()[0], (0, 3 * PAGE));
        s.release(c, 4 * PAGE as usize);
        assert_eq!(s.space.free_ranges().len(), 1);
        assert_eq!(s.alloc(16 * PAGE as usize), Some(0));
    }
}
