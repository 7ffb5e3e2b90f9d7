//! A session's worker process: it owns the tenant's OpenCL objects, serves the session's lanes
//! (one thread each, asleep while the tenant is idle) and ends when the client goes away,
//! which releases everything the session held.

use crate::session::Session;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;
use wormhole_protocol::cl::CL_OUT_OF_HOST_MEMORY;
use wormhole_protocol::{
    control, DecodeError, FrameHeader, FrameTooLarge, Op, Reader, Writer, FLAG_ASYNC, FLAG_REPLY,
};
use wormhole_transport::link::read_frame;
use wormhole_transport::rendezvous::{self, BeatWatch};
use wormhole_transport::unix::{recv_frame_with_fds, send_frame_with_fds};
use wormhole_transport::{
    Arena, FrameLink, FutexWaiter, Layout, PollWaiter, Region, ShmLink, SpinPolicy, TransportError,
};

static SESSION: OnceLock<Session> = OnceLock::new();
static LIMITS: OnceLock<Limits> = OnceLock::new();

/// The worker's one session.
pub fn session() -> &'static Session {
    SESSION.get_or_init(Session::default)
}

/// What the session's tenant may use (set once at start; unlimited if never set).
#[derive(Default)]
pub struct Limits {
    pub tenant: String,
    pub ledger: Option<crate::quota::Ledger>,
    pub slot: usize,
    pub mem_quota: Option<u64>,
    pub max_objects: Option<usize>,
    /// Substrings of the device names the tenant may use (empty: all).
    pub devices: Vec<String>,
}

impl Limits {
    /// Fails fast when `bytes` more would exceed the tenant's quota (nothing is reserved).
    pub fn precheck(&self, bytes: u64) -> Result<(), i32> {
        match (&self.ledger, self.mem_quota) {
            (Some(l), Some(q)) if (l.total().max(0) as u64).saturating_add(bytes) > q => {
                tracing::warn!(tenant = %self.tenant, bytes, quota = q, "allocation refused: over the tenant's memory quota");
                Err(wormhole_protocol::cl::CL_MEM_OBJECT_ALLOCATION_FAILURE)
            }
            _ => Ok(()),
        }
    }

    /// Reserves `bytes` against the quota; false (and a log line) if that would exceed it.
    pub fn reserve(&self, bytes: u64) -> bool {
        match &self.ledger {
            Some(l) => {
                let ok = l.reserve(self.slot, bytes, self.mem_quota);
                if !ok {
                    tracing::warn!(tenant = %self.tenant, bytes, quota = self.mem_quota, "allocation refused: over the tenant's memory quota");
                }
                ok
            }
            None => true,
        }
    }

    pub fn release(&self, bytes: u64) {
        if let Some(l) = &self.ledger {
            l.release(self.slot, bytes);
        }
    }

    pub fn tenant_bytes(&self) -> i64 {
        self.ledger.as_ref().map_or(0, |l| l.total())
    }
}

pub fn limits() -> &'static Limits {
    LIMITS.get_or_init(Limits::default)
}

/// Sets the session's limits; call once, before serving.
pub fn set_limits(l: Limits) {
    let _ = LIMITS.set(l);
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("transport failed")]
    Transport(#[from] TransportError),
    #[error("I/O failed")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
}

/// What a standby worker does before any tenant waits for it: load the driver and let it find
/// its devices, the slow part of a session's start (tens of milliseconds for PoCL).
pub fn warm_up() {
    use crate::generated::ffi;
    use std::ptr::null_mut;
    use wormhole_protocol::cl::{CL_DEVICE_TYPE_ALL, CL_SUCCESS};
    // SAFETY: plain queries into local buffers of the sizes given.
    unsafe {
        let mut n = 0u32;
        if ffi::clGetPlatformIDs(0, null_mut(), &mut n) != CL_SUCCESS || n == 0 {
            return;
        }
        let mut platforms = vec![null_mut(); n as usize];
        ffi::clGetPlatformIDs(n, platforms.as_mut_ptr(), null_mut());
        for p in platforms {
            let mut devices = 0u32;
            ffi::clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, null_mut(), &mut devices);
        }
    }
}

