//! A per-call trace for finding out what a program asked of the API and what it was told:
//! with `WORMHOLE_TRACE=FILE` (`%p` in it stands for the process id) the client appends a line
//! for every entry point the program calls (an ICD's table or an exported symbol: the
//! generated entries, `crates/apigen`) and what it returned, for every request it carried
//! (waited for, with the reply's status and the round trip's time, or pipelined), and for what
//! an API's client notes (a version-aware symbol lookup and its answer, an export table's slot). Each line is written
//! at once, so a crash or a hang leaves the trace up to the call it happened in.
//! `WORMHOLE_TRACE_LIMIT` caps the lines (default 200,000; the last one says so).
//!
//! A forked child writes nothing (its parent's trace is not its own).
//!
//! A line: seconds since the trace began, the thread's id, the API, then the event, nested
//! calls indented (`> cuInit` ... `< cuInit = 0`).

use std::cell::Cell;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const DEFAULT_LIMIT: u64 = 200_000;

struct Tracer {
    /// The process that opened the trace: a child forked from it writes nothing (the file's
    /// lock may have been held by a thread the fork did not copy).
    pid: u32,
    file: Mutex<File>,
    start: Instant,
    written: AtomicU64,
    limit: u64,
}

static TRACER: OnceLock<Option<Tracer>> = OnceLock::new();

thread_local! {
    /// How deep in the program's calls this thread is (a callback may call in again).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static TID: Cell<i64> = const { Cell::new(0) };
}

/// The trace file's name: `%p` is this process's id.
fn expand(path: &str) -> String {
    path.replace("%p", &std::process::id().to_string())
}

fn open() -> Option<Tracer> {
    let path = std::env::var("WORMHOLE_TRACE")
        .ok()
        .filter(|p| !p.is_empty())?;
    let path = expand(&path);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| {
            crate::log(&format!(
                "WORMHOLE_TRACE={path}: cannot open it ({e}); no trace"
            ))
        })
        .ok()?;
    let limit = std::env::var("WORMHOLE_TRACE_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_LIMIT);
    let t = Tracer {
        pid: std::process::id(),
        file: Mutex::new(file),
        start: Instant::now(),
        written: AtomicU64::new(0),
        limit,
    };
    // Which program this is: a directory of traces is read by matching them to runs.
    let cmdline = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\0')
                .replace('\0', " ")
        })
        .unwrap_or_default();
    t.line(
        "-",
        &format!("trace of pid {}: {cmdline}", std::process::id()),
    );
    Some(t)
}

fn tracer() -> Option<&'static Tracer> {
    TRACER
        .get_or_init(open)
        .as_ref()
        .filter(|t| t.pid == std::process::id())
}

/// Whether calls are traced (`WORMHOLE_TRACE` names a file that opened).
pub fn on() -> bool {
    tracer().is_some()
}

fn tid() -> i64 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no arguments and cannot fail.
            t.set(unsafe { libc::syscall(libc::SYS_gettid) });
        }
        t.get()
    })
}

impl Tracer {
    fn line(&self, api: &str, event: &str) {
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        if n > self.limit {
            return;
        }
        let mut s = String::with_capacity(80 + event.len());
        let depth = DEPTH.with(Cell::get);
        let _ = write!(
            s,
            "{:.6} t{} {api} {:indent$}",
            self.start.elapsed().as_secs_f64(),
            tid(),
            "",
            indent = 2 * depth
        );
        if n == self.limit {
            s.push_str("(WORMHOLE_TRACE_LIMIT reached: no more lines)\n");
        } else {
            s.push_str(event);
            s.push('\n');
        }
        // One write per line: lines of several threads never mix, and a crash loses none.
        let _ = self
            .file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(s.as_bytes());
    }
}

/// A program's call of an entry point, from its start to its return.
pub struct Call {
    api: &'static str,
    name: &'static str,
    start: Instant,
}

/// What an entry point returned, as the trace shows it.
pub enum Returned {
    Status(i64),
    Pointer(usize),
    Nothing,
}

/// The program called `name` (None, and nothing written, unless tracing).
pub fn enter(api: &'static str, name: &'static str) -> Option<Call> {
    let t = tracer()?;
    t.line(api, &format!("> {name}"));
    DEPTH.with(|d| d.set(d.get() + 1));
    Some(Call {
        api,
        name,
        start: Instant::now(),
    })
}

/// The call `c` returned `r`.
pub fn returned(c: Option<Call>, r: Returned) {
    let (Some(c), Some(t)) = (c, tracer()) else {
        return;
    };
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    let what = match r {
        Returned::Status(s) => format!(" = {s}"),
        Returned::Pointer(p) => format!(" = {p:#x}"),
        Returned::Nothing => String::new(),
    };
    t.line(
        c.api,
        &format!("< {}{what} ({})", c.name, micros(c.start.elapsed())),
    );
}

/// A line of the API client's own (what a lookup answered, an export table's slot).
pub fn note(api: &str, event: impl FnOnce() -> String) {
    if let Some(t) = tracer() {
        t.line(api, &event());
    }
}

/// A request carried to the server: waited for (`Some(reply status)`, or the transport's
/// failure) or pipelined.
pub(crate) fn request(api: &str, name: &str, carried: Carried, took: Duration) {
    if let Some(t) = tracer() {
        let event = match carried {
            Carried::Answered(status) => {
                format!("request {name}: waited, status {status} ({})", micros(took))
            }
            Carried::Failed => format!("request {name}: waited, no answer ({})", micros(took)),
            Carried::Pipelined => format!("request {name}: pipelined"),
        };
        t.line(api, &event);
    }
}

pub(crate) enum Carried {
    Answered(i32),
    Failed,
    Pipelined,
}

fn micros(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_name_takes_the_process_id() {
        let pid = std::process::id().to_string();
        assert_eq!(expand("/tmp/t.%p.log"), format!("/tmp/t.{pid}.log"));
        assert_eq!(expand("/tmp/t.log"), "/tmp/t.log");
    }

    #[test]
    fn lines_stop_at_the_limit_with_a_last_word() {
        let dir = std::env::temp_dir().join(format!("wh-trace-{}", std::process::id()));
        let t = Tracer {
            pid: std::process::id(),
            file: Mutex::new(File::create(&dir).unwrap()),
            start: Instant::now(),
            written: AtomicU64::new(0),
            limit: 2,
        };
        for i in 0..5 {
            t.line("cuda", &format!("event {i}"));
        }
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].ends_with(" cuda event 0"), "{text}");
        assert!(lines[2].ends_with("(WORMHOLE_TRACE_LIMIT reached: no more lines)"));
    }
}
