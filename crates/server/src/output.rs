//! A session's device output: what its driver writes to the worker's standard output (a
//! kernel's `printf`: PoCL writes it when the kernel's command ends, CUDA at synchronisation
//! points) reaches the application's own standard output, in order, on every transport.
//!
//! At session start fd 1 becomes a pipe. A forwarder thread sends whatever arrives as `OUTPUT`
//! frames on the session's callback channel at once, as asynchronous as the native write.
//! Synchronisation points are exact: when the application's `clFinish` returns, the output of
//! the kernels it waited for is already on its stdout. So the backend calls [`drain`] in its
//! synchronisation handlers, which empties the pipe there and then; the core then sends a
//! `MARK` naming the reply after the output and flags the reply (`FLAG_OUTPUT`), and the client
//! returns from the call only once it has written everything up to the mark. A reply on a lane
//! that has already waited for every `OUTPUT` sent goes without flag or mark: the client pays
//! nothing for it.

use crate::backend::CallbackSink;
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use wormhole_wire::{control, FrameHeader, HEADER_LEN};

/// The largest `OUTPUT` frame's body: one read of the pipe.
const CHUNK: usize = 64 * 1024;
/// What one synchronisation point reads at most: a kernel that keeps printing must not hold
/// the reply forever (the rest follows asynchronously).
const DRAIN_MAX: usize = 4 << 20;

/// The pipe behind fd 1 and where its bytes go.
struct Capture {
    /// The pipe's read end, non-blocking.
    pipe: OwnedFd,
    sink: CallbackSink,
    /// Every read of the pipe and the send of what it read happen under this lock, so the
    /// frames go out in the order of the bytes, and a `MARK` after all of them.
    state: Mutex<State>,
    /// Per lane: how many `OUTPUT` frames had gone out before its last `MARK`.
    marked: Vec<AtomicU64>,
}

struct State {
    /// `OUTPUT` frames sent so far.
    sent: u64,
    /// A frame: header space, then one read's bytes.
    frame: Vec<u8>,
}

enum Pumped {
    /// A frame of this many bytes went out.
    Sent(usize),
    /// Nothing to read now.
    Empty,
    /// The pipe has no writer any more, or cannot be read.
    Closed,
}

static CAPTURE: OnceLock<Capture> = OnceLock::new();

thread_local! {
    /// Set by [`drain`] on the thread that runs a request: how many `OUTPUT` frames had gone
    /// out when it finished, for the reply that thread is building.
    static SYNCED: Cell<Option<u64>> = const { Cell::new(None) };
}