/// A standby worker waits here for the supervisor to hand it a session: the transport's name
/// and the session's socket. `None` once the supervisor has gone.
pub fn await_session(
    ctl: &UnixStream,
) -> Result<Option<(String, std::os::fd::OwnedFd)>, WorkerError> {
    let mut body = Vec::new();
    let (h, fds) = match recv_frame_with_fds(ctl, &mut body) {
        Ok(got) => got,
        Err(TransportError::PeerGone) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let transport = Reader::new(&body)
        .bytes()
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok());
    match (h.opcode, transport, fds.into_iter().next()) {
        (control::HANDOFF, Some(transport), Some(fd)) => Ok(Some((transport, fd))),
        _ => Err(WorkerError::Io(std::io::Error::other(
            "the supervisor's handoff carried no session",
        ))),
    }
}

/// The shared memory of a local session: its region of lanes and its buffer arena. A standby
/// worker makes them before any tenant waits, so a session's start pays none of it.
pub struct SharedMemory {
    region: Region,
    arena: Option<Arena>,
}

impl SharedMemory {
    pub fn create(layout: Layout) -> Result<SharedMemory, WorkerError> {
        Ok(SharedMemory {
            region: Region::create_memfd(layout)?,
            // Large buffers of in-place devices live here, where the client copies them
            // itself. Without one (an address-space limit, say) every transfer goes through
            // the rings.
            arena: Arena::create(wormhole_transport::arena::ARENA_SIZE)
                .inspect_err(|e| tracing::warn!("no buffer arena for this session: {e}"))
                .ok(),
        })
    }
}

/// Serves one session on `sock` (HELLO was already checked by the supervisor) in `memory`
/// (made now if None). Returns when the client disconnects.
pub fn run(
    sock: UnixStream,
    stats: Option<UnixStream>,
    layout: Layout,
    memory: Option<SharedMemory>,
) -> Result<(), WorkerError> {
    let SharedMemory { region, arena } = match memory {
        Some(m) => m,
        None => SharedMemory::create(layout)?,
    };
    let mut w = Writer::new(control::WELCOME);
    w.u64(u64::from(std::process::id()));
    w.u32(layout.lanes);
    w.u64(layout.ring_capacity);
    let mut fds = vec![region.file().as_raw_fd()];
    fds.extend(arena.as_ref().map(|a| a.file().as_raw_fd()));
    send_frame_with_fds(&sock, &w.finish(0, 0)?, &fds)?;
    if let Some(arena) = arena {
        crate::arena::enable(arena);
    }
    crate::callbacks::set_sink(Arc::new(Mutex::new(sock.try_clone()?)));

    let region = Arc::new(region);
    // The process ends with its client, so lanes need not poll for liveness: they sleep until
    // the client writes (no CPU while the tenant is idle).
    let policy = SpinPolicy {
        sleep_slice: Duration::from_secs(3600),
        ..SpinPolicy::default()
    };
    for lane in 0..layout.lanes {
        let region = region.clone();
        std::thread::Builder::new()
            .name(format!("lane-{lane}"))
            .spawn(move || {
                let (req, rep) = region.lane(lane).expect("lane within layout");
                let link = ShmLink::new(rep, req, Arc::new(FutexWaiter), policy, Arc::new(|| true));
                if let Err(e) = serve_lane(link) {
                    tracing::error!(lane, "ending session: {e}");
                    std::process::exit(3);
                }
            })?;
    }
    if let Some(stats) = stats {
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || serve_stats(stats))?;
    }
    // The control socket carries callbacks to the client; from the client it only ever carries
    // EOF, which ends the session.
    let mut buf = [0u8; 64];
    loop {
        match (&sock).read(&mut buf) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => tracing::warn!("unexpected bytes on the control socket"),
        }
    }
}

