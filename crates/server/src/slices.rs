//! Short CPU time slices for the worker's threads that run briefly, and those threads kept on
//! their local client's CPU, while the CPUs are oversubscribed.
//!
//! With more runnable threads than CPUs, a thread that wakes waits for a CPU. Linux's fair
//! scheduler (EEVDF, 6.6 and later) lets it preempt the running thread at once only when it
//! asks for a shorter slice than the running one, or when that one's protected slice is over;
//! otherwise it waits for the next scheduler tick (4 ms at HZ=250). Measured on 2 CPUs with 3
//! tenants flooding the device (`perf sched timehist --state`, a light tenant's 1,500 tiny
//! kernels + `clFinish`): its lane's wake-ups waited 2-4 ms at the tail, and in half the runs
//! of that setup the light tenant's median was 1.9 ms.
//!
//! So while the CPUs are oversubscribed (see [`Pressure`]) the worker asks for short slices
//! (`sched_attr.sched_runtime` of `SCHED_OTHER`, Linux 6.12 and later; older kernels ignore
//! it):
//! - every lane for [`LANE_SLICE`], the shortest there is, so that a lane's wake-up preempts
//!   a flooding thread;
//! - the worker's other threads (the driver's) for [`BRIEF_SLICE`] while they run briefly
//!   between sleeps (less than [`BRIEF_BURST`] on average) and little in all (under
//!   [`COMPUTING_SHARE`] of a CPU), and for the kernel's default slice once they compute (a
//!   flooding tenant's driver threads), so that a brief thread's wake-up preempts those too;
//! - lanes and brief threads on the CPU the client sends from ([`Follow`]; local sessions
//!   only), computing threads anywhere. Traces of that setup showed two kinds of runs: in
//!   good ones client, lane and driver threads shared a CPU and handed it to each other
//!   (0-3 calls of 1,500 over 300 µs); in bad ones they had settled on different CPUs and
//!   every hand-off had to preempt a flood (100-600 over 300 µs).
//!
//! A review every [`REVIEW_EVERY`] sorts them; it parks while the session is idle, so an
//! idle tenant costs no CPU. With CPUs to spare every thread keeps the default: there a lane
//! with a short slice preempts its own client on the client's CPU before the client has sent
//! its next request (a tenant alone on 2 CPUs: 80 µs per tiny kernel + `clFinish`, not 57).
//!
//! What slices cannot do: EEVDF places a woken thread at zero lag, so it still waits while
//! queued threads are owed CPU time, and once it has run ahead of them any eligible thread
//! it wakes preempts it (the lane, by the driver threads it has just woken: ~1.8 times per
//! call in the trace above). A slice changes when a thread runs, not how much it runs: CPU
//! shares stay as the weights (nice, cgroups) say. Threads the operator moved to another
//! policy are left alone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use wormhole_transport::contention::schedstat_run;

/// A lane's slice: the least the kernel accepts (100 µs).
pub const LANE_SLICE: Duration = Duration::from_micros(100);
/// The slice of a driver thread that runs briefly: a lane's. 300 µs (so that the driver
/// threads a lane wakes would not preempt it for being shorter) measured worse once brief
/// threads sit beside their client: 22 calls of 1,500 over 300 µs against 6 (medians of 9
/// alternating runs beside three floods; native 1-3).
pub const BRIEF_SLICE: Duration = LANE_SLICE;
/// A thread that runs longer than this between sleeps, on average, computes: default slice.
pub const BRIEF_BURST: Duration = Duration::from_millis(1);
/// A thread that ran more than this share of a CPU since the last look computes, however
/// often it slept. PoCL's threads running a flood's kernels (16 work-groups of ~0.6 ms,
/// handed out under a lock) sleep every 0.5-1 ms, so their bursts alone made them brief,
/// pinned beside the lanes, in some runs for good; they ran 0.45-0.55 of a CPU on 2 CPUs
/// beside 4 spinning processes, 0.13-0.36 in single windows. A light tenant's driver
/// threads ran 0.08-0.11 (tiny kernel + `clFinish` back to back, 7-10 µs bursts), its lane
/// 0.16-0.21.
pub const COMPUTING_SHARE: f64 = 0.3;
/// The first look of a session (and after a park) comes sooner: a light tenant's whole run
/// may last well under a second.
pub const FIRST_LOOK: Duration = Duration::from_millis(50);
/// How often the worker's threads are sorted while its session is busy.
pub const REVIEW_EVERY: Duration = Duration::from_millis(100);
/// Reviews without a call after which the review parks until the next call.
const IDLE_REVIEWS: u32 = 10;

