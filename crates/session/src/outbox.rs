//! The sending side of a TCP (or TLS) session. Every lane's frames share one stream, and a
//! pipelined call (a kernel launch, an argument, a release) is a frame of tens of bytes: one
//! write each cost a system call and a loopback delivery per frame, most of the client's and
//! the server's CPU in a launch-heavy workload. So frames sent without waiting gather in a
//! buffer, and go out together: when a synchronous call goes (it sends them first, in one
//! write with its own frame), when the buffer holds enough, or when the outbox's thread,
//! woken by the first frame of a batch, gets to them (it writes whatever gathered meanwhile:
//! the batch is as large as the sender is faster than a thread's wake-up, and a frame never
//! waits longer than that wake-up). The wake-up is the price: a launch followed at once by
//! `clFinish` took ~7–14 µs longer over loopback on two cores (95 → 106 µs), while 100k
//! pipelined launches went from ~0.3M to ~0.55M calls/s and their CPU time fell by a quarter.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use wormhole_transport::TransportError;

/// Frames gathered beyond this go out at once, by the sender itself.
const FLUSH_AT: usize = 64 << 10;

pub(crate) struct Outbox {
    /// Frames sent without waiting, not yet written, in stream order.
    gathered: Mutex<Gathered>,
    /// The outbox's thread waits here for a first frame.
    wake: Condvar,
    /// The stream. Taken while `gathered` is still held, so that what is written goes out in
    /// the order it gathered, while later frames gather during the write.
    stream: Mutex<Box<dyn Write + Send>>,
    /// The session is gone (set here when a write fails; the caller's calls then fail).
    dead: Arc<AtomicBool>,
}

#[derive(Default)]
struct Gathered {
    frames: Vec<u8>,
    /// The buffer the last write emptied, kept for the next batch.
    spare: Vec<u8>,
}

/// The outbox, held: frames go into the stream in the order they are given here.
pub(crate) struct Held<'a> {
    outbox: &'a Outbox,
    gathered: MutexGuard<'a, Gathered>,
}

impl Outbox {
    /// An outbox for `stream`, with its thread; a failed write sets `dead`.
    pub(crate) fn start(
        stream: Box<dyn Write + Send>,
        dead: Arc<AtomicBool>,
    ) -> std::io::Result<Arc<Outbox>> {
        let outbox = Arc::new(Outbox {
            gathered: Mutex::default(),
            wake: Condvar::new(),
            stream: Mutex::new(stream),
            dead,
        });
        let background = outbox.clone();
        std::thread::Builder::new()
            .name("wormhole-outbox".into())
            .spawn(move || background.run())?;
        Ok(outbox)
    }

    /// Holds the outbox: what is given through the guard keeps its place in the stream.
    pub(crate) fn hold(&self) -> Held<'_> {
        Held {
            outbox: self,
            gathered: self.gathered.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// The outbox's thread: writes what gathered, each time a first frame wakes it. (Waiting
    /// a moment for more first was measured: on two cores the second wake-up cost a
    /// launch-and-finish over loopback more than the batch saved.)
    fn run(&self) {
        loop {
            let mut gathered = self.gathered.lock().unwrap_or_else(|p| p.into_inner());
            while gathered.frames.is_empty() {
                gathered = self.wake.wait(gathered).unwrap_or_else(|p| p.into_inner());
            }
            if self.write_gathered(gathered, &[]).is_err() {
                return;
            }
        }
    }

    /// Writes the gathered frames and then `parts`, releasing `gathered` once the stream is
    /// taken (later frames gather meanwhile, behind these).
    fn write_gathered(
        &self,
        mut gathered: MutexGuard<'_, Gathered>,
        parts: &[&[u8]],
    ) -> Result<(), TransportError> {
        let spare = std::mem::take(&mut gathered.spare);
        let frames = std::mem::replace(&mut gathered.frames, spare);
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        drop(gathered);
        let mut written = Ok(());
        for part in std::iter::once(&frames[..]).chain(parts.iter().copied()) {
            if !part.is_empty() {
                written = written.and_then(|_| stream.write_all(part));
            }
        }
        let written = written.and_then(|_| stream.flush());
        drop(stream);
        let mut frames = frames;
        frames.clear();
        let mut gathered = self.gathered.lock().unwrap_or_else(|p| p.into_inner());
        if gathered.spare.capacity() < frames.capacity() {
            gathered.spare = frames;
        }
        drop(gathered);
        written.map_err(|_| {
            self.dead.store(true, Ordering::SeqCst);
            TransportError::PeerGone
        })
    }
}

impl Held<'_> {
    /// A frame nobody waits for: it goes out with the next write.
    pub(crate) fn gather(mut self, frame: &[u8]) -> Result<(), TransportError> {
        if self.outbox.dead.load(Ordering::Relaxed) {
            return Err(TransportError::PeerGone);
        }
        let first = self.gathered.frames.is_empty();
        self.gathered.frames.extend_from_slice(frame);
        if self.gathered.frames.len() >= FLUSH_AT {
            return self.outbox.write_gathered(self.gathered, &[]);
        }
        if first {
            self.outbox.wake.notify_one();
        }
        Ok(())
    }

    /// A frame (in parts: a request and its bulk data) that goes out now, behind every frame
    /// gathered before it. Its first part (the request, small) joins them, so that they go in
    /// one write; bulk data is written from where it lies.
    pub(crate) fn send(mut self, parts: &[&[u8]]) -> Result<(), TransportError> {
        let Some((head, rest)) = parts.split_first() else {
            return self.outbox.write_gathered(self.gathered, &[]);
        };
        self.gathered.frames.extend_from_slice(head);
        self.outbox.write_gathered(self.gathered, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn joined(s: &Sink) -> Vec<u8> {
        s.0.lock().unwrap().concat()
    }

    /// Frames keep their order whoever writes them, a sent frame goes out at once behind the
    /// gathered ones, and a gathered frame goes out by itself soon after.
    #[test]
    fn frames_go_out_in_order_and_never_stay_behind() {
        let sink = Sink::default();
        let outbox = Outbox::start(Box::new(sink.clone()), Arc::default()).unwrap();
        outbox.hold().gather(b"a").unwrap();
        outbox.hold().gather(b"b").unwrap();
        outbox.hold().send(&[b"c", b"d"]).unwrap();
        assert_eq!(&joined(&sink)[..], b"abcd");
        outbox.hold().gather(b"e").unwrap();
        let t = Instant::now();
        while joined(&sink).len() < 5 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "a gathered frame stayed behind"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&joined(&sink)[..], b"abcde");
        // Many frames from several threads: all of them, each whole.
        let threads: Vec<_> = (0..4u8)
            .map(|k| {
                let outbox = outbox.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        outbox.hold().gather(&[k; 8]).unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        outbox.hold().send(&[]).unwrap();
        let all = joined(&sink);
        assert_eq!(all.len(), 5 + 4 * 10_000 * 8);
        assert!(all[5..].chunks(8).all(|c| c.iter().all(|b| *b == c[0])));
        // Far fewer writes than frames.
        assert!(sink.0.lock().unwrap().len() < 10_000);
    }

    /// A failed write fails the session: later frames are refused.
    #[test]
    fn a_failed_write_ends_the_session() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let dead = Arc::new(AtomicBool::new(false));
        let outbox = Outbox::start(Box::new(Broken), dead.clone()).unwrap();
        assert!(outbox.hold().send(&[b"x"]).is_err());
        assert!(dead.load(Ordering::SeqCst));
        assert!(outbox.hold().gather(b"y").is_err());
    }
}
