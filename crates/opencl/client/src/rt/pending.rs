//! Non-blocking reads: the server reads into a staging buffer and the data reaches the
//! application's memory at its next synchronisation point (clFinish, clWaitForEvents, an event
//! status query, a blocking call, an event callback) — before the application may look at it.

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

static PENDING: Mutex<Vec<(u64, Scatter)>> = Mutex::new(Vec::new());

pub fn defer(read_id: u64, s: Scatter) {
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((read_id, s));
}

/// Drops a read that must not land any more (its destination is going away); returns whether
/// it was still pending (its bytes never reached the application).
pub fn forget(read_id: u64) -> bool {
    // Not while a collection may be writing into it.
    let _serial = COLLECTING.lock().unwrap_or_else(|p| p.into_inner());
    let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    match p.iter().position(|(id, _)| *id == read_id) {
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
    match s {
        // SAFETY: the application's buffer holds the read's size, which is data.len().
        Scatter::Plain { dst } => unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), *dst as *mut u8, data.len())
        },
        Scatter::Rows { dst, rows } => {
            for (off, n) in rows {
                if off + n <= data.len() {
                    // SAFETY: the row lies inside the read's host footprint.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            data.as_ptr().add(*off),
                            (*dst + *off) as *mut u8,
                            *n,
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
    let ids: Vec<u64> = {
        let p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_empty() {
            return;
        }
        p.iter().map(|(id, _)| *id).collect()
    };
    let mut w = Writer::new(control::COLLECT);
    req::Collect { reads: ids }.encode(&mut w);
    let Ok(reply) = call(w) else { return };
    let Ok(collected) = req::CollectReply::decode_all(&reply) else {
        return;
    };
    for (id, state) in collected.reads {
        let data = match state {
            req::Collected::Pending => continue,
            req::Collected::Done(data) => Some(data),
            req::Collected::Failed => None,
        };
        let entry = {
            let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
            p.iter()
                .position(|(i, _)| *i == id)
                .map(|i| p.swap_remove(i))
        };
        if let (Some((_, s)), Some(d)) = (entry, data) {
            // SAFETY: the scatter was recorded for exactly this read.
            unsafe { scatter(&s, d) };
        }
    }
}
