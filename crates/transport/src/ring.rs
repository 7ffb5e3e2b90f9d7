//! A single-producer/single-consumer byte ring in shared memory.
//!
//! Control words live on their own 64-byte lines. `head` (bytes ever written) is stored only by
//! the producer, `tail` (bytes ever read) only by the consumer; both are 64-bit and never wrap in
//! practice. The producer publishes data with a Release store of `head`, the consumer observes
//! it with an Acquire load (and symmetrically for `tail`), so bytes are visible before the
//! counter that covers them.
//!
//! Sleeping without lost wake-ups: a sleeper stores 1 to its `*_waiting` word, issues a SeqCst
//! fence, re-checks the counter and only then sleeps on the word; a publisher stores the counter,
//! issues a SeqCst fence and then loads the word. The two fences order the pairs, so either the
//! sleeper sees the new counter or the publisher sees the flag and wakes it. A producer that
//! found the ring full sleeps until a quarter of it is free, and the consumer wakes it only
//! then (both test the same condition), so a fast producer costs one wake-up per quarter
//! ring, not one per frame.
//!
//! The peer is not trusted: a `head`/`tail` pair claiming more than `capacity` bytes in flight is
//! reported as corruption, never used to index memory.

use crate::copy::{copy_bulk, SharedBytes};
use crate::region::Region;
use crate::wait::{SpinPolicy, Waiter};
use crate::TransportError;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Line<T>(pub T);

/// The control block of one ring, 320 bytes, at the start of the ring's lane.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingCtrl {
    pub head: Line<AtomicU64>,
    pub tail: Line<AtomicU64>,
    pub consumer_waiting: Line<AtomicU32>,
    pub producer_waiting: Line<AtomicU32>,
    /// The CPU the producer's thread last sent from, plus one (0: not known). A hint only:
    /// the server keeps a local client's brief threads on the CPU it runs on (see the server's
    /// `slices`); nothing else depends on it, and a peer may write anything there.
    pub producer_cpu: Line<AtomicU32>,
}

pub const CTRL_SIZE: usize = std::mem::size_of::<RingCtrl>();

/// Bulk data moves through a ring in pieces of at most this size, each published (or freed) on
/// its own, so that the consumer copies one piece while the producer writes the next: the two
/// copies of a large transfer overlap on two cores instead of taking turns.
pub const STREAM_PIECE: u64 = 32 * 1024;

/// One ring as seen from one side. Neither `Copy` nor `Clone`: a ring of a region holds the
/// region (and so its mapping) alive, and each side owns its view of a ring exactly once.
#[derive(Debug)]
pub struct Ring {
    ctrl: *const RingCtrl,
    data: *mut u8,
    cap: u64,
    /// The mapping `ctrl` and `data` point into, kept alive as long as the ring (None for a
    /// ring over memory whose lifetime the creator vouches for, see [`Ring::new`]).
    _mapping: Option<Arc<Region>>,
}

// SAFETY: a Ring is only a view; all shared state is accessed through atomics or through byte
// ranges the SPSC protocol gives to exactly one side at a time.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// What a waiting side needs: how to sleep, how long to spin, whether the peer still lives.
pub struct WaitCtx<'a> {
    pub waiter: &'a dyn Waiter,
    pub policy: SpinPolicy,
    pub peer_alive: &'a dyn Fn() -> bool,
}

impl Ring {
    /// # Safety
    /// `ctrl` must point to a `RingCtrl` and `data` to `cap` bytes, both inside a mapping that
    /// outlives the ring and is shared with exactly one peer playing the other role. `cap` must
    /// be a power of two.
    pub unsafe fn new(ctrl: *const RingCtrl, data: *mut u8, cap: u64) -> Ring {
        debug_assert!(cap.is_power_of_two());
        Ring {
            ctrl,
            data,
            cap,
            _mapping: None,
        }
    }

