//! Which program lanes live threads hold. A new thread takes a lane no live thread holds (the
//! lowest) and gives it back when it ends; only while more threads live than there are lanes do
//! threads share one. Before, lanes were dealt round-robin for good, so a program that starts
//! threads over time (a pool made anew, a thread per request) soon shared lanes among threads
//! that never ran at once: their calls then queued behind each other, and on a shared lane
//! they run on one worker thread, whose per-thread driver state (CUDA's current context) a
//! thread would see left by another.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Live threads per lane, and whether a thread ever took it.
#[derive(Debug)]
pub(crate) struct LaneUsers {
    live: Vec<AtomicU32>,
    taken: Vec<AtomicBool>,
}

/// A thread's hold on its lane, given back when the thread ends (its thread-local dies).
struct Hold {
    users: Arc<LaneUsers>,
    lane: usize,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.users.live[self.lane].fetch_sub(1, Ordering::AcqRel);
    }
}

thread_local! {
    static HOLD: RefCell<Option<Hold>> = const { RefCell::new(None) };
}

impl LaneUsers {
    /// For `lanes` program lanes.
    pub(crate) fn new(lanes: usize) -> Arc<LaneUsers> {
        Arc::new(LaneUsers {
            live: (0..lanes).map(|_| AtomicU32::new(0)).collect(),
            taken: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// A lane for the calling thread, held until it ends: the lowest no thread holds, or,
    /// when every one is held, the one the fewest threads share; and whether it is one a
    /// thread now ended took before (alone: not one shared with a live thread).
    pub(crate) fn take(self: &Arc<Self>) -> (usize, bool) {
        let (lane, alone) = self.pick();
        let before = self.taken[lane].swap(true, Ordering::AcqRel);
        HOLD.with(|h| {
            // A thread takes a lane once (the caller remembers it); should it take another,
            // the old hold goes first.
            *h.borrow_mut() = Some(Hold {
                users: self.clone(),
                lane,
            })
        });
        (lane, before && alone)
    }

    /// A lane, and whether no other live thread holds it.
    fn pick(&self) -> (usize, bool) {
        for (i, users) in self.live.iter().enumerate() {
            if users
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return (i, true);
            }
        }
        let (i, users) = self
            .live
            .iter()
            .enumerate()
            .min_by_key(|(_, u)| u.load(Ordering::Acquire))
            .expect("at least one lane");
        users.fetch_add(1, Ordering::AcqRel);
        (i, false)
    }

    #[cfg(test)]
    fn held(&self) -> Vec<u32> {
        self.live
            .iter()
            .map(|u| u.load(Ordering::Acquire))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_new_thread(users: &Arc<LaneUsers>) -> (usize, bool) {
        let users = users.clone();
        std::thread::spawn(move || users.take()).join().unwrap()
    }

    #[test]
    fn threads_that_end_give_their_lane_back() {
        let users = LaneUsers::new(3);
        assert_eq!(on_new_thread(&users), (0, false), "a lane never taken");
        // One after another: each finds lane 0 free again, taken before.
        for _ in 0..20 {
            assert_eq!(on_new_thread(&users), (0, true));
        }
        assert_eq!(users.held(), vec![0, 0, 0]);
    }

    #[test]
    fn live_threads_share_only_beyond_the_lanes() {
        let users = LaneUsers::new(3);
        let (tx, rx) = std::sync::mpsc::channel();
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(std::sync::Mutex::new(gate));
        let threads: Vec<_> = (0..5)
            .map(|_| {
                let (users, tx, gate) = (users.clone(), tx.clone(), gate.clone());
                let t = std::thread::spawn(move || {
                    tx.send(users.take()).unwrap();
                    let _ = gate.lock().unwrap().recv();
                });
                // One at a time, so each sees the holds before it.
                let lane = rx.recv().unwrap();
                (t, lane)
            })
            .collect();
        let lanes: Vec<(usize, bool)> = threads.iter().map(|(_, l)| *l).collect();
        assert_eq!(
            &lanes[..3],
            &[(0, false), (1, false), (2, false)],
            "a lane each while there are free ones"
        );
        assert!(
            lanes[3..].iter().all(|(_, reused)| !reused),
            "shared: no reset"
        );
        assert_eq!(users.held().iter().sum::<u32>(), 5);
        assert!(users.held().iter().all(|&n| n <= 2), "{:?}", users.held());
        for _ in 0..5 {
            release.send(()).unwrap();
        }
        for (t, _) in threads {
            t.join().unwrap();
        }
        assert_eq!(users.held(), vec![0, 0, 0]);
    }
}
