//! Copies between the device and pageable host memory, staged through page-locked memory in
//! the session's arena (local sessions): the client copies each piece between the program's
//! memory and the staging range, and the worker's driver copies between that range and the
//! device by DMA, as a copy of the program's own page-locked memory is made
//! (`copies::through_arena`). Through the rings a piece was read into a new vector, copied
//! into the request, carried into the worker's buffer and handed to the driver as pageable
//! memory: on the H200, 0.38 GB/s for 16 MiB to the device against 11.4 natively.
//!
//! A copy moves in pieces of up to 4 MiB (1 MiB where the tenant's page-locked quota or the
//! arena has no room for two of 4) through two slots in turn, each piece sent without
//! waiting (`pinned::PIECE`): while the device copies one, the client copies the next into
//! (or the previous out of) the other slot. The worker says each piece's end and status in
//! words of the range, which the client looks at before it reuses a slot (or, after 2 ms,
//! asks the worker with a fence instead). A fence ends the copy; for a copy to the host it
//! is a synchronisation point, as the native copy is. A piece's failure is its copy's alone
//! (the first one stays said), and no other thread's request waits for the pieces: they are
//! part of a call their thread waits for.
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
use crate::rt::{self, ApiErr};
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::Duration;
use wormhole_cuda_proto::cu::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use wormhole_cuda_proto::requests::{Message, PinnedCopy, PinnedFree, Signal, SignalWords};
use wormhole_cuda_proto::{pinned, HandleKind, Writer};
use wormhole_session::host_memory;
use wormhole_transport::SpinPolicy;

/// The sizes of a slot of the staging range, the largest piece, tried in turn: where the
/// tenant's page-locked quota or the arena has no room for the first, the second (DMA
/// reaches most of its speed from 1 MiB).
const SLOT_SIZES: [usize; 2] = [4 << 20, 1 << 20];
/// Slots a copy takes turns in: while the device copies one piece, the client copies the other.
const SLOTS: usize = 2;
// With two slots the piece that fails is always the last one sent, so no stale piece is left
// queued when a copy ends on a failure; more slots would need a fence on every failed end.
const _: () = assert!(SLOTS == 2);
/// After the slots, a page whose first words the worker signals pieces' ends in.
const SIGNAL_PAGE: usize = 4096;
/// How a copy looks for a piece's end before it asks the worker instead: a piece's DMA takes
/// about 0.1 ms on an H100, and the client's own copy of the other piece longer, so the end
/// is usually said already; a copy on a stream waits for the stream's earlier work too.
const LOOK: SpinPolicy = SpinPolicy {
    spin: Duration::from_micros(20),
    yield_until: Duration::from_millis(2),
    sleep_slice: Duration::from_millis(50),
};
/// Copies smaller than this travel through the rings: a copy to the device there is not
/// waited for, which costs less than a round trip.
pub const STAGED_FROM: usize = 256 << 10;

enum Range {
    /// Not asked for yet.
    Unasked,
    /// The worker refused it (or the session has no arena): the rings carry every copy.
    Refused,
    /// The program's address of the range, its offset in the arena, and its slots' size.
    Held {
        host: usize,
        offset: u64,
        slot: usize,
    },
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
        slot,
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
    let staged = Staged {
        host: staging as *mut u8,
        offset,
        slot,
        stream,
        per_thread,
        worker: Session,
    };
    // SAFETY: `host` holds `n` bytes the copy may read or write (the contract).
    Some(rt::entry_status(|| unsafe {
        match to_device {
            true => staged.copy_in(device, host, n),
            false => staged.copy_out(device, host, n),
        }
    }))
}

/// A copy through the held staging range: its pieces go without waiting, each in a slot the
/// previous piece in it has left, so that the client's copy of one piece and the device's
/// of the other overlap; the worker says each piece's end in the range's signal words, and a
/// fence ends the copy with its status (for a copy to the host a synchronisation point, as
/// the native copy is).
struct Staged<W: Worker> {
    host: *mut u8,
    offset: u64,
    /// A slot's size: the largest piece.
    slot: usize,
    stream: Option<u64>,
    per_thread: bool,
    worker: W,
}

/// What a staged copy asks of the worker.
trait Worker {
    /// Sends a piece without waiting (`pinned::PIECE`: its failure is said in its signal).
    fn send(&self, copy: PinnedCopy) -> Result<(), ApiErr>;
    /// Returns once the worker has done everything this thread sent before; where
    /// `synchronising`, with the status of what it did that nobody waited for (a
    /// synchronisation point, as a copy to the host is).
    fn fence(&self, synchronising: bool) -> Result<(), ApiErr>;
}

