//! A link carries whole frames (header + body) between two peers, whatever lies underneath.

use crate::copy::SharedBytes;
use crate::ring::{Ring, WaitCtx};
use crate::wait::{SpinPolicy, Waiter};
use crate::TransportError;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use wormhole_wire::{FrameHeader, HEADER_LEN};

pub trait FrameLink: Send {
    /// Sends one complete frame.
    fn send(&mut self, frame: &[u8]) -> Result<(), TransportError>;
    /// Receives one frame; `body` is replaced by its body.
    fn recv(&mut self, body: &mut Vec<u8>) -> Result<FrameHeader, TransportError>;
}

/// Tells a waiting side whether its peer still lives.
pub type Liveness = Arc<dyn Fn() -> bool + Send + Sync>;

/// One lane of a shared region, from one side: frames go out on `tx` and come in on `rx`.
pub struct ShmLink {
    tx: Arc<ShmSender>,
    rx: Ring,
    waiter: Arc<dyn Waiter>,
    policy: SpinPolicy,
    alive: Liveness,
}

/// The sending half of a lane. The lane's own thread sends through it, and so may a thread
/// that answers one of its requests later (the driver's thread that learns a wait is over):
/// the lock keeps one frame whole in the ring at a time.
pub struct ShmSender {
    tx: Ring,
    waiter: Arc<dyn Waiter>,
    alive: Liveness,
    lock: Mutex<()>,
}

/// Produces the rest of a frame piece by piece, each piece handed to the sink it is given as
/// soon as it is ready (bulk data arriving from a device while earlier pieces already travel).
pub type Pieces<'a> = dyn FnMut(&mut dyn FnMut(&[u8]) -> Result<(), TransportError>) -> Result<(), TransportError>
    + 'a;

impl ShmSender {
    /// Sends one frame made of several parts, waiting for room as `policy` says.
    pub fn send_parts(&self, parts: &[&[u8]], policy: SpinPolicy) -> Result<(), TransportError> {
        let (head, rest): (&[u8], &[&[u8]]) = match parts.split_first() {
            Some((head, rest)) => (head, rest),
            None => (&[], &[]),
        };
        self.send_pieces(
            head,
            &mut |sink| rest.iter().try_for_each(|p| sink(p)),
            policy,
        )
    }

    /// Sends one frame: `head`, then what `rest` produces. The frame stays whole in the ring
    /// (no other frame of this lane interleaves) until `rest` returns.
    pub fn send_pieces(
        &self,
        head: &[u8],
        rest: &mut Pieces<'_>,
        policy: SpinPolicy,
    ) -> Result<(), TransportError> {
        let ctx = WaitCtx {
            waiter: &*self.waiter,
            policy,
            peer_alive: &*self.alive,
        };
        let _one_frame_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.tx.note_producer_cpu();
        self.tx.write_all(head, &ctx)?;
        rest(&mut |piece| self.tx.write_all(piece, &ctx))
    }
}

impl ShmLink {
    pub fn new(
        tx: Ring,
        rx: Ring,
        waiter: Arc<dyn Waiter>,
        policy: SpinPolicy,
        alive: Liveness,
    ) -> ShmLink {
        let tx = Arc::new(ShmSender {
            tx,
            waiter: waiter.clone(),
            alive: alive.clone(),
            lock: Mutex::new(()),
        });
        ShmLink {
            tx,
            rx,
            waiter,
            policy,
            alive,
        }
    }

