//! A session's worker process: it serves one session of one API (its [`Backend`] owns the
//! tenant's driver objects), on the session's lanes (one thread each, asleep while the tenant
//! is idle), and ends when the client goes away, which releases everything the session held.
//! Every transport (shared memory, TCP/TLS, a guest region) runs requests through one path,
//! [`handle`].

use crate::backend::{Backend, CallbackSink, Completion, SessionSetup, StreamError, Streamed};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;
use wormhole_transport::link::{read_body, read_frame, read_header};
use wormhole_transport::rendezvous::{self, BeatWatch};
use wormhole_transport::unix::{recv_frame_with_fds, send_frame_with_fds};
use wormhole_transport::{
    Arena, FrameLink, FutexWaiter, Layout, PollWaiter, Region, ShmLink, SpinPolicy, SpinRead,
    TransportError,
};
use wormhole_wire::handshake::{self, Hello, Welcome};
use wormhole_wire::{
    control, DecodeError, FrameHeader, FrameTooLarge, Reader, Writer, FLAG_ASYNC, FLAG_OUTPUT,
    FLAG_REPLY,
};

static LIMITS: OnceLock<Arc<Limits>> = OnceLock::new();

/// Requests the session made, and requests sent without waiting that failed anyway.
static CALLS: AtomicU64 = AtomicU64::new(0);
static ASYNC_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How far each lane has handled its requests (see `order`), made when the session's lanes are
/// known.
static ORDER: OnceLock<crate::order::LaneOrder> = OnceLock::new();

fn order() -> &'static crate::order::LaneOrder {
    ORDER.get_or_init(|| crate::order::LaneOrder::new(0))
}