impl Capture {
    fn new(pipe: OwnedFd, sink: CallbackSink, lanes: usize) -> Capture {
        Capture {
            pipe,
            sink,
            state: Mutex::new(State {
                sent: 0,
                frame: vec![0; HEADER_LEN + CHUNK],
            }),
            marked: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads what the pipe holds (one chunk at most) and sends it as one `OUTPUT` frame.
    fn pump(&self, st: &mut State) -> Pumped {
        let n = loop {
            let buf = &mut st.frame[HEADER_LEN..];
            // SAFETY: reads at most `buf.len()` bytes into `buf`, which we own exclusively.
            let n =
                unsafe { libc::read(self.pipe.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                break n as usize;
            }
            match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::Interrupted => continue,
                e if e.kind() == std::io::ErrorKind::WouldBlock => return Pumped::Empty,
                e => {
                    tracing::warn!("cannot read the driver's output: {e}");
                    return Pumped::Closed;
                }
            }
        };
        if n == 0 {
            return Pumped::Closed;
        }
        let h = FrameHeader {
            flags: 0,
            opcode: control::OUTPUT,
            lane: 0,
            len: n as u32,
            seq: 0,
        };
        st.frame[..HEADER_LEN].copy_from_slice(&h.encode());
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = sink.write_all(&st.frame[..HEADER_LEN + n]) {
            // The client is gone and the session ends; the bytes go nowhere, as its stdout.
            tracing::debug!("driver output not delivered: {e}");
        }
        st.sent += 1;
        Pumped::Sent(n)
    }

    /// Sends everything the pipe holds now (up to [`DRAIN_MAX`]); returns the number of
    /// `OUTPUT` frames sent by then.
    fn drain(&self) -> u64 {
        let mut st = self.lock();
        let mut read = 0;
        while read < DRAIN_MAX {
            match self.pump(&mut st) {
                Pumped::Sent(n) => read += n,
                Pumped::Empty | Pumped::Closed => break,
            }
        }
        st.sent
    }

    /// After a synchronisation point that saw `sent` frames out: unless lane `lane` has
    /// already waited for all of them, sends a `MARK` for its reply `seq` and returns true
    /// (the reply then carries `FLAG_OUTPUT`).
    fn mark(&self, lane: usize, seq: u32, sent: u64) -> bool {
        let slot = self.marked.get(lane);
        if sent == 0 || slot.is_some_and(|m| m.load(Ordering::Relaxed) >= sent) {
            return false;
        }
        // Under the lock: the mark follows every frame counted so far.
        let st = self.lock();
        let h = FrameHeader {
            flags: 0,
            opcode: control::MARK,
            lane: lane as u16,
            len: 0,
            seq,
        };
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if sink.write_all(&h.encode()).is_err() {
            return false;
        }
        if let Some(m) = slot {
            m.fetch_max(st.sent, Ordering::Relaxed);
        }
        true
    }

    /// The forwarder: sends output as it arrives, one chunk per turn of the lock, so a
    /// synchronisation point never waits long behind it.
    fn forward(&self) {
        let mut pfd = libc::pollfd {
            fd: self.pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd, for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, -1) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("driver output no longer forwarded: {e}");
                return;
            }
            loop {
                match self.pump(&mut self.lock()) {
                    Pumped::Sent(_) => {}
                    Pumped::Empty => break,
                    Pumped::Closed => return,
                }
            }
        }
    }
}

