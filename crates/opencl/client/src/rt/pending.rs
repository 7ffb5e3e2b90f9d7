//! Non-blocking reads: the server reads into a staging buffer and the data reaches the
//! application's memory at its next synchronisation point (clFinish, clWaitForEvents, an event
//! status query, a blocking call, an event callback) — before the application may look at it.
//! Blocking reads too large for one reply wait on the server the same way and are fetched at
//! once. A read larger than one COLLECT reply comes in parts, written where they belong as
//! they arrive.

use super::*;
use std::sync::Mutex;
use wormhole_opencl_proto::control;
use wormhole_opencl_proto::requests::{self as req, Message};

/// Where a read's bytes go in the application's memory.
pub enum Scatter {
    /// `len` contiguous bytes at `dst`.
    Plain { dst: usize, len: usize },
    /// Rows of `row_bytes` at `dst + offset` for each offset (rect and image reads).
    Rows {
        dst: usize,
        rows: Vec<(usize, usize)>,
    },
}

// SAFETY: the addresses are the application's buffers, handed to OpenCL for this read.
unsafe impl Send for Scatter {}

impl Scatter {
    /// The application's memory the read fills: from its first byte to past its last.
    fn span(&self) -> (usize, usize) {
        match self {
            Scatter::Plain { dst, len } => (*dst, dst.saturating_add(*len)),
            Scatter::Rows { dst, rows } => {
                let lo = rows.iter().map(|r| r.0).min().unwrap_or(0);
                let hi = rows
                    .iter()
                    .map(|r| r.0.saturating_add(r.1))
                    .max()
                    .unwrap_or(0);
                (dst.saturating_add(lo), dst.saturating_add(hi))
            }
        }
    }
}

/// A read whose data has not all arrived.
struct Pending {
    id: u64,
    scatter: Scatter,
    /// Bytes of the data written out already (from parts).
    at: usize,
    /// The server keeps the read's bytes in a staging buffer of their own (a buffer or SVM
    /// copy, not a map): a write may take its bytes from there (`write_source`).
    staged: bool,
    /// Writes being sent that take their bytes from this read: it is not collected (and so
    /// not dropped on the server) meanwhile.
    pins: u32,
}

static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());

/// A non-blocking read (`staged`: see `Pending::staged`) whose bytes land at the next
/// synchronisation point.
pub fn defer(read_id: u64, s: Scatter, staged: bool) {
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Pending {
            id: read_id,
            scatter: s,
            at: 0,
            staged,
            pins: 0,
        });
}

/// Where a write from the application's memory `[src, src + len)` takes its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSource {
    /// From that memory, now: no read still to land there.
    Memory,
    /// From what pending read `read` brings, from `offset` of its bytes: natively the write
    /// reads the memory when it runs, after that read filled it.
    Read { read: u64, offset: u64 },
}

/// Runs `send` (which sends a write from `[src, src + len)`) with where the write must take
/// its bytes. Reads that land there and are not one staged read holding the whole range
/// (`from_read`: the write may take its bytes from one) are waited for first (at most
/// `LAND_WAIT`). A read `send` is told of is not collected until
/// `send` returns, so it is still pending on the server when the write arrives.
pub fn write_source<T>(
    src: usize,
    len: usize,
    from_read: bool,
    send: impl FnOnce(WriteSource) -> T,
) -> T {
    if len == 0 || !any() {
        return send(WriteSource::Memory);
    }
    let deadline = std::time::Instant::now() + LAND_WAIT;
    let mut pause = std::time::Duration::from_micros(20);
    let source = loop {
        let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        let source = source_now(&mut pending, src, len, from_read);
        drop(pending);
        if let Some(source) = source {
            break source;
        }
        if std::time::Instant::now() >= deadline {
            crate::connection::log(
                "a write from memory that non-blocking reads have not filled yet went ahead \
                 after 2 s without them",
            );
            break WriteSource::Memory;
        }
        collect();
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(1));
    };
    let out = send(source);
    if let WriteSource::Read { read, .. } = source {
        let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pending.iter_mut().find(|p| p.id == read) {
            p.pins -= 1;
        }
    }
    out
}

/// Where a write from `[src, src + len)` takes its bytes as things stand: None while reads
/// still to land there must land first. A read named is pinned (see `Pending::pins`).
fn source_now(
    pending: &mut [Pending],
    src: usize,
    len: usize,
    from_read: bool,
) -> Option<WriteSource> {
    let end = src.saturating_add(len);
    let mut over = pending.iter_mut().filter(|p| {
        let (lo, hi) = p.scatter.span();
        lo < end && src < hi
    });
    match (over.next(), over.next().is_some()) {
        (None, _) => Some(WriteSource::Memory),
        (Some(p), false) if from_read && p.staged => match p.scatter {
            Scatter::Plain { dst, len: n } if dst <= src && end <= dst.saturating_add(n) => {
                p.pins += 1;
                Some(WriteSource::Read {
                    read: p.id,
                    offset: (src - dst) as u64,
                })
            }
            _ => None,
        },
        _ => None,
    }
}