    fn ctx(&self) -> WaitCtx<'_> {
        WaitCtx {
            waiter: &*self.waiter,
            policy: self.policy,
            peer_alive: &*self.alive,
        }
    }

    /// How this side waits from now on.
    pub fn set_policy(&mut self, policy: SpinPolicy) {
        self.policy = policy;
    }

    /// How this side waits now.
    pub fn policy(&self) -> SpinPolicy {
        self.policy
    }

    /// The sending half, for a thread that sends on this lane besides its owner.
    pub fn sender(&self) -> Arc<ShmSender> {
        self.tx.clone()
    }

    /// Sends one frame made of several parts (a header-and-body head, then bulk data).
    pub fn send_parts(&mut self, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.tx.send_parts(parts, self.policy)
    }

    /// Sends one frame: `head`, then what `rest` produces (see [`ShmSender::send_pieces`]).
    pub fn send_pieces(
        &mut self,
        head: &[u8],
        rest: &mut Pieces<'_>,
    ) -> Result<(), TransportError> {
        self.tx.send_pieces(head, rest, self.policy)
    }

    /// Where what this side has received ends (bytes since the lane began): what the peer's
    /// side of the ring calls its head once this side has read everything sent.
    pub fn received(&self) -> u64 {
        self.rx.consumed()
    }

    /// Receives a frame's header; its body must then be read with [`ShmLink::recv_exact`].
    pub fn recv_header(&mut self) -> Result<FrameHeader, TransportError> {
        let mut h = [0u8; HEADER_LEN];
        self.rx.read_exact(&mut h, &self.ctx())?;
        Ok(FrameHeader::decode(&h)?)
    }

    /// Reads the next `buf.len()` bytes of the frame being received.
    pub fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), TransportError> {
        self.rx.read_exact(buf, &self.ctx())
    }

    /// Hands the next `n` bytes of the frame being received to `f` in place (see
    /// [`Ring::read_in_place`]).
    pub fn recv_in_place(
        &mut self,
        n: u64,
        f: &mut dyn FnMut(SharedBytes<'_>),
    ) -> Result<(), TransportError> {
        self.rx.read_in_place(n, f, &self.ctx())
    }

    /// Receives a frame into `buf`, which only grows: the body is `buf[..header.len]`. Reusing
    /// one buffer avoids zeroing and faulting in fresh memory for every bulk request.
    pub fn recv_reuse(&mut self, buf: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        let h = self.recv_header()?;
        let n = h.len as usize;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        self.recv_exact(&mut buf[..n])?;
        Ok(h)
    }

    /// Blocks until a frame starts arriving (spin, then sleep).
    pub fn wait_incoming(&self) -> Result<(), TransportError> {
        self.rx.wait_readable(&self.ctx())
    }
}

impl FrameLink for ShmLink {
    fn send(&mut self, frame: &[u8]) -> Result<(), TransportError> {
        self.tx.send_parts(&[frame], self.policy)
    }

    fn recv(&mut self, body: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        let ctx = self.ctx();
        let mut h = [0u8; HEADER_LEN];
        self.rx.read_exact(&mut h, &ctx)?;
        let header = FrameHeader::decode(&h)?;
        body.clear();
        body.resize(header.len as usize, 0);
        self.rx.read_exact(body, &ctx)?;
        Ok(header)
    }
}

/// Where the rest of a request being received comes from, for a backend that takes its bulk
/// data as it arrives: a lane's shared-memory ring, or the chunks a stream's reader passes on.
pub trait BulkIn {
    /// Reads the next `buf.len()` bytes of the request.
    fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), TransportError>;

    /// Hands the next `n` bytes of the request to `f`, a piece at a time, where they lie.
    fn recv_in_place(
        &mut self,
        n: u64,
        f: &mut dyn FnMut(SharedBytes<'_>),
    ) -> Result<(), TransportError>;
}

impl BulkIn for ShmLink {
    fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), TransportError> {
        ShmLink::recv_exact(self, buf)
    }

    fn recv_in_place(
        &mut self,
        n: u64,
        f: &mut dyn FnMut(SharedBytes<'_>),
    ) -> Result<(), TransportError> {
        ShmLink::recv_in_place(self, n, f)
    }
}

/// Frames over a byte stream (TCP, Unix socket).
pub struct StreamLink<S> {
    pub stream: S,
}

impl<S: Read + Write + Send> FrameLink for StreamLink<S> {
    fn send(&mut self, frame: &[u8]) -> Result<(), TransportError> {
        self.stream.write_all(frame).map_err(eof_is_gone)?;
        self.stream.flush().map_err(eof_is_gone)
    }

    fn recv(&mut self, body: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        read_frame(&mut self.stream, body)
    }
}

/// Reads one frame from a stream.
pub fn read_frame(s: &mut impl Read, body: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
    let header = read_header(s)?;
    read_body(s, body, header.len as usize)?;
    Ok(header)
}

/// Reads a frame's header from a stream (its body follows: [`read_body`]).
pub fn read_header(s: &mut impl Read) -> Result<FrameHeader, TransportError> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).map_err(eof_is_gone)?;
    Ok(FrameHeader::decode(&h)?)
}

/// Reads the next `len` bytes of a stream into `body` (its length becomes `len`).
pub fn read_body(s: &mut impl Read, body: &mut Vec<u8>, len: usize) -> Result<(), TransportError> {
    // A body reused from an earlier frame is only zeroed where it grows (read_exact overwrites
    // every byte kept); a new one comes zeroed from the allocator (fresh pages, no memset).
    if body.capacity() < len {
        *body = vec![0; len];
    } else {
        body.resize(len, 0);
    }
    s.read_exact(body).map_err(eof_is_gone)
}

pub fn eof_is_gone(e: std::io::Error) -> TransportError {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | BrokenPipe | ConnectionReset | ConnectionAborted => {
            TransportError::PeerGone
        }
        _ => TransportError::Io(e),
    }
}
