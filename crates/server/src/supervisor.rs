//! The supervisor: accepts sessions on the Unix socket, checks their HELLO, and hands each to
//! a fresh worker process (`wh worker`); reaps workers and answers `wh status`.

use crate::config::Config;
use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wormhole_protocol::{control, Reader, Writer, API_OPENCL, FLAG_REPLY, VERSION};
use wormhole_transport::link::read_frame;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare the runtime directory {path}")]
    Runtime {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

struct Worker {
    child: Child,
    stats: UnixStream,
    peer_pid: Option<i32>,
    peer_uid: Option<u32>,
    started: Instant,
}

type Workers = Arc<Mutex<HashMap<u32, Worker>>>;

/// Runs the server in the foreground until killed.
pub fn serve(config: Config) -> Result<(), ServeError> {
    let dir = config
        .socket
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir).map_err(|source| ServeError::Runtime {
        path: dir.clone(),
        source,
    })?;
    let vendors =
        crate::vendors::filtered_vendor_dir(&dir).map_err(|source| ServeError::Runtime {
            path: dir.clone(),
            source,
        })?;
    let _ = std::fs::remove_file(&config.socket);
    let listener = UnixListener::bind(&config.socket).map_err(|source| ServeError::Listen {
        path: config.socket.clone(),
        source,
    })?;
    tracing::info!(socket = %config.socket.display(), "wormhole server listening");
    let workers: Workers = Arc::default();
    {
        let workers = workers.clone();
        std::thread::spawn(move || reap(workers));
    }
    if let Some(addr) = &config.tcp {
        let tcp = TcpListener::bind(addr).map_err(|source| ServeError::Listen {
            path: addr.into(),
            source,
        })?;
        tracing::warn!(%addr, "listening on TCP: sessions there are not authenticated yet; bind to loopback or a trusted network only");
        let (config, vendors, workers) = (config.clone(), vendors.clone(), workers.clone());
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = accept(&config, &vendors, &workers, Conn::Tcp(stream)) {
                            tracing::warn!("session not started: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("accept failed: {e}"),
                }
            }
        });
    }
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                if let Err(e) = accept(&config, &vendors, &workers, Conn::Unix(stream)) {
                    tracing::warn!("session not started: {e}");
                }
            }
            Err(e) => tracing::warn!("accept failed: {e}"),
        }
    }
    Ok(())
}

/// A client connection on either listener.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(d),
            Conn::Tcp(s) => s.set_read_timeout(d),
        }
    }
    fn read_frame(
        &self,
        body: &mut Vec<u8>,
    ) -> Result<wormhole_protocol::FrameHeader, wormhole_transport::TransportError> {
        match self {
            Conn::Unix(s) => read_frame(&mut &*s, body),
            Conn::Tcp(s) => read_frame(&mut &*s, body),
        }
    }
    fn write_all(&self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => (&*s).write_all(b),
            Conn::Tcp(s) => (&*s).write_all(b),
        }
    }
    fn fd(&self) -> i32 {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        }
    }
}

fn refuse(stream: &Conn, reason: &str) {
    tracing::warn!(reason, "refusing a client");
    let mut w = Writer::new(control::REFUSED);
    w.bytes(reason.as_bytes());
    let _ = stream.write_all(&w.finish(FLAG_REPLY, 0));
}

