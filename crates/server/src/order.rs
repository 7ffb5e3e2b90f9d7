//! Order across lanes. Each application thread sends on a lane of its own, and the worker
//! serves each lane on a thread of its own, so requests of different lanes may run in any
//! order. Natively, what one thread's call started before it told another thread (through a
//! mutex, a condition, a join) comes before what the other thread then does. A synchronous
//! call waits for its reply, so nothing it sent is left behind; a pipelined one (sent without
//! waiting: a repeated kernel launch, a release) may still sit in its lane when the thread the
//! application told sends a call that depends on it (a `clFinish` of the same queue: it would
//! return before the kernel was even enqueued, and the results read after it would be stale).
//!
//! So before a lane runs a synchronous request, every other lane first handles what had been
//! sent on it by then: the lanes' senders publish how far they have sent (a ring's head, a
//! stream's frame count), and the lanes how far they have handled. A lane inside a synchronous
//! request is not waited for: everything sent on it before that request is handled already,
//! and its sender, waiting for the reply, sends nothing more there (a request queued behind a
//! blocked one over TCP is the exception that is not waited for: waiting could deadlock), and
//! a lane blocked inside a pipelined request is waited for 1 s at most.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How far each lane of a session has handled its requests.
pub struct LaneOrder {
    lanes: Box<[Progress]>,
}

#[derive(Default)]
struct Progress {
    /// Where the lane's handled requests end, in the lane's own units (what `produced`
    /// counts for it).
    handled: AtomicU64,
    /// The lane is running a synchronous request.
    in_sync: AtomicBool,
}

/// How long a lane spins for another before it yields its CPU between looks (pipelined
/// requests take microseconds; the lane that has them may need this CPU to run them).
const SPIN: u32 = 100;

/// How long a synchronous request waits for another lane at most.
const GIVE_UP: Duration = Duration::from_secs(1);

impl LaneOrder {
    pub fn new(lanes: usize) -> LaneOrder {
        LaneOrder {
            lanes: (0..lanes).map(|_| Progress::default()).collect(),
        }
    }

    /// Lane `lane` took a synchronous request (its sender waits for the reply).
    pub fn took_sync(&self, lane: usize) {
        if let Some(p) = self.lanes.get(lane) {
            p.in_sync.store(true, Ordering::SeqCst);
        }
    }

    /// Lane `lane` has handled everything it received up to `position`.
    pub fn handled(&self, lane: usize, position: u64) {
        if let Some(p) = self.lanes.get(lane) {
            p.handled.store(position, Ordering::Release);
            p.in_sync.store(false, Ordering::Release);
        }
    }

    /// Before lane `lane` runs a synchronous request: waits until every other lane has
    /// handled what had been sent on it (`produced(j)`, in lane `j`'s units), or is inside a
    /// synchronous request itself. Lanes with nothing outstanding cost a look each (what a
    /// sender publishes sits in a cache line only it writes).
    pub fn wait_for_others(&self, lane: usize, produced: impl Fn(usize) -> u64) {
        for j in (0..self.lanes.len()).filter(|j| *j != lane) {
            self.wait_for(j, produced(j));
        }
    }

    fn wait_for(&self, j: usize, target: u64) {
        let p = &self.lanes[j];
        let caught_up =
            || p.handled.load(Ordering::Acquire) >= target || p.in_sync.load(Ordering::SeqCst);
        if caught_up() {
            return;
        }
        let start = Instant::now();
        let mut looks = 0u32;
        while !caught_up() {
            looks += 1;
            if looks < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
                if looks > 10 * SPIN {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            if start.elapsed() > GIVE_UP {
                // A pipelined request can block in the worker (an enqueue held back by the
                // tenant's `max_queued` until commands finish, which may wait for this very
                // call): going on beats a deadlock.
                tracing::warn!(
                    lane = j,
                    "a synchronous call waited {GIVE_UP:?} for requests another thread sent before it; running it anyway"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lane_with_nothing_outstanding_is_not_waited_for() {
        let o = LaneOrder::new(4);
        o.handled(0, 100);
        o.took_sync(1);
        // Lane 0 handled all 100 units sent on it; lanes 2 and 3 never had a request.
        o.wait_for_others(1, |j| if j == 0 { 100 } else { 0 });
    }

    #[test]
    fn a_lane_inside_a_synchronous_request_is_not_waited_for() {
        let o = LaneOrder::new(2);
        o.took_sync(0);
        o.took_sync(1);
        o.wait_for_others(1, |_| 500);
    }

    #[test]
    fn a_synchronous_request_waits_for_what_another_lane_still_has() {
        let o = Arc::new(LaneOrder::new(2));
        o.handled(0, 10);
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (o, done) = (o.clone(), done.clone());
            std::thread::spawn(move || {
                o.took_sync(1);
                o.wait_for_others(1, |j| if j == 0 { 20 } else { 0 });
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!done.load(Ordering::SeqCst), "it did not wait for lane 0");
        o.handled(0, 20);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    /// A lane whose thread has not yet taken its first request is waited for too.
    #[test]
    fn a_lane_not_yet_started_is_waited_for() {
        let o = Arc::new(LaneOrder::new(130));
        let waited = Arc::new(AtomicBool::new(true));
        let t = {
            let (o, waited) = (o.clone(), waited.clone());
            std::thread::spawn(move || {
                o.took_sync(3);
                o.wait_for_others(3, |j| if j == 129 { 1 } else { 0 });
                waited.store(false, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        assert!(waited.load(Ordering::SeqCst));
        o.handled(129, 1);
        t.join().unwrap();
    }

    /// A lane blocked inside a pipelined request (which may wait for this very call) holds a
    /// synchronous request up for a second, not for ever.
    #[test]
    fn a_lane_that_never_catches_up_is_waited_for_a_second_at_most() {
        let o = LaneOrder::new(2);
        o.took_sync(1);
        let t0 = Instant::now();
        o.wait_for_others(1, |j| if j == 0 { 1 } else { 0 });
        let waited = t0.elapsed();
        assert!(waited >= GIVE_UP && waited < GIVE_UP * 3, "{waited:?}");
    }
}
