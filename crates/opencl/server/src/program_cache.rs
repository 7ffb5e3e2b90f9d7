//! The program cache every session of the server shares: the binaries of programs built from
//! source, keyed by what determines them (the source, the build options, and the device and
//! its driver), kept in the server's blob cache (`wormhole-blobcache`). A tenant that builds a
//! program any session built before gets it from the binary in about a millisecond instead of
//! waiting for the compiler (PoCL here: ~0.7 s cold, ~45 ms even from its own kernel cache).
//! `custom/program.rs` decides when an entry may serve a build, and what a store does.
//!
//! Storing can cost as much as the build itself (a CPU driver generates code for every kernel
//! when asked for binaries), and PoCL runs one compiler job at a time per process, so a store
//! beside the application's work delays it just as a store in the build's reply would. Such
//! stores therefore wait for a quiet moment (no request for `QUIET`, no build running) on one
//! background thread. A build whose keys are still waiting runs their store at once and is
//! served from it, rather than compiling the same program a second time; a session's
//! remaining stores run after its client has gone, for at most `END_BUDGET`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use wormhole_blobcache::BlobCache;
pub use wormhole_blobcache::Key;

/// Builds served from the cache, and builds that compiled (and then filled the cache).
pub static HITS: AtomicU64 = AtomicU64::new(0);
pub static MISSES: AtomicU64 = AtomicU64::new(0);
/// Builds not stored because a build from their binary would describe its kernels otherwise.
pub static UNCACHEABLE: AtomicU64 = AtomicU64::new(0);
/// Builds not stored because no quiet moment came for them (`MAX_QUEUED`, `END_BUDGET`).
pub static STORES_SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Stores waiting for a quiet moment at most; a session that builds more than this without
/// pause keeps the latest (the ones most likely built again soon).
const MAX_QUEUED: usize = 32;
/// How long the session must make no request before a store may run.
const QUIET: Duration = Duration::from_millis(50);
/// How long a worker whose client has gone goes on storing before it exits: it still counts
/// as the tenant's session until then.
const END_BUDGET: Duration = Duration::from_secs(2);
/// How long a build waits for a store of its own keys before compiling after all (a store is
/// one build of the program: far less, unless the driver is stuck).
const PENDING_WAIT: Duration = Duration::from_secs(120);

/// Builds of the application's running now (a long request no call count shows).
static BUILDS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Marks one build of the application's as running while it lives.
pub struct Building(());

impl Building {
    pub fn start() -> Building {
        BUILDS_RUNNING.fetch_add(1, Ordering::Relaxed);
        Building(())
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        BUILDS_RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What changes whenever the session does something.
fn activity() -> (u64, usize) {
    (
        wormhole_server::worker::calls_served(),
        BUILDS_RUNNING.load(Ordering::Relaxed),
    )
}

static CACHE: OnceLock<ProgramCache> = OnceLock::new();

/// Work that stores a build's entries, run on the background thread.
pub type StoreWork = Box<dyn FnOnce(&ProgramCache) + Send>;

struct Job {
    keys: Vec<Key>,
    work: StoreWork,
}

#[derive(Default)]
struct Stores {
    queue: VecDeque<Job>,
    /// The keys of the job the thread runs now.
    running: Option<Vec<Key>>,
    thread_started: bool,
    /// Builds waiting for a store of their keys: the front job runs without a quiet moment.
    waiting: usize,
    /// The session's client is gone: no new jobs, no waiting for quiet moments.
    closed: bool,
}

impl Stores {
    fn pending(&self, keys: &[Key]) -> bool {
        self.running
            .iter()
            .chain(self.queue.iter().map(|j| &j.keys))
            .any(|ks| ks.iter().any(|k| keys.contains(k)))
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_none()
    }
}

/// The worker's cache, if the server has one (set once at start; none in tests and fuzzing).
pub fn get() -> Option<&'static ProgramCache> {
    CACHE.get()
}

/// Sets the worker's cache; call once, before serving.
pub fn set(cache: BlobCache) {
    let _ = CACHE.set(ProgramCache::new(cache));
}

/// End of the session: no new stores; the queued ones run for at most `END_BUDGET`, and the
/// one running is done before this returns (the worker exits next: a thread still inside
/// the driver could crash its exit handlers).
pub fn finish() {
    if let Some(cache) = get() {
        cache.finish_stores(END_BUDGET);
    }
}

/// The key of a program built from `source` with `options` for a device described by
/// `device_identity` (platform and device names and versions, driver version).
pub fn key(device_identity: &[&[u8]], options: &[u8], source: &[u8]) -> Key {
    let mut inputs: Vec<&[u8]> = device_identity.to_vec();
    inputs.push(options);
    inputs.push(source);
    // The domain names what an entry promises: "/2" entries were checked to describe their
    // kernels as the compiled program does (see custom/program.rs), so older ones never match.
    wormhole_blobcache::key(b"opencl-program/2", &inputs)
}

/// One device's share of a built program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub binary: Vec<u8>,
    pub log: Vec<u8>,
}