fn accept(
    config: &Config,
    vendors: &std::path::Path,
    workers: &Workers,
    stream: Conn,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut body = Vec::new();
    let h = match stream.read_frame(&mut body) {
        Ok(h) => h,
        Err(e) => {
            refuse(&stream, &format!("no valid HELLO: {e}"));
            return Ok(());
        }
    };
    stream.set_read_timeout(None)?;
    match h.opcode {
        control::STATUS => match &stream {
            Conn::Unix(s) => return status(workers, s),
            Conn::Tcp(_) => {
                refuse(&stream, "status is only served on the local socket");
                return Ok(());
            }
        },
        control::HELLO => {}
        other => {
            refuse(
                &stream,
                &format!("unexpected opcode {other:#06x} instead of HELLO"),
            );
            return Ok(());
        }
    }
    let mut r = Reader::new(&body);
    let hello = (|| Ok::<_, wormhole_protocol::DecodeError>((r.u8()?, r.bytes()?.to_vec())))();
    match hello {
        Ok((v, api)) if v == VERSION && api == API_OPENCL.as_bytes() => {}
        Ok((v, api)) => {
            refuse(
                &stream,
                &format!(
                    "unsupported version {v} or API {:?}",
                    String::from_utf8_lossy(&api)
                ),
            );
            return Ok(());
        }
        Err(e) => {
            refuse(&stream, &format!("malformed HELLO: {e}"));
            return Ok(());
        }
    }
    if workers.lock().unwrap_or_else(|p| p.into_inner()).len() >= config.max_sessions {
        refuse(
            &stream,
            &format!("server is at its limit of {} sessions", config.max_sessions),
        );
        return Ok(());
    }
    let cred = match &stream {
        Conn::Unix(s) => {
            nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials).ok()
        }
        Conn::Tcp(_) => None,
    };
    let transport = match &stream {
        Conn::Unix(_) => "unix",
        Conn::Tcp(_) => "tcp",
    };
    let (stats_ours, stats_theirs) = UnixStream::pair()?;
    let session_fd = stream.fd();
    let stats_fd = stats_theirs.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("worker")
        .arg("--lanes")
        .arg(config.lanes.to_string())
        .arg("--ring-kib")
        .arg(config.ring_kib.to_string())
        .arg("--transport")
        .arg(transport)
        .env("OCL_ICD_VENDORS", vendors)
        .env("WORMHOLE_NAME_PREFIX", &config.name_prefix);
    // SAFETY: dup2 is async-signal-safe; the source descriptors stay open until after spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(session_fd, 3) < 0 || libc::dup2(stats_fd, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = child.id();
    tracing::info!(
        worker = pid,
        peer_pid = cred.map(|c| c.pid()),
        peer_uid = cred.map(|c| c.uid()),
        "session started"
    );
    workers.lock().unwrap_or_else(|p| p.into_inner()).insert(
        pid,
        Worker {
            child,
            stats: stats_ours,
            peer_pid: cred.map(|c| c.pid()),
            peer_uid: cred.map(|c| c.uid()),
            started: Instant::now(),
        },
    );
    Ok(())
}

/// Reaps finished workers (their sessions' objects died with them).
fn reap(workers: Workers) {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let mut w = workers.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|pid, wk| match wk.child.try_wait() {
            Ok(Some(st)) => {
                tracing::info!(worker = pid, status = %st, "session ended");
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
    }
}

/// Answers `wh status` with one JSON document.
fn status(workers: &Workers, stream: &UnixStream) -> std::io::Result<()> {
    let mut sessions = Vec::new();
    let mut w = workers.lock().unwrap_or_else(|p| p.into_inner());
    for (pid, wk) in w.iter_mut() {
        let mut q = Writer::new(control::STATUS);
        q.u8(0);
        let _ = wk.stats.set_read_timeout(Some(Duration::from_millis(500)));
        let detail = (&wk.stats)
            .write_all(&q.finish(0, 0))
            .ok()
            .and_then(|_| {
                let mut body = Vec::new();
                read_frame(&mut &wk.stats, &mut body).ok()?;
                let mut r = Reader::new(&body);
                Some(String::from_utf8_lossy(r.bytes().ok()?).into_owned())
            })
            .unwrap_or_else(|| "null".into());
        sessions.push(format!(
            "{{\"worker\":{pid},\"client_pid\":{},\"client_uid\":{},\"uptime_s\":{:.1},\"detail\":{detail}}}",
            wk.peer_pid.map_or("null".into(), |p| p.to_string()),
            wk.peer_uid.map_or("null".into(), |p| p.to_string()),
            wk.started.elapsed().as_secs_f64()
        ));
    }
    let json = format!("{{\"sessions\":[{}]}}", sessions.join(","));
    let mut reply = Writer::new(control::STATUS);
    reply.bytes(json.as_bytes());
    (&*stream).write_all(&reply.finish(FLAG_REPLY, 0))
}
