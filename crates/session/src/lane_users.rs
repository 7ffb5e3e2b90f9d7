//! Which program lanes live threads hold. A new thread takes a lane no live thread holds (the
//! lowest) and gives it back when it ends; only while more threads live than there are lanes do
//! threads share one. Before, lanes were dealt round-robin for good, so a program that starts
//! threads over time (a pool made anew, a thread per request) soon shared lanes among threads
//! that never ran at once: their calls then queued behind each other, and on a shared lane
//! they run on one worker thread, whose per-thread driver state (CUDA's current context) a
//! thread would see left by another.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// Live threads per lane, and whether a thread ever took it.
#[derive(Debug)]
pub(crate) struct LaneUsers {
    live: Vec<AtomicU32>,
    taken: Vec<AtomicBool>,
}

/// A thread's hold on its lane, given back when the thread ends.
struct Hold {
    users: Arc<LaneUsers>,
    lane: usize,
    /// Whether the key's destructor has put the hold back once already (see [`hold_key`]).
    rearmed: bool,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.users.live[self.lane].fetch_sub(1, Ordering::AcqRel);
    }
}

/// The pthread key a thread's hold hangs on. Its destructor runs when the thread ends, among
/// the other libraries' per-thread destructors (cudart's calls the driver from its own): the
/// first run puts the hold back, so the lane is given back in the next round, after those
/// calls, and a new thread that takes the lane cannot reset it under them. (A Rust
/// thread-local would be dropped before every pthread key's destructor.)
fn hold_key() -> Option<libc::pthread_key_t> {
    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a valid out-pointer and a destructor with the C signature.
        (unsafe { libc::pthread_key_create(&mut key, Some(release)) } == 0).then_some(key)
    })
}

unsafe extern "C" fn release(hold: *mut libc::c_void) {
    let hold = hold.cast::<Hold>();
    // SAFETY: the key holds only pointers from `Box::into_raw` in `take`, each seen here once
    // per round, and the key exists (this is its destructor).
    unsafe {
        if !(*hold).rearmed {
            (*hold).rearmed = true;
            if let Some(key) = hold_key() {
                if libc::pthread_setspecific(key, hold.cast()) == 0 {
                    return;
                }
            }
        }
        drop(Box::from_raw(hold));
    }
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
        let hold = Box::new(Hold {
            users: self.clone(),
            lane,
            rearmed: false,
        });
        // A thread takes a lane once (the caller remembers it).
        let kept = hold_key().is_some_and(|key| {
            let hold = Box::into_raw(hold);
            // SAFETY: the key exists; the pointer is released by its destructor.
            let ok = unsafe { libc::pthread_setspecific(key, hold.cast()) } == 0;
            if !ok {
                // SAFETY: not kept by the key: still ours.
                drop(unsafe { Box::from_raw(hold) });
            }
            ok
        });
        if !kept {
            // Nothing would give the lane back: it is not counted as held (another thread may
            // take it too), and not reset.
            return (lane, false);
        }
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