pub struct ProgramCache {
    blobs: BlobCache,
    stores: Mutex<Stores>,
    changed: Condvar,
}

impl ProgramCache {
    fn new(blobs: BlobCache) -> ProgramCache {
        ProgramCache {
            blobs,
            stores: Mutex::default(),
            changed: Condvar::new(),
        }
    }

    /// The entry stored under `key`, if there is a sound one (a program needs a binary).
    pub fn load(&self, key: &Key) -> Option<Entry> {
        match <[Vec<u8>; 2]>::try_from(self.blobs.load(key)?) {
            Ok([log, binary]) if !binary.is_empty() => Some(Entry { binary, log }),
            _ => {
                self.blobs.discard(key);
                None
            }
        }
    }

    pub fn store(&self, key: &Key, entry: &Entry) {
        self.blobs.store(key, &[&entry.log, &entry.binary]);
    }

    pub fn discard(&self, key: &Key) {
        self.blobs.discard(key);
    }

    fn stores(&self) -> std::sync::MutexGuard<'_, Stores> {
        self.stores.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `work` (which stores the entries of `keys`) on the background thread at the
    /// session's next quiet moment; false, and nothing runs, if the session is over or no
    /// thread could start.
    pub fn store_later(&'static self, keys: Vec<Key>, work: StoreWork) -> bool {
        let mut st = self.stores();
        if st.closed {
            return false;
        }
        if !st.thread_started {
            let spawned = std::thread::Builder::new()
                .name("program-store".into())
                .spawn(move || self.run_stores());
            if let Err(e) = spawned {
                tracing::warn!("program cache: no thread for stores ({e}); not stored");
                return false;
            }
            st.thread_started = true;
        }
        if st.queue.len() >= MAX_QUEUED {
            st.queue.pop_front();
            STORES_SKIPPED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("program cache: {MAX_QUEUED} stores waiting; the oldest dropped");
        }
        st.queue.push_back(Job { keys, work });
        self.changed.notify_all();
        true
    }