/// How a guest-region worker's lanes wait: no futex reaches into a VM, so an idle lane polls
/// with a sleep that grows to this bound (the latency of the first call after a pause).
const GUEST_POLL: PollWaiter = PollWaiter {
    max_sleep: Duration::from_millis(8),
};
/// How often a guest worker looks for newly used lanes and for its client's end: a thread's
/// first call on a new lane may wait this long.
const GUEST_TICK: Duration = Duration::from_millis(40);
/// A guest client whose heartbeat stops for this long is gone (killed, or its VM stopped).
const GUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// A claimed region must see its HELLO within this time.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one session of a guest region (an ivshmem backing file): resets the region, waits
/// for a client in the guest to claim it, answers its HELLO on lane 0, serves the lanes it
/// uses, and returns when the client closes or its heartbeat stops. The supervisor then
/// starts a fresh worker (fresh driver state) for the guest's next session.
pub fn run_guest(
    path: &std::path::Path,
    layout: Layout,
    stats: Option<UnixStream>,
) -> Result<(), WorkerError> {
    if layout.lanes < 2 {
        return Err(WorkerError::Transport(TransportError::Layout(
            "a guest region needs a call lane and an event lane".into(),
        )));
    }
    let region = Arc::new(Region::reset_file(path, layout)?);
    {
        let region = region.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || loop {
                region.rendezvous().beat_server();
                std::thread::sleep(rendezvous::BEAT_INTERVAL);
            })?;
    }
    if let Some(stats) = stats {
        // Nothing else tells a guest worker that its supervisor is gone (it has no client
        // socket), and an orphan must not keep serving a region a new server resets.
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || {
                serve_stats(stats);
                tracing::warn!("the supervisor is gone; ending the guest session");
                std::process::exit(0);
            })?;
    }
    let rv = region.rendezvous();
    let epoch = rv.server_epoch.load(Ordering::Acquire);
    let overtaken = || rv.server_epoch.load(Ordering::Acquire) != epoch;
    tracing::info!(region = %path.display(), "guest region ready");
    while rv.client_claim.load(Ordering::Acquire) == 0 {
        if overtaken() {
            tracing::warn!(region = %path.display(), "another worker reset the region; leaving it");
            return Ok(());
        }
        std::thread::sleep(GUEST_TICK);
    }
    let client = Arc::new(BeatWatch::new(
        rv.client_beat.load(Ordering::Acquire),
        GUEST_TIMEOUT,
    ));
    let alive: wormhole_transport::link::Liveness = {
        let (region, client) = (region.clone(), client.clone());
        Arc::new(move || {
            let rv = region.rendezvous();
            rv.client_state.load(Ordering::Acquire) != rendezvous::CLIENT_CLOSED
                && client.alive(&rv.client_beat)
        })
    };
    let policy = SpinPolicy {
        sleep_slice: Duration::from_millis(100),
        ..SpinPolicy::default()
    };
    let waiter = Arc::new(GUEST_POLL);
    // The handshake: HELLO on lane 0, answered there.
    let (req, rep) = region.lane(0).expect("lane 0");
    let mut link = ShmLink::new(rep, req, waiter.clone(), policy, {
        let (alive, start) = (alive.clone(), std::time::Instant::now());
        Arc::new(move || alive() && start.elapsed() < HELLO_TIMEOUT)
    });
    let mut body = Vec::new();
    let h = link.recv(&mut body)?;
    if let Err(reason) = check_hello(&h, &body) {
        tracing::warn!(region = %path.display(), "guest session refused: {reason}");
        let mut w = Writer::new(control::REFUSED);
        w.bytes(reason.as_bytes());
        link.send(&w.finish(FLAG_REPLY, h.seq)?)?;
        return Ok(());
    }
    let call_lanes = layout.lanes - 1;
    let mut w = Writer::new(control::WELCOME);
    w.u64(u64::from(std::process::id()));
    w.u32(call_lanes);
    w.u64(layout.ring_capacity);
    link.send(&w.finish(FLAG_REPLY, h.seq)?)?;
    rv.server_state
        .store(rendezvous::STATE_SERVING, Ordering::Release);
    tracing::info!(region = %path.display(), "guest session started");
    // Callbacks go out on the reply ring of the last lane, which the client reads on its own
    // thread.
    let (ev_req, ev_rep) = region.lane(call_lanes).expect("event lane");
    let events = ShmLink::new(ev_rep, ev_req, waiter.clone(), policy, alive.clone());
    crate::callbacks::set_sink(Arc::new(Mutex::new(LinkWriter(events))));
    // Serve each lane once the client hands it to a thread; end when the client goes.
    let mut served = 0u64;
    loop {
        let used = rv.lanes_used.load(Ordering::Acquire) & ((1u64 << call_lanes.min(63)) - 1);
        for lane in 0..call_lanes {
            if used & !served & (1 << lane) != 0 {
                served |= 1 << lane;
                let region = region.clone();
                let waiter = waiter.clone();
                std::thread::Builder::new()
                    .name(format!("lane-{lane}"))
                    .spawn(move || {
                        let (req, rep) = region.lane(lane).expect("lane within layout");
                        // The lane lives until the worker ends the session (below).
                        let link = ShmLink::new(rep, req, waiter, policy, Arc::new(|| true));
                        if let Err(e) = serve_lane(link) {
                            tracing::error!(lane, "ending guest session: {e}");
                            std::process::exit(3);
                        }
                    })?;
            }
        }
        if rv.client_state.load(Ordering::Acquire) == rendezvous::CLIENT_CLOSED {
            tracing::info!(region = %path.display(), "guest session closed by the client");
            return Ok(());
        }
        if overtaken() {
            tracing::warn!(region = %path.display(), "another worker reset the region; ending the session");
            return Ok(());
        }
        if !client.alive(&rv.client_beat) {
            tracing::warn!(region = %path.display(), "guest client stopped its heartbeat; ending its session");
            return Ok(());
        }
        std::thread::sleep(GUEST_TICK);
    }
}

