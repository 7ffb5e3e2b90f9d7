//! The supervisor: accepts sessions on the Unix socket, checks their HELLO, and hands each to
//! a fresh worker process (`wh worker`); reaps workers and answers `wh status`.

use crate::config::{Config, Guest, ProgramCacheSetting, Tenant};
use crate::program_cache::ProgramCache;
use crate::quota::Ledger;
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
use wormhole_protocol::{control, Reader, Writer, FLAG_REPLY};
use wormhole_transport::link::read_frame;
use wormhole_transport::tls::{self, rustls, TlsReader, TlsWriter};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up TLS with {path}")]
    Tls {
        path: PathBuf,
        #[source]
        source: tls::TlsError,
    },
    #[error("cannot serve the guest region {path}")]
    Region {
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
    tenant: usize,
    slot: usize,
    /// The guest region this worker serves, if any.
    guest: Option<usize>,
    /// A standby worker (driver loaded, no session yet): the line its session is handed over.
    standby: Option<UnixStream>,
}

impl Worker {
    fn in_session(&self) -> bool {
        self.standby.is_none()
    }
}

/// A tenant's limits and the memory ledger its sessions share.
struct TenantState {
    cfg: Tenant,
    ledger: Ledger,
    slots: Vec<bool>,
    /// When the tenant's next standby worker may start (None: one is up).
    standby_at: Option<Instant>,
}

/// A guest region and when its next worker may start.
struct GuestState {
    cfg: Guest,
    /// Held open with an exclusive lock: one server per region.
    _lock: nix::fcntl::Flock<std::fs::File>,
    tenant: usize,
    /// None while a worker serves the region.
    start_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    workers: HashMap<u32, Worker>,
    tenants: Vec<TenantState>,
    guests: Vec<GuestState>,
}

type Workers = Arc<Mutex<State>>;

/// Runs the server in the foreground until killed.
pub fn serve(mut config: Config) -> Result<(), ServeError> {
    // Workers get the program cache only once it is known to be usable (and safe: the
    // server's own directory).
    config.program_cache = match config.program_cache_dir() {
        Some(d) => match ProgramCache::open(&d, config.program_cache_mib << 20) {
            Ok(_) => {
                tracing::info!(dir = %d.display(), "program cache shared by all sessions");
                ProgramCacheSetting::Dir(d)
            }
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                tracing::warn!("program cache off: {e}{cause}");
                ProgramCacheSetting::On(false)
            }
        },
        None => ProgramCacheSetting::On(false),
    };
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
    let tenant_cfgs = if config.tenants.is_empty() {
        vec![Tenant::open()]
    } else {
        config.tenants.clone()
    };
    let mut tenants = Vec::new();
    for cfg in tenant_cfgs {
        let ledger = Ledger::create().map_err(|source| ServeError::Runtime {
            path: dir.clone(),
            source,
        })?;
        tenants.push(TenantState {
            cfg,
            ledger,
            slots: vec![false; crate::quota::SLOTS],
            standby_at: Some(Instant::now()),
        });
    }
    let mut guests = Vec::new();
    for g in &config.guests {
        let lock = prepare_region(g)?;
        let tenant = match &g.tenant {
            Some(name) => tenants
                .iter()
                .position(|t| &t.cfg.name == name)
                .unwrap_or(0),
            None => 0,
        };
        tracing::info!(region = %g.region.display(), size_mib = g.size_mib, tenant = %tenants[tenant].cfg.name, "serving a guest region (ivshmem)");
        guests.push(GuestState {
            cfg: g.clone(),
            _lock: lock,
            tenant,
            start_at: Some(Instant::now()),
        });
    }
    let workers: Workers = Arc::new(Mutex::new(State {
        workers: HashMap::new(),
        tenants,
        guests,
    }));
    {
        let (workers, config, vendors) = (workers.clone(), config.clone(), vendors.clone());
        std::thread::spawn(move || reap(&config, &vendors, workers));
    }
    if let Some(addr) = &config.metrics {
        serve_metrics(addr, workers.clone())?;
    }
    if let Some(addr) = &config.tcp {
        let tcp = TcpListener::bind(addr).map_err(|source| ServeError::Listen {
            path: addr.into(),
            source,
        })?;
        let tls_cfg = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                let cfg = tls::server_config(cert, key).map_err(|e| ServeError::Tls {
                    path: cert.clone(),
                    source: e,
                })?;
                tracing::info!(%addr, "listening on TCP with TLS; tenants present tokens");
                Some(cfg)
            }
            _ => {
                tracing::warn!(%addr, "listening on plain TCP: traffic and tokens are not encrypted; configure tls_cert/tls_key, or bind to loopback only");
                None
            }
        };
        let (config, vendors, workers) = (config.clone(), vendors.clone(), workers.clone());
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                let Ok(stream) = conn else { continue };
                let (config, vendors, workers, tls_cfg) = (
                    config.clone(),
                    vendors.clone(),
                    workers.clone(),
                    tls_cfg.clone(),
                );
                // One thread per connection: a slow handshake must not hold up the others.
                std::thread::spawn(move || {
                    let _ = stream.set_nodelay(true);
                    let conn = match tls_cfg {
                        Some(cfg) => match TlsConn::new(stream, cfg) {
                            Ok(t) => Conn::Tls(Box::new(t)),
                            Err(e) => {
                                tracing::warn!("TLS session not set up: {e}");
                                return;
                            }
                        },
                        None => Conn::Tcp(stream),
                    };
                    if let Err(e) = accept(&config, &vendors, &workers, conn) {
                        tracing::warn!("session not started: {e}");
                    }
                });
            }
        });
    }
    // The Unix socket appears last: its existence tells scripts and tests that every
    // listener (TCP, metrics) is already accepting.
    let _ = std::fs::remove_file(&config.socket);
    let listener = UnixListener::bind(&config.socket).map_err(|source| ServeError::Listen {
        path: config.socket.clone(),
        source,
    })?;
    tracing::info!(socket = %config.socket.display(), "wormhole server listening");
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
    Tls(Box<TlsConn>),
}