/// The longest a write waits for reads to land in the memory it writes from (they may wait
/// for a user event the application sets only after the write).
const LAND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether some non-blocking read has not landed yet.
pub fn any() -> bool {
    !PENDING.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
}

/// Whether read `read_id` has yet to land.
pub fn is_due(read_id: u64) -> bool {
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|e| e.id == read_id)
}

/// Drops a read that must not land any more (its destination is going away); returns whether
/// it was still pending (its bytes never reached the application).
pub fn forget(read_id: u64) -> bool {
    // Not while a collection may be writing into it.
    let _serial = COLLECTING.lock().unwrap_or_else(|p| p.into_inner());
    let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    match p.iter().position(|e| e.id == read_id) {
        Some(i) => {
            p.swap_remove(i);
            true
        }
        None => false,
    }
}

/// Writes `data` where the read wanted it.
///
/// # Safety
/// The scatter's addresses must be the application's buffer for this read.
pub unsafe fn scatter(s: &Scatter, data: &[u8]) {
    // SAFETY: per the contract.
    unsafe { scatter_at(s, 0, data) }
}

/// Writes `data`, the read's bytes from `at` on, where the read wanted them.
///
/// # Safety
/// The scatter's addresses must be the application's buffer for this read, and the read's
/// data at least `at + data.len()` bytes long.
unsafe fn scatter_at(s: &Scatter, at: usize, data: &[u8]) {
    let end = at.saturating_add(data.len());
    match s {
        // SAFETY: the application's buffer holds the read's size, at least `end`.
        Scatter::Plain { dst, .. } => unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*dst + at) as *mut u8, data.len())
        },
        Scatter::Rows { dst, rows } => {
            for &(off, n) in rows {
                // The part of the row that these bytes hold.
                let (lo, hi) = (off.max(at), off.saturating_add(n).min(end));
                if lo < hi {
                    // SAFETY: the row lies inside the read's host footprint; `lo..hi` is in
                    // both the row and `data`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            data.as_ptr().add(lo - at),
                            (*dst + lo) as *mut u8,
                            hi - lo,
                        )
                    };
                }
            }
        }
    }
}

/// Held for a whole collection, so a thread returning from its sync point knows that data
/// another thread (the callback thread) fetched has been written out, not just fetched.
static COLLECTING: Mutex<()> = Mutex::new(());

pub fn collect() {
    let _serial = COLLECTING.lock().unwrap_or_else(|p| p.into_inner());
    // Again at once while reads come in parts; every round but the last brings bytes or ends
    // reads, so this ends.
    while collect_round() {}
}

/// One COLLECT of every pending read; true if a part came and more is to be had now.
fn collect_round() -> bool {
    let ids: Vec<u64> = {
        let p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        // Pinned reads wait: a write being sent takes its bytes from them.
        let ids: Vec<u64> = p.iter().filter(|e| e.pins == 0).map(|e| e.id).collect();
        if ids.is_empty() {
            return false;
        }
        ids
    };
    let mut w = Writer::new(control::COLLECT);
    req::Collect { reads: ids }.encode(&mut w);
    let Ok(reply) = call(w) else { return false };
    let Ok(collected) = req::CollectReply::decode_all(&reply) else {
        return false;
    };
    let (mut parts, mut progress) = (false, false);
    for (id, state) in collected.reads {
        let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        let Some(i) = p.iter().position(|e| e.id == id) else {
            continue;
        };
        match state {
            req::Collected::Pending => {}
            req::Collected::Part(data) => {
                // SAFETY: the scatter was recorded for exactly this read, whose data goes on
                // past this part.
                unsafe { scatter_at(&p[i].scatter, p[i].at, data) };
                p[i].at += data.len();
                parts = true;
                progress |= !data.is_empty();
            }
            req::Collected::Done(data) => {
                let e = p.swap_remove(i);
                drop(p);
                // SAFETY: as above; this is the rest of it.
                unsafe { scatter_at(&e.scatter, e.at, data) };
                progress = true;
            }
            req::Collected::Failed => {
                p.swap_remove(i);
                progress = true;
            }
        }
    }
    parts && progress
}

