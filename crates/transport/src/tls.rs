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
    raw: Vec<u8>,
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
                self.shared.flush(&mut conn)?;
            }
            // Wait for bytes without holding the lock, so the writing half can proceed.
            let n = (&self.shared.sock).read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            let mut conn = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner());
            let mut input = &self.raw[..n];
            while !input.is_empty() {
                conn.read_tls(&mut input)?;
                conn.process_new_packets()
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            }
            self.shared.flush(&mut conn)?;
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