/// A TLS session: the supervisor terminates TLS and relays plaintext frames to the worker over
/// a socketpair, so workers need not carry TLS state.
struct TlsConn {
    reader: Mutex<TlsReader>,
    writer: Mutex<TlsWriter>,
    tcp: TcpStream,
    worker_end: UnixStream,
    relay_end: UnixStream,
}

impl TlsConn {
    fn new(tcp: TcpStream, cfg: Arc<rustls::ServerConfig>) -> std::io::Result<TlsConn> {
        let conn = rustls::ServerConnection::new(cfg).map_err(std::io::Error::other)?;
        let (reader, writer) = tls::split(rustls::Connection::Server(conn), tcp.try_clone()?);
        let (worker_end, relay_end) = UnixStream::pair()?;
        Ok(TlsConn {
            reader: Mutex::new(reader),
            writer: Mutex::new(writer),
            tcp,
            worker_end,
            relay_end,
        })
    }

    /// Relays plaintext between the TLS stream and the worker until either side closes.
    fn relay(self) {
        let TlsConn {
            reader,
            writer,
            tcp,
            relay_end,
            ..
        } = self;
        let (mut reader, mut writer) = (
            reader.into_inner().unwrap_or_else(|p| p.into_inner()),
            writer.into_inner().unwrap_or_else(|p| p.into_inner()),
        );
        let Ok(mut to_worker) = relay_end.try_clone() else {
            return;
        };
        let mut from_worker = relay_end;
        let tcp2 = tcp.try_clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut to_worker);
            let _ = to_worker.shutdown(std::net::Shutdown::Both);
        });
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from_worker, &mut writer);
            let _ = tcp.shutdown(std::net::Shutdown::Both);
            drop(tcp2);
        });
    }
}

impl Conn {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(d),
            Conn::Tcp(s) => s.set_read_timeout(d),
            Conn::Tls(t) => t.tcp.set_read_timeout(d),
        }
    }
    fn read_frame(
        &self,
        body: &mut Vec<u8>,
    ) -> Result<wormhole_protocol::FrameHeader, wormhole_transport::TransportError> {
        match self {
            Conn::Unix(s) => read_frame(&mut &*s, body),
            Conn::Tcp(s) => read_frame(&mut &*s, body),
            Conn::Tls(t) => read_frame(
                &mut *t.reader.lock().unwrap_or_else(|p| p.into_inner()),
                body,
            ),
        }
    }
    fn write_all(&self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => (&*s).write_all(b),
            Conn::Tcp(s) => (&*s).write_all(b),
            Conn::Tls(t) => {
                let mut w = t.writer.lock().unwrap_or_else(|p| p.into_inner());
                w.write_all(b)?;
                w.flush()
            }
        }
    }
    fn fd(&self) -> i32 {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Tls(t) => t.worker_end.as_raw_fd(),
        }
    }
}

