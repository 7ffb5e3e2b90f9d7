//! How a side that found nothing to do waits: spin for a bounded window (the fast path: the
//! other side usually answers within microseconds), then sleep on a word of the shared region.
//! The sleep is pluggable: a futex between processes of one host, timed polling across a VM
//! boundary where no futex reaches the other side.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Sleeps on, and wakes sleepers of, a 32-bit word in shared memory.
pub trait Waiter: Send + Sync {
    /// Sleeps while `*word == expected`, at most `timeout`. May return early.
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration);
    /// Wakes every sleeper on `word`.
    fn wake(&self, word: &AtomicU32);
}

/// A shared (not process-private) futex: works for any two processes mapping the same memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct FutexWaiter;

impl Waiter for FutexWaiter {
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: `word` is a valid, aligned u32 for the duration of the call; FUTEX_WAIT only
        // reads it. Errors (EAGAIN: value changed, ETIMEDOUT, EINTR) all mean "re-check".
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0,
            );
        }
    }

    fn wake(&self, word: &AtomicU32) {
        // SAFETY: as above; FUTEX_WAKE does not access the word's memory beyond its address.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
        }
    }
}

/// Timed polling for mappings no futex reaches (an ivshmem BAR inside a VM guest): the sleeper
/// re-checks after a short sleep that grows while it stays idle, so an idle guest costs the
/// host almost nothing and a busy one pays at most the current sleep.
#[derive(Debug, Clone, Copy)]
pub struct PollWaiter {
    pub max_sleep: Duration,
}

impl Default for PollWaiter {
    fn default() -> Self {
        PollWaiter {
            max_sleep: Duration::from_millis(2),
        }
    }
}

impl Waiter for PollWaiter {
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        let start = Instant::now();
        let mut sleep = Duration::from_micros(20);
        while word.load(Ordering::Acquire) == expected && start.elapsed() < timeout {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(self.max_sleep);
        }
    }

    fn wake(&self, _word: &AtomicU32) {}
}

/// How long to spin before sleeping, and how often a sleeper re-checks that its peer lives.
#[derive(Debug, Clone, Copy)]
pub struct SpinPolicy {
    /// Busy-wait this long first: a forwarded call usually answers within a few µs.
    pub spin: Duration,
    /// Then keep polling but yield the CPU between polls for up to this long (in all): on a
    /// machine with few cores the driver's own threads (which run the kernels we wait for)
    /// get the CPU, and a quick answer is still seen without a wake-up.
    pub yield_until: Duration,
    /// Then sleep, waking at least this often to check that the peer lives.
    pub sleep_slice: Duration,
}

impl Default for SpinPolicy {
    fn default() -> Self {
        // 50 ms bounds how late a dead peer is noticed (well under the 1 s a waiting call may
        // take to fail).
        SpinPolicy {
            spin: Duration::from_micros(20),
            yield_until: Duration::from_micros(200),
            sleep_slice: Duration::from_millis(50),
        }
    }
}