/// The session's worker, through this thread's lane.
struct Session;

impl Worker for Session {
    fn send(&self, copy: PinnedCopy) -> Result<(), ApiErr> {
        let mut w = Writer::new(pinned::PIECE);
        copy.encode(&mut w);
        rt::call_async(w).map(|_| ())
    }

    fn fence(&self, synchronising: bool) -> Result<(), ApiErr> {
        let op = match synchronising {
            true => pinned::FENCE_SYNC,
            false => pinned::FENCE,
        };
        rt::status_of(&rt::call(Writer::new(op))?)
    }
}

impl<W: Worker> Staged<W> {
    /// Where piece `piece` goes: the program's address of its slot, and the slot's offset.
    fn slot_of(&self, piece: usize) -> (*mut u8, u64) {
        let at = (piece % SLOTS) * self.slot;
        (self.host.wrapping_add(at), self.offset + at as u64)
    }

    /// The words the worker says each piece's end in: at the start of the page after the
    /// slots (their offset in the range).
    fn signal_at(&self) -> usize {
        SLOTS * self.slot
    }

    fn words(&self) -> &SignalWords {
        // SAFETY: the range's last page holds them, aligned, for as long as it is held;
        // the worker touches them only through `SignalWords` too.
        unsafe { SignalWords::at(self.host.wrapping_add(self.signal_at())) }
    }

    /// Where piece `piece` of a copy of `n` bytes lies in it, and how long it is.
    fn piece(&self, piece: usize, n: usize) -> (usize, usize) {
        let at = piece * self.slot;
        (at, self.slot.min(n - at))
    }

    /// Sends piece `piece` (`len` bytes at `device`; the first piece names the whole copy's
    /// `total`) without waiting; its end is signalled. If it cannot be sent (the session is
    /// gone), the pieces before it are waited for: no late signal for the next copy.
    fn send(
        &self,
        to_device: bool,
        piece: usize,
        device: u64,
        len: usize,
        total: usize,
    ) -> Result<(), ApiErr> {
        let copy = PinnedCopy {
            to_device,
            device,
            offset: self.slot_of(piece).1,
            len: len as u64,
            stream: self.stream,
            per_thread: self.per_thread,
            complete: self.stream.is_some(),
            signal: Some(Signal {
                offset: self.offset + self.signal_at() as u64,
                value: piece as u32 + 1,
            }),
            whole: if piece == 0 { total as u64 } else { 0 },
        };
        self.worker.send(copy).inspect_err(|_| {
            let _ = self.worker.fence(false);
        })
    }

    /// Returns once piece `piece` is done: looks at the signal for a while, then asks the
    /// worker (a fence sleeps as any call does: a slow stream, a worker gone). A failed
    /// piece (its own or an earlier one's) ends the copy: once nothing sent is left in the
    /// worker (no late signal for the next copy), with the first failure's status.
    fn done(&self, piece: usize) -> Result<(), ApiErr> {
        let said = || Ok::<_, ()>(self.words().said(piece as u32 + 1));
        // Not said within the window (or the CPUs are oversubscribed, where looking only
        // delays the worker): the fence waits, asleep once its own window is over.
        if !LOOK.poll(said).unwrap_or(false) {
            self.worker.fence(false)?;
        } else if self.words().failure().is_some() {
            // The pieces sent after the failed one are done too before the copy answers.
            self.worker.fence(false)?;
        }
        self.failure()
    }

    /// Once every piece sent is done: the first failure's status, if one failed.
    fn failure(&self) -> Result<(), ApiErr> {
        self.words().failure().map_or(Ok(()), |st| Err(ApiErr(st)))
    }

    /// Ends the copy: every piece done, then its status (a copy to the host is a
    /// synchronisation point, as natively: what failed unwaited-for before it is answered
    /// first).
    fn end(&self, synchronising: bool) -> Result<i32, ApiErr> {
        self.worker.fence(synchronising)?;
        self.failure().map(|()| CUDA_SUCCESS)
    }