fn check_hello(h: &FrameHeader, body: &[u8]) -> Result<(), String> {
    if h.opcode != control::HELLO {
        return Err(format!("expected HELLO, got opcode {:#06x}", h.opcode));
    }
    parse_hello(body).map(|_token| ())
}

/// Checks a HELLO body (version, API, then a tenant token if any) and returns the token, or
/// the reason to refuse the session.
pub(crate) fn parse_hello(body: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut r = Reader::new(body);
    let hello = (|| {
        let v = r.u8()?;
        let api = r.bytes()?;
        // A token (TCP tenants) may follow.
        let token = if r.remaining() > 0 {
            r.opt_bytes()?
        } else {
            None
        };
        Ok::<_, DecodeError>((v, api, token))
    })();
    match hello {
        Ok((v, api, token))
            if v == wormhole_protocol::VERSION
                && api == wormhole_protocol::API_OPENCL.as_bytes() =>
        {
            Ok(token)
        }
        Ok((v, api, _)) => Err(format!(
            "unsupported version {v} or API {:?}",
            String::from_utf8_lossy(api)
        )),
        Err(e) => Err(format!("malformed HELLO: {e}")),
    }
}

/// Frames written to a shared-memory link (the callback sink of a guest session).
struct LinkWriter(ShmLink);

impl Write for LinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .send(buf)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum LaneError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("malformed request (opcode {op:#06x}): {source}")]
    Malformed { op: u16, source: DecodeError },
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
}

