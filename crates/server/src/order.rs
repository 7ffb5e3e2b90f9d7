//! Order across lanes. Each application thread sends on a lane of its own, and the worker
//! serves each lane on a thread of its own, so requests of different lanes could run in any
//! order. Natively, what one thread's call did before it told another thread (through a mutex,
//! a condition, a join) comes before what the other thread then does. A synchronous call waits
//! for its reply, so nothing it sent is left behind; a pipelined one (sent without waiting: a
//! repeated kernel launch, an argument, a release) may still sit in its lane when the thread
//! the application told sends a call that depends on it: a `clFinish` of the same queue would
//! return before the kernel was even enqueued, and a launch of its own would run before it.
//!
//! So every request carries a ticket (its seq) from one counter of the client's: a request
//! sent after another one finished sending has a later ticket. Before a lane runs a request,
//! every other lane first handles what had been sent on it by then (the senders publish how
//! far they have sent: a ring's head, a stream's frame count) with an earlier ticket: it is
//! not waited for once it works on a request with a later ticket (what it had before is
//! handled, and what comes after has later tickets still), nor while it is inside a
//! synchronous request (its sender, waiting for the reply, sends nothing more there: so a lane
//! says a request is handled before its reply goes out, after which the sender may), nor
//! inside a request sent as part of a call its sender waits for (`Backend::within_waited_call`:
//! the call's end waits for it before the sender can tell anyone). Waits go
//! only to earlier tickets, so they never form a cycle. A lane blocked inside a pipelined
//! request (an enqueue held back by the tenant's `max_queued`) is waited for 1 s at most.

use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The request the lane works on: its ticket << 2 | synchronous << 1 | working.
    working: AtomicU64,
}

const WORKING: u64 = 1;
const SYNC: u64 = 2;

/// How long a lane spins for another before it yields its CPU between looks (pipelined
/// requests take microseconds; the lane that has them may need this CPU to run them).
const SPIN: u32 = 100;

/// How long a request waits for another lane at most.
const GIVE_UP: Duration = Duration::from_secs(1);

/// Whether ticket `a` was given out after ticket `b` (tickets wrap).
fn later(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl LaneOrder {
    pub fn new(lanes: usize) -> LaneOrder {
        LaneOrder {
            lanes: (0..lanes).map(|_| Progress::default()).collect(),
        }
    }

    /// Lane `lane` took the request with ticket `ticket` (`sync`: its sender waits for the
    /// reply). Said before the lane waits for others, so that they need not wait for it.
    pub fn took(&self, lane: usize, ticket: u32, sync: bool) {
        if let Some(p) = self.lanes.get(lane) {
            let word = u64::from(ticket) << 2 | if sync { SYNC } else { 0 } | WORKING;
            p.working.store(word, Ordering::SeqCst);
        }
    }

    /// Lane `lane` has handled everything it received up to `position`.
    pub fn handled(&self, lane: usize, position: u64) {
        if let Some(p) = self.lanes.get(lane) {
            p.handled.store(position, Ordering::Release);
            p.working.store(0, Ordering::Release);
        }
    }

    /// Before lane `lane` runs its request of ticket `ticket`: waits until every other lane in
    /// `lanes` has handled what had been sent on it (`produced(j)`, in lane `j`'s units) with
    /// an earlier ticket.
    pub fn wait_for_others(
        &self,
        lane: usize,
        ticket: u32,
        lanes: impl Iterator<Item = usize>,
        produced: impl Fn(usize) -> u64,
    ) {
        for j in lanes.filter(|j| *j != lane && *j < self.lanes.len()) {
            self.wait_for(j, ticket, produced(j));
        }
    }

    fn wait_for(&self, j: usize, ticket: u32, target: u64) {
        let p = &self.lanes[j];
        let caught_up = || {
            if p.handled.load(Ordering::Acquire) >= target {
                return true;
            }
            let w = p.working.load(Ordering::SeqCst);
            w & WORKING != 0 && (w & SYNC != 0 || later((w >> 2) as u32, ticket))
        };
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
                // request): going on beats a deadlock.
                tracing::warn!(
                    lane = j,
                    "a request waited {GIVE_UP:?} for requests another thread sent before it; running it anyway"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn all(n: usize) -> impl Iterator<Item = usize> {
        0..n
    }

    #[test]
    fn tickets_compare_across_the_wrap() {
        assert!(later(5, 3));
        assert!(!later(3, 5));
        assert!(!later(7, 7));
        assert!(later(2, u32::MAX - 1));
    }

    #[test]
    fn a_lane_with_nothing_outstanding_is_not_waited_for() {
        let o = LaneOrder::new(4);
        o.handled(0, 100);
        o.took(1, 9, true);
        // Lane 0 handled all 100 units sent on it; lanes 2 and 3 never had a request.
        o.wait_for_others(1, 9, all(4), |j| if j == 0 { 100 } else { 0 });
    }

    #[test]
    fn a_lane_inside_a_synchronous_request_is_not_waited_for() {
        let o = LaneOrder::new(2);
        o.took(0, 3, true);
        o.took(1, 9, true);
        o.wait_for_others(1, 9, all(2), |_| 500);
    }

    /// A lane working on a later ticket has handled everything before it: what it has left
    /// was sent after this request (or at the same time), so it is not waited for, and two
    /// lanes never wait for each other.
    #[test]
    fn a_lane_working_on_a_later_ticket_is_not_waited_for() {
        let o = LaneOrder::new(2);
        o.took(0, 12, false);
        o.took(1, 9, false);
        o.wait_for_others(1, 9, all(2), |_| 500);
    }

    fn waits(o: &Arc<LaneOrder>, lane: usize, ticket: u32, produced: u64) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        let (o, d) = (o.clone(), done.clone());
        o.took(lane, ticket, false);
        std::thread::spawn(move || {
            o.wait_for_others(lane, ticket, all(2), |_| produced);
            d.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(20));
        done
    }

    #[test]
    fn a_request_waits_for_an_earlier_ticket_another_lane_still_has() {
        let o = Arc::new(LaneOrder::new(2));
        o.handled(0, 10);
        // Lane 0 has 10 more units, not yet taken: they may hold an earlier ticket.
        let done = waits(&o, 1, 9, 20);
        assert!(!done.load(Ordering::SeqCst), "it did not wait for lane 0");
        // Lane 0 takes an earlier ticket: still waited for; then handles it.
        o.took(0, 8, false);
        std::thread::sleep(Duration::from_millis(10));
        assert!(!done.load(Ordering::SeqCst), "it did not wait for ticket 8");
        o.handled(0, 20);
        std::thread::sleep(Duration::from_millis(10));
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn lanes_not_named_are_not_looked_at() {
        let o = LaneOrder::new(3);
        o.took(0, 5, false);
        o.wait_for_others(
            0,
            5,
            [0usize, 1].into_iter(),
            |j| if j == 2 { 99 } else { 0 },
        );
    }

    /// A lane blocked inside a pipelined request (which may wait for this very request) holds
    /// another up for a second, not for ever.
    #[test]
    fn a_lane_that_never_catches_up_is_waited_for_a_second_at_most() {
        let o = LaneOrder::new(2);
        o.took(1, 9, true);
        let t0 = Instant::now();
        o.wait_for_others(1, 9, all(2), |j| if j == 0 { 1 } else { 0 });
        let waited = t0.elapsed();
        assert!(waited >= GIVE_UP && waited < GIVE_UP * 3, "{waited:?}");
    }
}
