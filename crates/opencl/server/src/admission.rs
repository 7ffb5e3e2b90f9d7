//! The tenant's admission limit on queued device work (`max_queued`): one session may have at
//! most that many commands enqueued and not finished per command queue, so a tenant that
//! floods a shared device cannot fill the driver's queues ahead of everyone else.
//!
//! Counting every command's completion would cost an event per command. Instead, every
//! `max(1, N/4)`-th enqueue on a queue is followed by a marker of our own
//! (`clEnqueueMarkerWithWaitList` without a wait list: it completes once everything enqueued
//! before it has), and an enqueue that finds the queue's markers covering N commands waits for
//! the oldest one first. The wait holds up only the lane of the calling thread, whose ring then
//! fills and stops its client: back-pressure on that tenant alone. Markers are the server's
//! own: the application's events, wait lists and errors are untouched.

use crate::generated::ffi;
use crate::session::Handle;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use wormhole_opencl_proto::cl::CL_SUCCESS;

#[derive(Default)]
pub struct Admission {
    /// Some queue has been tracked: until then the hooks after `clFinish` and queue releases
    /// return at once.
    active: AtomicBool,
    /// The session made a user event. A command may then wait for one that only a later call
    /// of the client completes, and a wait here would keep that call from ever arriving: the
    /// limit is no longer enforced in this session.
    user_events: AtomicBool,
    queues: Mutex<HashMap<u64, Tracked>>,
    /// The most commands found enqueued and not known finished on one queue (`wh status`).
    pub peak: AtomicU64,
    /// Enqueues that waited for a marker.
    pub waits: AtomicU64,
}

/// A command queue under the limit (by the client's id).
#[derive(Default)]
struct Tracked {
    /// Commands enqueued since tracking began...
    enqueued: u64,
    /// ...of which these are known to be finished (those before a marker seen complete).
    done: u64,
    /// Commands since the last marker.
    since_marker: u64,
    /// Our markers not yet waited for: the event, and `enqueued` when it was put in.
    markers: VecDeque<(usize, u64)>,
    /// A marker could not be enqueued: the queue is not limited.
    broken: bool,
}

/// Commands between two markers under the limit `n`.
fn batch(n: u64) -> u64 {
    (n / 4).max(1)
}

/// Markers that may be outstanding before an enqueue waits: together they cover at most `n`
/// commands.
fn markers_allowed(n: u64) -> usize {
    usize::try_from(n / batch(n)).unwrap_or(usize::MAX)
}

/// Gives back our reference to a marker's event (this module's, and `later`'s).
pub(crate) fn release(ev: usize) {
    // SAFETY: `ev` is a marker event its creator still holds one reference to.
    unsafe { ffi::clReleaseEvent(ev as Handle) };
}

impl Admission {
    /// Before an enqueue on `queue` under the limit `n`: waits until the queue's markers cover
    /// fewer than `n` commands.
    pub fn before(&self, queue: u64, n: u64) {
        if self.user_events.load(Ordering::Relaxed) {
            return;
        }
        loop {
            let (ev, at) = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let Some(t) = queues.get_mut(&queue) else {
                    return;
                };
                if t.markers.len() < markers_allowed(n) {
                    return;
                }
                match t.markers.pop_front() {
                    Some(m) => m,
                    None => return,
                }
            };
            self.waits.fetch_add(1, Ordering::Relaxed);
            let ev_handle = ev as Handle;
            // SAFETY: a marker event we hold a reference to; waited for (outside the lock:
            // other lanes of the session go on), then released. A marker after a failed
            // command completes with an error status: finished all the same, and the error is
            // the application's to see on its own events.
            unsafe { ffi::clWaitForEvents(1, &ev_handle) };
            release(ev);
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = queues.get_mut(&queue) {
                t.done = t.done.max(at);
            }
        }
    }

    /// After a successful enqueue on `queue` (its real object `real`) under the limit `n`:
    /// counts it, and puts a marker in after every batch.
    pub fn after(&self, queue: u64, real: Handle, n: u64) {
        // Not enforced in a session with user events (see `user_event`): no markers either,
        // or they would pile up unreleased.
        if self.user_events.load(Ordering::Relaxed) {
            return;
        }
        self.active.store(true, Ordering::Relaxed);
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let t = queues.entry(queue).or_default();
        if t.broken {
            return;
        }
        t.enqueued += 1;
        self.peak
            .fetch_max(t.enqueued - t.done.min(t.enqueued), Ordering::Relaxed);
        t.since_marker += 1;
        if t.since_marker < batch(n) {
            return;
        }
        t.since_marker = 0;
        let mut ev: Handle = std::ptr::null_mut();
        // SAFETY: `real` is the live queue the application just enqueued on (resolved from
        // the session's table on this lane); no wait list; `ev` receives the new event.
        let st = unsafe { ffi::clEnqueueMarkerWithWaitList(real, 0, std::ptr::null(), &mut ev) };
        if st == CL_SUCCESS && !ev.is_null() {
            t.markers.push_back((ev as usize, t.enqueued));
        } else {
            tracing::warn!(
                status = st,
                "max_queued not enforced on a command queue: the driver enqueues no marker on it"
            );
            t.broken = true;
        }
    }

    /// After a successful `clFinish` of `queue`: everything enqueued on it is finished.
    pub fn finished(&self, queue: u64) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = queues.get_mut(&queue) {
            t.done = t.enqueued;
            t.markers.drain(..).for_each(|(ev, _)| release(ev));
        }
    }

    /// The application released its last reference to `queue`: its markers go too.
    pub fn forget(&self, queue: u64) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let removed = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&queue);
        if let Some(t) = removed {
            t.markers.into_iter().for_each(|(ev, _)| release(ev));
        }
    }

    /// The session made a user event (see `user_events`).
    pub fn user_event(&self) {
        if !self.user_events.swap(true, Ordering::Relaxed) {
            tracing::info!("this session uses user events: max_queued is not enforced in it (a wait could hold up the call that completes one)");
            // The markers outstanding now are never waited for: give them back.
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            for t in queues.values_mut() {
                t.markers.drain(..).for_each(|(ev, _)| release(ev));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_cover_at_most_the_limit() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 64, 100, 1000, 1 << 40] {
            let covered = markers_allowed(n) as u64 * batch(n);
            assert!(covered <= n && covered * 2 > n, "n = {n}: {covered}");
            assert!(markers_allowed(n) >= 1);
        }
        assert_eq!((batch(64), markers_allowed(64)), (16, 4));
    }
}