/// Runs one request, writing the reply frame into `out` (whose allocation is reused); returns
/// whether there is a reply (the client asked for none with FLAG_ASYNC).
fn handle(h: &FrameHeader, body: &[u8], out: &mut Vec<u8>) -> Result<bool, LaneError> {
    let s = session();
    s.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut w = Writer::with_buffer(h.opcode, std::mem::take(out));
    let mut r = Reader::new(body);
    let res = if h.opcode == control::COLLECT {
        crate::custom::collect(s, &mut r, &mut w)
    } else if h.opcode == control::SVM_PUSH {
        crate::custom::svm_push(s, &mut r, &mut w)
    } else if h.opcode == control::SVM_PULL {
        crate::custom::svm_pull(s, &mut r, &mut w)
    } else if h.opcode == control::DIRECT {
        crate::arena::direct(s, &mut r, &mut w)
    } else {
        match Op::from_u16(h.opcode) {
            Some(op) => crate::generated::dispatch(s, op, &mut r, &mut w),
            None => Err(DecodeError::UnknownOp(h.opcode)),
        }
    };
    res.map_err(|source| LaneError::Malformed {
        op: h.opcode,
        source,
    })?;
    if h.flags & FLAG_ASYNC != 0 {
        // The client sent this without waiting because it had ruled out every error; a failure
        // here is a gap in that validation (or a resource failure): say so, and count it.
        let status = w
            .body()
            .get(..4)
            .map_or(0, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if status != 0 {
            s.async_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = Op::from_u16(h.opcode).map_or("control", |o| o.name());
            tracing::warn!(
                op = name,
                status,
                "a call the client sent without waiting failed"
            );
        }
        // No reply goes out, so neither does bulk data a handler left for it.
        if let Some(t) = crate::custom::take_trailer() {
            t.release();
        }
        // Only the buffer is kept, for reuse.
        *out = w.finish_on(h.lane, 0, h.seq).unwrap_or_default();
        return Ok(false);
    }
    *out = reply_frame(h, w);
    Ok(true)
}

/// The reply frame `w` makes for request `h`. A reply that cannot travel (the peer would
/// refuse it) becomes a failure of the call instead, as any call may fail for want of memory,
/// and the session goes on.
fn reply_frame(h: &FrameHeader, w: Writer) -> Vec<u8> {
    match w.finish_on(h.lane, FLAG_REPLY, h.seq) {
        Ok(frame) => frame,
        Err(e) => {
            let name = Op::from_u16(h.opcode).map_or("control", |o| o.name());
            tracing::error!(op = name, "{e}: answering CL_OUT_OF_HOST_MEMORY instead");
            if let Some(t) = crate::custom::take_trailer() {
                t.release();
            }
            status_reply(h, CL_OUT_OF_HOST_MEMORY)
        }
    }
}

/// A reply to `h` that carries a status only (what every reply starts with).
fn status_reply(h: &FrameHeader, status: i32) -> Vec<u8> {
    let header = FrameHeader {
        flags: FLAG_REPLY,
        opcode: h.opcode,
        lane: h.lane,
        len: 4,
        seq: h.seq,
    };
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(&status.to_le_bytes());
    frame
}

/// Buffers a lane keeps between requests stay allocated up to this size.
const KEEP_BUFFER: usize = 64 << 20;

fn serve_lane(mut link: ShmLink) -> Result<(), LaneError> {
    use crate::custom::{StreamError, Streamed, STREAMED_WRITE_MIN};
    let mut body = Vec::new();
    let mut reply = Vec::new();
    loop {
        let h = link.recv_header()?;
        if h.opcode == Op::clEnqueueWriteBuffer as u16
            && h.flags & FLAG_ASYNC == 0
            && u64::from(h.len) >= STREAMED_WRITE_MIN
        {
            // Bulk data may go from the ring straight into the driver's buffer.
            match crate::custom::stream_write(session(), &mut link, &h, &mut body) {
                Ok(Streamed::Done(status)) => {
                    let mut w = Writer::with_buffer(h.opcode, std::mem::take(&mut reply));
                    w.i32(status);
                    reply = w.finish_on(h.lane, FLAG_REPLY, h.seq)?;
                    link.send(&reply)?;
                    continue;
                }
                Ok(Streamed::Body) => {}
                Err(StreamError::Transport(e)) => return Err(e.into()),
                Err(StreamError::Malformed(source)) => {
                    return Err(LaneError::Malformed {
                        op: h.opcode,
                        source,
                    })
                }
            }
        } else {
            let n = h.len as usize;
            if body.len() < n {
                body.resize(n, 0);
            }
            link.recv_exact(&mut body[..n])?;
        }
        if handle(&h, &body[..h.len as usize], &mut reply)? {
            match crate::custom::take_trailer() {
                Some(t) => {
                    let sent = link.send_parts(&[&reply, t.bytes()]);
                    t.release();
                    sent?;
                }
                None => link.send(&reply)?,
            }
        }
        if body.len() > KEEP_BUFFER {
            body = Vec::new();
        }
        if reply.capacity() > KEEP_BUFFER {
            reply = Vec::new();
        }
    }
}

/// A byte stream the TCP-style transport can read on one thread and write on others: a TCP
/// socket, or (TLS sessions) the worker's end of the supervisor's TLS proxy.
pub trait Duplex: Read + Write + Send + 'static {
    fn duplicate(&self) -> std::io::Result<Self>
    where
        Self: Sized;
}

