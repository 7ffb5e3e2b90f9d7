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
        let _precise = PreciseSleeps::new();
        while word.load(Ordering::Acquire) == expected && start.elapsed() < timeout {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(self.max_sleep);
        }
    }

    fn wake(&self, _word: &AtomicU32) {}
}

/// The calling thread's sleeps end within 1 µs of their time while this lives: a poller's
/// first sleeps (20, 40 µs) are the latency of the answer it waits for, and the kernel's
/// default timer slack (50 µs for an ordinary thread) more than tripled them (a tiny kernel
/// and `clFinish` through a guest region: 94 µs, with this 54–59 µs). The thread's own slack
/// comes back after, so the application's sleeps are its own affair.
struct PreciseSleeps {
    before: libc::c_int,
}

impl PreciseSleeps {
    fn new() -> PreciseSleeps {
        // SAFETY: PR_GET/SET_TIMERSLACK read and set a number of the calling thread only.
        unsafe {
            let before = libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0);
            libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
            PreciseSleeps { before }
        }
    }
}

impl Drop for PreciseSleeps {
    fn drop(&mut self) {
        if self.before > 0 {
            // SAFETY: as above.
            unsafe {
                libc::prctl(
                    libc::PR_SET_TIMERSLACK,
                    self.before as libc::c_ulong,
                    0,
                    0,
                    0,
                )
            };
        }
    }
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

impl SpinPolicy {
    /// Looks for `ready` as a waiting side does before it sleeps: spinning for the spin
    /// window, then yielding between looks up to `yield_until`, and neither while the CPUs
    /// are oversubscribed (see `contention`: there both only delay the threads waited for).
    /// True once `ready` said so; false when it is time to sleep.
    pub fn poll<E>(&self, mut ready: impl FnMut() -> Result<bool, E>) -> Result<bool, E> {
        let start = Instant::now();
        if ready()? {
            return Ok(true);
        }
        let polite = !self.spin.is_zero() || !self.yield_until.is_zero();
        if polite && crate::contention::contended() {
            return Ok(false);
        }
        let mut i = 0u32;
        loop {
            if ready()? {
                return Ok(true);
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(64) && start.elapsed() >= self.spin {
                break;
            }
            std::hint::spin_loop();
        }
        while start.elapsed() < self.yield_until {
            std::thread::yield_now();
            if ready()? {
                return Ok(true);
            }
        }
        Ok(false)
    }
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

/// A stream socket read the way a ring is waited on: look without blocking for the spin
/// window, then yield between looks, then sleep in the kernel. A reader asleep in the kernel
/// is woken by the delivery of the bytes, which cost ~20 µs a side on a 2-core VM (a loopback
/// ping-pong of two blocking readers took 52–61 µs, of two spinning ones 9–12 µs); an idle
/// session still sleeps once the window has passed. The threads a reader hands frames to
/// should sleep at once: they are woken by the reader, which is running then (a cheap wake-up),
/// and spinning beside it took the CPUs it needed (a round trip of TCP with reader and lane
/// threads all spinning: ~60 µs; with the readers alone: ~20 µs).
///
/// Only reads of up to `bulk_from` bytes spin: a frame reader's buffer is filled by reads of
/// its size, and a larger read is the rest of a bulk body, whose bytes stream in at the
/// sender's pace, so spinning there only takes the CPU the sender needs. The owner may also
/// turn spinning off while it expects nothing soon (`set_spin`).
pub struct SpinRead<S> {
    inner: S,
    policy: SpinPolicy,
    bulk_from: usize,
    /// Whether reads spin at all now (the owner's say: see `set_spin`).
    spin: bool,
}

impl<S: std::io::Read + std::os::fd::AsRawFd> SpinRead<S> {
    /// Reads spin within `policy`, those longer than `bulk_from` bytes sleep at once (see
    /// above: pass the capacity of the buffer that reads through this).
    pub fn new(inner: S, policy: SpinPolicy, bulk_from: usize) -> SpinRead<S> {
        SpinRead {
            inner,
            policy,
            bulk_from,
            spin: true,
        }
    }

    /// Whether the next reads spin: a reader that expects nothing soon (behind pipelined
    /// frames, whose sender does not wait) leaves the CPU to the threads that have work.
    pub fn set_spin(&mut self, spin: bool) {
        self.spin = spin;
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: std::io::Read + std::os::fd::AsRawFd> std::io::Read for SpinRead<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.spin || buf.len() > self.bulk_from {
            return self.inner.read(buf);
        }
        let fd = self.inner.as_raw_fd();
        read_spinning(fd, buf, self.policy, |buf| self.inner.read(buf))
    }
}

/// One read of stream socket `fd` that looks for bytes without blocking as `policy` polls,
/// then sleeps in `read` (the socket's blocking read; see [`SpinRead`]).
pub fn read_spinning(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    policy: SpinPolicy,
    read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<usize> {
    let mut got = 0;
    let arrived = policy.poll(|| {
        // SAFETY: `buf` is writable for its length; a bad descriptor is an error, not UB.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            got = n as usize;
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(false),
            _ => Err(e),
        }
    })?;
    if arrived {
        return Ok(got);
    }
    // Asleep until bytes come (or the stream's own read timeout passes).
    read(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// Bytes that come within the spin window, after it (the read sleeps in the kernel), and
    /// the peer's close all reach the reader as a plain read would give them.
    #[test]
    fn a_spinning_read_gets_what_a_blocking_one_would() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut r = SpinRead::new(rx, SpinPolicy::default(), 1 << 16);
        let writer = std::thread::spawn(move || {
            tx.write_all(b"soon").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            tx.write_all(b"late").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            tx.write_all(&[9u8; 100 << 10]).unwrap();
            tx.write_all(b"idle").unwrap();
        });
        let mut buf = [0u8; 4];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"soon");
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late");
        // A bulk read (beyond 64 KiB) and a read told not to spin sleep at once, and get the
        // same bytes.
        let mut bulk = vec![0u8; 100 << 10];
        r.read_exact(&mut bulk).unwrap();
        assert!(bulk.iter().all(|&b| b == 9));
        r.set_spin(false);
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"idle");
        writer.join().unwrap();
        assert_eq!(
            r.read(&mut buf).unwrap(),
            0,
            "the peer's close is an end of file"
        );
    }

    /// A poller sleeps precisely, and leaves the thread's own timer slack as it found it.
    #[test]
    fn a_poll_leaves_the_threads_timer_slack_alone() {
        // SAFETY: reads the calling thread's slack only.
        let slack = || unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        // SAFETY: sets the calling thread's slack only.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 77_000 as libc::c_ulong, 0, 0, 0) };
        {
            let _precise = PreciseSleeps::new();
            assert_eq!(slack(), 1000);
        }
        let word = AtomicU32::new(0);
        PollWaiter::default().wait(&word, 0, Duration::from_millis(1));
        assert_eq!(slack(), 77_000);
    }
}
