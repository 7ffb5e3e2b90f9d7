//! The client side of a Wormhole session, the same for every API: connect (Unix socket and
//! shared memory, TCP or TLS, or a VM guest's ivshmem region), say HELLO for the API, map the
//! lanes, keep the heartbeat and the callback thread, and carry calls on the calling thread's
//! own lane. An API's client library (the OpenCL ICD, the CUDA driver) supplies [`ApiHooks`] and
//! turns [`CallError`]s into its own error codes.
//!
//! Locally: connect to the Unix socket, receive the shared region, map its lanes, and keep the
//! socket for callbacks and liveness. Remotely (`WORMHOLE_SERVER=tcp://host:port`): one TCP
//! stream carries every lane's frames, tagged with the lane, plus callbacks. Either way each
//! application thread uses its own lane.

pub mod call_counts;
pub mod host_memory;
mod lane_users;
pub mod marshal;
mod outbox;
pub mod trace;

use lane_users::LaneUsers;
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use wormhole_transport::link::{eof_is_gone, read_body, read_frame, read_header};
use wormhole_transport::unix::recv_frame_with_fds;
use wormhole_transport::{
    Arena, FrameLink, FutexWaiter, Region, ShmLink, SpinPolicy, SpinRead, TransportError,
};
use wormhole_wire::handshake::{self, Hello};
use wormhole_wire::{control, FrameHeader, Writer, FLAG_ASYNC, FLAG_OUTPUT, FLAG_REPLY};

/// What the session needs to know of the API it carries.
#[derive(Clone, Copy)]
pub struct ApiHooks {
    /// The API's name in HELLO (`"opencl"`, `"cuda"`).
    pub api: &'static str,
    /// Calls that wait for a device that computes on the host's CPUs (OpenCL's `clFinish` on
    /// PoCL): the client yields the CPU from the start instead of spinning, because on a
    /// machine with few cores the driver's threads that run the awaited work, and the worker
    /// thread that answers, need it.
    pub waits_for_device: fn(opcode: u16) -> bool,
    /// Runs one CALLBACK frame's body, on the session's callback thread.
    pub deliver_callback: fn(body: &[u8]),
    /// What the application sees once the server is gone (the API's own words), for the log.
    pub when_gone: &'static str,
    /// The entry point an opcode stands for (for `call_counts`).
    pub op_name: call_counts::OpName,
    /// A thread took a lane that a thread now ended used before it: resets what the driver
    /// keeps per thread on that lane's worker thread (CUDA's current context), since natively
    /// a new thread starts with none. Called on the thread, before its first call is sent.
    pub lane_reused: Option<fn()>,
}

fn policy_for(hooks: &ApiHooks, opcode: u16) -> SpinPolicy {
    if (hooks.waits_for_device)(opcode) {
        // A call that waits for the device (clFinish) takes at least the device's time: the
        // caller sleeps at once and leaves its CPU to the driver's threads, which run the
        // very work it waits for on a CPU device (a yield loop kept them from it on 2 cores).
        SpinPolicy {
            spin: Duration::ZERO,
            yield_until: Duration::ZERO,
            ..SpinPolicy::default()
        }
    } else {
        SpinPolicy::default()
    }
}

/// One lane of the shared region.
pub struct ShmLane {
    link: ShmLink,
}

/// One lane of a TCP session: the reply the reader thread handed over, and who waits for it.
#[derive(Default)]
struct TcpSlot {
    busy: Mutex<()>,
    reply: Mutex<Option<(FrameHeader, Vec<u8>)>>,
    ready: Condvar,
    /// Where the waiting call wants its reply's bulk data: the reader thread reads it from
    /// the stream straight there (no buffer to fault in, no second copy). Held by the reader
    /// while it writes there, so that a call giving up (the session died) takes it back only
    /// once nothing writes to its memory any more.
    sink: Mutex<Option<Sink>>,
}

/// The caller's memory a reply's tail goes to: a reply of exactly `prefix + len` bytes to
/// request `seq` has its last `len` bytes read into `dst`.
struct Sink {
    seq: u32,
    prefix: usize,
    dst: *mut u8,
    len: usize,
    filled: bool,
}

// SAFETY: `dst` is the waiting caller's memory, written only by the reader thread while it
// holds the slot's `sink` lock, and the caller takes the sink back under that lock before it
// returns (so before that memory can go).
unsafe impl Send for Sink {}

/// Reads one frame from the TCP stream; a reply the lane's waiting call gave a sink for has
/// its tail read straight into it (the body then holds the head only).
fn read_tcp_frame(
    s: &mut impl Read,
    slots: &[TcpSlot],
    body: &mut Vec<u8>,
) -> Result<FrameHeader, TransportError> {
    let header = read_header(s)?;
    let len = header.len as usize;
    if header.flags & FLAG_REPLY != 0 {
        if let Some(slot) = slots.get(usize::from(header.lane)) {
            let mut sink = slot.sink.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = sink
                .as_mut()
                .filter(|k| k.seq == header.seq && k.prefix + k.len == len)
            {
                read_body(s, body, k.prefix)?;
                // SAFETY: the caller gave `len` writable bytes at `dst` and waits, its sink
                // registered, until it takes the sink back under this lock.
                let dst = unsafe { std::slice::from_raw_parts_mut(k.dst, k.len) };
                s.read_exact(dst).map_err(eof_is_gone)?;
                k.filled = true;
                return Ok(header);
            }
        }
    }
    read_body(s, body, len)?;
    Ok(header)
}

enum Transport {
    Shm {
        lanes: Vec<Mutex<ShmLane>>,
        region: Arc<Region>,
    },
    Tcp {
        outbox: Arc<outbox::Outbox>,
        slots: Arc<Vec<TcpSlot>>,
    },
}

/// The device's output marks the callback channel has delivered (see `FLAG_OUTPUT`): per lane,
/// the seq of the last reply whose preceding output has been written to the application's
/// stdout.
struct Marks {
    seen: Vec<AtomicU32>,
    lock: Mutex<()>,
    passed: Condvar,
}

/// How long a call waits for the output that precedes its reply before it returns anyway.
const MARK_TIMEOUT: Duration = Duration::from_secs(1);