/// Worker, at session start: fd 1 becomes a pipe whose bytes go to `sink` (the session's
/// callback channel) as `OUTPUT` frames; `lanes` is the session's number of call lanes. On
/// error nothing changed (the driver's output stays in the worker's stdout).
pub fn capture(sink: CallbackSink, lanes: usize) -> std::io::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array, which has room for them.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: plain fcntl calls on a descriptor we own.
    if unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Whatever C stdio holds for the old stdout stays there.
    // SAFETY: fflush(NULL) flushes every output stream; no pointer of ours is involved.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    // SAFETY: replaces fd 1 (the worker's stdout, which the worker itself never writes: its
    // log goes to stderr) with the pipe's write end; `write` is closed below, fd 1 keeps it.
    if unsafe { libc::dup2(write.as_raw_fd(), 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(write);
    if CAPTURE.set(Capture::new(read, sink, lanes)).is_err() {
        return Err(std::io::Error::other("the output is captured already"));
    }
    let capture = CAPTURE.get().expect("just set");
    std::thread::Builder::new()
        .name("output".into())
        .spawn(|| capture.forward())?;
    Ok(())
}

/// Backend, at a synchronisation point (after the wait, before the reply): sends the output
/// the driver has written by now, and has the core mark the reply so that the client returns
/// only after writing it. C stdio buffers are flushed first (drivers that print through them).
pub fn drain() {
    let Some(c) = CAPTURE.get() else { return };
    // Not under the lock: this write may wait for the forwarder to make room in the pipe.
    // SAFETY: fflush(NULL) flushes every output stream; no pointer of ours is involved.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    SYNCED.set(Some(c.drain()));
}

/// Backend, before it sends a callback frame: output written before the event the callback
/// reports goes out first, as natively it is written first.
pub fn flush() {
    if let Some(c) = CAPTURE.get() {
        c.drain();
    }
}

/// Core, once the backend answered a request on this thread: whether [`drain`] ran for it;
/// then the reply's lane and seq go to [`mark`].
pub(crate) fn take_synced() -> Option<u64> {
    SYNCED.take()
}

/// Core, for a reply after a synchronisation point that saw `sent` frames out: sends the
/// `MARK` its client waits for if needed; true if the reply must carry `FLAG_OUTPUT`.
pub(crate) fn mark(lane: usize, seq: u32, sent: u64) -> bool {
    CAPTURE.get().is_some_and(|c| c.mark(lane, seq, sent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;
    use wormhole_wire::DecodeError;

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

    impl Sent {
        /// The frames sent so far (header, body), taken.
        fn frames(&self) -> Vec<(FrameHeader, Vec<u8>)> {
            let bytes = std::mem::take(&mut *self.0.lock().unwrap());
            let mut out = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let h = FrameHeader::decode(rest[..HEADER_LEN].try_into().unwrap())
                    .map_err(|e: DecodeError| e.to_string())
                    .unwrap();
                let end = HEADER_LEN + h.len as usize;
                out.push((h, rest[HEADER_LEN..end].to_vec()));
                rest = &rest[end..];
            }
            out
        }
    }

    fn pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: room for two descriptors.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(made, 0);
        // SAFETY: fresh descriptors, owned here.
        unsafe {
            (
                OwnedFd::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    /// Output is sent in order; a lane's reply is marked once per batch of output it has not
    /// waited for yet, and only then; lanes mark independently.
    #[test]
    fn output_goes_out_in_order_and_marks_only_when_needed() {
        let (read, mut write) = pipe();
        let sent = Sent::default();
        let c = Capture::new(read, Arc::new(Mutex::new(sent.clone())), 2);
        // Nothing written: nothing sent, no mark.
        assert_eq!(c.drain(), 0);
        assert!(!c.mark(0, 1, 0));
        assert!(sent.frames().is_empty());

        write.write_all(b"kernel 0\n").unwrap();
        write.write_all(b"kernel 1\n").unwrap();
        let n = c.drain();
        assert_eq!(n, 1);
        assert!(c.mark(0, 7, n));
        let frames = sent.frames();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0.opcode, control::OUTPUT);
        assert_eq!(frames[0].1, b"kernel 0\nkernel 1\n");
        assert_eq!(
            (
                frames[1].0.opcode,
                frames[1].0.lane,
                frames[1].0.seq,
                frames[1].1.len()
            ),
            (control::MARK, 0, 7, 0)
        );
        // Lane 0 has waited for that output; lane 1 has not.
        assert!(!c.mark(0, 8, c.drain()));
        assert!(c.mark(1, 3, c.drain()));
        assert!(!c.mark(1, 4, c.drain()));
        let frames = sent.frames();
        assert_eq!(frames.len(), 1);
        assert_eq!(
            (frames[0].0.opcode, frames[0].0.lane, frames[0].0.seq),
            (control::MARK, 1, 3)
        );

        // More than one chunk goes out as several frames, in order.
        let big: Vec<u8> = (0..CHUNK + 100).map(|i| b'a' + (i % 26) as u8).collect();
        std::thread::scope(|s| {
            // The pipe holds less than that: the writer waits for the drain to make room.
            let w = s.spawn(|| {
                let mut f = &write;
                let mut at = 0;
                while at < big.len() {
                    match f.write(&big[at..]) {
                        Ok(n) => at += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::yield_now()
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            let mut got = Vec::new();
            while got.len() < big.len() {
                c.drain();
                got.extend(sent.frames().into_iter().flat_map(|(h, b)| {
                    assert_eq!(h.opcode, control::OUTPUT);
                    assert!(b.len() <= CHUNK);
                    b
                }));
            }
            w.join().unwrap();
            assert_eq!(got, big);
        });
        // A lane whose slot is unknown is always marked.
        assert!(c.mark(9, 1, c.drain()));
    }
}