/// Whether this worker asks for short slices at all (`short_slices` in the server's config).
static ENABLED: AtomicBool = AtomicBool::new(true);
/// Set while the review is parked; the next call unparks it.
static PARKED: AtomicBool = AtomicBool::new(false);
static REVIEWER: OnceLock<std::thread::Thread> = OnceLock::new();
/// The lanes' threads: the review gives them a lane's slice.
static LANES: Mutex<Option<HashSet<libc::pid_t>>> = Mutex::new(None);

/// What a thread asks of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    Lane,
    Brief,
    /// The kernel's own slice.
    Default,
}

impl Slice {
    fn runtime_ns(self) -> u64 {
        match self {
            Slice::Lane => LANE_SLICE.as_nanos() as u64,
            Slice::Brief => BRIEF_SLICE.as_nanos() as u64,
            Slice::Default => 0,
        }
    }
}

/// Turns the whole mechanism off (before any lane starts), for servers configured so.
pub fn disable() {
    ENABLED.store(false, Ordering::Relaxed);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Thread `tid`'s scheduling attributes, as `sched_getattr` reports them.
fn getattr(tid: libc::pid_t) -> std::io::Result<libc::sched_attr> {
    // SAFETY: an all-zero sched_attr is a valid value of this plain C struct.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::sched_attr>() as u32;
    // SAFETY: sched_getattr writes at most `size` bytes into `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr, size, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    attr.size = size;
    Ok(attr)
}

/// Asks the scheduler for `slice` on thread `tid` of this process, keeping its nice value.
/// Threads not under `SCHED_OTHER` (an operator's choice) are left as they are.
pub fn set(tid: libc::pid_t, slice: Slice) -> std::io::Result<()> {
    let mut attr = getattr(tid)?;
    if attr.sched_policy != libc::SCHED_OTHER as u32 {
        return Ok(());
    }
    attr.sched_flags = 0;
    attr.sched_runtime = slice.runtime_ns();
    // SAFETY: sched_setattr reads `attr` (of the size it states).
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &attr, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The slice `tid` has now, as the kernel reports it (Linux 6.12 and later report the slice
/// in force, 0 before that).
pub fn current(tid: libc::pid_t) -> std::io::Result<u64> {
    Ok(getattr(tid)?.sched_runtime)
}

/// Called by each lane thread as it starts: the review gives it a lane's slice.
pub fn lane() {
    if !enabled() {
        return;
    }
    LANES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(gettid());
}

/// Called on each call a lane serves: wakes a parked review (one load otherwise).
pub fn busy() {
    if PARKED.load(Ordering::Relaxed) && PARKED.swap(false, Ordering::AcqRel) {
        if let Some(t) = REVIEWER.get() {
            t.unpark();
        }
    }
}

/// What a local client's lanes say: per lane, the bytes it has sent so far and the CPU it
/// last sent from (`Region::request_activity`).
pub type ClientLanes = Box<dyn FnMut() -> Vec<(u64, Option<u32>)> + Send>;

/// Starts the review of the worker's threads; `calls` counts the calls the lanes served;
/// `client` (local clients only: a guest's CPUs are not the host's) tells where the client
/// runs, so that brief threads can be kept on its CPU while the CPUs are oversubscribed.
pub fn start_review(calls: &'static AtomicU64, client: Option<ClientLanes>) -> std::io::Result<()> {
    if !enabled() || REVIEWER.get().is_some() {
        return Ok(());
    }
    let handle = std::thread::Builder::new()
        .name("slices".into())
        .spawn(move || review_loop(calls, client))?;
    let _ = REVIEWER.set(handle.thread().clone());
    Ok(())
}

fn review_loop(calls: &'static AtomicU64, mut client: Option<ClientLanes>) {
    let mut seen = Seen::default();
    let mut follow = Follow::default();
    let mut pressure = Pressure::default();
    let me = gettid();
    let (mut last, mut idle) = (calls.load(Ordering::Relaxed), 0u32);
    // The pressure's first window starts now.
    pressure.look();
    let mut wait = FIRST_LOOK;
    loop {
        std::thread::sleep(wait);
        wait = REVIEW_EVERY;
        let now = calls.load(Ordering::Relaxed);
        if now == last {
            idle += 1;
            if idle >= IDLE_REVIEWS {
                PARKED.store(true, Ordering::Release);
                // A call between the load above and the store is caught by the next look.
                while PARKED.load(Ordering::Acquire) && calls.load(Ordering::Relaxed) == last {
                    std::thread::park();
                }
                PARKED.store(false, Ordering::Release);
                idle = 0;
                wait = FIRST_LOOK;
                pressure.look();
                continue;
            }
        } else {
            idle = 0;
        }
        last = now;
        let lanes = LANES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        let contended = pressure.look();
        let pin = match &mut client {
            Some(lanes_of_client) if contended => follow.cpu(lanes_of_client()),
            _ => None,
        };
        seen.review(contended, pin, |tid| lanes.contains(&tid), |tid| tid == me);
    }
}

/// Where a local client runs: the one CPU that every lane it used since the last look last
/// heard from (a client whose busy threads run on several CPUs has none).
#[derive(Default)]
pub struct Follow {
    heads: Vec<u64>,
    cpu: Option<u32>,
}

impl Follow {
    pub fn cpu(&mut self, lanes: Vec<(u64, Option<u32>)>) -> Option<u32> {
        let mut cpus = HashSet::new();
        for (i, &(head, cpu)) in lanes.iter().enumerate() {
            // A lane not seen before counts from nothing: a session's first look follows too.
            if self.heads.get(i).copied().unwrap_or(0) != head {
                cpus.insert(cpu);
            }
        }
        self.heads = lanes.iter().map(|l| l.0).collect();
        match cpus.len() {
            // Nothing sent: where it was.
            0 => {}
            1 => self.cpu = cpus.into_iter().next().flatten(),
            _ => self.cpu = None,
        }
        self.cpu
    }
}

/// Whether the CPUs are oversubscribed, seen once per review (a window of [`REVIEW_EVERY`]):
/// the kernel's CPU pressure ("some" in `/proc/pressure/cpu`: time in which some runnable
/// task waited for a CPU) over [`PRESSURE_SHARE`] of the window. The verdict holds [`HOLD`]
/// after it was last seen. Three tenants flooding 2 CPUs read 0.93-1.00 per window; a
/// tenant alone, 0-0.2. The review's own wake-up delay (which `contention` also watches for
/// pollers) is no help here: a driver that busy-waits (PoCL's workers spin for a while after
/// their work) delays it by milliseconds now and then with the machine otherwise idle.
/// Without PSI the CPUs never count as oversubscribed.
#[derive(Default)]
pub struct Pressure {
    at: Option<std::time::Instant>,
    psi_total_us: u64,
    last_seen: Option<std::time::Instant>,
}

/// The share of a window in which some task waited for a CPU that counts as oversubscribed.
pub const PRESSURE_SHARE: f64 = 0.75;
/// How long the verdict holds once seen.
pub const HOLD: Duration = Duration::from_secs(1);

impl Pressure {
    /// Called by the review thread once per review.
    pub fn look(&mut self) -> bool {
        let now = std::time::Instant::now();
        let Some(total) = std::fs::read_to_string("/proc/pressure/cpu")
            .ok()
            .and_then(|t| wormhole_transport::contention::psi_some_total(&t))
        else {
            return false;
        };
        // A longer window (the review was parked) stands for no moment in particular: it only
        // starts the next one.
        if let Some(at) = self
            .at
            .filter(|at| now.duration_since(*at) < 2 * REVIEW_EVERY)
        {
            let window_ns = now.duration_since(at).as_nanos() as f64;
            let stalled_ns = total.saturating_sub(self.psi_total_us).saturating_mul(1000);
            if stalled_ns as f64 > PRESSURE_SHARE * window_ns {
                self.last_seen = Some(now);
            }
        }
        (self.at, self.psi_total_us) = (Some(now), total);
        self.last_seen
            .is_some_and(|seen| now.duration_since(seen) < HOLD)
    }
}

/// What the review knew of each thread at its last look.
#[derive(Clone, Copy)]
struct Thread {
    /// Run time (ns) and voluntary sleeps so far, and when they were read.
    run: u64,
    sleeps: u64,
    at: std::time::Instant,
    /// Its average share of a CPU ([`Share`]); None before its first window.
    average_share: Option<f64>,
    /// What its behaviour calls for while the CPUs are oversubscribed.
    class: Slice,
    /// The slice it was given.
    given: Slice,
    /// The CPU it was kept on (None: those the worker may use), if known.
    kept_on: Option<Option<u32>>,
}

/// The review's memory of the process's threads.
#[derive(Default)]
pub struct Seen {
    threads: HashMap<libc::pid_t, Thread>,
    /// Whether the last review gave short slices or kept threads on a CPU (else every
    /// thread has the defaults, and an uncontended review has nothing to do).
    acted: bool,
    /// The CPUs the worker may use, as it started.
    allowed: Option<libc::cpu_set_t>,
}

impl Seen {
    /// Looks at every thread of this process but those `skip` names, and gives each the
    /// slice it calls for: while `contended`, lanes (`is_lane`) a lane's and the others
    /// by their recent behaviour; otherwise everyone the default. Lanes and brief threads
    /// are kept on CPU `pin` (the client's), where given and allowed; computing threads,
    /// and every thread without `pin`, may run on any CPU the worker may use.
    pub fn review(
        &mut self,
        contended: bool,
        pin: Option<u32>,
        is_lane: impl Fn(libc::pid_t) -> bool,
        skip: impl Fn(libc::pid_t) -> bool,
    ) {
        if !contended && !self.acted {
            return;
        }
        self.acted = contended;
        let allowed = *self.allowed.get_or_insert_with(|| {
            // SAFETY: an all-zero cpu_set_t is an empty set; sched_getaffinity fills it.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is a cpu_set_t of the size given.
            unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
            set
        });
        let pin = pin.filter(|&c| {
            (c as usize) < libc::CPU_SETSIZE as usize
                // SAFETY: CPU_ISSET reads the set; the index was checked against its size.
                && unsafe { libc::CPU_ISSET(c as usize, &allowed) }
        });
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let mut alive = HashSet::new();
        for entry in dir.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if skip(tid) {
                continue;
            }
            let Some((run, sleeps)) = thread_counts(tid) else {
                continue;
            };
            let at = std::time::Instant::now();
            let mut average_share = None;
            alive.insert(tid);
            let before = self.threads.get(&tid).copied();
            let class = if is_lane(tid) {
                Slice::Lane
            } else {
                match before {
                    Some(b) => {
                        let (ran, slept) =
                            (run.saturating_sub(b.run), sleeps.saturating_sub(b.sleeps));
                        let window = at.duration_since(b.at).as_nanos().max(1) as f64;
                        // A thread's first window is all its average knows.
                        let last = ran as f64 / window;
                        let share = Share::new(last, b.average_share.unwrap_or(last));
                        average_share = Some(share.average);
                        classify(ran, slept, share, b.class).unwrap_or(b.class)
                    }
                    // First sight: brief until it shows otherwise.
                    None => Slice::Brief,
                }
            };
            let want = if contended { class } else { Slice::Default };
            // A thread first seen has what it inherited (a lane's slice, maybe): set it.
            let mut given = before.map(|b| b.given);
            if given != Some(want) {
                match set(tid, want) {
                    Ok(()) => given = Some(want),
                    Err(e) => tracing::debug!("slice of thread {tid} unchanged: {e}"),
                }
            }
            let given = given.unwrap_or(Slice::Default);
            let keep_on = if want == Slice::Default { None } else { pin };
            let mut kept_on = before.and_then(|b| b.kept_on);
            if kept_on != Some(keep_on) {
                match keep(tid, keep_on, &allowed) {
                    Ok(()) => kept_on = Some(keep_on),
                    Err(e) => tracing::debug!("CPUs of thread {tid} unchanged: {e}"),
                }
            }
            self.threads.insert(
                tid,
                Thread {
                    run,
                    sleeps,
                    at,
                    average_share,
                    class,
                    given,
                    kept_on,
                },
            );
        }
        self.threads.retain(|tid, _| alive.contains(tid));
    }
}

/// Keeps thread `tid` on CPU `cpu`, or (None) lets it run on every CPU in `allowed`.
fn keep(tid: libc::pid_t, cpu: Option<u32>, allowed: &libc::cpu_set_t) -> std::io::Result<()> {
    let set = match cpu {
        Some(c) => {
            // SAFETY: an all-zero cpu_set_t is an empty set.
            let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `c` was checked against the set's size by the caller (`review`).
            unsafe { libc::CPU_SET(c as usize, &mut one) };
            one
        }
        None => *allowed,
    };
    // SAFETY: `set` is a cpu_set_t of the size given.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A thread's run time as a share of a CPU: in the window since the last look, and on
/// average (each look halves the weight of the ones before).
#[derive(Debug, Clone, Copy)]
pub struct Share {
    pub last: f64,
    pub average: f64,
}

impl Share {
    pub fn new(last: f64, average_before: f64) -> Share {
        Share {
            last,
            average: (last + average_before) / 2.0,
        }
    }
}

/// The slice for a thread of class `was` that ran `run_ns` and slept voluntarily `sleeps`
/// times since the last look, `share` of a CPU; `None` (keep what it has) if it did not run.
/// A thread computes as soon as one window shows it, and turns brief again only once its
/// average share is under half [`COMPUTING_SHARE`]: a flood's thread that waited for its
/// next kernel through one window (0.2-13 ms of 100) stays where it is.
pub fn classify(run_ns: u64, sleeps: u64, share: Share, was: Slice) -> Option<Slice> {
    if run_ns == 0 {
        return None;
    }
    let little = match was {
        Slice::Default => share.average < COMPUTING_SHARE / 2.0,
        Slice::Brief | Slice::Lane => share.last < COMPUTING_SHARE,
    };
    if run_ns / sleeps.max(1) < BRIEF_BURST.as_nanos() as u64 && little {
        Some(Slice::Brief)
    } else {
        Some(Slice::Default)
    }
}

/// A thread's total run time (ns, `schedstat`) and voluntary context switches (`status`).
fn thread_counts(tid: libc::pid_t) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    Some((schedstat_run(&stat)?, voluntary_switches(&status)?))
}

/// The `voluntary_ctxt_switches` of a `status` file.
pub fn voluntary_switches(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_counts() {
        assert_eq!(schedstat_run("1057062785 7345187 1176\n"), Some(1057062785));
        assert_eq!(schedstat_run(""), None);
        let status =
            "Name:\tlane-0\nvoluntary_ctxt_switches:\t812\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(voluntary_switches(status), Some(812));
        assert_eq!(voluntary_switches("Name:\tx\n"), None);
    }

    #[test]
    fn sorts_by_run_between_sleeps() {
        let (brief, computing) = (Slice::Brief, Slice::Default);
        let share = |last| Share::new(last, last);
        // A light tenant's driver thread: 20 µs per wake-up, 0.02 of a CPU.
        assert_eq!(classify(2_000_000, 100, share(0.02), brief), Some(brief));
        // A flooding one: 100 ms of kernels between two sleeps.
        assert_eq!(classify(100_000_000, 1, share(1.0), brief), Some(computing));
        // Ran without sleeping at all.
        assert_eq!(classify(5_000_000, 0, share(0.05), brief), Some(computing));
        // Computed half the window, sleeping every 0.7 ms (work-groups handed out).
        assert_eq!(classify(50_000_000, 70, share(0.5), brief), Some(computing));
        // The same at 0.05 of a CPU: brief.
        assert_eq!(classify(50_000_000, 70, share(0.05), brief), Some(brief));
        // A computing thread's quiet window after busy ones leaves it computing (its
        // average is 0.25); a second one makes it brief (0.125).
        let quiet = Share::new(0.002, 0.5);
        assert_eq!(classify(200_000, 16, quiet, computing), Some(computing));
        let quieter = Share::new(0.002, quiet.average);
        assert_eq!(classify(200_000, 16, quieter, computing), Some(brief));
        // A brief thread's window at 0.2 leaves it brief.
        assert_eq!(classify(20_000_000, 40, share(0.2), brief), Some(brief));
        assert_eq!(classify(0, 0, share(0.0), brief), None);
    }

    #[test]
    fn pressure_is_seen_while_cpus_are_oversubscribed() {
        if !std::path::Path::new("/proc/pressure/cpu").exists() {
            eprintln!("skipped: no PSI here");
            return;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hogs = wormhole_transport::contention::SpinningThreads::start(2 * cpus + 1);
        let mut p = Pressure::default();
        let mut seen = false;
        for _ in 0..20 {
            std::thread::sleep(REVIEW_EVERY);
            seen |= p.look();
        }
        drop(hogs);
        assert!(seen, "oversubscription not seen");
    }

    #[test]
    fn follows_the_one_cpu_the_busy_lanes_heard_from() {
        let mut f = Follow::default();
        // Lane 0 sent from CPU 1 (since the start), lane 1 nothing.
        assert_eq!(f.cpu(vec![(100, Some(1)), (0, None)]), Some(1));
        // And again.
        assert_eq!(f.cpu(vec![(200, Some(1)), (0, None)]), Some(1));
        // Nothing sent: still CPU 1.
        assert_eq!(f.cpu(vec![(200, Some(1)), (0, None)]), Some(1));
        // The client moved.
        assert_eq!(f.cpu(vec![(300, Some(0)), (0, None)]), Some(0));
        // Two busy lanes on two CPUs: none.
        assert_eq!(f.cpu(vec![(400, Some(0)), (50, Some(1))]), None);
        // Both on one CPU again.
        assert_eq!(f.cpu(vec![(500, Some(1)), (60, Some(1))]), Some(1));
    }

    /// Whether this kernel keeps custom slices (Linux 6.12+): a probe thread asks for one.
    fn kernel_keeps_slices() -> bool {
        std::thread::spawn(|| {
            let tid = gettid();
            set(tid, Slice::Lane).is_ok() && current(tid).ok() == Some(LANE_SLICE.as_nanos() as u64)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn review_gives_brief_threads_short_slices_and_busy_ones_the_default() {
        if !kernel_keeps_slices() {
            eprintln!("skipped: this kernel has no custom slices");
            return;
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let spawn = |busy: bool| {
            let stop = stop.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let h = std::thread::spawn(move || {
                tx.send(gettid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if busy {
                        std::hint::spin_loop();
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
            (rx.recv().unwrap(), h)
        };
        let (brief, hb) = spawn(false);
        let (busy, hs) = spawn(true);
        let me = gettid();
        let mut seen = Seen::default();
        let (lane, no_lane) = (|t| t == me, |_| false);
        seen.review(true, None, no_lane, lane);
        std::thread::sleep(Duration::from_millis(150));
        seen.review(true, None, no_lane, lane);
        let (b, s) = (current(brief).unwrap(), current(busy).unwrap());
        // The calling thread stands for a lane here.
        let mut lanes = Seen::default();
        lanes.review(true, None, lane, |t| t != me);
        let l = current(me).unwrap();
        // With CPUs to spare, everyone goes back to the default.
        seen.review(false, None, no_lane, lane);
        lanes.review(false, None, lane, |t| t != me);
        let (b2, s2, l2) = (
            current(brief).unwrap(),
            current(busy).unwrap(),
            current(me).unwrap(),
        );
        stop.store(true, Ordering::Relaxed);
        hb.join().unwrap();
        hs.join().unwrap();
        assert_eq!(b, BRIEF_SLICE.as_nanos() as u64, "the sleeper's slice");
        assert!(
            s > BRIEF_SLICE.as_nanos() as u64,
            "the spinner's slice: {s}"
        );
        assert_eq!(l, LANE_SLICE.as_nanos() as u64, "the lane's slice");
        assert!(
            b2 == s2 && s2 == l2 && l2 == s,
            "defaults: {b2} {s2} {l2} (busy had {s})"
        );
    }
}