impl Duplex for TcpStream {
    fn duplicate(&self) -> std::io::Result<Self> {
        self.set_nodelay(true)?;
        self.try_clone()
    }
}

impl Duplex for UnixStream {
    fn duplicate(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
}

/// Requests waiting for a lane's thread.
type LaneQueue = mpsc::Sender<(FrameHeader, Vec<u8>)>;

/// Serves one session over a TCP stream: frames of all lanes share it, each lane's requests run
/// on their own thread (started on first use) so one lane's blocking call never stalls another.
pub fn run_tcp<S: Duplex>(
    stream: S,
    stats: Option<UnixStream>,
    lanes: u32,
) -> Result<(), WorkerError> {
    let writer = Arc::new(Mutex::new(stream.duplicate()?));
    let mut w = Writer::new(control::WELCOME);
    w.u64(u64::from(std::process::id()));
    w.u32(lanes);
    w.u64(0);
    writer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .write_all(&w.finish(0, 0)?)?;
    crate::callbacks::set_sink(writer.clone());
    if let Some(stats) = stats {
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || serve_stats(stats))?;
    }
    let mut queues: Vec<Option<LaneQueue>> = (0..lanes).map(|_| None).collect();
    let mut reader = std::io::BufReader::with_capacity(1 << 16, stream);
    loop {
        let mut body = Vec::new();
        let h = match read_frame(&mut reader, &mut body) {
            Ok(h) => h,
            Err(TransportError::PeerGone) => return Ok(()),
            Err(e) => {
                tracing::error!("ending session: {e}");
                std::process::exit(3);
            }
        };
        let Some(slot) = queues.get_mut(usize::from(h.lane)) else {
            tracing::error!(
                lane = h.lane,
                "ending session: frame for a lane that does not exist"
            );
            std::process::exit(3);
        };
        let tx = match slot {
            Some(tx) => tx,
            None => {
                let (tx, rx) = mpsc::channel::<(FrameHeader, Vec<u8>)>();
                let writer = writer.clone();
                std::thread::Builder::new()
                    .name(format!("lane-{}", h.lane))
                    .spawn(move || {
                        let mut reply = Vec::new();
                        for (h, body) in rx {
                            match handle(&h, &body, &mut reply) {
                                Ok(true) => {
                                    let trailer = crate::custom::take_trailer();
                                    let sent = {
                                        let mut out =
                                            writer.lock().unwrap_or_else(|p| p.into_inner());
                                        out.write_all(&reply).and_then(|_| match &trailer {
                                            Some(t) => out.write_all(t.bytes()),
                                            None => Ok(()),
                                        })
                                    };
                                    if let Some(t) = trailer {
                                        t.release();
                                    }
                                    if sent.is_err() {
                                        return;
                                    }
                                }
                                Ok(false) => {}
                                Err(e) => {
                                    tracing::error!(lane = h.lane, "ending session: {e}");
                                    std::process::exit(3);
                                }
                            }
                        }
                    })?;
                slot.insert(tx)
            }
        };
        let _ = tx.send((h, body));
    }
}

