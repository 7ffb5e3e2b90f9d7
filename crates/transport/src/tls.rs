//! TLS for remote sessions (rustls). A TLS stream is split into a reading half and a writing
//! half that two threads can use at once, as the TCP transport does (a reader thread for
//! replies and callbacks, callers writing requests): the halves share the TLS state under a
//! lock that is never held while blocking on the socket for input.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use rustls;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no {what}")]
    Missing { path: String, what: &'static str },
    #[error("TLS configuration rejected")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    let p = path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: p.clone(),
        source,
    })?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: p.clone(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            path: p,
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Server side: a certificate chain and its private key, both PEM.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certs(cert)?;
    let kp = key.display().to_string();
    let pem = std::fs::read(key).map_err(|source| TlsError::Read {
        path: kp.clone(),
        source,
    })?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|source| TlsError::Read {
            path: kp.clone(),
            source,
        })?
        .ok_or(TlsError::Missing {
            path: kp,
            what: "private key",
        })?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(Arc::new(cfg))
}

/// Client side: trust exactly the certificate(s) in `ca` (PEM).
pub fn client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca)? {
        roots.add(c)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

struct Shared {
    conn: Mutex<rustls::Connection>,
    /// Held while records are written to the socket (taken before `conn`): records go out in
    /// the order rustls made them. The reading half never waits for it: a writer blocked on a
    /// full socket must not keep the reader from draining what the peer sends, or two ends
    /// sending at once wait for each other forever.
    send: Mutex<()>,
    /// Records are waiting that whoever holds `send` must write before letting go.
    pending: AtomicBool,
    sock: TcpStream,
}

impl Shared {
    /// Writes every record rustls has made; the caller holds `send`.
    fn write_out(&self) -> std::io::Result<()> {
        loop {
            self.pending.store(false, Ordering::SeqCst);
            let mut records = Vec::new();
            {
                let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
                while conn.wants_write() {
                    conn.write_tls(&mut records)?;
                }
            }
            if records.is_empty() {
                return Ok(());
            }
            (&self.sock).write_all(&records)?;
        }
    }

    /// Writes the records rustls made, unless another thread is writing: then that thread
    /// writes them before it lets go (`pending`), and this one goes on without waiting.
    fn flush_without_waiting(&self) -> std::io::Result<()> {
        loop {
            self.pending.store(true, Ordering::SeqCst);
            let Ok(guard) = self.send.try_lock() else {
                return Ok(());
            };
            let written = self.write_out();
            drop(guard);
            written?;
            if !self.pending.load(Ordering::SeqCst) {
                return Ok(());
            }
        }
    }

    /// Writes the records rustls made, waiting for another writer to finish first.
    fn flush_waiting(&self) -> std::io::Result<()> {
        let guard = self.send.lock().unwrap_or_else(|p| p.into_inner());
        let written = self.write_out();
        drop(guard);
        written?;
        // Records a reader left while this thread wrote.
        if self.pending.load(Ordering::SeqCst) {
            self.flush_without_waiting()?;
        }
        Ok(())
    }
}

/// The reading half of a TLS stream.
pub struct TlsReader {
    shared: Arc<Shared>,
    /// Bytes read from the socket that rustls has not taken yet (`raw[taken..filled]`).
    raw: Vec<u8>,
    taken: usize,
    filled: usize,
    /// Reads of the socket spin first within this window (a client waiting for its replies);
    /// None: they sleep at once.
    spin: Option<crate::SpinPolicy>,
}

/// How long a write waits for the handshake the reading half carries out.
const HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The writing half of a TLS stream.
pub struct TlsWriter {
    shared: Arc<Shared>,
}

/// Splits an established (or establishing) TLS connection over `sock` into halves.
pub fn split(conn: rustls::Connection, sock: TcpStream) -> (TlsReader, TlsWriter) {
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        send: Mutex::new(()),
        pending: AtomicBool::new(false),
        sock,
    });
    (
        TlsReader {
            shared: shared.clone(),
            raw: vec![0; 16 * 1024],
            taken: 0,
            filled: 0,
            spin: None,
        },
        TlsWriter { shared },
    )
}