/// Requests the session has made so far: a backend that defers its own work to quiet moments
/// watches this stand still.
pub fn calls_served() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// One more call served: counted for `wh status`, and it wakes a parked slice review.
fn count_call() {
    CALLS.fetch_add(1, Ordering::Relaxed);
    crate::slices::busy();
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
    /// Whether the tenant may use the device named `name` (its name contains one of the
    /// tenant's `devices`, or the tenant has none).
    pub fn may_use_device(&self, name: &str) -> bool {
        self.devices.is_empty() || self.devices.iter().any(|p| name.contains(p.as_str()))
    }

    /// Fails fast when `bytes` more would exceed the tenant's quota (nothing is reserved).
    #[allow(clippy::result_unit_err)]
    pub fn precheck(&self, bytes: u64) -> Result<(), ()> {
        match (&self.ledger, self.mem_quota) {
            (Some(l), Some(q)) if (l.total().max(0) as u64).saturating_add(bytes) > q => {
                tracing::warn!(tenant = %self.tenant, bytes, quota = q, "allocation refused: over the tenant's memory quota");
                Err(())
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

    /// Reserves `bytes` of page-locked host memory against the quota (an account of its own,
    /// apart from device memory); false (and a log line) if that would exceed it.
    pub fn reserve_host(&self, bytes: u64) -> bool {
        match &self.ledger {
            Some(l) => {
                let ok = l.reserve_of(crate::quota::Kind::Host, self.slot, bytes, self.mem_quota);
                if !ok {
                    tracing::warn!(tenant = %self.tenant, bytes, quota = self.mem_quota, "page-locked host memory refused: over the tenant's memory quota");
                }
                ok
            }
            None => true,
        }
    }

    pub fn release_host(&self, bytes: u64) {
        if let Some(l) = &self.ledger {
            l.release_of(crate::quota::Kind::Host, self.slot, bytes);
        }
    }

    pub fn tenant_bytes(&self) -> i64 {
        self.ledger.as_ref().map_or(0, |l| l.total())
    }

    /// The most commands a session may have queued per command queue now (0: no limit). It
    /// lives in the tenant's ledger, where `wh tenant set` changes it for running sessions.
    pub fn max_queued(&self) -> u64 {
        self.ledger.as_ref().map_or(0, |l| l.max_queued())
    }
}

/// The worker's limits (its backend gets them explicitly, in [`SessionSetup`]).
fn limits() -> &'static Arc<Limits> {
    LIMITS.get_or_init(Default::default)
}

/// Sets the session's limits; call once, before serving.
fn set_limits(l: Limits) {
    let _ = LIMITS.set(Arc::new(l));
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("transport failed")]
    Transport(#[from] TransportError),
    #[error("I/O failed")]
    Io(#[from] std::io::Error),
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

/// Answers the session's client REFUSED with `reason` instead of WELCOME (its application then
/// sees no device) and ends the session: a worker without a driver has nothing to serve.
fn refuse(mut stream: impl Write, reason: &str) -> Result<(), WorkerError> {
    tracing::warn!("session refused: {reason}");
    stream.write_all(&handshake::refused(reason))?;
    Ok(())
}

/// Serves one session of `backend` on `sock` (HELLO was already checked by the supervisor) in
/// `memory` (made now if None). Returns when the client disconnects.
pub fn run(
    backend: &'static dyn Backend,
    build_cache: Option<wormhole_blobcache::BlobCache>,
    sock: UnixStream,
    stats: Option<UnixStream>,
    layout: Layout,
    memory: Option<SharedMemory>,
) -> Result<(), WorkerError> {
    if let Err(reason) = backend.load() {
        return refuse(&sock, &reason);
    }
    let SharedMemory { region, arena } = match memory {
        Some(m) => m,
        None => SharedMemory::create(layout)?,
    };
    let welcome = Welcome {
        session: u64::from(std::process::id()),
        lanes: layout.lanes,
        ring_capacity: layout.ring_capacity,
    };
    let mut fds = vec![region.file().as_raw_fd()];
    fds.extend(arena.as_ref().map(|a| a.file().as_raw_fd()));
    send_frame_with_fds(&sock, &welcome.encode(0), &fds)?;
    let callbacks: CallbackSink = Arc::new(Mutex::new(sock.try_clone()?));
    capture_output(&callbacks, layout.lanes);
    let callbacks_of_session = callbacks.clone();
    backend.begin(SessionSetup {
        limits: limits().clone(),
        callbacks,
        arena,
        build_cache,
    });

    let region = Arc::new(region);
    // The process ends with its client, so lanes need not poll for liveness: they sleep until
    // the client writes (no CPU while the tenant is idle).
    let policy = SpinPolicy {
        sleep_slice: Duration::from_secs(3600),
        ..SpinPolicy::default()
    };
    let _ = ORDER.set(crate::order::LaneOrder::new(layout.lanes as usize));
    for lane in 0..layout.lanes {
        let region = region.clone();
        std::thread::Builder::new()
            .name(format!("lane-{lane}"))
            .spawn(move || {
                crate::slices::lane();
                let (req, rep) = region.lane(lane).expect("lane within layout");
                let link = ShmLink::new(rep, req, Arc::new(FutexWaiter), policy, Arc::new(|| true));
                if let Err(e) = serve_lane(backend, lane as usize, link, &region) {
                    tracing::error!(lane, "ending session: {e}");
                    backend.end();
                    std::process::exit(3);
                }
            })?;
    }
    // A local client's CPU is the host's: brief threads may be kept beside it.
    let (client_region, lanes) = (region.clone(), layout.lanes);
    crate::slices::start_review(
        &CALLS,
        Some(Box::new(move || {
            (0..lanes)
                .filter_map(|i| client_region.request_activity(i))
                .collect()
        })),
    )?;
    if let Some(stats) = stats {
        let sink = callbacks_of_session.clone();
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || serve_stats(backend, stats, Some(sink)))?;
    }
    // The control socket carries callbacks to the client; from the client it only ever carries
    // EOF, which ends the session.
    let mut buf = [0u8; 64];
    loop {
        match (&sock).read(&mut buf) {
            Ok(0) | Err(_) => {
                backend.end();
                return Ok(());
            }
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
    backend: &'static dyn Backend,
    build_cache: Option<wormhole_blobcache::BlobCache>,
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
    crate::slices::start_review(&CALLS, None)?;
    if let Some(stats) = stats {
        // Nothing else tells a guest worker that its supervisor is gone (it has no client
        // socket), and an orphan must not keep serving a region a new server resets.
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || {
                serve_stats(backend, stats, None);
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
    if let Err(reason) = Hello::check(&h, &body, &[backend.api()])
        .map(|_| ())
        .and_then(|()| backend.load())
    {
        tracing::warn!(region = %path.display(), "guest session refused: {reason}");
        link.send(&handshake::refused(&reason))?;
        return Ok(());
    }
    let call_lanes = layout.lanes - 1;
    let welcome = Welcome {
        session: u64::from(std::process::id()),
        lanes: call_lanes,
        ring_capacity: layout.ring_capacity,
    };
    link.send(&welcome.encode(h.seq))?;
    rv.server_state
        .store(rendezvous::STATE_SERVING, Ordering::Release);
    tracing::info!(region = %path.display(), "guest session started");
    // Callbacks go out on the reply ring of the last lane, which the client reads on its own
    // thread.
    let (ev_req, ev_rep) = region.lane(call_lanes).expect("event lane");
    let events = ShmLink::new(ev_rep, ev_req, waiter.clone(), policy, alive.clone());
    let callbacks: CallbackSink = Arc::new(Mutex::new(LinkWriter(events)));
    capture_output(&callbacks, call_lanes);
    let _ = ORDER.set(crate::order::LaneOrder::new(call_lanes as usize));
    backend.begin(SessionSetup {
        limits: limits().clone(),
        callbacks,
        arena: None,
        build_cache,
    });
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
                        crate::slices::lane();
                        let (req, rep) = region.lane(lane).expect("lane within layout");
                        // The lane lives until the worker ends the session (below).
                        let link = ShmLink::new(rep, req, waiter, policy, Arc::new(|| true));
                        if let Err(e) = serve_lane(backend, lane as usize, link, &region) {
                            tracing::error!(lane, "ending guest session: {e}");
                            backend.end();
                            std::process::exit(3);
                        }
                    })?;
            }
        }
        if rv.client_state.load(Ordering::Acquire) == rendezvous::CLIENT_CLOSED {
            tracing::info!(region = %path.display(), "guest session closed by the client");
            backend.end();
            return Ok(());
        }
        if overtaken() {
            tracing::warn!(region = %path.display(), "another worker reset the region; ending the session");
            backend.end();
            return Ok(());
        }
        if !client.alive(&rv.client_beat) {
            tracing::warn!(region = %path.display(), "guest client stopped its heartbeat; ending its session");
            backend.end();
            return Ok(());
        }
        std::thread::sleep(GUEST_TICK);
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
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
    #[error("malformed request (opcode {op:#06x}): {source}")]
    Malformed { op: u16, source: DecodeError },
}

/// A reply frame, and the bulk data that follows it (if any).
struct Outgoing {
    trailer: Option<Box<dyn crate::backend::Trailer>>,
}

/// Starts forwarding the driver's output (fd 1) to the session's client on `sink`.
fn capture_output(sink: &CallbackSink, lanes: u32) {
    if let Err(e) = crate::output::capture(sink.clone(), lanes as usize) {
        tracing::warn!("device output (kernel printf) stays in the worker's stdout: {e}");
    }
}

/// The flag a reply to `h` on lane `lane` carries for the driver's output: FLAG_OUTPUT when
/// its request was a synchronisation point with output the lane has not waited for yet (the
/// MARK the client then waits for has just gone out), else none.
fn output_flag(lane: usize, h: &FrameHeader) -> u8 {
    match crate::output::take_synced() {
        Some(sent) if crate::output::mark(lane, h.seq, sent) => FLAG_OUTPUT,
        _ => 0,
    }
}

/// Runs one request, writing the reply frame into `out` (whose allocation is reused): the one
/// path every transport's requests take. `lane` is the lane it came on. Returns the bulk data
/// to send after the frame, or None when no reply goes out (the client asked for none with
/// FLAG_ASYNC).
fn handle(
    backend: &dyn Backend,
    lane: usize,
    h: &FrameHeader,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<Option<Outgoing>, LaneError> {
    count_call();
    let mut w = Writer::with_buffer(h.opcode, std::mem::take(out));
    let mut r = Reader::new(body);
    let reply = backend
        .handle(h, &mut r, &mut w)
        .map_err(|source| LaneError::Malformed {
            op: h.opcode,
            source,
        })?;
    if h.flags & FLAG_ASYNC != 0 {
        // No reply to mark: nobody waits for this call.
        crate::output::take_synced();
        // The client sent this without waiting because it had ruled out every error; a failure
        // here is a gap in that validation (or a resource failure): say so, and count it. (A
        // request within a waited call is answered to its caller by the call's end.)
        if reply.status != 0 && !backend.within_waited_call(h.opcode) {
            ASYNC_FAILURES.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                opcode = h.opcode,
                status = reply.status,
                "a call the client sent without waiting failed"
            );
        }
        // No reply goes out, so neither does bulk data the handler left for it (dropping
        // the trailer releases it). Only the buffer is kept, for reuse.
        *out = w.finish_on(h.lane, 0, h.seq).unwrap_or_default();
        return Ok(None);
    }
    Ok(Some(frame_reply(
        backend.out_of_memory(),
        lane,
        h,
        w,
        reply,
        out,
    )))
}

/// Frames the reply to synchronous request `h` (on lane `lane`), whose body `w` holds, into
/// `out`; returns the bulk data to send after it.
fn frame_reply(
    out_of_memory: i32,
    lane: usize,
    h: &FrameHeader,
    w: Writer,
    reply: crate::backend::Reply,
    out: &mut Vec<u8>,
) -> Outgoing {
    let flag = output_flag(lane, h);
    match w.finish_on(h.lane, FLAG_REPLY | flag, h.seq) {
        Ok(frame) => {
            *out = frame;
            Outgoing {
                trailer: reply.trailer,
            }
        }
        Err(e) => {
            // A reply that cannot travel (the peer would refuse it) becomes a failure of the
            // call instead, as any call may fail for want of memory, and the session goes on.
            tracing::error!(opcode = h.opcode, "{e}: answering out-of-memory instead");
            *out = status_reply(h, out_of_memory);
            wormhole_wire::add_flag(out, flag);
            Outgoing { trailer: None }
        }
    }
}

/// Answers a request the backend took to answer later (see [`Completion`]), on the thread
/// that completes it: framed as [`handle`] frames replies, sent through the lane's sender.
pub(crate) fn complete(
    c: &Completion,
    f: impl FnOnce(&mut Writer) -> Result<crate::backend::Reply, DecodeError>,
) {
    let mut w = Writer::with_buffer(c.h.opcode, Vec::new());
    let reply = match f(&mut w) {
        Ok(reply) => reply,
        Err(e) => {
            tracing::error!(opcode = c.h.opcode, "{e}: answering out-of-memory instead");
            w = Writer::with_buffer(c.h.opcode, Vec::new());
            w.i32(c.out_of_memory);
            crate::backend::Reply {
                status: c.out_of_memory,
                trailer: None,
            }
        }
    };
    let mut frame = Vec::new();
    let out = frame_reply(c.out_of_memory, c.lane, &c.h, w, reply, &mut frame);
    let sent = match out.trailer {
        Some(mut t) => c
            .sink
            .send_pieces(&frame, &mut |sink| t.send(sink), c.policy),
        None => c.sink.send_parts(&[&frame], c.policy),
    };
    if let Err(e) = sent {
        // The client is gone (or broke its ring): the lane's thread ends the session when it
        // next reads; this thread is the driver's and goes back to it.
        tracing::warn!(lane = c.lane, "could not send a reply answered later: {e}");
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

/// Requests at least this large are offered to the backend to stream as they arrive.
const STREAM_MIN: u64 = 64 * 1024;

/// Whether request `h` (its header read, its body not) is offered to [`Backend::stream`].
fn streamable(h: &FrameHeader) -> bool {
    h.flags & FLAG_ASYNC == 0 && u64::from(h.len) >= STREAM_MIN
}

/// Offers request `h` to the backend to take its bulk data from `src` as it arrives. True: it
/// did, and `reply` holds the reply frame. False: the whole body is in `body` now (its first
/// `h.len` bytes), for the ordinary path.
fn offer_stream(
    backend: &dyn Backend,
    lane: usize,
    h: &FrameHeader,
    src: &mut dyn wormhole_transport::BulkIn,
    body: &mut Vec<u8>,
    reply: &mut Vec<u8>,
) -> Result<bool, LaneError> {
    let mut w = Writer::with_buffer(h.opcode, std::mem::take(reply));
    let streamed = match backend.stream(h, src, body, &mut w) {
        Ok(s) => s,
        Err(StreamError::Transport(e)) => return Err(e.into()),
        Err(StreamError::Malformed(source)) => {
            return Err(LaneError::Malformed {
                op: h.opcode,
                source,
            })
        }
    };
    if let Streamed::Done = streamed {
        count_call();
        *reply = w.finish_on(h.lane, FLAG_REPLY | output_flag(lane, h), h.seq)?;
        return Ok(true);
    }
    *reply = w.finish_on(h.lane, 0, 0).unwrap_or_default();
    if let Streamed::Declined = streamed {
        let n = h.len as usize;
        if body.len() < n {
            body.resize(n, 0);
        }
        src.recv_exact(&mut body[..n])?;
    }
    Ok(false)
}

/// Whether the sender waits for request `h`, or for the call it is part of (see `order`).
fn waited(backend: &dyn Backend, h: &FrameHeader) -> bool {
    h.flags & FLAG_ASYNC == 0 || backend.within_waited_call(h.opcode)
}

/// Serves one lane of a shared region (`region`: where the other lanes' senders say how far
/// they have sent, for the order across lanes).
fn serve_lane(
    backend: &'static dyn Backend,
    lane: usize,
    mut link: ShmLink,
    region: &Region,
) -> Result<(), LaneError> {
    let mut body = Vec::new();
    let mut reply = Vec::new();
    loop {
        let h = link.recv_header()?;
        // What other threads sent before this was sent comes first.
        order().took(lane, h.seq, waited(backend, &h));
        if !backend.unordered(h.opcode) {
            let used = region.rendezvous().lanes_used.load(Ordering::Acquire);
            order().wait_for_others(
                lane,
                h.seq,
                // Lanes the client marked used (past 64 lanes there are no marks: all of them).
                (0..region.layout().lanes as usize).filter(|j| *j >= 64 || used & (1 << j) != 0),
                |j| {
                    region
                        .request_activity(j as u32)
                        .map_or(0, |(head, _)| head)
                },
            );
        }
        serve_request(backend, lane, &mut link, h, &mut body, &mut reply)?;
        order().handled(lane, link.received());
        if body.len() > KEEP_BUFFER {
            body = Vec::new();
        }
        if reply.capacity() > KEEP_BUFFER {
            reply = Vec::new();
        }
    }
}

/// The request this lane works on is handled: said before its reply goes out. Its client may
/// send more on this lane as soon as it has the reply, and another thread it then tells may
/// send on another lane; that lane must not take this one for still inside the waited-for
/// request (see `order`), which would let it run before what came after the reply here (a
/// kernel made without waiting, then asked about by the other thread: CL_INVALID_KERNEL).
fn handled_before_reply(lane: usize, link: &ShmLink) {
    order().handled(lane, link.received());
}

/// Serves one request of a shared region's lane, whose header `h` was read.
fn serve_request(
    backend: &'static dyn Backend,
    lane: usize,
    link: &mut ShmLink,
    h: FrameHeader,
    body: &mut Vec<u8>,
    reply: &mut Vec<u8>,
) -> Result<(), LaneError> {
    if streamable(&h) {
        // Bulk data may go from the ring straight into the driver's memory.
        if offer_stream(backend, lane, &h, link, body, reply)? {
            handled_before_reply(lane, link);
            link.send(reply)?;
            return Ok(());
        }
    } else {
        let n = h.len as usize;
        if body.len() < n {
            body.resize(n, 0);
        }
        link.recv_exact(&mut body[..n])?;
    }
    let n = h.len as usize;
    if h.flags & FLAG_ASYNC == 0 && backend.answers_later(h.opcode) {
        // The reply may go out from another thread at once.
        handled_before_reply(lane, link);
        let later = Completion {
            h,
            lane,
            sink: link.sender(),
            policy: link.policy(),
            out_of_memory: backend.out_of_memory(),
            answered: false,
        };
        match backend.handle_later(&h, &body[..n], later) {
            Ok(None) => {
                // Taken: its client sends nothing on this lane before the reply, and its
                // next request follows the reply closely, so the lane waits for it now
                // (spinning briefly, as it always does).
                count_call();
                return Ok(());
            }
            Ok(Some(mut c)) => c.answered = true,
            Err(source) => {
                return Err(LaneError::Malformed {
                    op: h.opcode,
                    source,
                })
            }
        }
    }
    if let Some(out) = handle(backend, lane, &h, &body[..h.len as usize], reply)? {
        handled_before_reply(lane, link);
        match out.trailer {
            Some(mut t) => link.send_pieces(reply, &mut |sink| t.send(sink))?,
            None => link.send(reply)?,
        }
    }
    Ok(())
}

/// A byte stream the TCP-style transport can read on one thread and write on others: a TCP
/// socket, or (TLS sessions) the worker's end of the supervisor's TLS proxy.
pub trait Duplex: Read + Write + Send + AsRawFd + 'static {
    fn duplicate(&self) -> std::io::Result<Self>
    where
        Self: Sized;

    /// Whether the peer has closed its end (without reading what it sent before).
    fn peer_closed(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd for a descriptor this stream owns; no waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
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

/// Requests waiting for a lane's thread, and the bytes they hold.
struct LaneQueue {
    tx: mpsc::Sender<(FrameHeader, Incoming)>,
    held: Arc<QueuedBytes>,
}

/// A request's body as a stream's reader passes it to the lane: whole, or (a large request the
/// backend streams) in chunks that follow while the lane already runs it.
enum Incoming {
    Whole(Vec<u8>),
    Chunks(Chunks),
}

/// The body of a request the reader is still receiving: its chunks, in order, as they come.
/// Each chunk counts against the lane's queued bytes until the lane has taken it.
struct Chunks {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    held: Arc<QueuedBytes>,
    pool: BodyPool,
}

impl Chunks {
    /// The chunk with unread bytes (the next one once this is used up); PeerGone if the reader
    /// stopped before the body's end (the session is ending).
    fn current(&mut self) -> Result<&[u8], TransportError> {
        while self.at == self.chunk.len() {
            let next = self.rx.recv().map_err(|_| TransportError::PeerGone)?;
            let used = std::mem::replace(&mut self.chunk, next);
            self.at = 0;
            self.give_back(used);
        }
        Ok(&self.chunk[self.at..])
    }

    fn give_back(&self, chunk: Vec<u8>) {
        self.held.release(chunk.len());
        self.pool.give_back(chunk);
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        // What the lane did not take (a request that failed halfway) is counted off too, and
        // the request itself (`QueuedBytes::cost` of an empty body) once it has run.
        let last = std::mem::take(&mut self.chunk);
        self.give_back(last);
        while let Ok(c) = self.rx.recv() {
            self.give_back(c);
        }
        self.held.release(QueuedBytes::cost(&[]));
    }
}

impl wormhole_transport::BulkIn for Chunks {
    fn recv_exact(&mut self, mut buf: &mut [u8]) -> Result<(), TransportError> {
        while !buf.is_empty() {
            let src = self.current()?;
            let n = src.len().min(buf.len());
            buf[..n].copy_from_slice(&src[..n]);
            self.at += n;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    fn recv_in_place(
        &mut self,
        mut n: u64,
        f: &mut dyn FnMut(wormhole_transport::copy::SharedBytes<'_>),
    ) -> Result<(), TransportError> {
        while n > 0 {
            let src = self.current()?;
            let k = src.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            f(wormhole_transport::copy::SharedBytes::private(&src[..k]));
            self.at += k;
            n -= k as u64;
        }
        Ok(())
    }
}

/// Requests at least this large reach their lane in chunks. Below it the overlap does not pay
/// for what taking the data as it arrives costs the driver (PoCL: a map and an unmap, two
/// commands, where a whole body is one write): measured on loopback, 64–256 KiB writes went
/// at 0.6× through chunks, 1 MiB at par, 4–16 MiB at 1.2–1.3×.
const CHUNKED_MIN: u64 = 2 << 20;

/// How a streamed request's body is cut: small enough that the lane starts on it early, large
/// enough that each chunk is worth a hand-over.
fn chunk_len(total: usize) -> usize {
    (total / 8).clamp(256 << 10, 4 << 20)
}

/// The bytes of requests a TCP lane has queued and not yet run. The shared-memory rings bound
/// what a client can have in flight; a stream does not, so without this a client sending
/// faster than its lane runs (or to a lane waiting in a blocking call) would grow the worker
/// without end. Past the bound the session's reader stops reading until the lane catches
/// up, and TCP's own flow control holds the client back. It cannot stall a lane that another
/// waits for: a client waiting for a lane's reply sends that lane nothing more, so a lane in
/// a blocking call has run everything queued before it.
#[derive(Default)]
struct QueuedBytes {
    bytes: Mutex<usize>,
    drained: std::sync::Condvar,
}

impl QueuedBytes {
    /// Bytes a lane may have queued; one request larger than this still goes alone.
    const MAX: usize = 64 << 20;

    /// What a request costs: its body, and at least the bookkeeping of a small one.
    fn cost(body: &[u8]) -> usize {
        body.len().max(256)
    }

    /// Reader: waits until `n` more bytes fit, then counts them. False if `gone` says the
    /// client went away meanwhile (a lane may wait forever for what only it could send).
    fn admit(&self, n: usize, gone: impl Fn() -> bool) -> bool {
        let mut held = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        while *held > 0 && *held + n > Self::MAX {
            let (next, waited) = self
                .drained
                .wait_timeout(held, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner());
            held = next;
            if waited.timed_out() && gone() {
                return false;
            }
        }
        *held += n;
        true
    }

    /// Reader: counts `n` more bytes without waiting (the chunks of a request its lane may be
    /// running already: waiting for that lane to take them could wait for a request behind
    /// them on the stream, a user event's status that the running write waits for).
    fn count(&self, n: usize) {
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner()) += n;
    }

    /// Lane: `n` bytes have been run.
    fn release(&self, n: usize) {
        let mut held = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        *held = held.saturating_sub(n);
        self.drained.notify_all();
    }
}

/// Serves one session over a TCP stream: frames of all lanes share it, each lane's requests run
/// on their own thread (started on first use) so one lane's blocking call never stalls another.
pub fn run_tcp<S: Duplex>(
    backend: &'static dyn Backend,
    build_cache: Option<wormhole_blobcache::BlobCache>,
    stream: S,
    stats: Option<UnixStream>,
    lanes: u32,
) -> Result<(), WorkerError> {
    if let Err(reason) = backend.load() {
        return refuse(stream, &reason);
    }
    // This thread reads the stream and runs some requests itself (unordered ones).
    crate::backend::set_replies_share_a_stream();
    let writer = Arc::new(Mutex::new(stream.duplicate()?));
    let welcome = Welcome {
        session: u64::from(std::process::id()),
        lanes,
        ring_capacity: 0,
    };
    writer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .write_all(&welcome.encode(0))?;
    let callbacks: CallbackSink = writer.clone();
    capture_output(&callbacks, lanes);
    backend.begin(SessionSetup {
        limits: limits().clone(),
        callbacks: callbacks.clone(),
        arena: None,
        build_cache,
    });
    crate::slices::start_review(&CALLS, None)?;
    if let Some(stats) = stats {
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || serve_stats(backend, stats, Some(callbacks)))?;
    }
    let mut queues: Vec<Option<LaneQueue>> = (0..lanes).map(|_| None).collect();
    // Frames received per lane, for the order across lanes: the stream is one, so what any
    // thread sent before a request was received before it.
    let received: Arc<[AtomicU64]> = (0..lanes).map(|_| AtomicU64::new(0)).collect();
    let _ = ORDER.set(crate::order::LaneOrder::new(lanes as usize));
    // Read as a lane's ring is, spinning a moment before the kernel puts the reader to sleep;
    // the lane threads it hands requests to sleep at once (see `SpinRead`).
    const FRAMES: usize = 1 << 16;
    let mut reader = std::io::BufReader::with_capacity(
        FRAMES,
        SpinRead::new(stream, SpinPolicy::default(), FRAMES),
    );
    let bodies = BodyPool::default();
    let chunk_pool = BodyPool::new(64, 64 << 20);
    loop {
        let h = match read_header(&mut reader) {
            Ok(h) => h,
            Err(TransportError::PeerGone) => {
                backend.end();
                return Ok(());
            }
            Err(e) => {
                tracing::error!("ending session: {e}");
                backend.end();
                std::process::exit(3);
            }
        };
        // The next request comes soon after the reply a waiting client gets; behind pipelined
        // frames the lanes have work, and spinning here took their CPU (100k pipelined calls:
        // some runs at 350k/s and a quarter more server CPU, against 500-560k/s).
        reader.get_mut().set_spin(h.flags & FLAG_ASYNC == 0);
        let chunked =
            streamable(&h) && u64::from(h.len) >= CHUNKED_MIN && backend.streams(h.opcode);
        let mut body = Vec::new();
        if !chunked {
            body = bodies.take();
            if let Err(e) = read_body(&mut reader, &mut body, h.len as usize) {
                return stream_ended(backend, e);
            }
        }
        if backend.unordered(h.opcode) && h.flags & FLAG_ASYNC != 0 {
            // It depends on nothing queued, and something queued (or this reader, held back
            // by a full lane) may be waiting for it: run it here, now.
            let mut reply = Vec::new();
            if let Err(e) = handle(backend, usize::from(h.lane), &h, &body, &mut reply) {
                tracing::error!(lane = h.lane, "ending session: {e}");
                backend.end();
                std::process::exit(3);
            }
            bodies.give_back(body);
            continue;
        }
        let Some(slot) = queues.get_mut(usize::from(h.lane)) else {
            tracing::error!(
                lane = h.lane,
                "ending session: frame for a lane that does not exist"
            );
            backend.end();
            std::process::exit(3);
        };
        let queue = match slot {
            Some(queue) => queue,
            None => {
                let (tx, rx) = mpsc::channel::<(FrameHeader, Incoming)>();
                let held = Arc::new(QueuedBytes::default());
                let lane_held = held.clone();
                let writer = writer.clone();
                let bodies = bodies.clone();
                let received = received.clone();
                std::thread::Builder::new()
                    .name(format!("lane-{}", h.lane))
                    .spawn(move || {
                        crate::slices::lane();
                        crate::backend::set_replies_share_a_stream();
                        let mut reply = Vec::new();
                        let mut taken = 0u64;
                        for (h, incoming) in rx {
                            let lane = usize::from(h.lane);
                            order().took(lane, h.seq, waited(backend, &h));
                            if !backend.unordered(h.opcode) {
                                order().wait_for_others(lane, h.seq, 0..received.len(), |j| {
                                    received[j].load(Ordering::Acquire)
                                });
                            }
                            let handled = match incoming {
                                Incoming::Whole(body) => {
                                    let handled = handle(backend, lane, &h, &body, &mut reply);
                                    lane_held.release(QueuedBytes::cost(&body));
                                    bodies.give_back(body);
                                    handled
                                }
                                Incoming::Chunks(mut chunks) => {
                                    let mut body = bodies.take();
                                    let handled = match offer_stream(
                                        backend,
                                        lane,
                                        &h,
                                        &mut chunks,
                                        &mut body,
                                        &mut reply,
                                    ) {
                                        Ok(true) => Ok(Some(Outgoing { trailer: None })),
                                        Ok(false) => handle(
                                            backend,
                                            lane,
                                            &h,
                                            &body[..h.len as usize],
                                            &mut reply,
                                        ),
                                        // The reader stopped mid-body: it ends the session.
                                        Err(LaneError::Transport(_)) => return,
                                        Err(e) => Err(e),
                                    };
                                    bodies.give_back(body);
                                    handled
                                }
                            };
                            taken += 1;
                            order().handled(lane, taken);
                            match handled {
                                Ok(Some(done)) => {
                                    let mut out = writer.lock().unwrap_or_else(|p| p.into_inner());
                                    let sent = out
                                        .write_all(&reply)
                                        .map_err(TransportError::from)
                                        .and_then(|_| match done.trailer {
                                            Some(mut t) => {
                                                t.send(&mut |piece| Ok(out.write_all(piece)?))
                                            }
                                            None => Ok(()),
                                        });
                                    if sent.is_err() {
                                        return;
                                    }
                                }
                                Ok(None) => {}
                                Err(e) => {
                                    tracing::error!(lane = h.lane, "ending session: {e}");
                                    backend.end();
                                    std::process::exit(3);
                                }
                            }
                        }
                    })?;
                slot.insert(LaneQueue { tx, held })
            }
        };
        if chunked {
            // The lane may start on the request while the rest of it arrives. Admitted as a
            // request is (its lane's queue has room); its chunks are then counted as they come,
            // one body at most, as a whole body was before it was queued.
            if !queue.held.admit(QueuedBytes::cost(&[]), || {
                reader.get_ref().get_ref().peer_closed()
            }) {
                tracing::info!("client gone while a lane's queue was full: ending the session");
                backend.end();
                return Ok(());
            }
            let (tx, rx) = mpsc::channel();
            received[usize::from(h.lane)].fetch_add(1, Ordering::Release);
            let chunks = Chunks {
                rx,
                chunk: Vec::new(),
                at: 0,
                held: queue.held.clone(),
                pool: chunk_pool.clone(),
            };
            let _ = queue.tx.send((h, Incoming::Chunks(chunks)));
            let total = h.len as usize;
            let piece = chunk_len(total);
            let mut left = total;
            while left > 0 {
                let n = piece.min(left);
                queue.held.count(n);
                let mut chunk = chunk_pool.take();
                if let Err(e) = read_body(&mut reader, &mut chunk, n) {
                    return stream_ended(backend, e);
                }
                left -= n;
                // A lane that stopped (its session is ending) takes no more.
                let _ = tx.send(chunk);
            }
            continue;
        }
        if !queue.held.admit(QueuedBytes::cost(&body), || {
            reader.get_ref().get_ref().peer_closed()
        }) {
            tracing::info!("client gone while a lane's queue was full: ending the session");
            backend.end();
            return Ok(());
        }
        received[usize::from(h.lane)].fetch_add(1, Ordering::Release);
        let _ = queue.tx.send((h, Incoming::Whole(body)));
    }
}

/// The session's stream broke (or its client closed it) in the middle of a request's body:
/// the session ends.
fn stream_ended(backend: &dyn Backend, e: TransportError) -> Result<(), WorkerError> {
    if !matches!(e, TransportError::PeerGone) {
        tracing::error!("ending session: {e}");
    }
    backend.end();
    Ok(())
}

/// Request bodies read from a stream, kept for the next frames: a bulk transfer's body is
/// hundreds of MiB, and a fresh one each time costs the allocator a map, the kernel a fault per
/// page and the allocator an unmap, several times the copy itself.
#[derive(Clone)]
struct BodyPool {
    kept: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Bodies kept at most, and the bytes they may hold together (more goes back to the
    /// system: an idle session keeps at most this much host memory).
    most: usize,
    bytes: usize,
}

impl Default for BodyPool {
    fn default() -> Self {
        BodyPool::new(4, 512 << 20)
    }
}

impl BodyPool {
    fn new(most: usize, bytes: usize) -> BodyPool {
        BodyPool {
            kept: Arc::default(),
            most,
            bytes,
        }
    }

    fn take(&self) -> Vec<u8> {
        let mut pool = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        // The largest: the next big transfer finds its memory mapped already.
        let i = (0..pool.len()).max_by_key(|&i| pool[i].capacity());
        i.map(|i| pool.swap_remove(i)).unwrap_or_default()
    }

    fn give_back(&self, body: Vec<u8>) {
        let mut pool = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = pool.iter().map(Vec::capacity).sum();
        if body.capacity() > 0 && pool.len() < self.most && held + body.capacity() <= self.bytes {
            pool.push(body);
        }
    }
}

/// What a worker reports about its session (`wh status`, metrics).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SessionDetail {
    pub pid: u32,
    /// The API the session speaks.
    #[serde(default)]
    pub api: String,
    pub tenant: String,
    pub mem_quota: Option<u64>,
    pub tenant_mem_bytes: i64,
    pub calls: u64,
    pub async_failures: u64,
    pub mem_bytes: i64,
    pub objects: std::collections::BTreeMap<String, usize>,
    /// The API's own counters (OpenCL: buffers in the shared arena, direct transfers,
    /// program-cache hits and misses).
    #[serde(flatten)]
    pub backend: serde_json::Map<String, serde_json::Value>,
}

fn detail(backend: &dyn Backend) -> SessionDetail {
    SessionDetail {
        pid: std::process::id(),
        api: backend.api().to_string(),
        tenant: limits().tenant.clone(),
        mem_quota: limits().mem_quota,
        tenant_mem_bytes: limits().tenant_bytes(),
        calls: CALLS.load(Ordering::Relaxed),
        async_failures: ASYNC_FAILURES.load(Ordering::Relaxed),
        mem_bytes: backend.mem_bytes(),
        objects: backend.objects(),
        backend: backend.detail(),
    }
}

/// Answers the supervisor's status questions about this session; ends the session when the
/// supervisor says so (`ENDED`, its reason: the tenant was removed), telling the client why on
/// the callback channel (`session`) first.
fn serve_stats(backend: &dyn Backend, mut sock: UnixStream, session: Option<CallbackSink>) {
    let mut body = Vec::new();
    while let Ok(h) = read_frame(&mut sock, &mut body) {
        if h.opcode == control::ENDED {
            end_session(session.as_ref(), &body);
        }
        let json = serde_json::to_vec(&detail(backend)).unwrap_or_default();
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

/// Ends this session at the supervisor's word: the device's output so far and an `ENDED` frame
/// with the reason go to the client, then the process exits (the driver's objects die with it,
/// and the supervisor writes off the session's memory).
fn end_session(session: Option<&CallbackSink>, body: &[u8]) -> ! {
    let reason = Reader::new(body)
        .bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_else(|_| "ended by the server".into());
    tracing::warn!("ending the session: {reason}");
    if let Some(sink) = session {
        crate::output::flush();
        let mut w = Writer::new(control::ENDED);
        w.bytes(reason.as_bytes());
        if let Ok(frame) = w.finish(0, 0) {
            let _ = sink
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .write_all(&frame);
        }
    }
    // No exit handlers or driver destructors: other threads may be inside the driver.
    // SAFETY: _exit has no preconditions; it ends the process at once.
    unsafe { libc::_exit(0) }
}

/// How the supervisor starts a worker (`wh worker ...`): what it serves and for whom. The
/// session's socket (or a standby worker's line to the supervisor) is fd 3, the stats socket
/// fd 4 and the tenant's memory ledger fd 5.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// The API's name (one of the server's backends).
    pub api: String,
    pub layout: Layout,
    /// unix, tcp, tls, guest, or standby (warm up, then wait for a session's socket).
    pub transport: String,
    pub tenant: String,
    pub slot: usize,
    pub mem_quota: Option<u64>,
    pub max_objects: Option<usize>,
    /// Substrings of the device names the tenant may use (empty: all).
    pub devices: Vec<String>,
    /// The guest region (transport "guest").
    pub region: Option<std::path::PathBuf>,
    /// The build cache shared by all sessions (checked by the supervisor), and its bound.
    pub build_cache: Option<std::path::PathBuf>,
    pub build_cache_bytes: u64,
    /// Short time slices for lanes and brief driver threads (see `slices`).
    pub short_slices: bool,
    /// Builds of tenants that could not read the server's files run confined
    /// (`build_sandbox`).
    pub build_sandbox: bool,
    /// A standby worker readies the tenant's first device too (`warm_device`).
    pub warm_device: bool,
}

/// A worker process's life: take the descriptors the supervisor passed, set the tenant's
/// limits, and serve one session of `backend`.
pub fn main(args: WorkerArgs, backend: &'static dyn Backend) -> Result<(), WorkerError> {
    if args.transport == "inventory" {
        // No session: the devices as JSON on stdout, for the supervisor that asked. The driver
        // may print too: its output goes to stderr (the log), the answer to the original stdout.
        // SAFETY: dup and dup2 on the process's own standard descriptors.
        let answer = unsafe {
            let fd = libc::dup(1);
            if fd < 0 || libc::dup2(2, 1) < 0 {
                return Err(WorkerError::Io(std::io::Error::last_os_error()));
            }
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        };
        // No devices (no driver, no device) is an answer too: the reason, for `wh devices`.
        let answer_json = match backend.inventory() {
            Ok(devices) => serde_json::to_value(&devices),
            Err(reason) => Ok(serde_json::json!({ "error": reason })),
        }
        .map_err(|e| WorkerError::Io(e.into()))?;
        serde_json::to_writer(answer, &answer_json).map_err(|e| WorkerError::Io(e.into()))?;
        return Ok(());
    }
    if !args.short_slices {
        crate::slices::disable();
    }
    let build_cache = args.build_cache.as_deref().and_then(|dir| {
        wormhole_blobcache::BlobCache::open(dir, args.build_cache_bytes)
            .inspect_err(|e| tracing::warn!("build cache off in this session: {e}"))
            .ok()
    });
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: the supervisor hands the tenant's memory ledger as fd 5 (dup2 before exec).
    let ledger = crate::quota::Ledger::from_fd(unsafe { OwnedFd::from_raw_fd(5) }).ok();
    set_limits(Limits {
        tenant: args.tenant,
        ledger,
        slot: args.slot,
        mem_quota: args.mem_quota,
        max_objects: args.max_objects,
        devices: args.devices,
    });
    // SAFETY: the supervisor hands the stats socket as fd 4 (dup2 before exec); nothing else in
    // this process owns it.
    let stats = unsafe { UnixStream::from_raw_fd(4) };
    let layout = args.layout;
    if args.transport == "guest" {
        let region = args.region.ok_or_else(|| {
            WorkerError::Io(std::io::Error::other("transport guest needs --region"))
        })?;
        crate::build_sandbox::configure(args.build_sandbox, None);
        return run_guest(backend, build_cache, &region, layout, Some(stats));
    }
    // SAFETY: as above, fd 3 is the session's socket or stream (a Unix socket, a TCP stream, or
    // the worker's end of the supervisor's TLS proxy) or, for a standby worker, its line to the
    // supervisor; nothing else in this process owns it.
    let fd3 = unsafe { OwnedFd::from_raw_fd(3) };
    let (transport, session, memory) = if args.transport == "standby" {
        // Ready before any tenant waits (the driver loaded, a local session's shared memory
        // made); the session arrives later.
        backend.warm_up(limits(), args.warm_device);
        let memory = SharedMemory::create(layout)?;
        match await_session(&UnixStream::from(fd3))? {
            Some((transport, session)) => (transport, session, Some(memory)),
            None => return Ok(()),
        }
    } else {
        (args.transport, fd3, None)
    };
    // A TLS session's socket leads to the supervisor's proxy, not to the client.
    let local = !matches!(transport.as_str(), "tcp" | "tls");
    let peer = local
        .then(|| crate::build_sandbox::peer_of(std::os::fd::AsFd::as_fd(&session)))
        .flatten();
    crate::build_sandbox::configure(args.build_sandbox, peer);
    match transport.as_str() {
        "tcp" => run_tcp(
            backend,
            build_cache,
            TcpStream::from(session),
            Some(stats),
            layout.lanes,
        ),
        "tls" => run_tcp(
            backend,
            build_cache,
            UnixStream::from(session),
            Some(stats),
            layout.lanes,
        ),
        _ => run(
            backend,
            build_cache,
            UnixStream::from(session),
            Some(stats),
            layout,
            memory,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A backend whose every call answers with a reply of the size it is asked for.
    struct Echo;

    impl Backend for Echo {
        fn api(&self) -> &'static str {
            "echo"
        }
        fn out_of_memory(&self) -> i32 {
            -6
        }
        fn begin(&self, _: SessionSetup) {}
        fn handle(
            &self,
            _h: &FrameHeader,
            r: &mut Reader<'_>,
            w: &mut Writer,
        ) -> Result<crate::backend::Reply, DecodeError> {
            w.i32(0);
            w.trailing_bytes(r.u64()? as usize);
            Ok(crate::backend::Reply {
                status: 0,
                trailer: None,
            })
        }
        fn objects(&self) -> BTreeMap<String, usize> {
            BTreeMap::new()
        }
        fn mem_bytes(&self) -> i64 {
            0
        }
    }

    /// A lane's queue holds at most its bound (one request larger than it alone), and the
    /// reader waiting for room goes on as the lane runs what it holds.
    #[test]
    fn a_lane_queue_admits_up_to_its_bound() {
        let q = Arc::new(QueuedBytes::default());
        let big = QueuedBytes::MAX + 1;
        assert!(q.admit(big, || false));
        let (tx, rx) = mpsc::channel();
        let reader = {
            let q = q.clone();
            std::thread::spawn(move || {
                assert!(q.admit(QueuedBytes::MAX / 2, || false));
                tx.send(()).unwrap();
                assert!(q.admit(QueuedBytes::MAX / 2, || false));
                tx.send(()).unwrap();
                assert!(q.admit(1, || false));
                tx.send(()).unwrap();
            })
        };
        // Nothing fits beside the oversized request until it has run.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        q.release(big);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        // Full now: one byte more waits for the lane.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        q.release(QueuedBytes::MAX / 2);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        reader.join().unwrap();
        assert_eq!(*q.bytes.lock().unwrap(), QueuedBytes::MAX / 2 + 1);
        // A reader waiting for room gives up once its client is gone.
        assert!(!q.admit(QueuedBytes::MAX, || true));
    }

    /// A reply larger than a frame may be is answered with the API's out-of-memory status
    /// alone (it used to trip a debug assertion, and in release builds to go out with a
    /// header the client refuses, ending the session).
    #[test]
    fn an_oversize_reply_becomes_an_error_status() {
        let h = FrameHeader {
            flags: 0,
            opcode: 7,
            lane: 2,
            len: 8,
            seq: 41,
        };
        let mut out = Vec::new();
        let big = (wormhole_wire::MAX_BODY as u64).to_le_bytes();
        assert!(handle(&Echo, 2, &h, &big, &mut out).unwrap().is_some());
        let got =
            FrameHeader::decode(out[..wormhole_wire::HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            (got.opcode, got.lane, got.seq, got.flags),
            (7, 2, 41, FLAG_REPLY)
        );
        let mut r = Reader::new(&out[wormhole_wire::HEADER_LEN..]);
        assert_eq!(r.i32().unwrap(), -6);
        r.finish().unwrap();
        // A reply within the limit goes out as written.
        assert!(handle(&Echo, 2, &h, &8u64.to_le_bytes(), &mut out)
            .unwrap()
            .is_some());
        let got =
            FrameHeader::decode(out[..wormhole_wire::HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            got.len,
            4 + 8 + 8,
            "the status, the bulk length and the bulk bytes"
        );
    }
}