impl Marks {
    fn new(lanes: usize) -> Arc<Marks> {
        Arc::new(Marks {
            seen: (0..lanes).map(|_| AtomicU32::new(0)).collect(),
            lock: Mutex::new(()),
            passed: Condvar::new(),
        })
    }

    /// Whether the mark of reply `seq` on `lane`, or a later one, has been processed (a lane's
    /// marks come in the order of its calls).
    fn reached(&self, lane: usize, seq: u32) -> bool {
        self.seen
            .get(lane)
            .is_none_or(|s| s.load(Ordering::Acquire).wrapping_sub(seq) as i32 >= 0)
    }

    /// The callback channel delivered MARK (`lane`, `seq`): the output before it is written.
    fn record(&self, lane: usize, seq: u32) {
        if let Some(s) = self.seen.get(lane) {
            s.store(seq, Ordering::Release);
            self.wake();
        }
    }

    /// Wakes the waiting calls (a mark passed, or the session is gone).
    fn wake(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.passed.notify_all();
    }

    /// A reply with FLAG_OUTPUT arrived: waits until the output before it is written (bounded:
    /// a stuck callback channel must not hang the application).
    fn wait(&self, lane: usize, seq: u32, dead: &AtomicBool) {
        static LATE: AtomicBool = AtomicBool::new(false);
        let deadline = std::time::Instant::now() + MARK_TIMEOUT;
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !self.reached(lane, seq) {
            let now = std::time::Instant::now();
            if dead.load(Ordering::Relaxed) {
                return;
            }
            if now >= deadline {
                if !LATE.swap(true, Ordering::Relaxed) {
                    log(&format!(
                        "the device's output did not arrive within {MARK_TIMEOUT:?} of its call's reply; it follows when it does"
                    ));
                }
                return;
            }
            g = self
                .passed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Writes the device's output (an OUTPUT frame's body) to the application's fd 1 itself, past
/// any buffering of its own language's stdout, as the native driver does.
fn write_output(mut bytes: &[u8]) {
    static FAILED: AtomicBool = AtomicBool::new(false);
    while !bytes.is_empty() {
        // SAFETY: writes from a valid slice of `bytes.len()` bytes.
        let n = unsafe { libc::write(1, bytes.as_ptr().cast(), bytes.len()) };
        if n >= 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock => {
                // The application made its stdout non-blocking: wait until it takes more.
                let mut pfd = libc::pollfd {
                    fd: 1,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, for the duration of the call.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
            }
            _ => {
                if !FAILED.swap(true, Ordering::Relaxed) {
                    log(&format!("cannot write the device's output to stdout: {e}"));
                }
                return;
            }
        }
    }
}

/// A client's session with the server.
pub struct Connection {
    hooks: ApiHooks,
    transport: Transport,
    lanes: usize,
    dead: Arc<AtomicBool>,
    marks: Arc<Marks>,
    /// Where the lanes this client uses are marked (a region's rendezvous): a guest's worker
    /// serves a lane once it is marked; a local worker looks only at marked lanes for the
    /// order across lanes.
    used_lanes: Option<Arc<Region>>,
    /// Which program lanes live threads hold (`lane_users`).
    lane_users: Arc<LaneUsers>,
    /// Every request's ticket (its seq), from one counter for all lanes: a request sent after
    /// another one finished sending has a later ticket, which is how the worker orders
    /// requests across lanes.
    tickets: AtomicU32,
    /// Local sessions: where windowed buffers' bytes lie (see the server's `arena` module).
    arena: Option<Arena>,
}

/// The lanes program threads take: all but the last, which is the callback thread's, when
/// there are two or more.
fn program_lanes(lanes: usize) -> usize {
    if lanes >= 2 {
        lanes - 1
    } else {
        1
    }
}

thread_local! {
    static MY_LANE: Cell<Option<usize>> = const { Cell::new(None) };
    /// Whether this is the session's callback thread, which has the last lane to itself.
    static CALLBACK_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread sent requests without waiting (FLAG_ASYNC) on its lane since its
    /// last reply there: then its next call must follow them on that lane.
    static SENT_ASYNC: Cell<bool> = const { Cell::new(false) };
}

/// Writes one line to stderr, prefixed so the user knows who speaks.
pub fn log(msg: &str) {
    eprintln!("wormhole: {msg}");
}

/// `ApiHooks::deliver_callback` of an API none of whose entry points registers a callback: a
/// CALLBACK frame is the server's mistake, logged and dropped.
pub fn no_callbacks(body: &[u8]) {
    log(&format!(
        "ignoring a callback of {} bytes from the server: this client registered none",
        body.len()
    ));
}

/// Logs that Wormhole does not forward entry point `what` and what the call answers instead:
/// once per entry point (a program may call one in a loop).
pub fn log_unsupported_once(what: &'static str, answer: &str) {
    static LOGGED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.contains(&what) {
        logged.push(what);
        log(&format!(
            "{what} is not forwarded by Wormhole; returning {answer}"
        ));
    }
}

/// An API client library's one session, opened on first use; what a failed open said is kept
/// (logged once, after `why`: "no CUDA device"), so later calls fail at once the same way.
pub struct OnceConnection(OnceLock<Result<Connection, String>>);

impl OnceConnection {
    pub const fn new() -> Self {
        OnceConnection(OnceLock::new())
    }

    pub fn get(&self, hooks: ApiHooks, why: &str) -> Result<&Connection, &str> {
        self.0
            .get_or_init(|| {
                Connection::open(hooks).map_err(|e| {
                    let reason = e.to_string();
                    log(&format!("{why}: {reason}"));
                    reason
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The session, if one was opened (never opens one).
    pub fn opened(&self) -> Option<&Connection> {
        self.0.get().and_then(|c| c.as_ref().ok())
    }
}

impl Default for OnceConnection {
    fn default() -> Self {
        Self::new()
    }
}

/// Set in the child of a fork(): the session (its lanes, its worker) stays the parent's, so
/// the child's calls fail instead of corrupting it. A fork handler, not a getpid() per call
/// (a system call on every forwarded call).
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn in_forked_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Why no session could be opened (the API's client logs it and reports "no device").
#[derive(Debug)]
pub struct ConnectError(String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

impl Connection {
    /// Opens a session of `hooks.api` with the server `WORMHOLE_SERVER` names (default: the
    /// local socket, `WORMHOLE_SOCKET`).
    pub fn open(hooks: ApiHooks) -> Result<Connection, ConnectError> {
        static ATFORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe).
        ATFORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_forked_child));
        });
        connect(hooks)
    }
}

fn hello(hooks: &ApiHooks) -> Result<Vec<u8>, ConnectError> {
    // TCP tenants identify themselves with a token (local ones by their uid). A token file
    // (WORMHOLE_TOKEN_FILE, as a cluster integration mounts it) keeps the token out of the
    // environment, where other processes of the same user could read it; WORMHOLE_TOKEN, if
    // set, comes first.
    let token = match std::env::var("WORMHOLE_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        Some(t) => Some(t),
        None => match std::env::var_os("WORMHOLE_TOKEN_FILE").filter(|p| !p.is_empty()) {
            Some(path) => {
                let shown = std::path::Path::new(&path).display().to_string();
                let token = std::fs::read_to_string(&path)
                    .map(|t| t.trim().to_string())
                    .map_err(|e| {
                        ConnectError(format!(
                            "WORMHOLE_TOKEN_FILE={shown}: cannot read the token: {e}"
                        ))
                    })?;
                if token.is_empty() {
                    return Err(ConnectError(format!(
                        "WORMHOLE_TOKEN_FILE={shown}: the file holds no token"
                    )));
                }
                Some(token)
            }
            None => None,
        },
    };
    Hello::new(hooks.api, token.as_deref().map(str::as_bytes))
        .encode()
        .map_err(|e| ConnectError(format!("cannot send HELLO: {e}")))
}

/// Checks the server's first answer: WELCOME (returns its lane count) or REFUSED.
fn welcome(h: &FrameHeader, body: &[u8]) -> Result<u32, ConnectError> {
    handshake::answer(h, body)
        .map(|w| w.lanes)
        .map_err(ConnectError)
}

// Starting a worker and its driver takes a moment; a server that never answers must not hang
// the application.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(20);

fn connect(hooks: ApiHooks) -> Result<Connection, ConnectError> {
    match std::env::var("WORMHOLE_SERVER") {
        Ok(s) if s == "ivshmem" || s.starts_with("ivshmem:") => connect_guest(
            hooks,
            s.strip_prefix("ivshmem").unwrap_or_default().trim_start_matches(':'),
        ),
        Ok(s) if !s.is_empty() => match s.strip_prefix("tcp://") {
            Some(addr) => connect_tcp(hooks, addr, false),
            None => match s.strip_prefix("tls://") {
                Some(addr) => connect_tcp(hooks, addr, true),
                None => Err(ConnectError(format!(
                    "WORMHOLE_SERVER={s}: expected tcp://host:port, tls://host:port or ivshmem[:PATH]"
                ))),
            },
        },
        _ => connect_local(hooks),
    }
}

/// The BAR of the first ivshmem device (QEMU `ivshmem-plain`: vendor 0x1af4, device 0x1110),
/// enabled so that it can be mapped.
fn find_ivshmem() -> Result<std::path::PathBuf, ConnectError> {
    let dir = std::fs::read_dir("/sys/bus/pci/devices")
        .map_err(|e| ConnectError(format!("cannot list PCI devices: {e}")))?;
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let mut devices: Vec<_> = dir
        .flatten()
        .map(|d| d.path())
        .filter(|p| {
            read(p.join("vendor")).trim() == "0x1af4" && read(p.join("device")).trim() == "0x1110"
        })
        .collect();
    devices.sort();
    let dev = devices.into_iter().next().ok_or_else(|| {
        ConnectError("WORMHOLE_SERVER=ivshmem but this machine has no ivshmem device".into())
    })?;
    if read(dev.join("enable")).trim() == "0" {
        std::fs::write(dev.join("enable"), "1").map_err(|e| {
            ConnectError(format!(
                "cannot enable {} ({e}); run as root",
                dev.display()
            ))
        })?;
    }
    Ok(dev.join("resource2"))
}

/// The guest region of this process, marked closed when the process exits normally so the
/// worker ends the session at once (a killed process is noticed by its silent heartbeat).
static GUEST_REGION: OnceLock<(Arc<Region>, u32)> = OnceLock::new();

extern "C" fn close_guest_session() {
    // Only the process that opened the session closes it, not a forked child that exits.
    if let Some((r, _)) = GUEST_REGION
        .get()
        .filter(|(_, pid)| *pid == std::process::id())
    {
        r.rendezvous().client_state.store(
            wormhole_transport::rendezvous::CLIENT_CLOSED,
            Ordering::Release,
        );
    }
}

// Runs at exit, and at dlclose (where an atexit handler would point at unmapped code).
#[used]
#[link_section = ".fini_array"]
static CLOSE_GUEST_SESSION: extern "C" fn() = close_guest_session;

/// Connects through a guest region (`WORMHOLE_SERVER=ivshmem[:PATH]`): no socket, so the
/// handshake runs on lane 0, callbacks arrive on the last lane, and each side watches the
/// other's heartbeat in the region.
fn connect_guest(hooks: ApiHooks, spec: &str) -> Result<Connection, ConnectError> {
    use wormhole_transport::rendezvous::{self, BeatWatch};
    let path = if spec.is_empty() {
        find_ivshmem()?
    } else {
        std::path::PathBuf::from(spec)
    };
    let nonce = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()));
    let (region, epoch) = Region::claim_guest(
        &path,
        nonce,
        // Between two sessions (or right after the server starts) the region has no worker
        // for a moment: the supervisor starts one within ~200 ms, longer on a loaded machine.
        // A heartbeat silent for 3 s means no server.
        Duration::from_secs(3),
        Duration::from_secs(10),
    )
    .map_err(|e| {
        ConnectError(format!(
            "cannot open a session through {}: {e}",
            path.display()
        ))
    })?;
    let region = Arc::new(region);
    let rv = region.rendezvous();
    rv.client_state
        .store(rendezvous::CLIENT_ACTIVE, Ordering::Release);
    let _ = GUEST_REGION.set((region.clone(), std::process::id()));
    {
        let region = region.clone();
        std::thread::Builder::new()
            .name("wormhole-heartbeat".into())
            .spawn(move || loop {
                region.rendezvous().beat_client();
                std::thread::sleep(rendezvous::BEAT_INTERVAL);
            })
            .map_err(|e| ConnectError(format!("cannot start the heartbeat thread: {e}")))?;
    }
    let dead = Arc::new(AtomicBool::new(false));
    let server = Arc::new(BeatWatch::new(
        rv.server_beat.load(Ordering::Acquire),
        // Ten missed beats: a dead server fails a waiting call well within a second.
        Duration::from_millis(500),
    ));
    let alive: wormhole_transport::link::Liveness = {
        let (dead, region) = (dead.clone(), region.clone());
        Arc::new(move || {
            let rv = region.rendezvous();
            !dead.load(Ordering::Relaxed)
                && rv.server_epoch.load(Ordering::Acquire) == epoch
                && server.alive(&rv.server_beat)
        })
    };
    // No futex reaches the host: poll, sleeping at most 1 ms between looks once a call has
    // taken longer than the spin window (a long kernel).
    let waiter = Arc::new(wormhole_transport::PollWaiter {
        max_sleep: Duration::from_millis(1),
    });
    let link = |i: u32| {
        let (req, rep) = region.lane(i).expect("lane in layout");
        ShmLink::new(
            req,
            rep,
            waiter.clone(),
            SpinPolicy::default(),
            alive.clone(),
        )
    };
    let mut lane0 = link(0);
    rv.use_lane(0);
    lane0
        .send(&hello(&hooks)?)
        .map_err(|e| ConnectError(format!("server gone during HELLO: {e}")))?;
    let mut body = Vec::new();
    let h = lane0
        .recv(&mut body)
        .map_err(|e| ConnectError(format!("no answer from the server: {e}")))?;
    let n = welcome(&h, &body)?;
    if n + 1 > region.layout().lanes {
        return Err(ConnectError(
            "WELCOME names more lanes than the region has".into(),
        ));
    }
    // The callback lane idles most of the time: poll it lazily (callbacks may run ≤ 10 ms late).
    let (ev_req, ev_rep) = region.lane(n).expect("event lane in layout");
    let mut events = ShmLink::new(
        ev_req,
        ev_rep,
        Arc::new(wormhole_transport::PollWaiter {
            max_sleep: Duration::from_millis(10),
        }),
        SpinPolicy::default(),
        alive.clone(),
    );
    let marks = Marks::new(n as usize);
    spawn_event_thread(hooks, dead.clone(), marks.clone(), move |body| {
        events.recv(body)
    })?;
    let lanes: Vec<Mutex<ShmLane>> = std::iter::once(lane0)
        .chain((1..n).map(link))
        .map(|link| Mutex::new(ShmLane { link }))
        .collect();
    Ok(Connection {
        hooks,
        transport: Transport::Shm {
            lanes,
            region: region.clone(),
        },
        lanes: n as usize,
        lane_users: LaneUsers::new(program_lanes(n as usize)),
        dead,
        marks,
        used_lanes: Some(region),
        tickets: AtomicU32::new(0),
        arena: None,
    })
}

fn connect_local(hooks: ApiHooks) -> Result<Connection, ConnectError> {
    let path = wormhole_wire::default_socket_path();
    let sock = UnixStream::connect(&path).map_err(|e| {
        ConnectError(format!(
            "cannot reach the Wormhole server at {} ({e}); is `wh serve` running?",
            path.display()
        ))
    })?;
    (&sock)
        .write_all(&hello(&hooks)?)
        .map_err(|e| ConnectError(format!("server hung up during HELLO: {e}")))?;
    sock.set_read_timeout(Some(WELCOME_TIMEOUT)).ok();
    let mut body = Vec::new();
    let (h, fds) = recv_frame_with_fds(&sock, &mut body)
        .map_err(|e| ConnectError(format!("no answer from the server: {e}")))?;
    sock.set_read_timeout(None).ok();
    welcome(&h, &body)?;
    let mut fds = fds.into_iter();
    let fd = fds
        .next()
        .ok_or_else(|| ConnectError("the server sent no shared region".into()))?;
    let region =
        Arc::new(Region::open_fd(fd).map_err(|e| ConnectError(format!("bad shared region: {e}")))?);
    // Without an arena every transfer simply goes through the rings.
    let arena = fds.next().and_then(|fd| match Arena::open_fd(fd) {
        Ok(a) => Some(a),
        Err(e) => {
            log(&format!(
                "buffer arena not mapped ({e}); transfers use the rings"
            ));
            None
        }
    });
    let dead = Arc::new(AtomicBool::new(false));
    let alive = {
        let dead = dead.clone();
        Arc::new(move || !dead.load(Ordering::Relaxed))
    };
    let waiter = Arc::new(FutexWaiter);
    let lanes: Vec<Mutex<ShmLane>> = (0..region.layout().lanes)
        .map(|i| {
            let (req, rep) = region.lane(i).expect("lane in layout");
            Mutex::new(ShmLane {
                link: ShmLink::new(
                    req,
                    rep,
                    waiter.clone(),
                    SpinPolicy::default(),
                    alive.clone(),
                ),
            })
        })
        .collect();
    let n = lanes.len();
    let marks = Marks::new(n);
    // Buffered: the callbacks of a burst of completions come in one read, not two per frame.
    let mut events = std::io::BufReader::with_capacity(1 << 16, sock);
    spawn_event_thread(hooks, dead.clone(), marks.clone(), move |body| {
        read_frame(&mut events, body)
    })?;
    Ok(Connection {
        hooks,
        transport: Transport::Shm {
            lanes,
            region: region.clone(),
        },
        lanes: n,
        lane_users: LaneUsers::new(program_lanes(n)),
        dead,
        marks,
        used_lanes: Some(region),
        tickets: AtomicU32::new(0),
        arena,
    })
}

/// The two halves of a remote session's stream (plain TCP or TLS).
type BoxRead = Box<dyn Read + Send>;
type BoxWrite = Box<dyn Write + Send>;

/// TLS for a remote session: the server's certificate must be signed by (or be) the
/// certificate in `WORMHOLE_CA`.
fn tls_client(addr: &str, sock: &TcpStream) -> Result<(BoxRead, BoxWrite), ConnectError> {
    use wormhole_transport::tls::{self, rustls};
    let ca = std::env::var_os("WORMHOLE_CA").ok_or_else(|| {
        ConnectError("tls:// needs WORMHOLE_CA (the server's certificate, PEM)".into())
    })?;
    let cfg = tls::client_config(std::path::Path::new(&ca))
        .map_err(|e| ConnectError(format!("TLS setup failed: {e}")))?;
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let name = rustls::pki_types::ServerName::try_from(host)
        .map_err(|e| ConnectError(format!("bad server name: {e}")))?;
    let conn = rustls::ClientConnection::new(cfg, name)
        .map_err(|e| ConnectError(format!("TLS setup failed: {e}")))?;
    let (r, w) = tls::split(
        rustls::Connection::Client(conn),
        sock.try_clone().map_err(|e| ConnectError(e.to_string()))?,
    );
    // Spinning as a plain stream's reader does (see connect_tcp).
    Ok((Box::new(r.spinning(SpinPolicy::default())), Box::new(w)))
}

/// The buffer a TCP session's frames are read through: larger reads are bulk bodies.
const TCP_READ_BUFFER: usize = 1 << 16;

fn connect_tcp(hooks: ApiHooks, addr: &str, tls: bool) -> Result<Connection, ConnectError> {
    use std::net::ToSocketAddrs;
    let target = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ConnectError(format!("cannot resolve {addr}")))?;
    let sock = TcpStream::connect_timeout(&target, Duration::from_secs(5)).map_err(|e| {
        ConnectError(format!(
            "cannot reach the Wormhole server at tcp://{addr} ({e})"
        ))
    })?;
    sock.set_nodelay(true).ok();
    let (mut reader, mut writer): (BoxRead, BoxWrite) = if tls {
        tls_client(addr, &sock)?
    } else {
        // Replies are looked for as a lane's ring is, spinning a moment before the kernel puts
        // the reader to sleep (its wake-up cost more than the rest of a round trip).
        let r = sock
            .try_clone()
            .map(|s| SpinRead::new(s, SpinPolicy::default(), TCP_READ_BUFFER))
            .map_err(|e| ConnectError(format!("cannot share the TCP stream: {e}")))?;
        let w = sock
            .try_clone()
            .map_err(|e| ConnectError(format!("cannot share the TCP stream: {e}")))?;
        (Box::new(r), Box::new(w))
    };
    writer
        .write_all(&hello(&hooks)?)
        .and_then(|_| writer.flush())
        .map_err(|e| ConnectError(format!("server hung up during HELLO: {e}")))?;
    sock.set_read_timeout(Some(WELCOME_TIMEOUT)).ok();
    let mut body = Vec::new();
    let h = read_frame(&mut reader, &mut body)
        .map_err(|e| ConnectError(format!("no answer from the server: {e}")))?;
    sock.set_read_timeout(None).ok();
    let n = welcome(&h, &body)? as usize;
    let slots: Arc<Vec<TcpSlot>> = Arc::new((0..n).map(|_| TcpSlot::default()).collect());
    let dead = Arc::new(AtomicBool::new(false));
    let outbox = outbox::Outbox::start(writer, dead.clone())
        .map_err(|e| ConnectError(format!("cannot start the TCP sender: {e}")))?;
    // Callbacks run on their own thread: they may call the API, whose replies the reader delivers.
    let callbacks = spawn_callback_thread(hooks)?;
    let marks = Marks::new(n);
    {
        let (dead, slots, marks) = (dead.clone(), slots.clone(), marks.clone());
        std::thread::Builder::new()
            .name("wormhole-tcp".into())
            .spawn(move || {
                let mut reader = std::io::BufReader::with_capacity(TCP_READ_BUFFER, reader);
                let mut gone = TransportError::PeerGone;
                loop {
                    let mut body = Vec::new();
                    match read_tcp_frame(&mut reader, &slots, &mut body) {
                        Ok(h) if h.flags & FLAG_REPLY == 0 => event(&h, body, &marks, &callbacks),
                        Ok(h) => match slots.get(usize::from(h.lane)) {
                            Some(slot) => {
                                *slot.reply.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some((h, body));
                                slot.ready.notify_all();
                            }
                            None => {
                                log("frame for an unknown lane; closing the session");
                                break;
                            }
                        },
                        Err(e) => {
                            gone = e;
                            break;
                        }
                    }
                }
                mark_dead(&hooks, &dead, &gone, || {
                    slots.iter().for_each(|s| s.ready.notify_all());
                    marks.wake();
                });
            })
            .map_err(|e| ConnectError(format!("cannot start the TCP reader: {e}")))?;
    }
    Ok(Connection {
        hooks,
        transport: Transport::Tcp { outbox, slots },
        lanes: n,
        lane_users: LaneUsers::new(program_lanes(n)),
        dead,
        marks,
        used_lanes: None,
        tickets: AtomicU32::new(0),
        arena: None,
    })
}

/// Runs the application's callbacks (CALLBACK bodies sent to the returned channel) on a
/// thread of their own: a callback may call the API, or take its time, without holding up the
/// frames behind it on the callback channel (the device's output, the marks calls wait for).
fn spawn_callback_thread(hooks: ApiHooks) -> Result<mpsc::Sender<Vec<u8>>, ConnectError> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::Builder::new()
        .name("wormhole-callbacks".into())
        .spawn(move || {
            CALLBACK_THREAD.set(true);
            for body in rx {
                (hooks.deliver_callback)(&body);
            }
        })
        .map_err(|e| ConnectError(format!("cannot start the callback thread: {e}")))?;
    Ok(tx)
}