fn refuse(stream: &Conn, reason: &str) {
    tracing::warn!(reason, "refusing a client");
    let mut w = Writer::new(control::REFUSED);
    w.bytes(reason.as_bytes());
    match w.finish(FLAG_REPLY, 0) {
        Ok(frame) => {
            let _ = stream.write_all(&frame);
        }
        Err(e) => tracing::warn!("refusal not sent: {e}"),
    }
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
            Conn::Tcp(_) | Conn::Tls(_) => {
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
    let token = match crate::worker::parse_hello(&body) {
        Ok(token) => token,
        Err(reason) => {
            refuse(&stream, &reason);
            return Ok(());
        }
    };
    if workers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .workers
        .values()
        .filter(|w| w.in_session())
        .count()
        >= config.max_sessions
    {
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
        Conn::Tcp(_) | Conn::Tls(_) => None,
    };
    let transport = match &stream {
        Conn::Unix(_) => "unix",
        Conn::Tcp(_) => "tcp",
        Conn::Tls(_) => "tls",
    };
    // Who is this? Local peers by uid, TCP peers by token.
    let mut state = workers.lock().unwrap_or_else(|p| p.into_inner());
    let tenant = if config.tenants.is_empty() {
        Some(0)
    } else {
        match (&stream, cred, &token) {
            (Conn::Unix(_), Some(c), _) => state
                .tenants
                .iter()
                .position(|t| t.cfg.uids.contains(&c.uid())),
            (Conn::Tcp(_) | Conn::Tls(_), _, Some(tok)) => state
                .tenants
                .iter()
                .position(|t| t.cfg.token.as_deref().map(str::as_bytes) == Some(tok.as_slice())),
            _ => None,
        }
    };
    let Some(tenant) = tenant else {
        let who = match (cred, &token) {
            (Some(c), _) => format!("uid {} is not a tenant of this server", c.uid()),
            (None, Some(_)) => "unknown token".to_string(),
            (None, None) => {
                "no token: TCP sessions must present a tenant token (WORMHOLE_TOKEN)".to_string()
            }
        };
        drop(state);
        refuse(&stream, &who);
        return Ok(());
    };
    let open_sessions = state
        .workers
        .values()
        .filter(|w| w.tenant == tenant && w.in_session())
        .count();
    let t = &mut state.tenants[tenant];
    if t.cfg.max_sessions.is_some_and(|m| open_sessions >= m) {
        let reason = format!(
            "tenant {} is at its limit of {} sessions",
            t.cfg.name, open_sessions
        );
        drop(state);
        refuse(&stream, &reason);
        return Ok(());
    }
    // A standby worker has its driver loaded already: the session starts without waiting
    // for a process to start and find its devices.
    let pid = match hand_to_standby(&mut state, tenant, stream.fd(), transport) {
        Some(pid) => pid,
        None => {
            let t = &mut state.tenants[tenant];
            let Some(slot) = t.slots.iter().position(|used| !used) else {
                drop(state);
                refuse(&stream, "no session slot left for this tenant");
                return Ok(());
            };
            spawn_worker(
                config,
                vendors,
                &mut state,
                tenant,
                slot,
                Serves::Client {
                    fd: stream.fd(),
                    transport,
                },
            )?
        }
    };
    let wk = state.workers.get_mut(&pid).expect("just inserted");
    wk.peer_pid = cred.map(|c| c.pid());
    wk.peer_uid = cred.map(|c| c.uid());
    tracing::info!(
        worker = pid,
        peer_pid = wk.peer_pid,
        peer_uid = wk.peer_uid,
        "session started"
    );
    drop(state);
    if let Conn::Tls(t) = stream {
        t.relay();
    }
    Ok(())
}

/// How long after a standby worker takes a session its successor starts.
const STANDBY_DELAY: Duration = Duration::from_millis(250);

/// Hands a session to the tenant's standby worker; its pid, or None if there is none (or it
/// is gone: it is then reaped, and a new one started later).
fn hand_to_standby(
    state: &mut State,
    tenant: usize,
    fd: std::os::fd::RawFd,
    transport: &str,
) -> Option<u32> {
    let (&pid, wk) = state
        .workers
        .iter_mut()
        .find(|(_, w)| w.tenant == tenant && !w.in_session())?;
    let line = wk.standby.take()?;
    let mut w = Writer::new(control::HANDOFF);
    w.bytes(transport.as_bytes());
    let sent = w
        .finish(0, 0)
        .map_err(wormhole_transport::TransportError::from)
        .and_then(|frame| wormhole_transport::unix::send_frame_with_fds(&line, &frame, &[fd]));
    match sent {
        Ok(()) => {
            wk.started = Instant::now();
            // The reaper starts the next standby worker, a little later: loading the driver
            // takes CPU the new session's own start-up needs now.
            state.tenants[tenant].standby_at = Some(Instant::now() + STANDBY_DELAY);
            Some(pid)
        }
        Err(e) => {
            tracing::warn!(worker = pid, "standby worker unreachable: {e}");
            let _ = wk.child.kill();
            None
        }
    }
}

/// What a new worker serves.
enum Serves<'a> {
    /// A connected client, whose socket or stream becomes the worker's fd 3.
    Client {
        fd: std::os::fd::RawFd,
        transport: &'static str,
    },
    /// The guest region `guests[index]`.
    Guest { index: usize, cfg: &'a Guest },
    /// Nothing yet: a standby worker, whose fd 3 is this line from the supervisor.
    Standby { line: std::os::fd::RawFd },
}

/// Starts `wh worker` for one session of `tenant` in its ledger slot `slot`, and records it.
fn spawn_worker(
    config: &Config,
    vendors: &std::path::Path,
    state: &mut State,
    tenant: usize,
    slot: usize,
    serves: Serves<'_>,
) -> std::io::Result<u32> {
    let t = &mut state.tenants[tenant];
    let (stats_ours, stats_theirs) = UnixStream::pair()?;
    let stats_fd = stats_theirs.as_raw_fd();
    // The supervisor's own executable, even after an upgrade replaced the file on disk (its
    // path then names the new one, or nothing): workers always match their supervisor.
    let mut cmd = Command::new("/proc/self/exe");
    if let Ok(path) = std::env::current_exe() {
        cmd.arg0(path);
    }
    cmd.arg("worker");
    // A guest worker has no session socket; it gets /dev/null as fd 3.
    let devnull;
    let (session_fd, guest) = match serves {
        Serves::Client { fd, transport } => {
            cmd.arg("--lanes")
                .arg(config.lanes.to_string())
                .arg("--ring-kib")
                .arg(config.ring_kib.to_string())
                .arg("--transport")
                .arg(transport);
            (fd, None)
        }
        Serves::Guest { index, cfg } => {
            let layout = cfg.layout().ok_or_else(|| {
                std::io::Error::other(format!("{} is too small", cfg.region.display()))
            })?;
            devnull = std::fs::File::open("/dev/null")?;
            cmd.arg("--lanes")
                .arg(layout.lanes.to_string())
                .arg("--ring-kib")
                .arg((layout.ring_capacity / 1024).to_string())
                .arg("--transport")
                .arg("guest")
                .arg("--region")
                .arg(&cfg.region);
            (devnull.as_raw_fd(), Some(index))
        }
        Serves::Standby { line } => {
            cmd.arg("--lanes")
                .arg(config.lanes.to_string())
                .arg("--ring-kib")
                .arg(config.ring_kib.to_string())
                .arg("--transport")
                .arg("standby");
            (line, None)
        }
    };
    cmd.arg("--tenant")
        .arg(&t.cfg.name)
        .arg("--slot")
        .arg(slot.to_string())
        .env("OCL_ICD_VENDORS", vendors)
        .env("WORMHOLE_NAME_PREFIX", &config.name_prefix);
    if let Some(q) = t.cfg.mem_quota_mib {
        cmd.arg("--mem-quota").arg((q << 20).to_string());
    }
    if let Some(m) = t.cfg.max_objects {
        cmd.arg("--max-objects").arg(m.to_string());
    }
    for d in &t.cfg.devices {
        cmd.arg("--device").arg(d);
    }
    if let Some(d) = config.program_cache_dir() {
        cmd.arg("--program-cache")
            .arg(d)
            .arg("--program-cache-mib")
            .arg(config.program_cache_mib.to_string());
    }
    let ledger_fd = t.ledger.raw_fd();
    // SAFETY: fcntl and dup2 are async-signal-safe (no allocation: fixed array); the source
    // descriptors stay open until after spawn.
    unsafe {
        cmd.pre_exec(move || {
            // Move the sources out of the way first: one of them may itself be 3, 4 or 5.
            let mut high = [0i32; 3];
            for (h, fd) in high.iter_mut().zip([session_fd, stats_fd, ledger_fd]) {
                *h = libc::fcntl(fd, libc::F_DUPFD, 10);
                if *h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (target, fd) in (3..).zip(high) {
                if libc::dup2(fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    t.slots[slot] = true;
    let pid = child.id();
    state.workers.insert(
        pid,
        Worker {
            child,
            stats: stats_ours,
            peer_pid: None,
            peer_uid: None,
            started: Instant::now(),
            tenant,
            slot,
            guest,
            standby: None,
        },
    );
    Ok(pid)
}

/// Reaps finished workers (their sessions' objects died with them).
/// Reaps finished workers (their sessions' objects died with them) and starts a fresh
/// worker for every guest region that has none.
fn reap(config: &Config, vendors: &std::path::Path, workers: Workers) {
    loop {
        let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        let tenants = &mut state.tenants;
        let guests = &mut state.guests;
        state.workers.retain(|pid, wk| {
            let (done, failed) = match wk.child.try_wait() {
                Ok(Some(st)) => {
                    tracing::info!(worker = pid, status = %st, "session ended");
                    (true, !st.success())
                }
                Ok(None) => (false, false),
                Err(_) => (true, true),
            };
            if done {
                // Whatever the session still held (a crash frees no driver objects one by one)
                // no longer counts against its tenant.
                let t = &mut tenants[wk.tenant];
                t.ledger.write_off(wk.slot);
                t.slots[wk.slot] = false;
                if !wk.in_session() {
                    // A standby worker that cannot even start is not restarted in a tight loop.
                    tracing::warn!(worker = pid, "standby worker ended before any session");
                    let quick = wk.started.elapsed() < Duration::from_secs(2);
                    t.standby_at =
                        Some(Instant::now() + Duration::from_secs(if quick { 5 } else { 0 }));
                }
                if let Some(g) = wk.guest {
                    // A worker that dies at once (bad region, driver trouble) is not
                    // restarted in a tight loop.
                    let quick = failed && wk.started.elapsed() < Duration::from_secs(2);
                    guests[g].start_at =
                        Some(Instant::now() + Duration::from_secs(if quick { 2 } else { 0 }));
                }
            }
            !done
        });
        for tenant in 0..state.tenants.len() {
            start_standby(config, vendors, state, tenant);
        }
        for index in 0..state.guests.len() {
            let g = &state.guests[index];
            if g.start_at.is_none_or(|t| t > Instant::now()) {
                continue;
            }
            let (tenant, cfg) = (g.tenant, g.cfg.clone());
            let Some(slot) = state.tenants[tenant].slots.iter().position(|u| !u) else {
                tracing::warn!(region = %cfg.region.display(), "no session slot left for the guest's tenant; retrying");
                state.guests[index].start_at = Some(Instant::now() + Duration::from_secs(1));
                continue;
            };
            match spawn_worker(
                config,
                vendors,
                state,
                tenant,
                slot,
                Serves::Guest { index, cfg: &cfg },
            ) {
                Ok(pid) => {
                    tracing::debug!(worker = pid, region = %cfg.region.display(), "guest worker started");
                    state.guests[index].start_at = None;
                }
                Err(e) => {
                    tracing::error!(region = %cfg.region.display(), "cannot start a guest worker: {e}");
                    state.guests[index].start_at = Some(Instant::now() + Duration::from_secs(2));
                }
            }
        }
        drop(guard);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts the tenant's standby worker when it is due and a session slot is free.
fn start_standby(config: &Config, vendors: &std::path::Path, state: &mut State, tenant: usize) {
    let t = &state.tenants[tenant];
    if t.standby_at.is_none_or(|at| at > Instant::now()) {
        return;
    }
    let Some(slot) = t.slots.iter().position(|u| !u) else {
        return;
    };
    let started = UnixStream::pair().and_then(|(ours, theirs)| {
        let pid = spawn_worker(
            config,
            vendors,
            state,
            tenant,
            slot,
            Serves::Standby {
                line: theirs.as_raw_fd(),
            },
        )?;
        if let Some(wk) = state.workers.get_mut(&pid) {
            wk.standby = Some(ours);
        }
        Ok(pid)
    });
    state.tenants[tenant].standby_at = match started {
        Ok(pid) => {
            tracing::debug!(worker = pid, tenant = %state.tenants[tenant].cfg.name, "standby worker started");
            None
        }
        Err(e) => {
            tracing::error!("cannot start a standby worker: {e}");
            Some(Instant::now() + Duration::from_secs(5))
        }
    };
}

/// Creates a guest's region file at its configured size (QEMU maps it at that size, so an
/// existing file of another size is an error, not something to resize under a running VM).
fn prepare_region(g: &Guest) -> Result<nix::fcntl::Flock<std::fs::File>, ServeError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| ServeError::Region {
        path: g.region.clone(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o660)
        .open(&g.region)
        .map_err(err)?;
    let f = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
        |(_, e)| {
            err(std::io::Error::other(format!(
                "another Wormhole server serves this region ({e})"
            )))
        },
    )?;
    let (len, want) = (f.metadata().map_err(err)?.len(), g.size_mib << 20);
    if len == 0 {
        f.set_len(want).map_err(err)?;
    } else if len != want {
        return Err(err(std::io::Error::other(format!(
            "exists with {len} bytes but size_mib = {} (QEMU maps it at its size: remove it or fix the setting)",
            g.size_mib
        ))));
    }
    Ok(f)
}

/// The server's state as `wh status` and the metrics endpoint show it.
#[derive(Debug, serde::Serialize)]
pub struct Snapshot {
    pub tenants: Vec<TenantStatus>,
    pub sessions: Vec<SessionStatus>,
}

#[derive(Debug, serde::Serialize)]
pub struct TenantStatus {
    pub name: String,
    pub sessions: usize,
    pub mem_bytes: i64,
    pub mem_quota: Option<u64>,
    /// The worker waiting, driver loaded, for the tenant's next session.
    pub standby_worker: Option<u32>,
}

#[derive(Debug, serde::Serialize)]
pub struct SessionStatus {
    pub worker: u32,
    pub tenant: String,
    pub client_pid: Option<i32>,
    pub client_uid: Option<u32>,
    /// The guest region (ivshmem) the session is served through, if any.
    pub guest_region: Option<PathBuf>,
    pub uptime_s: f64,
    pub calls_per_s: f64,
    pub detail: Option<crate::worker::SessionDetail>,
}

fn snapshot(workers: &Workers) -> Snapshot {
    let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    let tenants = state
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| TenantStatus {
            name: t.cfg.name.clone(),
            sessions: state
                .workers
                .values()
                .filter(|w| w.tenant == i && w.in_session())
                .count(),
            mem_bytes: t.ledger.total(),
            mem_quota: t.cfg.mem_quota_mib.map(|q| q << 20),
            standby_worker: state
                .workers
                .iter()
                .find(|(_, w)| w.tenant == i && !w.in_session())
                .map(|(pid, _)| *pid),
        })
        .collect();
    let mut sessions = Vec::new();
    for (pid, wk) in state.workers.iter_mut().filter(|(_, w)| w.in_session()) {
        let mut q = Writer::new(control::STATUS);
        q.u8(0);
        let _ = wk.stats.set_read_timeout(Some(Duration::from_millis(500)));
        let detail: Option<crate::worker::SessionDetail> = q
            .finish(0, 0)
            .ok()
            .and_then(|f| (&wk.stats).write_all(&f).ok())
            .and_then(|_| {
                let mut body = Vec::new();
                read_frame(&mut &wk.stats, &mut body).ok()?;
                serde_json::from_slice(Reader::new(&body).bytes().ok()?).ok()
            });
        let uptime = wk.started.elapsed().as_secs_f64();
        sessions.push(SessionStatus {
            worker: *pid,
            tenant: state.tenants[wk.tenant].cfg.name.clone(),
            client_pid: wk.peer_pid,
            client_uid: wk.peer_uid,
            guest_region: wk.guest.map(|g| state.guests[g].cfg.region.clone()),
            uptime_s: uptime,
            calls_per_s: detail
                .as_ref()
                .map_or(0.0, |d| d.calls as f64 / uptime.max(1e-3)),
            detail,
        });
    }
    sessions.sort_by_key(|s| s.worker);
    Snapshot { tenants, sessions }
}

/// Answers `wh status` with one JSON document.
fn status(workers: &Workers, stream: &UnixStream) -> std::io::Result<()> {
    let json = serde_json::to_vec(&snapshot(workers)).unwrap_or_default();
    let mut reply = Writer::new(control::STATUS);
    reply.bytes(&json);
    (&*stream).write_all(&reply.finish(FLAG_REPLY, 0)?)
}

/// The same state in Prometheus' text format.
pub fn prometheus(s: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "# HELP wormhole_tenant_sessions Open sessions of a tenant.\n# TYPE wormhole_tenant_sessions gauge");
    for t in &s.tenants {
        let _ = writeln!(
            o,
            "wormhole_tenant_sessions{{tenant=\"{}\"}} {}",
            t.name, t.sessions
        );
    }
    let _ = writeln!(o, "# HELP wormhole_tenant_memory_bytes Device memory held by a tenant's sessions.\n# TYPE wormhole_tenant_memory_bytes gauge");
    for t in &s.tenants {
        let _ = writeln!(
            o,
            "wormhole_tenant_memory_bytes{{tenant=\"{}\"}} {}",
            t.name, t.mem_bytes
        );
    }
    let _ = writeln!(o, "# HELP wormhole_tenant_memory_quota_bytes A tenant's device-memory quota.\n# TYPE wormhole_tenant_memory_quota_bytes gauge");
    for t in s.tenants.iter().filter(|t| t.mem_quota.is_some()) {
        let _ = writeln!(
            o,
            "wormhole_tenant_memory_quota_bytes{{tenant=\"{}\"}} {}",
            t.name,
            t.mem_quota.unwrap_or(0)
        );
    }
    let _ = writeln!(o, "# HELP wormhole_session_calls_total Requests a session made.\n# TYPE wormhole_session_calls_total counter");
    for x in &s.sessions {
        if let Some(d) = &x.detail {
            let _ = writeln!(
                o,
                "wormhole_session_calls_total{{tenant=\"{}\",worker=\"{}\"}} {}",
                x.tenant, x.worker, d.calls
            );
        }
    }
    let _ = writeln!(o, "# HELP wormhole_session_memory_bytes Device memory a session holds.\n# TYPE wormhole_session_memory_bytes gauge");
    for x in &s.sessions {
        if let Some(d) = &x.detail {
            let _ = writeln!(
                o,
                "wormhole_session_memory_bytes{{tenant=\"{}\",worker=\"{}\"}} {}",
                x.tenant, x.worker, d.mem_bytes
            );
        }
    }
    let _ = writeln!(o, "# HELP wormhole_session_objects Objects a session holds, by kind.\n# TYPE wormhole_session_objects gauge");
    for x in &s.sessions {
        if let Some(d) = &x.detail {
            for (kind, n) in &d.objects {
                let _ = writeln!(
                    o,
                    "wormhole_session_objects{{tenant=\"{}\",worker=\"{}\",kind=\"{}\"}} {}",
                    x.tenant, x.worker, kind, n
                );
            }
        }
    }
    o
}

/// Serves `GET /metrics` on `addr` until the process ends.
fn serve_metrics(addr: &str, workers: Workers) -> Result<(), ServeError> {
    let server = tiny_http::Server::http(addr).map_err(|e| ServeError::Listen {
        path: addr.into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let resp = if req.url() == "/metrics" {
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"text/plain; version=0.0.4"[..],
                )
                .expect("static header");
                tiny_http::Response::from_string(prometheus(&snapshot(&workers)))
                    .with_header(header)
            } else {
                tiny_http::Response::from_string("not found; try /metrics\n").with_status_code(404)
            };
            let _ = req.respond(resp);
        }
    });
    Ok(())
}
