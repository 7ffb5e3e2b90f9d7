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
    /// Contiguous bytes at `dst`.
    Plain { dst: usize },
    /// Rows of `row_bytes` at `dst + offset` for each offset (rect and image reads).
    Rows {
        dst: usize,
        rows: Vec<(usize, usize)>,
    },
}

// SAFETY: the addresses are the application's buffers, handed to OpenCL for this read.
unsafe impl Send for Scatter {}

/// A read whose data has not all arrived.
struct Pending {
    id: u64,
    scatter: Scatter,
    /// Bytes of the data written out already (from parts).
    at: usize,
}

static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());

pub fn defer(read_id: u64, s: Scatter) {
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Pending {
            id: read_id,
            scatter: s,
            at: 0,
        });
}

/// Whether some non-blocking read has not landed yet.
pub fn any() -> bool {
    !PENDING.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
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
        Scatter::Plain { dst } => unsafe {
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
        if p.is_empty() {
            return false;
        }
        p.iter().map(|e| e.id).collect()
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