    /// # Safety
    /// `host` holds `n` readable bytes of the program's.
    unsafe fn copy_in(&self, device: u64, host: *const u8, n: usize) -> Result<i32, ApiErr> {
        self.words().reset();
        for piece in 0..n.div_ceil(self.slot) {
            if piece >= SLOTS {
                self.done(piece - SLOTS)?;
            }
            let (at, len) = self.piece(piece, n);
            // SAFETY: `host` holds `n` bytes (the contract), the slot `slot` bytes; they do not
            // overlap (the range is the worker's, never the program's).
            unsafe { std::ptr::copy_nonoverlapping(host.add(at), self.slot_of(piece).0, len) };
            self.send(true, piece, device.wrapping_add(at as u64), len, n)?;
        }
        self.end(false)
    }

    /// # Safety
    /// `host` holds `n` writable bytes of the program's.
    unsafe fn copy_out(&self, device: u64, host: *mut u8, n: usize) -> Result<i32, ApiErr> {
        self.words().reset();
        let pieces = n.div_ceil(self.slot);
        let send = |piece: usize| {
            let (at, len) = self.piece(piece, n);
            self.send(false, piece, device.wrapping_add(at as u64), len, n)
        };
        for piece in 0..pieces.min(SLOTS) {
            send(piece)?;
        }
        for piece in 0..pieces {
            self.done(piece)?;
            let (at, len) = self.piece(piece, n);
            // SAFETY: as in `copy_in`, the other way.
            unsafe { std::ptr::copy_nonoverlapping(self.slot_of(piece).0, host.add(at), len) };
            // The slot is free: the piece after the next goes into it.
            if piece + SLOTS < pieces {
                send(piece + SLOTS)?;
            }
        }
        self.end(true)
    }
}

