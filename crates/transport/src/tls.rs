//! TLS for remote sessions (rustls). A TLS stream is split into a reading half and a writing
//! half that two threads can use at once, as the TCP transport does (a reader thread for
//! replies and callbacks, callers writing requests): the halves share the TLS state under a
//! lock that is never held while blocking on the socket for input.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
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
    sock: TcpStream,
}

impl Shared {
    /// Sends whatever TLS records are pending. Called with the connection locked, so records
    /// from the two halves never interleave.
    fn flush(&self, conn: &mut rustls::Connection) -> std::io::Result<()> {
        while conn.wants_write() {
            conn.write_tls(&mut &self.sock)?;
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
}

/// The writing half of a TLS stream.
pub struct TlsWriter {
    shared: Arc<Shared>,
}

/// Splits an established (or establishing) TLS connection over `sock` into halves.
pub fn split(conn: rustls::Connection, sock: TcpStream) -> (TlsReader, TlsWriter) {
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        sock,
    });
    (
        TlsReader {
            shared: shared.clone(),
            raw: vec![0; 16 * 1024],
            taken: 0,
            filled: 0,
        },
        TlsWriter { shared },
    )
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
                    self.shared.flush(&mut conn)?;
                    continue;
                }
                self.shared.flush(&mut conn)?;
            }
            // Wait for bytes without holding the lock, so the writing half can proceed.
            let n = (&self.shared.sock).read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            (self.taken, self.filled) = (0, n);
        }
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut conn = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner());
        let n = conn.writer().write(buf)?;
        self.shared.flush(&mut conn)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut conn = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.flush(&mut conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A TLS pair over loopback TCP: (the server's halves, the client's halves).
    fn pair() -> ((TlsReader, TlsWriter), (TlsReader, TlsWriter)) {
        let dir = std::env::temp_dir().join(format!("wh-tls-test-{}", std::process::id()));
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
