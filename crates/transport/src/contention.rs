//! Whether the machine's CPUs are oversubscribed right now. A waiting side that spins or yields
//! keeps (or hands away) a CPU that others are queueing for: under oversubscription a yield
//! gives a busy thread a whole time slice (milliseconds) before the waiter runs again, and a
//! spinner delays the very thread it waits for. So waiters skip both and sleep at once while
//! the CPUs are oversubscribed, and poll only on a machine with CPU to spare.
//!
//! The signal is the kernel's pressure-stall accounting (`/proc/pressure/cpu`, "some": time in
//! which at least one runnable task waited for a CPU) above [`PRESSURE_SHARE`] in two
//! [`SAMPLE_EVERY`] windows in a row; without PSI, more runnable tasks than CPUs
//! (`/proc/loadavg`). The verdict "contended" holds for [`HOLD`] after pressure was last
//! seen, so a waiter that stops polling (and so relieves the pressure it added) does not flap
//! back at the next sample. The bar is high and the windows long because a tenant's own
//! threads make pressure too: a forwarded call's client, lane and driver threads hand the CPU
//! to each other in turn (a tiny-kernel loop on 2 CPUs: 0.4-0.6 in 25 ms windows, a single
//! window up to 0.9), while tenants that keep every CPU busy hold it at 1.0.
//!
//! PSI misses a machine whose CPUs are each kept busy by one thread of others (a tenant
//! flooding 2 CPUs with 2 driver threads): nobody waits until a poller yields to them, and
//! then the poller waits a whole slice. So each waiting thread also watches its own wait for
//! a CPU per time slice (`/proc/thread-self/schedstat`), and sleeps at once for [`OWN_HOLD`]
//! after its wake-ups waited more than [`OWN_WAIT`] on average.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often the pressure is read (a read costs a few µs; the check in between is two loads).
/// The kernel folds stall time into its totals in bursts, so shorter windows read as noise.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(25);
/// How long a contended verdict holds once pressure was seen.
pub const HOLD: Duration = Duration::from_millis(100);
/// The share of a window in which some task waited for a CPU that counts as pressure.
const PRESSURE_SHARE: f64 = 0.75;
/// A thread whose time slices waited this long on average for a CPU is losing it to others.
const OWN_WAIT: Duration = Duration::from_micros(100);
/// How long that verdict holds: while it holds the thread sleeps, so its waits look short
/// again, and each time polling resumes it costs a slice. Long, so that this is rare.
pub const OWN_HOLD: Duration = Duration::from_secs(1);
enum Source {
    /// `/proc/pressure/cpu`: the "some" line's cumulative µs.
    Psi(File),
    /// `/proc/loadavg`: runnable tasks now, against this many CPUs.
    LoadAvg(File, u64),
    /// Neither: never contended (the waiters spin as they always did).
    None,
}

struct Detector {
    source: Source,
    start: Instant,
    /// Nanoseconds since `start` of the last sample; 0 before the first.
    sampled_at: AtomicU64,
    /// The PSI total (µs) at the last sample.
    last_total: AtomicU64,
    /// Nanoseconds since `start` when pressure was last seen.
    pressure_at: AtomicU64,
    /// Whether the last window was over the bar (the verdict needs two in a row).
    over_once: AtomicBool,
    contended: AtomicBool,
    /// One sampler at a time; the others use the verdict as it stands.
    sampling: AtomicBool,
}

fn detector() -> &'static Detector {
    static D: OnceLock<Detector> = OnceLock::new();
    D.get_or_init(|| {
        let source = if let Ok(f) = File::open("/proc/pressure/cpu") {
            Source::Psi(f)
        } else if let Ok(f) = File::open("/proc/loadavg") {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
            Source::LoadAvg(f, cpus)
        } else {
            Source::None
        };
        Detector {
            source,
            start: Instant::now(),
            sampled_at: AtomicU64::new(0),
            last_total: AtomicU64::new(0),
            pressure_at: AtomicU64::new(0),
            over_once: AtomicBool::new(false),
            contended: AtomicBool::new(false),
            sampling: AtomicBool::new(false),
        }
    })
}

fn read(f: &File) -> Option<String> {
    let mut buf = [0u8; 256];
    let n = f.read_at(&mut buf, 0).ok()?;
    String::from_utf8(buf[..n].to_vec()).ok()
}