    /// Waits (a bounded time) until no store of any of `keys` is queued or running; a queued
    /// one is run next, without waiting for a quiet moment.
    pub fn wait_for_stores(&self, keys: &[Key]) {
        let deadline = Instant::now() + PENDING_WAIT;
        let mut st = self.stores();
        if !st.pending(keys) {
            return;
        }
        if let Some(i) = st
            .queue
            .iter()
            .position(|j| j.keys.iter().any(|k| keys.contains(k)))
        {
            if let Some(job) = st.queue.remove(i) {
                st.queue.push_front(job);
            }
        }
        st.waiting += 1;
        self.changed.notify_all();
        while st.pending(keys) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "program cache: the store of this build is still running; compiling instead"
                );
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.waiting -= 1;
    }

    fn finish_stores(&self, budget: Duration) {
        let deadline = Instant::now() + budget;
        let mut st = self.stores();
        st.closed = true;
        self.changed.notify_all();
        while !st.idle() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !st.queue.is_empty() {
                let n = st.queue.len();
                st.queue.clear();
                STORES_SKIPPED.fetch_add(n as u64, Ordering::Relaxed);
                tracing::debug!("program cache: {n} stores left undone as the session ends");
            }
            st = if left.is_zero() {
                // Only the running store is left: it must finish before the worker exits.
                self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
            } else {
                self.changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            };
        }
    }

    /// The background thread: runs queued stores one at a time at quiet moments, below the
    /// session's own threads in the scheduler's eyes (a CPU device's kernels run beside it).
    fn run_stores(&self) {
        // SAFETY: a plain syscall on this thread's own id.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
        }
        let mut st = self.stores();
        loop {
            if st.queue.is_empty() {
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if !(st.closed || st.waiting > 0) {
                let (before, since) = (activity(), Instant::now());
                st = self
                    .changed
                    .wait_timeout(st, QUIET)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                let urgent = st.closed || st.waiting > 0;
                let quiet = since.elapsed() >= QUIET && activity() == before && before.1 == 0;
                if !(urgent || quiet) {
                    continue;
                }
            }
            let Some(job) = st.queue.pop_front() else {
                continue;
            };
            st.running = Some(job.keys);
            drop(st);
            let work = job.work;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(self))).is_err() {
                tracing::error!("program cache: a store panicked; not stored");
            }
            st = self.stores();
            st.running = None;
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_every_input() {
        let dev: &[&[u8]] = &[b"pocl", b"cpu"];
        let k = key(dev, b"-DN=1", b"kernel");
        assert_eq!(k, key(dev, b"-DN=1", b"kernel"));
        assert_ne!(k, key(dev, b"-DN=2", b"kernel"));
        assert_ne!(k, key(&[b"pocl", b"gpu"], b"-DN=1", b"kernel"));
        // An option moved into the device identity is another key.
        assert_ne!(key(&[b"a"], b"b", b"s"), key(&[b"a", b"b"], b"", b"s"));
    }

    fn test_dir(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("wh-pc-{name}-{}", std::process::id()))
    }

    /// A cache for the rest of the test process (its store thread holds it); `test_dir(name)`
    /// is removed at the test's end.
    fn leaked_cache(name: &str) -> &'static ProgramCache {
        let dir = test_dir(name);
        let _ = std::fs::remove_dir_all(&dir);
        Box::leak(Box::new(ProgramCache::new(
            BlobCache::open(&dir, 1 << 20).unwrap(),
        )))
    }

    fn entry(n: u8) -> Entry {
        Entry {
            binary: vec![n],
            log: vec![],
        }
    }

    /// A job that stores entry `n` under its key once `gate` lets it.
    fn gated_store(c: &'static ProgramCache, n: u8, gate: std::sync::mpsc::Receiver<()>) {
        let k = key(&[b"d"], &[n], b"src");
        c.store_later(
            vec![k],
            Box::new(move |c| {
                let _ = gate.recv();
                c.store(&k, &entry(n));
            }),
        );
    }

    fn quick_store(c: &'static ProgramCache, n: u8) -> Key {
        let k = key(&[b"d"], &[n], b"src");
        c.store_later(vec![k], Box::new(move |c| c.store(&k, &entry(n))));
        k
    }

    #[test]
    fn a_build_waiting_for_its_store_is_served_by_it() {
        let c = leaked_cache("wait");
        let (open, gate) = std::sync::mpsc::channel();
        gated_store(c, 1, gate);
        let k2 = quick_store(c, 2);
        // The store of key 2 waits behind the one of key 1 (held by its gate) until a build
        // asks for key 2: then it is next, and its entry is there when the wait returns.
        let asker = std::thread::spawn(move || {
            c.wait_for_stores(&[k2]);
            c.load(&k2)
        });
        std::thread::sleep(Duration::from_millis(100));
        open.send(()).unwrap();
        assert_eq!(asker.join().unwrap(), Some(entry(2)));
        c.wait_for_stores(&[key(&[b"d"], &[1], b"src")]);
        assert_eq!(c.load(&key(&[b"d"], &[1], b"src")), Some(entry(1)));
        std::fs::remove_dir_all(test_dir("wait")).unwrap();
    }

    #[test]
    fn the_end_of_a_session_runs_what_is_queued_within_its_budget() {
        let c = leaked_cache("end");
        let keys: Vec<Key> = (0..3).map(|n| quick_store(c, n)).collect();
        c.finish_stores(Duration::from_secs(60));
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(c.load(k), Some(entry(n as u8)));
        }
        // Closed: nothing more is queued.
        assert!(!c.store_later(vec![], Box::new(|_| panic!("ran after the end"))));
        std::fs::remove_dir_all(test_dir("end")).unwrap();
    }

    #[test]
    fn past_its_budget_the_end_waits_only_for_the_running_store() {
        let c = leaked_cache("budget");
        let (open, gate) = std::sync::mpsc::channel();
        gated_store(c, 1, gate);
        let later = quick_store(c, 2);
        let before = STORES_SKIPPED.load(Ordering::Relaxed);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            open.send(()).unwrap();
        });
        c.finish_stores(Duration::from_millis(100));
        // The running one finished (its entry is there), the queued one was dropped.
        assert_eq!(c.load(&key(&[b"d"], &[1], b"src")), Some(entry(1)));
        assert_eq!(c.load(&later), None);
        assert!(STORES_SKIPPED.load(Ordering::Relaxed) > before);
        std::fs::remove_dir_all(test_dir("budget")).unwrap();
    }

    #[test]
    fn entries_roundtrip_through_the_blob_cache() {
        let dir = std::env::temp_dir().join(format!("wh-pc-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = ProgramCache::new(BlobCache::open(&dir, 1 << 20).unwrap());
        let k = key(&[b"d"], b"", b"src");
        let e = Entry {
            binary: vec![1, 2, 3],
            log: b"ok".to_vec(),
        };
        assert_eq!(c.load(&k), None);
        c.store(&k, &e);
        assert_eq!(c.load(&k), Some(e));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
