//! The client's session with the server: connect, receive the shared region, map the lanes,
//! and run the thread that delivers callbacks and notices when the server goes away.

use std::cell::Cell;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use wormhole_protocol::{control, FrameHeader, Reader, Writer, API_OPENCL, FLAG_REPLY, VERSION};
use wormhole_transport::unix::recv_frame_with_fds;
use wormhole_transport::{FrameLink, FutexWaiter, Region, ShmLink, SpinPolicy, TransportError};

pub struct Lane {
    link: ShmLink,
    seq: u32,
    reply: Vec<u8>,
}

pub struct Connection {
    lanes: Vec<Mutex<Lane>>,
    dead: Arc<AtomicBool>,
    pid: u32,
    _region: Arc<Region>,
}

static CONNECTION: OnceLock<Option<Connection>> = OnceLock::new();
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_LANE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Writes one line to stderr, prefixed so the user knows who speaks.
pub fn log(msg: &str) {
    eprintln!("wormhole: {msg}");
}

/// The session, connecting on first use. `None` when no server could be reached (logged once).
pub fn get() -> Option<&'static Connection> {
    CONNECTION
        .get_or_init(|| match connect() {
            Ok(c) => Some(c),
            Err(e) => {
                log(&format!("no OpenCL platforms: {e}"));
                None
            }
        })
        .as_ref()
}

#[derive(Debug)]
struct ConnectError(String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn connect() -> Result<Connection, ConnectError> {
    let path = wormhole_protocol::default_socket_path();
    let sock = UnixStream::connect(&path).map_err(|e| {
        ConnectError(format!(
            "cannot reach the Wormhole server at {} ({e}); is `wh serve` running?",
            path.display()
        ))
    })?;
    let mut hello = Writer::new(control::HELLO);
    hello.u8(VERSION);
    hello.bytes(API_OPENCL.as_bytes());
    std::io::Write::write_all(&mut &sock, &hello.finish(0, 0))
        .map_err(|e| ConnectError(format!("server hung up during HELLO: {e}")))?;
    // Starting a worker and its OpenCL platform takes a moment; a server that never answers
    // must not hang the application.
    sock.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let mut body = Vec::new();
    let (h, mut fds) = recv_frame_with_fds(&sock, &mut body)
        .map_err(|e| ConnectError(format!("no answer from the server: {e}")))?;
    sock.set_read_timeout(None).ok();
    match h.opcode {
        control::WELCOME => {}
        control::REFUSED => {
            let reason = Reader::new(&body)
                .bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            return Err(ConnectError(format!(
                "the server refused the session: {reason}"
            )));
        }
        other => {
            return Err(ConnectError(format!(
                "unexpected answer {other:#06x} from the server"
            )))
        }
    }
    let fd = fds
        .pop()
        .ok_or_else(|| ConnectError("the server sent no shared region".into()))?;
    let region =
        Arc::new(Region::open_fd(fd).map_err(|e| ConnectError(format!("bad shared region: {e}")))?);
    let dead = Arc::new(AtomicBool::new(false));
    let alive = {
        let dead = dead.clone();
        Arc::new(move || !dead.load(Ordering::Relaxed))
    };
    let waiter = Arc::new(FutexWaiter);
    let lanes = (0..region.layout().lanes)
        .map(|i| {
            let (req, rep) = region.lane(i).expect("lane in layout");
            Mutex::new(Lane {
                link: ShmLink::new(
                    req,
                    rep,
                    waiter.clone(),
                    SpinPolicy::default(),
                    alive.clone(),
                ),
                seq: 0,
                reply: Vec::new(),
            })
        })
        .collect();
    {
        let dead = dead.clone();
        std::thread::Builder::new()
            .name("wormhole-events".into())
            .spawn(move || events(sock, dead))
            .map_err(|e| ConnectError(format!("cannot start the callback thread: {e}")))?;
    }
    Ok(Connection {
        lanes,
        dead,
        pid: std::process::id(),
        _region: region,
    })
}

/// Delivers callbacks until the server closes the session, then marks it dead so every
/// waiting call fails instead of hanging.
fn events(sock: UnixStream, dead: Arc<AtomicBool>) {
    let mut body = Vec::new();
    loop {
        match wormhole_transport::link::read_frame(&mut &sock, &mut body) {
            Ok(h) if h.opcode == control::CALLBACK => crate::rt::callbacks::deliver(&body),
            Ok(h) => log(&format!(
                "ignoring unexpected frame {:#06x} from the server",
                h.opcode
            )),
            Err(_) => break,
        }
    }
    dead.store(true, Ordering::SeqCst);
    log("the server closed the session; further OpenCL calls fail with CL_OUT_OF_RESOURCES");
}

#[derive(Debug)]
pub enum CallError {
    /// No session, or it is gone.
    Unavailable,
    /// The transport failed mid-call; the session is now unusable.
    Broken,
}

static WARNED: AtomicU32 = AtomicU32::new(0);

impl Connection {
    /// Sends a request on this thread's lane and returns the reply body.
    pub fn call(&self, w: Writer) -> Result<Vec<u8>, CallError> {
        self.exchange(w, true).map(|r| r.unwrap_or_default())
    }

    fn exchange(&self, w: Writer, wait: bool) -> Result<Option<Vec<u8>>, CallError> {
        if self.dead.load(Ordering::Relaxed) || std::process::id() != self.pid {
            return Err(CallError::Unavailable);
        }
        let idx = MY_LANE.with(|l| match l.get() {
            Some(i) => i,
            None => {
                let i = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
                l.set(Some(i));
                i
            }
        });
        let mut lane = self.lanes[idx].lock().unwrap_or_else(|p| p.into_inner());
        lane.seq = lane.seq.wrapping_add(1);
        let seq = lane.seq;
        let frame = w.finish(0, seq);
        let res = (|| -> Result<Option<Vec<u8>>, TransportError> {
            lane.link.send(&frame)?;
            if !wait {
                return Ok(None);
            }
            let mut reply = std::mem::take(&mut lane.reply);
            let h: FrameHeader = lane.link.recv(&mut reply)?;
            if h.flags & FLAG_REPLY == 0 || h.seq != seq {
                return Err(TransportError::Corrupt("reply does not match the request"));
            }
            Ok(Some(reply))
        })();
        res.map_err(|e| {
            self.dead.store(true, Ordering::SeqCst);
            if WARNED.fetch_add(1, Ordering::Relaxed) == 0 {
                log(&format!("lost the server mid-call: {e}"));
            }
            CallError::Broken
        })
    }
}