impl TlsReader {
    /// Reads of the socket spin within `policy`'s window before they sleep.
    pub fn spinning(self, policy: crate::SpinPolicy) -> TlsReader {
        TlsReader {
            spin: Some(policy),
            ..self
        }
    }
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            {
                let mut conn = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner());
                match conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // rustls refuses input while it holds more decrypted bytes than its limit, so
                // it is fed only once they are all read, and the rest of a socket read waits
                // here: feeding a whole read at once fails mid-stream ("received plaintext
                // buffer full") when it completes several records.
                if self.taken < self.filled {
                    let n = conn.read_tls(&mut &self.raw[self.taken..self.filled])?;
                    if n == 0 {
                        return Err(std::io::Error::other("TLS: input not taken"));
                    }
                    self.taken += n;
                    conn.process_new_packets()
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                    let answer = conn.wants_write();
                    drop(conn);
                    // What processing made (handshake messages, alerts) goes out; the reader
                    // never waits for a writer to do it.
                    if answer {
                        self.shared.flush_without_waiting()?;
                    }
                    continue;
                }
                // Records nobody sent yet (a client's first handshake message) go out before
                // this half waits for the answer.
                let unsent = conn.wants_write();
                drop(conn);
                if unsent {
                    self.shared.flush_without_waiting()?;
                }
            }
            // Wait for bytes without holding the lock, so the writing half can proceed.
            let n = match self.spin {
                Some(policy) => {
                    use std::os::fd::AsRawFd;
                    let sock = &self.shared.sock;
                    crate::wait::read_spinning(sock.as_raw_fd(), &mut self.raw, policy, |b| {
                        (&*sock).read(b)
                    })?
                }
                None => (&self.shared.sock).read(&mut self.raw)?,
            };
            if n == 0 {
                return Ok(0);
            }
            (self.taken, self.filled) = (0, n);
        }
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Encrypted under the connection's lock, written to the socket without it. rustls
        // takes nothing while its buffer is full: records it holds go out first (the reading
        // half may have made them), and until the handshake is done, which the reading half
        // carries out, it only buffers.
        let started = std::time::Instant::now();
        let n = loop {
            let (n, handshaking) = {
                let mut conn = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner());
                (conn.writer().write(buf)?, conn.is_handshaking())
            };
            if n > 0 || buf.is_empty() {
                break n;
            }
            self.shared.flush_waiting()?;
            if handshaking {
                if started.elapsed() > HANDSHAKE_WAIT {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "TLS handshake not done",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        self.shared.flush_waiting()?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.shared.flush_waiting()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A TLS pair over loopback TCP: (the server's halves, the client's halves).
    fn pair() -> ((TlsReader, TlsWriter), (TlsReader, TlsWriter)) {
        static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wh-tls-test-{}-{}",
            std::process::id(),
            PAIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.join("cert.pem"), cert.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), cert.key_pair.serialize_pem()).unwrap();
        let server_cfg = server_config(&dir.join("cert.pem"), &dir.join("key.pem")).unwrap();
        let client_cfg = client_config(&dir.join("cert.pem")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client_sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_sock, _) = listener.accept().unwrap();
        let server = rustls::ServerConnection::new(server_cfg).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let client = rustls::ClientConnection::new(client_cfg, name).unwrap();
        (
            split(rustls::Connection::Server(server), server_sock),
            split(rustls::Connection::Client(client), client_sock),
        )
    }

    fn byte(i: usize) -> u8 {
        (i % 251) as u8
    }

    /// Both sides send 64 MiB at once, each reading on another thread: neither half waits for
    /// the other (a writer blocked on a full socket once held the lock its reader needed, and
    /// the two ends waited for each other forever).
    #[test]
    fn bulk_data_both_ways_at_once_never_deadlocks() {
        const TOTAL: usize = 64 << 20;
        let ((mut sr, mut sw), (mut cr, mut cw)) = pair();
        let send = |w: &mut TlsWriter| {
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..TOTAL / chunk.len() {
                w.write_all(&chunk).unwrap();
            }
            w.flush().unwrap();
        };
        let drain = |r: &mut TlsReader| {
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0;
            while got < TOTAL {
                let n = r.read(&mut buf).unwrap();
                assert!(n > 0, "stream ended after {got} bytes");
                got += n;
            }
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let threads = [
            std::thread::spawn(move || send(&mut sw)),
            std::thread::spawn(move || send(&mut cw)),
            std::thread::spawn({
                let done = done_tx.clone();
                move || {
                    drain(&mut sr);
                    let _ = done.send(());
                }
            }),
            std::thread::spawn(move || {
                drain(&mut cr);
                let _ = done_tx.send(());
            }),
        ];
        for _ in 0..2 {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("both ways at once: no progress for 60 s (deadlock)");
        }
        for t in threads {
            t.join().unwrap();
        }
    }

    /// Bulk data in writes of many sizes, read back in reads of many sizes: every byte arrives,
    /// in order, however the socket's reads split the TLS records (a read that completed
    /// several records once failed with "received plaintext buffer full").
    #[test]
    fn bulk_data_arrives_whole_however_reads_split_the_records() {
        const TOTAL: usize = 48 << 20;
        let ((mut server_reader, mut server_writer), (mut client_reader, _client_writer)) = pair();
        // The server's reading half completes the handshake, as a relay's reading thread does.
        std::thread::spawn(move || std::io::copy(&mut server_reader, &mut std::io::sink()));
        let sender = std::thread::spawn(move || {
            let data: Vec<u8> = (0..TOTAL).map(byte).collect();
            let (mut at, mut k) = (0, 0usize);
            while at < TOTAL {
                let n = [1, 16, 4096, 16_384, 16_385, 70_000, 1 << 20][k % 7].min(TOTAL - at);
                server_writer.write_all(&data[at..at + n]).unwrap();
                (at, k) = (at + n, k + 1);
            }
            server_writer.flush().unwrap();
        });
        let mut buf = vec![0u8; 1 << 16];
        let (mut got, mut k) = (0, 0usize);
        while got < TOTAL {
            let want = [16, 1 << 16, 3, 20_000][k % 4];
            let n = client_reader.read(&mut buf[..want]).unwrap();
            assert!(n > 0, "stream ended after {got} bytes");
            for (j, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, byte(got + j), "byte {}", got + j);
            }
            (got, k) = (got + n, k + 1);
        }
        sender.join().unwrap();
    }
}