/// Asks the worker for the staging range. A session without an arena, or one whose tenant
/// or arena has no room, or whose driver refuses it, goes without for good; a refusal of the
/// moment (the calling thread has no context for the worker to register the range in, a call
/// from a host function or before cuInit) is asked again at the next copy.
fn take_range() -> Range {
    let Some(arena) = host_memory_pinned::session_arena() else {
        return Range::Refused;
    };
    let mut refused = 0;
    for slot in SLOT_SIZES {
        match host_memory_pinned::alloc_in_arena(arena, SLOTS * slot + SIGNAL_PAGE, 0) {
            Ok((host, in_arena)) => {
                return Range::Held {
                    host: host as usize,
                    offset: in_arena.offset,
                    slot,
                }
            }
            // No room (the tenant's quota, the arena): a smaller one may fit.
            Err(e) if e.0 == CUDA_ERROR_OUT_OF_MEMORY => refused = e.0,
            // Something of the moment (no context current on the calling thread for the
            // worker to register it in, a call from a host function, one before cuInit):
            // asked again at the next copy.
            Err(e)
                if matches!(
                    e.0,
                    CUDA_ERROR_INVALID_CONTEXT
                        | CUDA_ERROR_NOT_PERMITTED
                        | CUDA_ERROR_NOT_INITIALIZED
                ) =>
            {
                return Range::Unasked
            }
            // Anything else (no page-locked memory here at all, a refusal of the driver's)
            // would fail again at every copy: the rings carry them.
            Err(e) => {
                refused = e.0;
                break;
            }
        }
    }
    crate::connection::log(&format!(
        "no page-locked staging memory (status {refused}): copies of pageable memory go through the rings"
    ));
    Range::Refused
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    /// A worker on a thread of its own, as the session's is in its process: it takes the
    /// requests in order, copies between the staging range and a device of plain memory
    /// (slowly now and then, so that a slot reused too early would be seen), and signals as
    /// the real one does (a failure stays said).
    struct Simulated {
        requests: mpsc::Sender<Request>,
        fenced: mpsc::Receiver<()>,
    }

    enum Request {
        Piece(PinnedCopy),
        Fence,
    }

    #[derive(Clone, Copy)]
    struct Range(*mut u8);
    // SAFETY: the test's range outlives the worker's use (the worker is joined first).
    unsafe impl Send for Range {}

    fn simulated(
        range: Range,
        device: Arc<Mutex<Vec<u8>>>,
    ) -> (Simulated, std::thread::JoinHandle<()>) {
        let (requests, rx) = mpsc::channel::<Request>();
        let (fence_tx, fenced) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            let range = range;
            for (i, req) in rx.iter().enumerate() {
                let c = match req {
                    Request::Fence => {
                        fence_tx.send(()).unwrap();
                        continue;
                    }
                    Request::Piece(c) => c,
                };
                if i % 3 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                }
                let sig = c.signal.unwrap();
                // SAFETY: the signal page of the test's range (a page's start: aligned).
                let words = unsafe { SignalWords::at(range.0.add(sig.offset as usize)) };
                if words.failure().is_some() {
                    continue;
                }
                let mut dev = device.lock().unwrap();
                let (at, len) = (c.device as usize, c.len as usize);
                let whole = (c.whole as usize).max(len);
                let fits = at + whole <= dev.len();
                let status = match dev.get_mut(at..at + len).filter(|_| fits) {
                    None => CUDA_ERROR_INVALID_VALUE,
                    Some(d) => {
                        // SAFETY: the slot lies in the test's range.
                        let slot = unsafe {
                            std::slice::from_raw_parts_mut(range.0.add(c.offset as usize), len)
                        };
                        match c.to_device {
                            true => d.copy_from_slice(slot),
                            false => slot.copy_from_slice(d),
                        }
                        CUDA_SUCCESS
                    }
                };
                words.say(sig.value, status);
            }
        });
        (Simulated { requests, fenced }, worker)
    }

    impl Worker for &Simulated {
        fn send(&self, copy: PinnedCopy) -> Result<(), ApiErr> {
            self.requests.send(Request::Piece(copy)).unwrap();
            Ok(())
        }
        fn fence(&self, _synchronising: bool) -> Result<(), ApiErr> {
            self.requests.send(Request::Fence).unwrap();
            self.fenced.recv().unwrap();
            Ok(())
        }
    }

    /// Copies of every shape through the two slots land whole both ways: a slot is never
    /// refilled before the worker is done with it, nor read before the worker filled it; a
    /// refused piece fails its copy, and the next copy starts afresh.
    #[test]
    fn staged_copies_arrive_whole_whatever_their_length() {
        for slot in SLOT_SIZES {
            copies_through_slots_of(slot);
        }
    }

    fn copies_through_slots_of(slot: usize) {
        let mut range = vec![0u64; (SLOTS * slot + SIGNAL_PAGE) / 8];
        let range = Range(range.as_mut_ptr().cast());
        let device = Arc::new(Mutex::new(vec![0u8; 40 << 20]));
        let (sim, worker) = simulated(range, device.clone());
        let staged = Staged {
            host: range.0,
            offset: 0,
            slot,
            stream: None,
            per_thread: false,
            worker: &sim,
        };
        for (k, n) in [
            STAGED_FROM,
            slot,
            slot + 1,
            2 * slot,
            3 * slot + 4093,
            37 << 20,
        ]
        .into_iter()
        .enumerate()
        {
            // No two pieces alike: a piece landing in another's place shows.
            let data: Vec<u8> = (0..n as u64)
                .map(|i| ((i + k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                .collect();
            // SAFETY: `data` holds `n` bytes.
            let st = unsafe { staged.copy_in(8, data.as_ptr(), n) };
            assert_eq!(st, Ok(CUDA_SUCCESS));
            assert!(device.lock().unwrap()[8..8 + n] == data[..], "{n} bytes in");
            let mut back = vec![0u8; n];
            // SAFETY: `back` holds `n` bytes.
            let st = unsafe { staged.copy_out(8, back.as_mut_ptr(), n) };
            assert_eq!(st, Ok(CUDA_SUCCESS));
            assert!(back == data, "{n} bytes out");
        }
        // A copy whose device range ends past the device's fails before a byte moves (the
        // first piece answers for the whole range), twice over (no failure outlives its
        // copy); then a copy that fits works.
        let n = 3 * slot;
        let data = vec![7u8; n];
        let end = 40 << 20;
        let second_out = end - 2 * slot as u64 + 1;
        for _ in 0..2 {
            let before = device.lock().unwrap()[second_out as usize..].to_vec();
            // SAFETY: `data` holds `n` bytes.
            let st = unsafe { staged.copy_in(second_out, data.as_ptr(), n) };
            assert_eq!(st, Err(ApiErr(CUDA_ERROR_INVALID_VALUE)));
            let after = device.lock().unwrap()[second_out as usize..].to_vec();
            assert!(before == after, "nothing written");
            let mut back = vec![0u8; n];
            // SAFETY: `back` holds `n` bytes.
            let st = unsafe { staged.copy_out(second_out, back.as_mut_ptr(), n) };
            assert_eq!(st, Err(ApiErr(CUDA_ERROR_INVALID_VALUE)));
        }
        // SAFETY: `data` holds `n` bytes.
        let st = unsafe { staged.copy_in(end - n as u64, data.as_ptr(), n) };
        assert_eq!(st, Ok(CUDA_SUCCESS));
        // The worker ends with its requests' channel.
        drop(sim);
        worker.join().unwrap();
    }
}