/// One frame of the callback channel (not a reply). The device's output is written here, in
/// the order it came, and before any callback behind it runs (natively a kernel's output is
/// written before its event completes).
fn event(h: &FrameHeader, body: Vec<u8>, marks: &Marks, callbacks: &mpsc::Sender<Vec<u8>>) {
    match h.opcode {
        control::CALLBACK => {
            let _ = callbacks.send(body);
        }
        control::OUTPUT => write_output(&body),
        control::MARK => marks.record(usize::from(h.lane), h.seq),
        // The worker exits right after: the channel's end then fails the session's calls.
        control::ENDED => log(&format!(
            "the server ended this session: {}",
            wormhole_wire::Reader::new(&body)
                .bytes()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
        )),
        op => log(&format!(
            "ignoring unexpected frame {op:#06x} from the server"
        )),
    }
}

/// Reads the callback channel (frames from `next`) on a thread of its own, until it ends,
/// which ends the session.
fn spawn_event_thread(
    hooks: ApiHooks,
    dead: Arc<AtomicBool>,
    marks: Arc<Marks>,
    mut next: impl FnMut(&mut Vec<u8>) -> Result<FrameHeader, TransportError> + Send + 'static,
) -> Result<(), ConnectError> {
    let callbacks = spawn_callback_thread(hooks)?;
    std::thread::Builder::new()
        .name("wormhole-events".into())
        .spawn(move || {
            let mut body = Vec::new();
            let gone = loop {
                match next(&mut body) {
                    Ok(h) => event(&h, std::mem::take(&mut body), &marks, &callbacks),
                    Err(e) => break e,
                }
            };
            mark_dead(&hooks, &dead, &gone, || marks.wake());
        })
        .map(|_| ())
        .map_err(|e| ConnectError(format!("cannot start the callback thread: {e}")))
}