/// What a worker reports about its session (`wh status`, metrics).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SessionDetail {
    pub pid: u32,
    pub tenant: String,
    pub mem_quota: Option<u64>,
    pub tenant_mem_bytes: i64,
    pub calls: u64,
    pub async_failures: u64,
    pub mem_bytes: i64,
    /// Bytes of buffers stored in the arena the client maps, and the blocking transfers the
    /// client copied there itself (see `arena`).
    #[serde(default)]
    pub shared_mem_bytes: u64,
    #[serde(default)]
    pub direct_transfers: u64,
    /// Builds the program cache served, and builds it could have served but compiled.
    #[serde(default)]
    pub program_cache_hits: u64,
    #[serde(default)]
    pub program_cache_misses: u64,
    pub objects: std::collections::BTreeMap<String, usize>,
}

fn detail() -> SessionDetail {
    let s = session();
    SessionDetail {
        pid: std::process::id(),
        tenant: limits().tenant.clone(),
        mem_quota: limits().mem_quota,
        tenant_mem_bytes: limits().tenant_bytes(),
        calls: s.calls.load(std::sync::atomic::Ordering::Relaxed),
        async_failures: s.async_failures.load(std::sync::atomic::Ordering::Relaxed),
        mem_bytes: s.mem_bytes(),
        shared_mem_bytes: crate::arena::SHARED_BYTES.load(std::sync::atomic::Ordering::Relaxed),
        direct_transfers: crate::arena::DIRECT_TRANSFERS.load(std::sync::atomic::Ordering::Relaxed),
        program_cache_hits: crate::program_cache::HITS.load(std::sync::atomic::Ordering::Relaxed),
        program_cache_misses: crate::program_cache::MISSES
            .load(std::sync::atomic::Ordering::Relaxed),
        objects: s
            .object_counts()
            .into_iter()
            .map(|(k, n)| (format!("{k:?}"), n))
            .collect(),
    }
}

/// Answers the supervisor's status questions about this session.
fn serve_stats(mut sock: UnixStream) {
    let mut body = Vec::new();
    while read_frame(&mut sock, &mut body).is_ok() {
        let json = serde_json::to_vec(&detail()).unwrap_or_default();
        let mut w = Writer::new(control::STATUS);
        w.bytes(&json);
        let Ok(frame) = w.finish(FLAG_REPLY, 0) else {
            tracing::warn!("session statistics too large to send");
            continue;
        };
        if sock.write_all(&frame).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply larger than a frame may be is answered with CL_OUT_OF_HOST_MEMORY alone (it
    /// used to trip a debug assertion, and to go out with a header the client refuses, ending
    /// the session, in release builds).
    #[test]
    fn an_oversize_reply_becomes_an_error_status() {
        let h = FrameHeader {
            flags: 0,
            opcode: Op::clGetProgramInfo as u16,
            lane: 2,
            len: 0,
            seq: 41,
        };
        let mut w = Writer::new(h.opcode);
        w.i32(0);
        w.trailing_bytes(wormhole_protocol::MAX_BODY as usize);
        let frame = reply_frame(&h, w);
        let got = FrameHeader::decode(frame[..wormhole_protocol::HEADER_LEN].try_into().unwrap())
            .unwrap();
        assert_eq!(
            (got.opcode, got.lane, got.seq, got.flags),
            (h.opcode, 2, 41, FLAG_REPLY)
        );
        let mut r = Reader::new(&frame[wormhole_protocol::HEADER_LEN..]);
        assert_eq!(r.i32().unwrap(), CL_OUT_OF_HOST_MEMORY);
        r.finish().unwrap();
        // A reply within the limit goes out as written.
        let mut w = Writer::new(h.opcode);
        w.i32(0);
        w.u64(7);
        let frame = reply_frame(&h, w);
        assert_eq!(frame.len(), wormhole_protocol::HEADER_LEN + 12);
    }
}
