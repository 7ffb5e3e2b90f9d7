//! Page-locked host memory in the session's arena (`wormhole_cuda_proto::pinned`). A local
//! session's arena is memory the client maps too, at the same address when it can (see
//! `wormhole_transport::arena`). `cuMemHostAlloc` in the client takes a range of it from here,
//! which the worker registers with its driver (`cuMemHostRegister`, portable and mapped), so:
//! - copies between it and the device are the driver's own DMA, no byte through the rings;
//! - asynchronous copies are queued on their stream and complete when it does, as natively
//!   (a device-to-host copy lands in the program's memory without a reply carrying it); those
//!   the client stages from the program's pageable memory are answered once complete;
//! - under unified addressing the device reaches it at its host address, which is the
//!   program's address too when both sides mapped the arena at one place.
//!
//! The program can write the range at any time; the worker only hands it to the driver.

use crate::generated::ffi;
use crate::session::Call;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    Message, PinnedAlloc, PinnedAllocated, PinnedCopy, PinnedFree, Signal, SignalWords,
};
use wormhole_cuda_proto::{pinned, DecodeError, HandleKind, Reader, Writer};
use wormhole_transport::{Arena, ArenaSpace};

/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`: every context may use the
/// range, and the device reaches it (what `cuMemHostAlloc` memory is under unified addressing
/// whatever its flags).
const REGISTER_FLAGS: u32 = 0x1 | 0x2;
/// `CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP | _WRITECOMBINED`.
const ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;

pub struct Pinned {
    arena: Arena,
    space: ArenaSpace,
    state: Mutex<State>,
}

/// Live ranges: offset → bytes (whole pages). Their sum is the tenant's page-locked host
/// memory in this session, reserved against its memory quota (an account of its own, apart
/// from device memory, shared by all the tenant's sessions).
#[derive(Default)]
struct State {
    live: BTreeMap<u64, u64>,
}

static PINNED: OnceLock<Pinned> = OnceLock::new();

/// Gives this session's page-locked memory its arena (local sessions; once, before serving).
pub fn enable(arena: Arena) {
    let _ = PINNED.set(Pinned::new(arena));
}

/// Handles `opcode` if it is one of `wormhole_cuda_proto::pinned`'s (None: it is not).
pub fn handle(
    s: &Call<'_>,
    opcode: u16,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Option<Result<(), DecodeError>> {
    if matches!(opcode, pinned::FENCE | pinned::FENCE_SYNC) {
        // Everything before it on the lane is done once it runs: nothing else to do.
        return Some(r.finish().map(|()| w.i32(CUDA_SUCCESS)));
    }
    if !matches!(
        opcode,
        pinned::ALLOC | pinned::FREE | pinned::COPY | pinned::PIECE
    ) {
        return None;
    }
    let Some(p) = PINNED.get() else {
        tracing::warn!("page-locked memory request in a session without an arena");
        w.i32(CUDA_ERROR_NOT_SUPPORTED);
        return Some(Ok(()));
    };
    Some(p.handle(s, opcode, r, w))
}

impl Pinned {
    fn new(arena: Arena) -> Pinned {
        Pinned {
            space: ArenaSpace::new(arena.len()),
            arena,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handle(
        &self,
        s: &Call<'_>,
        opcode: u16,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<(), DecodeError> {
        match opcode {
            pinned::ALLOC => {
                let reply = match self.alloc(s, PinnedAlloc::decode_rest(r)?) {
                    Ok((offset, address)) => PinnedAllocated {
                        status: CUDA_SUCCESS,
                        offset,
                        address,
                    },
                    Err(status) => PinnedAllocated {
                        status,
                        offset: 0,
                        address: 0,
                    },
                };
                reply.encode(w);
            }
            pinned::FREE => w.i32(self.free(s, PinnedFree::decode_rest(r)?)),
            _ => w.i32(self.copy_and_signal(s, &PinnedCopy::decode_rest(r)?)),
        }
        Ok(())
    }

    /// A new range of at least `m.bytes`, registered with the driver: its offset and address.
    fn alloc(&self, s: &Call<'_>, m: PinnedAlloc) -> Result<(u64, u64), i32> {
        if m.bytes == 0 || m.flags & !ALLOC_FLAGS != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if m.bytes > self.arena.len() {
            tracing::warn!(
                bytes = m.bytes,
                "page-locked memory refused: larger than the arena"
            );
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let len = ArenaSpace::pages_for(m.bytes);
        if !s.limits().reserve_host(len) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let give_back = |offset: Option<u64>| {
            if let Some(offset) = offset {
                self.space.release(offset, len);
            }
            s.limits().release_host(len);
        };
        let Some(offset) = self.space.alloc(len) else {
            tracing::warn!(bytes = len, "page-locked memory refused: the arena is full");
            give_back(None);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        let Some(ptr) = self.arena.range(offset, len) else {
            give_back(Some(offset));
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        // SAFETY: `len` bytes of the arena's mapping, which outlives the registration (it is
        // undone before the range goes back).
        let st =
            unsafe { ffi::cuMemHostRegister_v2(ptr as *mut c_void, len as usize, REGISTER_FLAGS) };
        if st != CUDA_SUCCESS {
            tracing::warn!(
                bytes = len,
                status = st,
                "the driver refused to page-lock arena memory"
            );
            give_back(Some(offset));
            return Err(st);
        }
        self.state().live.insert(offset, len);
        Ok((offset, ptr as u64))
    }

    /// Frees a range `alloc` made, once the device is done with it. A range the driver will
    /// not unregister stays the session's (its pages are still locked).
    fn free(&self, s: &Call<'_>, m: PinnedFree) -> i32 {
        let Some(len) = self.state().live.remove(&m.offset) else {
            tracing::warn!(
                offset = m.offset,
                "cuMemFreeHost of arena memory the session did not allocate"
            );
            return CUDA_ERROR_INVALID_VALUE;
        };
        // Copies queued from or to the range must finish before its pages go (the native
        // cuMemFreeHost waits for the device too).
        // SAFETY: no arguments; the lane's current context, if any.
        unsafe { ffi::cuCtxSynchronize() };
        wormhole_server::output::drain();
        if let Some(ptr) = self.arena.range(m.offset, len) {
            // SAFETY: a range registered by `alloc`.
            let st = unsafe { ffi::cuMemHostUnregister(ptr as *mut c_void) };
            // A registration ends with the context that made it (cuCtxDestroy, a primary
            // context's reset): the driver then says it is not registered, there is nothing
            // left to undo, and the range and its quota go back as after an unregister. (Any
            // other refusal may leave it registered: kept.)
            let ended = st == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
            if ended {
                tracing::info!(status = st, "page-locked memory whose context ended: freed");
            } else if st != CUDA_SUCCESS {
                tracing::warn!(status = st, "could not unregister page-locked memory: kept");
                self.state().live.insert(m.offset, len);
                return st;
            }
        }
        self.arena.discard(m.offset, len);
        self.space.release(m.offset, len);
        s.limits().release_host(len);
        CUDA_SUCCESS
    }

    /// The worker's address of `[offset, offset + len)` if it lies in one live range.
    fn host_range(&self, offset: u64, len: u64) -> Option<*mut c_void> {
        let end = offset.checked_add(len)?;
        let state = self.state();
        let (&start, &have) = state.live.range(..=offset).next_back()?;
        (end <= start + have)
            .then(|| self.arena.range(offset, len))
            .flatten()
            .map(|p| p as *mut c_void)
    }

    /// The copy's status, said in its signal's words too if it names some. A piece of a copy
    /// that already failed moves nothing (the copy's first failure is its status).
    fn copy_and_signal(&self, s: &Call<'_>, m: &PinnedCopy) -> i32 {
        let words = m.signal.and_then(|sig| self.signal_words(sig));
        if let Some(failed) = words.and_then(SignalWords::failure) {
            return failed;
        }
        let status = self.copy(s, m).err().unwrap_or(CUDA_SUCCESS);
        // The client, which sent it without waiting, reuses the piece's memory once told.
        match (m.signal, words) {
            (Some(sig), Some(w)) => w.say(sig.value, status),
            (Some(sig), None) => tracing::warn!(
                offset = sig.offset,
                "a copy's signal names no page-locked memory of the session: not written"
            ),
            (None, _) => {}
        }
        status
    }

    /// The words `signal` names, if they lie in a range of the session's, aligned.
    fn signal_words(&self, signal: Signal) -> Option<&SignalWords> {
        let p = self
            .host_range(signal.offset, 8)
            .filter(|p| (*p as usize).is_multiple_of(4))?;
        // SAFETY: 8 aligned bytes of a live range of the arena's mapping (which lives as
        // long as `self`), which the client touches only through `SignalWords` too.
        Some(unsafe { SignalWords::at(p as *const u8) })
    }

    fn copy(&self, s: &Call<'_>, m: &PinnedCopy) -> Result<(), i32> {
        let n = usize::try_from(m.len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let Some(host) = self.host_range(m.offset, m.len) else {
            tracing::warn!(
                offset = m.offset,
                len = m.len,
                "refused a copy of page-locked memory the session did not allocate"
            );
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        // A staged copy's first piece answers for the whole copy's range.
        let whole = usize::try_from(m.whole).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        crate::rt::check_device(s, m.device, Some(n.max(whole)))?;
        let stream = match m.stream {
            Some(id) => Some(s.resolve(id, HandleKind::Stream, true)?),
            None => None,
        };
        let dev = m.device;
        // SAFETY: `host` holds `n` bytes of the arena and `dev` `n` bytes of the session's
        // device memory (both checked above); the stream is one of the session's.
        let st = unsafe {
            match (m.to_device, stream, m.per_thread) {
                (true, None, false) => ffi::cuMemcpyHtoD_v2(dev, host, n),
                (true, None, true) => ffi::cuMemcpyHtoD_v2_ptds(dev, host, n),
                (true, Some(h), false) => ffi::cuMemcpyHtoDAsync_v2(dev, host, n, h),
                (true, Some(h), true) => ffi::cuMemcpyHtoDAsync_v2_ptsz(dev, host, n, h),
                (false, None, false) => ffi::cuMemcpyDtoH_v2(host, dev, n),
                (false, None, true) => ffi::cuMemcpyDtoH_v2_ptds(host, dev, n),
                (false, Some(h), false) => ffi::cuMemcpyDtoHAsync_v2(host, dev, n, h),
                (false, Some(h), true) => ffi::cuMemcpyDtoHAsync_v2_ptsz(host, dev, n, h),
            }
        };
        // An asynchronous copy to be answered once complete waits for its stream, as the
        // driver's copies of pageable memory wait for theirs (the range is reused at once).
        let st = match stream {
            Some(h) if m.complete && st == CUDA_SUCCESS => unsafe {
                // SAFETY: one of the session's streams (resolved above).
                match m.per_thread {
                    true => ffi::cuStreamSynchronize_ptsz(h),
                    false => ffi::cuStreamSynchronize(h),
                }
            },
            _ => st,
        };
        if m.stream.is_none() || m.complete {
            // A synchronous copy is a synchronisation point: what kernels printed comes first.
            wormhole_server::output::drain();
        }
        crate::rt::status(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;
    use std::sync::atomic::{AtomicU32, Ordering};

    const PAGE: u64 = ArenaSpace::PAGE;

    fn pinned_with(ranges: &[(u64, u64)]) -> Pinned {
        let p = Pinned::new(Arena::create(64 * PAGE).unwrap());
        for &(off, len) in ranges {
            assert_eq!(p.space.alloc(len), Some(off));
            p.state().live.insert(off, len);
        }
        p
    }

    fn copy(to_device: bool, device: u64, offset: u64, len: u64) -> PinnedCopy {
        PinnedCopy {
            to_device,
            device,
            offset,
            len,
            stream: None,
            per_thread: false,
            complete: false,
            signal: None,
            whole: 0,
        }
    }

    /// A copy names arena memory the session allocated, and device memory it owns, or the
    /// driver never sees it.
    #[test]
    fn copies_are_refused_outside_the_sessions_ranges() {
        let p = pinned_with(&[(0, 2 * PAGE), (2 * PAGE, PAGE)]);
        assert!(p.host_range(0, 2 * PAGE).is_some());
        assert!(p.host_range(PAGE, 10).is_some());
        assert!(p.host_range(PAGE, 2 * PAGE).is_none(), "spans two ranges");
        assert!(p.host_range(3 * PAGE, 1).is_none(), "never allocated");
        assert!(p.host_range(u64::MAX - 1, 4).is_none());
        let session = Session::default();
        let s = Call(&session);
        session.allocated(0x7000_0000, 0x1000, std::ptr::null_mut());
        assert_eq!(
            p.copy(&s, &copy(true, 0x7000_0000, 3 * PAGE, 16)),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            p.copy(&s, &copy(false, 0x7000_0800, 0, 0x1000)),
            Err(CUDA_ERROR_INVALID_VALUE),
            "device range beyond the allocation"
        );
        let mut staged = copy(true, 0x7000_0000, 0, 16);
        staged.whole = 0x1001;
        assert_eq!(
            p.copy(&s, &staged),
            Err(CUDA_ERROR_INVALID_VALUE),
            "a staged copy's first piece answers for the whole range"
        );
        let mut bad_stream = copy(true, 0x7000_0000, 0, 16);
        bad_stream.stream = Some(999);
        assert_eq!(p.copy(&s, &bad_stream), Err(CUDA_ERROR_INVALID_HANDLE));
    }

    /// A piece sent without waiting says it is done, and how, in the words it names: also
    /// when it is refused before the driver sees it (the client would wait for it otherwise);
    /// words outside the session's ranges are not written.
    #[test]
    fn a_signalled_copy_says_it_is_done_whatever_its_status() {
        let p = pinned_with(&[(0, 2 * PAGE)]);
        let session = Session::default();
        let s = Call(&session);
        let words = |off: u64| {
            let w = p.arena.range(off, 8).unwrap() as *const AtomicU32;
            // SAFETY: 8 bytes of the test's arena.
            unsafe {
                (
                    (*w).load(Ordering::Acquire),
                    (*w.add(1)).load(Ordering::Relaxed),
                )
            }
        };
        let mut m = copy(true, 0x7000_0000, 3 * PAGE, 16);
        m.signal = Some(Signal {
            offset: PAGE + 8,
            value: 5,
        });
        assert_eq!(p.copy_and_signal(&s, &m), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            words(PAGE + 8),
            (5 | pinned::SIGNAL_FAILED, CUDA_ERROR_INVALID_VALUE as u32)
        );
        // A later piece does not say "done" over the failure.
        m.signal = Some(Signal {
            offset: PAGE + 8,
            value: 6,
        });
        m.offset = 0;
        p.copy_and_signal(&s, &m);
        assert_eq!(
            words(PAGE + 8),
            (5 | pinned::SIGNAL_FAILED, CUDA_ERROR_INVALID_VALUE as u32)
        );
        m.signal = Some(Signal {
            offset: 2 * PAGE - 4,
            value: 6,
        });
        m.offset = 0;
        p.copy_and_signal(&s, &m);
        assert_eq!(
            words(2 * PAGE - 8).0,
            0,
            "spans the range's end: not written"
        );
    }

    #[test]
    fn frees_name_a_live_range_and_keep_what_the_driver_keeps() {
        let p = pinned_with(&[(0, PAGE)]);
        let session = Session::default();
        let s = Call(&session);
        assert_eq!(
            p.free(&s, PinnedFree { offset: PAGE }),
            CUDA_ERROR_INVALID_VALUE
        );
        // Without a driver the unregistration fails: the range stays the session's.
        assert_eq!(
            p.free(&s, PinnedFree { offset: 0 }),
            CUDA_ERROR_NOT_SUPPORTED
        );
        assert!(p.host_range(0, PAGE).is_some());
        assert_eq!(p.space.free_ranges(), vec![(PAGE, 63 * PAGE)]);
    }

    #[test]
    fn allocations_are_checked_and_bounded_by_the_tenants_quota() {
        let p = pinned_with(&[]);
        let ledger = wormhole_server::quota::Ledger::create().unwrap();
        // Another session of the tenant already holds 2 pages.
        assert!(ledger.reserve_of(wormhole_server::quota::Kind::Host, 9, 2 * PAGE, None));
        let session = Session::default();
        session.set_limits(std::sync::Arc::new(wormhole_server::worker::Limits {
            ledger: Some(ledger),
            mem_quota: Some(4 * PAGE),
            ..Default::default()
        }));
        let s = Call(&session);
        let alloc = |bytes, flags| p.alloc(&s, PinnedAlloc { bytes, flags });
        assert_eq!(alloc(0, 0), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(alloc(PAGE, 0x8), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(alloc(u64::MAX, 0), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(alloc(2 * PAGE + 1, 0), Err(CUDA_ERROR_OUT_OF_MEMORY));
        // Within the quota the driver decides (here there is none): the range and the
        // reservation go back.
        assert_eq!(alloc(2 * PAGE, 0x2), Err(CUDA_ERROR_NOT_SUPPORTED));
        assert_eq!(p.space.free_ranges(), vec![(0, 64 * PAGE)]);
        assert!(p.state().live.is_empty());
        let tenant = s.limits().ledger.as_ref().unwrap();
        assert_eq!(
            tenant.total_of(wormhole_server::quota::Kind::Host),
            2 * PAGE as i64
        );
    }
}
