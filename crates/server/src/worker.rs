//! A session's worker process: it owns the tenant's OpenCL objects, serves the session's lanes
//! (one thread each, asleep while the tenant is idle) and ends when the client goes away,
//! which releases everything the session held.

use crate::session::Session;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use wormhole_protocol::{control, DecodeError, Op, Reader, Writer, FLAG_ASYNC, FLAG_REPLY};
use wormhole_transport::link::read_frame;
use wormhole_transport::unix::send_frame_with_fds;
use wormhole_transport::{
    FrameLink, FutexWaiter, Layout, Region, ShmLink, SpinPolicy, TransportError,
};

static SESSION: OnceLock<Session> = OnceLock::new();

/// The worker's one session.
pub fn session() -> &'static Session {
    SESSION.get_or_init(Session::default)
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("transport failed")]
    Transport(#[from] TransportError),
    #[error("I/O failed")]
    Io(#[from] std::io::Error),
}

/// Serves one session on `sock` (HELLO was already checked by the supervisor). Returns when
/// the client disconnects.
pub fn run(sock: UnixStream, stats: Option<UnixStream>, layout: Layout) -> Result<(), WorkerError> {
    let region = Region::create_memfd(layout)?;
    let mut w = Writer::new(control::WELCOME);
    w.u64(u64::from(std::process::id()));
    w.u32(layout.lanes);
    w.u64(layout.ring_capacity);
    send_frame_with_fds(&sock, &w.finish(0, 0), &[region.file().as_raw_fd()])?;
    crate::callbacks::set_sink(sock.try_clone()?);

    let region = Arc::new(region);
    // The process ends with its client, so lanes need not poll for liveness: they sleep until
    // the client writes (no CPU while the tenant is idle).
    let policy = SpinPolicy {
        spin: Duration::from_micros(50),
        sleep_slice: Duration::from_secs(3600),
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

#[derive(Debug, thiserror::Error)]
enum LaneError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("malformed request (opcode {op:#06x}): {source}")]
    Malformed { op: u16, source: DecodeError },
}

fn serve_lane(mut link: ShmLink) -> Result<(), LaneError> {
    let s = session();
    let mut body = Vec::new();
    loop {
        let h = link.recv(&mut body)?;
        s.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut w = Writer::new(h.opcode);
        let mut r = Reader::new(&body);
        let res = if h.opcode == control::COLLECT {
            crate::custom::collect(s, &mut r, &mut w)
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
        if h.flags & FLAG_ASYNC == 0 {
            link.send(&w.finish(FLAG_REPLY, h.seq))?;
        }
    }
}

/// Answers the supervisor's status questions about this session.
fn serve_stats(mut sock: UnixStream) {
    let mut body = Vec::new();
    while read_frame(&mut sock, &mut body).is_ok() {
        let s = session();
        let objects: Vec<String> = s
            .object_counts()
            .iter()
            .map(|(k, n)| format!("\"{k:?}\":{n}"))
            .collect();
        let json = format!(
            "{{\"pid\":{},\"calls\":{},\"mem_bytes\":{},\"objects\":{{{}}}}}",
            std::process::id(),
            s.calls.load(std::sync::atomic::Ordering::Relaxed),
            s.mem_bytes(),
            objects.join(",")
        );
        let mut w = Writer::new(control::STATUS);
        w.bytes(json.as_bytes());
        if sock.write_all(&w.finish(FLAG_REPLY, 0)).is_err() {
            return;
        }
    }
}