/// Fetches the data of a read that is complete on the server (a blocking one too large for its
/// reply) and writes it where `s` says, now. The read is no pending one: no other thread
/// collects it meanwhile.
pub fn fetch(read_id: u64, s: &Scatter) -> Result<(), ClErr> {
    let mut at = 0usize;
    loop {
        let mut w = Writer::new(control::COLLECT);
        req::Collect {
            reads: vec![read_id],
        }
        .encode(&mut w);
        let reply = call(w)?;
        let collected = req::CollectReply::decode_all(&reply)?;
        let state = match collected.reads[..] {
            [(id, state)] if id == read_id => state,
            _ => return Err(ClErr(CL_OUT_OF_RESOURCES)),
        };
        match state {
            // SAFETY: the scatter is this read's; the data goes on past this part.
            req::Collected::Part(data) if !data.is_empty() => unsafe {
                scatter_at(s, at, data);
                at += data.len();
            },
            req::Collected::Done(data) => {
                // SAFETY: as above; this is the rest of it.
                unsafe { scatter_at(s, at, data) };
                return Ok(());
            }
            // Complete before the reply came, so never pending; a part without bytes here
            // would be no progress.
            _ => return Err(ClErr(CL_OUT_OF_RESOURCES)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(id: u64, dst: usize, len: usize, staged: bool) -> Pending {
        Pending {
            id,
            scatter: Scatter::Plain { dst, len },
            at: 0,
            staged,
            pins: 0,
        }
    }

    /// A write takes its bytes from the one staged read that fills all of them; memory no
    /// read fills is sent as it is; anything else waits for the reads to land.
    #[test]
    fn a_write_takes_its_bytes_from_the_read_that_fills_them() {
        let mut p = vec![read(1, 1000, 100, true), read(2, 2000, 100, false)];
        let read1 = |offset| Some(WriteSource::Read { read: 1, offset });
        assert_eq!(source_now(&mut p, 1010, 50, true), read1(10));
        assert_eq!(source_now(&mut p, 1000, 100, true), read1(0));
        assert_eq!(p[0].pins, 2);
        assert_eq!(
            source_now(&mut p, 500, 500, true),
            Some(WriteSource::Memory)
        );
        assert_eq!(
            source_now(&mut p, 1100, 900, true),
            Some(WriteSource::Memory)
        );
        // Sticking out of the read, across two reads, from a map's bytes, or not allowed.
        assert_eq!(source_now(&mut p, 990, 20, true), None);
        assert_eq!(source_now(&mut p, 1050, 1000, true), None);
        assert_eq!(source_now(&mut p, 2000, 10, true), None);
        assert_eq!(source_now(&mut p, 1010, 50, false), None);
        let rows = Pending {
            scatter: Scatter::Rows {
                dst: 3000,
                rows: vec![(10, 5), (40, 5)],
            },
            ..read(3, 0, 0, true)
        };
        let mut p = vec![rows];
        assert_eq!(
            source_now(&mut p, 3000, 10, true),
            Some(WriteSource::Memory)
        );
        assert_eq!(source_now(&mut p, 3020, 5, true), None);
        assert_eq!(p[0].pins, 0);
    }

    /// Data scattered in parts of any size lands exactly as when scattered whole.
    #[test]
    fn parts_land_where_the_whole_would() {
        let data: Vec<u8> = (1..=200u8).collect();
        // Rows of 7 bytes every 10 (the footprint's last row ends the data).
        let rows: Vec<(usize, usize)> = (0..20).map(|i| (i * 10, 7)).collect();
        let footprint = 19 * 10 + 7;
        let whole = |s: &Scatter| {
            // SAFETY: the scatter's buffer holds the footprint.
            unsafe { scatter(s, &data[..footprint]) };
        };
        for part in [1, 3, 7, 10, 64, footprint] {
            for plain in [false, true] {
                let mut want = vec![0u8; footprint];
                let mut got = vec![0u8; footprint];
                let make = |dst: &mut Vec<u8>| match plain {
                    true => Scatter::Plain {
                        dst: dst.as_mut_ptr() as usize,
                        len: footprint,
                    },
                    false => Scatter::Rows {
                        dst: dst.as_mut_ptr() as usize,
                        rows: rows.clone(),
                    },
                };
                whole(&make(&mut want));
                let s = make(&mut got);
                for (i, chunk) in data[..footprint].chunks(part).enumerate() {
                    // SAFETY: as above; the parts follow each other.
                    unsafe { scatter_at(&s, i * part, chunk) };
                }
                assert_eq!(got, want, "parts of {part}, plain {plain}");
            }
        }
    }
}