/// The cumulative "some" stall time in µs, from the first line of `/proc/pressure/cpu`.
pub fn psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Runnable tasks now, from `/proc/loadavg`'s fourth field ("running/total").
pub fn loadavg_running(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Whether CPUs are oversubscribed now, for the calling thread (see the module's comment).
pub fn contended() -> bool {
    let d = detector();
    let now = d.start.elapsed().as_nanos() as u64;
    let last = d.sampled_at.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= SAMPLE_EVERY.as_nanos() as u64
        && !d.sampling.swap(true, Ordering::Acquire)
    {
        sample(d, now, last);
        d.sampling.store(false, Ordering::Release);
    }
    d.contended.load(Ordering::Relaxed) || own_wake_ups_wait(now)
}

/// What this thread's own scheduler statistics said at its last look.
#[derive(Clone, Copy, Default)]
struct OwnWaits {
    /// Nanoseconds since the detector's start of the last look (0: none yet).
    sampled_at: u64,
    /// Cumulative nanoseconds spent runnable but waiting for a CPU, and time slices run.
    waited_ns: u64,
    slices: u64,
    /// Until when (detector nanoseconds) the last verdict "its wake-ups wait" holds.
    until: u64,
}

thread_local! {
    static OWN: std::cell::Cell<OwnWaits> = std::cell::Cell::new(OwnWaits::default());
}

/// Whether this thread, once runnable, has lately waited long for a CPU on average
/// (`/proc/thread-self/schedstat`: time on a run queue per time slice). That is the cost of
/// polling that PSI cannot tell from a tenant's own hand-offs: beside one flooding tenant
/// (no CPU pressure to speak of, two CPUs busy) a polling lane's yield handed the flood a
/// whole slice, ~0.6 ms per wake-up of the lane, where alone it waits ~10 µs.
fn own_wake_ups_wait(now: u64) -> bool {
    OWN.with(|own| {
        let mut o = own.get();
        if now.saturating_sub(o.sampled_at) >= SAMPLE_EVERY.as_nanos() as u64 {
            if let Some((waited_ns, slices)) = own_schedstat() {
                let (dw, ds) = (
                    waited_ns.saturating_sub(o.waited_ns),
                    slices.saturating_sub(o.slices),
                );
                if o.sampled_at != 0 && ds > 0 && dw / ds > OWN_WAIT.as_nanos() as u64 {
                    o.until = now + OWN_HOLD.as_nanos() as u64;
                }
                (o.waited_ns, o.slices) = (waited_ns, slices);
            }
            o.sampled_at = now.max(1);
            own.set(o);
        }
        now < o.until
    })
}

/// The calling thread's run-queue wait (ns) and time slices, if the kernel keeps them.
fn own_schedstat() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    schedstat_waits(&text)
}

/// The first field of a schedstat line: time run on a CPU (ns).
pub fn schedstat_run(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The second and third fields of a schedstat line: run-queue wait (ns) and time slices.
pub fn schedstat_waits(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace().skip(1);
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

fn sample(d: &Detector, now: u64, last: u64) {
    let pressure = match &d.source {
        Source::Psi(f) => read(f).and_then(|t| psi_some_total(&t)).map(|total| {
            let before = d.last_total.swap(total, Ordering::Relaxed);
            let stalled_ns = total.saturating_sub(before).saturating_mul(1000);
            // The first sample has no interval to compare with.
            let over =
                last != 0 && stalled_ns as f64 > PRESSURE_SHARE * now.saturating_sub(last) as f64;
            // A window longer than two means nobody asked for a while: it stands alone.
            let recent = now.saturating_sub(last) < 2 * SAMPLE_EVERY.as_nanos() as u64;
            let before_over = d.over_once.swap(over, Ordering::Relaxed) && recent;
            over && before_over
        }),
        Source::LoadAvg(f, cpus) => read(f)
            .and_then(|t| loadavg_running(&t))
            .map(|running| running > *cpus),
        Source::None => None,
    };
    d.sampled_at.store(now, Ordering::Relaxed);
    if pressure == Some(true) {
        d.pressure_at.store(now, Ordering::Relaxed);
        d.contended.store(true, Ordering::Relaxed);
    } else if now.saturating_sub(d.pressure_at.load(Ordering::Relaxed)) >= HOLD.as_nanos() as u64 {
        d.contended.store(false, Ordering::Relaxed);
    }
}

/// Threads that keep this many CPUs busy until dropped: for tests of what happens while the
/// CPUs are oversubscribed (here and in the server's).
#[doc(hidden)]
pub struct SpinningThreads {
    stop: std::sync::Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SpinningThreads {
    pub fn start(n: usize) -> SpinningThreads {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        SpinningThreads { stop, threads }
    }
}

impl Drop for SpinningThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pressure_and_load() {
        let psi = "some avg10=85.63 avg60=89.47 avg300=77.21 total=4046690721\n\
                   full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(psi_some_total(psi), Some(4046690721));
        assert_eq!(psi_some_total("full total=3\n"), None);
        assert_eq!(loadavg_running("8.29 9.89 6.59 4/135 1273\n"), Some(4));
        assert_eq!(loadavg_running("garbage"), None);
        assert_eq!(
            schedstat_waits("1057062785 7345187 1176\n"),
            Some((7345187, 1176))
        );
        assert_eq!(schedstat_waits("12"), None);
    }

    #[test]
    fn contention_is_seen_while_cpus_are_oversubscribed() {
        if !std::path::Path::new("/proc/pressure/cpu").exists() {
            return; // the load-average fallback is covered by the parser test
        }
        // Twice as many spinning threads as CPUs, for a few sample intervals.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hogs = SpinningThreads::start(2 * cpus + 1);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut seen = false;
        while Instant::now() < deadline && !seen {
            seen = contended();
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(hogs);
        assert!(seen, "oversubscription not detected");
    }
}