    /// A ring inside `region`, which the ring keeps mapped.
    ///
    /// # Safety
    /// As [`Ring::new`], except that the mapping is `region`'s (so it lives as long as the ring).
    pub(crate) unsafe fn in_region(
        region: Arc<Region>,
        ctrl: *const RingCtrl,
        data: *mut u8,
        cap: u64,
    ) -> Ring {
        // SAFETY: forwarded from the caller.
        let ring = unsafe { Ring::new(ctrl, data, cap) };
        Ring {
            _mapping: Some(region),
            ..ring
        }
    }

    fn ctrl(&self) -> &RingCtrl {
        // SAFETY: guaranteed by `Ring::new`.
        unsafe { &*self.ctrl }
    }

    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Producer: notes the CPU the calling thread runs on (see [`RingCtrl::producer_cpu`]).
    pub fn note_producer_cpu(&self) {
        // SAFETY: sched_getcpu has no arguments; glibc answers from rseq or the vDSO.
        let cpu = unsafe { libc::sched_getcpu() };
        if let Ok(cpu) = u32::try_from(cpu) {
            self.ctrl()
                .producer_cpu
                .0
                .store(cpu.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Consumer: where what it has read ends (bytes since the ring began).
    pub fn consumed(&self) -> u64 {
        self.ctrl().tail.0.load(Ordering::Relaxed)
    }

    /// Bytes readable now (consumer side).
    pub fn readable(&self) -> Result<u64, TransportError> {
        let c = self.ctrl();
        let n = c
            .head
            .0
            .load(Ordering::Acquire)
            .wrapping_sub(c.tail.0.load(Ordering::Relaxed));
        if n > self.cap {
            return Err(TransportError::Corrupt("ring holds more than its capacity"));
        }
        Ok(n)
    }

    fn writable(&self) -> Result<u64, TransportError> {
        let c = self.ctrl();
        let used = c
            .head
            .0
            .load(Ordering::Relaxed)
            .wrapping_sub(c.tail.0.load(Ordering::Acquire));
        if used > self.cap {
            return Err(TransportError::Corrupt("ring holds more than its capacity"));
        }
        Ok(self.cap - used)
    }

    /// Producer: writes all of `data`, waiting for room as needed (frames larger than the ring
    /// stream through it while the consumer drains).
    pub fn write_all(&self, mut data: &[u8], w: &WaitCtx<'_>) -> Result<(), TransportError> {
        let c = self.ctrl();
        while !data.is_empty() {
            let free = self.writable()?;
            if free == 0 {
                // A full ring means the consumer is far behind: spinning or yielding would only
                // take the CPU it (and the driver's threads) need. Sleep until a quarter of the
                // ring is free: one wake-up per quarter ring, not one per frame consumed.
                let patient = WaitCtx {
                    policy: SpinPolicy {
                        spin: std::time::Duration::ZERO,
                        yield_until: std::time::Duration::ZERO,
                        ..w.policy
                    },
                    ..*w
                };
                wait_until(&c.producer_waiting.0, &patient, || self.has_refill_room())?;
                continue;
            }
            let n = free.min(data.len() as u64).min(STREAM_PIECE) as usize;
            let head = c.head.0.load(Ordering::Relaxed);
            let off = (head & (self.cap - 1)) as usize;
            let first = n.min(self.cap as usize - off);
            // SAFETY: [off, off+first) and [0, n-first) lie inside the data area and are free
            // space, which only the producer touches until `head` is published below (a peer
            // that writes there anyway gets its frame garbled, nothing more: `copy_bulk` makes
            // no assumption about shared memory).
            unsafe {
                copy_bulk(self.data.add(off), data.as_ptr(), first);
                copy_bulk(self.data, data.as_ptr().add(first), n - first);
            }
            c.head
                .0
                .store(head.wrapping_add(n as u64), Ordering::Release);
            wake_if_waiting(&c.consumer_waiting.0, w, || Ok(true))?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Consumer: fills all of `buf`, waiting for data as needed.
    pub fn read_exact(&self, mut buf: &mut [u8], w: &WaitCtx<'_>) -> Result<(), TransportError> {
        let c = self.ctrl();
        while !buf.is_empty() {
            let avail = self.readable()?;
            if avail == 0 {
                wait_until(&c.consumer_waiting.0, w, || Ok(self.readable()? > 0))?;
                continue;
            }
            let n = avail.min(buf.len() as u64).min(STREAM_PIECE) as usize;
            let tail = c.tail.0.load(Ordering::Relaxed);
            let off = (tail & (self.cap - 1)) as usize;
            let first = n.min(self.cap as usize - off);
            // SAFETY: [off, off+first) and [0, n-first) lie inside the data area, and `buf` has
            // room for n bytes. The bytes were published by the producer's Release store of
            // `head` (observed by the Acquire in `readable`) and stay untouched until we advance
            // `tail`; a peer that breaks that rule only garbles what we copy out (`copy_bulk`
            // reads each shared byte once, volatile).
            unsafe {
                copy_bulk(buf.as_mut_ptr(), self.data.add(off), first);
                copy_bulk(buf.as_mut_ptr().add(first), self.data, n - first);
            }
            c.tail
                .0
                .store(tail.wrapping_add(n as u64), Ordering::Release);
            self.wake_producer(w)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// Consumer: hands the next `n` bytes to `f` where they lie in the ring, piece by piece as
    /// they arrive (the producer does not touch a piece until `f` returns), freeing each piece
    /// after `f`. Saves a copy when the bytes go somewhere else anyway (bulk data into a mapped
    /// driver buffer).
    pub fn read_in_place(
        &self,
        mut n: u64,
        f: &mut dyn FnMut(SharedBytes<'_>),
        w: &WaitCtx<'_>,
    ) -> Result<(), TransportError> {
        let c = self.ctrl();
        while n > 0 {
            let avail = self.readable()?;
            if avail == 0 {
                wait_until(&c.consumer_waiting.0, w, || Ok(self.readable()? > 0))?;
                continue;
            }
            let tail = c.tail.0.load(Ordering::Relaxed);
            let off = tail & (self.cap - 1);
            let take = avail.min(n).min(self.cap - off).min(STREAM_PIECE);
            // SAFETY: [off, off+take) lies inside the data area and holds published bytes that
            // stay ours until `tail` moves past them below, after `f` let go of the loan.
            f(unsafe { SharedBytes::new(self.data.add(off as usize), take as usize) });
            c.tail.0.store(tail.wrapping_add(take), Ordering::Release);
            self.wake_producer(w)?;
            n -= take;
        }
        Ok(())
    }

    /// What a producer that found the ring full waits for: a quarter of the ring free.
    fn has_refill_room(&self) -> Result<bool, TransportError> {
        Ok(self.writable()? >= self.cap / 4)
    }

    /// Consumer, after freeing bytes: wakes a producer that sleeps on a full ring once it has
    /// the room it waits for (the same condition, checked after the same fences as any wake).
    fn wake_producer(&self, w: &WaitCtx<'_>) -> Result<(), TransportError> {
        wake_if_waiting(&self.ctrl().producer_waiting.0, w, || {
            self.has_refill_room()
        })
    }

    /// Consumer: waits until at least one byte is readable (used to block for the next request).
    pub fn wait_readable(&self, w: &WaitCtx<'_>) -> Result<(), TransportError> {
        if self.readable()? > 0 {
            return Ok(());
        }
        wait_until(&self.ctrl().consumer_waiting.0, w, || {
            Ok(self.readable()? > 0)
        })
    }
}

/// Publisher's half of the sleep protocol: after its fence, wakes a sleeper on `flag` once
/// what the sleeper waits for (`ready`, the sleeper's own condition) holds.
fn wake_if_waiting(
    flag: &AtomicU32,
    w: &WaitCtx<'_>,
    ready: impl FnOnce() -> Result<bool, TransportError>,
) -> Result<(), TransportError> {
    fence(Ordering::SeqCst);
    if flag.load(Ordering::Relaxed) != 0 && ready()? {
        flag.store(0, Ordering::Relaxed);
        w.waiter.wake(flag);
    }
    Ok(())
}

/// Polls as the policy says (`SpinPolicy::poll`), then sleeps on `flag` in slices, checking
/// the peer each time.
fn wait_until(
    flag: &AtomicU32,
    w: &WaitCtx<'_>,
    mut ready: impl FnMut() -> Result<bool, TransportError>,
) -> Result<(), TransportError> {
    if w.policy.poll(&mut ready)? {
        return Ok(());
    }
    sleep_until(flag, w, ready)
}

/// Sleeps on `flag` in slices until `ready`, checking the peer each time.
fn sleep_until(
    flag: &AtomicU32,
    w: &WaitCtx<'_>,
    mut ready: impl FnMut() -> Result<bool, TransportError>,
) -> Result<(), TransportError> {
    loop {
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if ready()? {
            flag.store(0, Ordering::Relaxed);
            return Ok(());
        }
        w.waiter.wait(flag, 1, w.policy.sleep_slice);
        flag.store(0, Ordering::Relaxed);
        if ready()? {
            return Ok(());
        }
        if !(w.peer_alive)() {
            return Err(TransportError::PeerGone);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::FutexWaiter;
    use std::time::Instant;

    struct Mem {
        ctrl: Box<RingCtrl>,
        data: Vec<u8>,
    }

    fn ring(mem: &mut Mem) -> Ring {
        let cap = mem.data.len() as u64;
        // SAFETY: both live in `mem`, which outlives the test's use of the ring.
        unsafe { Ring::new(&*mem.ctrl, mem.data.as_mut_ptr(), cap) }
    }

    #[test]
    fn streams_more_than_capacity_across_threads() {
        let mut mem = Mem {
            ctrl: Box::default(),
            data: vec![0; 64],
        };
        let r = ring(&mut mem);
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let expect = payload.clone();
        let alive = || true;
        std::thread::scope(|s| {
            s.spawn(|| {
                let w = WaitCtx {
                    waiter: &FutexWaiter,
                    policy: SpinPolicy::default(),
                    peer_alive: &alive,
                };
                r.write_all(&payload, &w).unwrap();
            });
            let w = WaitCtx {
                waiter: &FutexWaiter,
                policy: SpinPolicy::default(),
                peer_alive: &alive,
            };
            let mut got = vec![0; expect.len()];
            r.read_exact(&mut got, &w).unwrap();
            assert_eq!(got, expect);
        });
    }

    #[test]
    fn corrupt_counters_are_reported_not_followed() {
        let mut mem = Mem {
            ctrl: Box::default(),
            data: vec![0; 64],
        };
        mem.ctrl.head.0.store(1000, Ordering::Relaxed);
        let r = ring(&mut mem);
        let alive = || true;
        let w = WaitCtx {
            waiter: &FutexWaiter,
            policy: SpinPolicy::default(),
            peer_alive: &alive,
        };
        let mut b = [0u8; 4];
        assert!(matches!(
            r.read_exact(&mut b, &w),
            Err(TransportError::Corrupt(_))
        ));
    }

    #[test]
    fn a_dead_peer_ends_the_wait() {
        let mut mem = Mem {
            ctrl: Box::default(),
            data: vec![0; 64],
        };
        let r = ring(&mut mem);
        let alive = || false;
        let w = WaitCtx {
            waiter: &FutexWaiter,
            policy: SpinPolicy::default(),
            peer_alive: &alive,
        };
        let mut b = [0u8; 4];
        let t = Instant::now();
        assert!(matches!(
            r.read_exact(&mut b, &w),
            Err(TransportError::PeerGone)
        ));
        assert!(t.elapsed().as_secs() < 1);
    }
}