fn mark_dead(hooks: &ApiHooks, dead: &AtomicBool, why: &TransportError, wake: impl FnOnce()) {
    // Said before a waiting call can see it and fail: the program may exit on that failure.
    let how = match why {
        TransportError::PeerGone => "the server closed the session".to_string(),
        e => format!("the session with the server broke ({e})"),
    };
    log(&format!("{how}; {}", hooks.when_gone));
    dead.store(true, Ordering::SeqCst);
    wake();
}

#[derive(Debug)]
pub enum CallError {
    /// No session, or it is gone.
    Unavailable,
    /// The transport failed mid-call; the session is now unusable.
    Broken,
    /// The request exceeds the protocol's frame limit: it was not sent, and the session goes
    /// on.
    TooLarge,
}

static WARNED: AtomicU32 = AtomicU32::new(0);

impl Connection {
    /// The session's buffer arena (local sessions whose server offers one).
    pub fn arena(&self) -> Option<&Arena> {
        self.arena.as_ref()
    }

    /// Whether calls can still be carried: the session is not gone, and this process is not
    /// the child of a fork (whose memory shared with the worker is the parent's too).
    pub fn usable(&self) -> bool {
        !self.dead.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed)
    }

    /// Sends a request on this thread's lane and returns the reply body.
    pub fn call(&self, w: Writer) -> Result<Vec<u8>, CallError> {
        self.call_bulk(w, &[], None).map(|(r, _)| r)
    }

    /// A call with bulk data: `payload` follows the request straight from the caller's memory
    /// (see `Writer::trailing_bytes`), and a reply of exactly `prefix + dst.len()` bytes has its
    /// tail read straight into `dst` (returns true then; otherwise the whole reply is returned).
    pub fn call_bulk(
        &self,
        w: Writer,
        payload: &[u8],
        sink: Option<(usize, &mut [u8])>,
    ) -> Result<(Vec<u8>, bool), CallError> {
        if !self.usable() {
            return Err(CallError::Unavailable);
        }
        call_counts::count(self.hooks.api, self.hooks.op_name, w.opcode(), true);
        let mut idx = self.my_lane();
        // Timed from here: a reused lane's reset (`my_lane`) is a request of its own.
        let traced = trace::on().then(|| (w.opcode(), std::time::Instant::now()));
        let res = match &self.transport {
            Transport::Shm { lanes, .. } => {
                let (i, mut lane) = self.take_lane(lanes.len(), |i| &lanes[i], idx);
                idx = i;
                let seq = self.ticket();
                lane.link.set_policy(policy_for(&self.hooks, w.opcode()));
                (|| {
                    let frame = w.finish(0, seq)?;
                    lane.link.send_parts(&[&frame, payload])?;
                    let h = lane.link.recv_header()?;
                    check_reply(&h, seq)?;
                    let len = h.len as usize;
                    let got = match sink {
                        Some((prefix, dst)) if len == prefix + dst.len() => {
                            let mut head = vec![0; prefix];
                            lane.link.recv_exact(&mut head)?;
                            lane.link.recv_exact(dst)?;
                            (head, true)
                        }
                        _ => {
                            let mut body = vec![0; len];
                            lane.link.recv_exact(&mut body)?;
                            (body, false)
                        }
                    };
                    // Still holding the lane: a later call on it must not overtake this wait.
                    if h.flags & FLAG_OUTPUT != 0 {
                        self.marks.wait(idx, seq, &self.dead);
                    }
                    // The reply follows everything this thread sent on the lane before.
                    SENT_ASYNC.set(false);
                    Ok(got)
                })()
            }
            Transport::Tcp { outbox, slots } => {
                let (i, busy) = self.take_lane(slots.len(), |i| &slots[i].busy, idx);
                self.call_tcp(outbox, &slots[i], busy, i, w, payload, sink)
            }
        };
        if let Some((opcode, start)) = traced {
            let carried = match &res {
                // Every reply body begins with the call's status.
                Ok((body, _)) => {
                    trace::Carried::Answered(wormhole_wire::Reader::new(body).i32().unwrap_or(0))
                }
                Err(_) => trace::Carried::Failed,
            };
            trace::request(
                self.hooks.api,
                &self.op_name(opcode),
                carried,
                start.elapsed(),
            );
        }
        res.map_err(|e: TransportError| self.broken(e))
    }

    /// The entry point an opcode stands for, for the trace.
    fn op_name(&self, opcode: u16) -> std::borrow::Cow<'static, str> {
        call_counts::label(self.hooks.api, self.hooks.op_name, opcode)
    }

    /// The most bulk data a request sent without waiting should carry: over shared memory,
    /// half a lane's ring, so that sending it never waits for the worker to drain the ring
    /// mid-frame (a guest's 1 MiB non-blocking writes through its 512 KiB ring, alternating
    /// runs: 3.5-8.2 GB/s pipelined, 6.9-10.8 waited); over TCP 4 MiB (the socket's buffers
    /// take it, and past that a round trip costs little next to moving the data).
    pub fn async_bulk_max(&self) -> usize {
        match &self.transport {
            Transport::Shm { region, .. } => (region.layout().ring_capacity / 2) as usize,
            Transport::Tcp { .. } => 4 << 20,
        }
    }

    /// Sends a request with FLAG_ASYNC: no reply comes back.
    pub fn send_async(&self, w: Writer) -> Result<(), CallError> {
        self.send_async_bulk(w, &[])
    }

    /// As `send_async`, with bulk data: `payload` follows the request straight from the
    /// caller's memory (see `Writer::trailing_bytes`); it is in the lane or the stream, and the
    /// caller's memory free again, when this returns.
    pub fn send_async_bulk(&self, w: Writer, payload: &[u8]) -> Result<(), CallError> {
        if !self.usable() {
            return Err(CallError::Unavailable);
        }
        call_counts::count(self.hooks.api, self.hooks.op_name, w.opcode(), false);
        let idx = self.my_lane();
        if trace::on() {
            let name = self.op_name(w.opcode());
            trace::request(
                self.hooks.api,
                &name,
                trace::Carried::Pipelined,
                Default::default(),
            );
        }
        let res = match &self.transport {
            Transport::Shm { lanes, .. } => {
                let mut lane = self.async_lane(lanes.len(), |i| &lanes[i], idx);
                SENT_ASYNC.set(true);
                w.finish(FLAG_ASYNC, self.ticket())
                    .map_err(TransportError::from)
                    .and_then(|frame| lane.link.send_parts(&[&frame, payload]))
            }
            Transport::Tcp { outbox, .. } => {
                SENT_ASYNC.set(true);
                // The ticket is taken where the frame's place in the stream is.
                let out = outbox.hold();
                w.finish_on(idx as u16, FLAG_ASYNC, self.ticket())
                    .map_err(TransportError::from)
                    .and_then(|frame| match payload {
                        [] => out.gather(&frame),
                        // Written now, from where it lies (not copied into the outbox).
                        _ => out.send(&[&frame, payload]),
                    })
            }
        };
        res.map_err(|e| self.broken(e))
    }

    /// The lane for this thread's call: its own, or, while another thread that shares it holds
    /// it and this thread has nothing unanswered there, any free lane. Threads beyond the
    /// lanes share them; waiting for the lane could otherwise wait for a call that waits for
    /// this one (a `clWaitForEvents` on the user event this thread is about to set).
    fn take_lane<'a, L>(
        &self,
        n: usize,
        lane: impl Fn(usize) -> &'a Mutex<L>,
        own: usize,
    ) -> (usize, std::sync::MutexGuard<'a, L>) {
        self.lane_or_free_one(n, lane, own, !SENT_ASYNC.get())
    }

    /// The lane for this thread's frame sent without waiting: its own; the callback thread's,
    /// while its own is held, any free one. A program thread may have taken the callback
    /// lane (its own was busy) for a call that waits for what this frame says (a CUDA host
    /// function's "done", which the worker takes on any lane): waiting for the lane would
    /// wait for that call.
    fn async_lane<'a, L>(
        &self,
        n: usize,
        lane: impl Fn(usize) -> &'a Mutex<L>,
        own: usize,
    ) -> std::sync::MutexGuard<'a, L> {
        self.lane_or_free_one(n, lane, own, CALLBACK_THREAD.get()).1
    }

    /// Lane `own` if it is free; else, where `borrow`, any free lane (told to the guest's
    /// rendezvous, as a lane is when first used); else `own` once it is free.
    fn lane_or_free_one<'a, L>(
        &self,
        n: usize,
        lane: impl Fn(usize) -> &'a Mutex<L>,
        own: usize,
        borrow: bool,
    ) -> (usize, std::sync::MutexGuard<'a, L>) {
        match lane(own).try_lock() {
            Ok(held) => return (own, held),
            Err(std::sync::TryLockError::Poisoned(p)) => return (own, p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if borrow {
            for i in (0..n).filter(|i| *i != own) {
                if let Ok(held) = lane(i).try_lock() {
                    if let Some(r) = &self.used_lanes {
                        r.rendezvous().use_lane(i as u32);
                    }
                    return (i, held);
                }
            }
        }
        (own, lane(own).lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The next request's ticket (its seq): later than every request whose sending finished
    /// before this was asked for.
    fn ticket(&self) -> u32 {
        self.tickets.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    fn my_lane(&self) -> usize {
        if let Some(i) = MY_LANE.get() {
            return i;
        }
        // The callback thread has the last lane to itself: what it sends (a CUDA host
        // function's "done") must not queue behind a program thread's call that waits for it.
        // Program threads take the others, one each while they last.
        let (i, reused) = match (CALLBACK_THREAD.get(), self.lanes) {
            (true, n) if n >= 2 => (n - 1, false),
            _ => self.lane_users.take(),
        };
        if let Some(r) = &self.used_lanes {
            r.rendezvous().use_lane(i as u32);
        }
        MY_LANE.set(Some(i));
        if reused {
            if let Some(reset) = self.hooks.lane_reused {
                // The lane is this thread's now (MY_LANE): the reset's own request goes on it.
                reset();
            }
        }
        i
    }

    fn broken(&self, e: TransportError) -> CallError {
        if let TransportError::TooLarge(e) = e {
            // Nothing was sent: only this call fails.
            log(&format!(
                "{e}: the call is not forwarded and fails as out of host memory"
            ));
            return CallError::TooLarge;
        }
        self.dead.store(true, Ordering::SeqCst);
        if WARNED.fetch_add(1, Ordering::Relaxed) == 0 {
            log(&format!("lost the server mid-call: {e}"));
        }
        CallError::Broken
    }

    #[allow(clippy::too_many_arguments)]
    fn call_tcp(
        &self,
        outbox: &outbox::Outbox,
        slot: &TcpSlot,
        _held: std::sync::MutexGuard<'_, ()>,
        idx: usize,
        w: Writer,
        payload: &[u8],
        sink: Option<(usize, &mut [u8])>,
    ) -> Result<(Vec<u8>, bool), TransportError> {
        // The sink goes back before this returns, whatever happens: the reader may write to
        // it only while this call waits.
        struct Registered<'a>(&'a TcpSlot);
        impl Registered<'_> {
            fn take(&self) -> bool {
                let k = self.0.sink.lock().unwrap_or_else(|p| p.into_inner()).take();
                k.is_some_and(|k| k.filled)
            }
        }
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.take();
            }
        }
        let registered = Registered(slot);
        let seq = {
            // The ticket is taken where the frame's place in the stream is.
            let out = outbox.hold();
            let seq = self.ticket();
            let frame = w.finish_on(idx as u16, 0, seq)?;
            if let Some((prefix, dst)) = sink {
                *slot.sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(Sink {
                    seq,
                    prefix,
                    dst: dst.as_mut_ptr(),
                    len: dst.len(),
                    filled: false,
                });
            }
            // Behind the frames gathered before it, in one write.
            out.send(&[&frame, payload])?;
            seq
        };
        let mut reply = slot.reply.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some((h, body)) = reply.take() {
                drop(reply);
                let filled = registered.take();
                check_reply(&h, seq)?;
                if h.flags & FLAG_OUTPUT != 0 {
                    // The reader handles the MARK before the reply behind it, so this
                    // hardly ever waits.
                    self.marks.wait(idx, seq, &self.dead);
                }
                // The reply follows everything this thread sent on the lane before.
                SENT_ASYNC.set(false);
                return Ok((body, filled));
            }
            if self.dead.load(Ordering::SeqCst) {
                return Err(TransportError::PeerGone);
            }
            reply = slot
                .ready
                .wait_timeout(reply, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn check_reply(h: &FrameHeader, seq: u32) -> Result<(), TransportError> {
    if h.flags & FLAG_REPLY == 0 || h.seq != seq {
        return Err(TransportError::Corrupt("reply does not match the request"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_wire::MAX_BODY;

    /// Bytes a TCP session would have sent.
    #[derive(Clone, Default)]
    struct Sent(Arc<Mutex<Vec<u8>>>);

    impl Write for Sent {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const HOOKS: ApiHooks = ApiHooks {
        api: "test",
        waits_for_device: |_| false,
        deliver_callback: |_| {},
        when_gone: "",
        op_name: |_| None,
        lane_reused: None,
    };

    /// A call waits for its own lane's mark, or a later one, and no longer than it must.
    #[test]
    fn marks_release_the_calls_they_name() {
        let marks = Marks::new(2);
        let dead = AtomicBool::new(false);
        assert!(!marks.reached(0, 1));
        marks.record(0, 1);
        assert!(marks.reached(0, 1) && !marks.reached(0, 2) && !marks.reached(1, 1));
        // A later call's mark covers the earlier ones, across the wrap of the counter.
        marks.record(1, u32::MAX);
        assert!(marks.reached(1, u32::MAX - 5) && !marks.reached(1, 0));
        marks.record(1, 2);
        assert!(marks.reached(1, u32::MAX) && marks.reached(1, 0) && marks.reached(1, 2));
        std::thread::scope(|s| {
            let t = std::time::Instant::now();
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                marks.record(0, 7);
            });
            marks.wait(0, 7, &dead);
            assert!(marks.reached(0, 7) && t.elapsed() < MARK_TIMEOUT);
        });
        // A mark that never comes costs the bound; a session that dies ends the wait at once.
        let t = std::time::Instant::now();
        marks.wait(0, 9, &dead);
        assert!(t.elapsed() >= MARK_TIMEOUT);
        dead.store(true, Ordering::SeqCst);
        let t = std::time::Instant::now();
        marks.wait(0, 10, &dead);
        assert!(t.elapsed() < MARK_TIMEOUT);
    }

    fn oversize() -> Writer {
        let mut w = Writer::new(6);
        w.trailing_bytes(MAX_BODY as usize);
        w
    }

    /// A request beyond the frame limit fails alone (the API's client reports it as its
    /// out-of-memory status): nothing goes out and the session stays usable (it used to trip a debug assertion, and to send a
    /// header the server refuses, ending the session, in release builds).
    #[test]
    fn an_oversize_request_fails_alone() {
        let sent = Sent::default();
        let tcp = Connection {
            hooks: HOOKS,
            transport: Transport::Tcp {
                outbox: outbox::Outbox::start(Box::new(sent.clone()), Arc::default()).unwrap(),
                slots: Arc::new(vec![TcpSlot::default()]),
            },
            lanes: 1,
            lane_users: LaneUsers::new(program_lanes(1)),
            dead: Arc::new(AtomicBool::new(false)),
            marks: Marks::new(1),
            used_lanes: None,
            tickets: AtomicU32::new(0),
            arena: None,
        };
        let region = Arc::new(
            Region::create_memfd(wormhole_transport::Layout {
                lanes: 1,
                ring_capacity: 4096,
            })
            .unwrap(),
        );
        let (req, rep) = region.lane(0).unwrap();
        let link = ShmLink::new(
            req,
            rep,
            Arc::new(FutexWaiter),
            SpinPolicy::default(),
            Arc::new(|| true),
        );
        let shm = Connection {
            hooks: HOOKS,
            transport: Transport::Shm {
                lanes: vec![Mutex::new(ShmLane { link })],
                region: region.clone(),
            },
            lanes: 1,
            lane_users: LaneUsers::new(program_lanes(1)),
            dead: Arc::new(AtomicBool::new(false)),
            marks: Marks::new(1),
            used_lanes: None,
            tickets: AtomicU32::new(0),
            arena: None,
        };
        for c in [&tcp, &shm] {
            let e = c.call_bulk(oversize(), &[], None).unwrap_err();
            assert!(matches!(e, CallError::TooLarge));
            assert!(matches!(c.send_async(oversize()), Err(CallError::TooLarge)));
            assert!(!c.dead.load(Ordering::SeqCst));
        }
        assert!(sent.0.lock().unwrap().is_empty());
        let (server_rx, _) = region.lane(0).unwrap();
        assert_eq!(server_rx.readable().unwrap(), 0);
    }
}
