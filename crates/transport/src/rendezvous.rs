//! Where a guest client and a host worker find each other in a region that no socket
//! accompanies (an ivshmem BAR): a few words in the region's header page.
//!
//! On a local session the Unix socket tells each side when the other is gone; across a VM
//! boundary nothing does, so both sides publish a heartbeat here and watch the other's.
//!
//! ```text
//! worker:  reset region (state INIT) → epoch += 1 → state READY → sees a claim → SERVING
//! client:  waits for READY → CAS claim 0 → nonce → HELLO on lane 0 → WELCOME → calls …
//!          exit: client_state = CLOSED (or its heartbeat stops) → the worker ends the session,
//!          the supervisor starts a fresh worker that resets the region for the next client.
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Offset of the rendezvous block inside the region's header page (after the RegionHeader).
pub const RENDEZVOUS_OFFSET: usize = 1024;

pub const STATE_INIT: u32 = 0;
pub const STATE_READY: u32 = 1;
pub const STATE_SERVING: u32 = 2;

pub const CLIENT_NONE: u32 = 0;
pub const CLIENT_ACTIVE: u32 = 1;
pub const CLIENT_CLOSED: u32 = 2;

/// How often each side bumps its heartbeat.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(50);

#[repr(C)]
#[derive(Debug, Default)]
pub struct Rendezvous {
    /// Bumped by every worker that (re)initialises the region: a client whose session an
    /// earlier worker served sees the change and knows that session is gone.
    pub server_epoch: AtomicU32,
    pub server_state: AtomicU32,
    pub server_beat: AtomicU32,
    /// Zero while free; a client takes the region by swapping in a random nonce, so two
    /// processes of one guest never share a session.
    pub client_claim: AtomicU32,
    pub client_state: AtomicU32,
    pub client_beat: AtomicU32,
    /// Lanes the client has given to a thread: the worker serves only those (an idle lane
    /// costs a polling thread on the host).
    pub lanes_used: AtomicU64,
}

impl Rendezvous {
    pub fn beat_server(&self) {
        self.server_beat.fetch_add(1, Ordering::Release);
    }

    pub fn beat_client(&self) {
        self.client_beat.fetch_add(1, Ordering::Release);
    }

    /// Marks lane `i` as used by the client.
    pub fn use_lane(&self, i: u32) {
        if i < 64 {
            self.lanes_used.fetch_or(1 << i, Ordering::AcqRel);
        }
    }
}

/// Watches a heartbeat word: the peer is alive while the word keeps changing. Time is measured
/// on the watcher's own clock (a guest's and its host's clocks need not agree), and only while
/// the watcher watches: after it looked away for longer than the timeout (no call for a
/// while, or a stall of the whole machine, after which the watcher's thread may run before
/// the peer's beating one) the silence it did not see gives the peer a new window, not a
/// verdict. A peer that stays silent is still found dead one timeout later.
#[derive(Debug)]
pub struct BeatWatch {
    seen: Mutex<Seen>,
    timeout: Duration,
}

/// What the watcher saw of the beat.
#[derive(Debug)]
struct Seen {
    /// The word as last seen to change, and when.
    beat: u32,
    changed_at: Instant,
    /// When the watcher last looked.
    looked_at: Instant,
}

impl BeatWatch {
    pub fn new(current: u32, timeout: Duration) -> BeatWatch {
        let now = Instant::now();
        BeatWatch {
            seen: Mutex::new(Seen {
                beat: current,
                changed_at: now,
                looked_at: now,
            }),
            timeout,
        }
    }

    /// Whether the beat changed within the timeout (as of this check).
    pub fn alive(&self, word: &AtomicU32) -> bool {
        let beat = word.load(Ordering::Acquire);
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let away = now.duration_since(seen.looked_at) > self.timeout;
        seen.looked_at = now;
        if beat != seen.beat || away {
            (seen.beat, seen.changed_at) = (beat, now);
            return true;
        }
        now.duration_since(seen.changed_at) < self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_in_the_header_page() {
        assert!(RENDEZVOUS_OFFSET + std::mem::size_of::<Rendezvous>() <= 4096);
        assert!(RENDEZVOUS_OFFSET >= std::mem::size_of::<crate::region::RegionHeader>());
    }

    /// Looks every 5 ms for `ms`: whether the peer was alive at the last look.
    fn watch_for(watch: &BeatWatch, w: &AtomicU32, ms: u64) -> bool {
        let until = Instant::now() + Duration::from_millis(ms);
        let mut alive = watch.alive(w);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
            alive = watch.alive(w);
        }
        alive
    }

    #[test]
    fn a_silent_beat_times_out() {
        let w = AtomicU32::new(0);
        let watch = BeatWatch::new(0, Duration::from_millis(100));
        assert!(watch.alive(&w));
        assert!(!watch_for(&watch, &w, 150));
        w.fetch_add(1, Ordering::Relaxed);
        assert!(watch.alive(&w));
    }

    #[test]
    fn silence_the_watcher_did_not_watch_gives_a_new_window() {
        let w = AtomicU32::new(0);
        let watch = BeatWatch::new(0, Duration::from_millis(100));
        assert!(watch.alive(&w));
        // The watcher looks away (a stall of its own) for longer than the timeout.
        std::thread::sleep(Duration::from_millis(150));
        assert!(watch.alive(&w), "judged on silence it did not watch");
        // Still silent while it watches: dead one timeout later.
        assert!(!watch_for(&watch, &w, 150));
    }
}
