//! The supervisor: accepts sessions on the Unix socket, checks their HELLO, and hands each to
//! a worker process (`wh worker`) of the API it asks for; reaps workers and answers
//! `wh status`.

use crate::cgroup::CpuGroups;
use crate::config::{CgroupSetting, Config, Guest, ProgramCacheSetting, Tenant};
use crate::quota::Ledger;
use crate::tenants::{Registry, StoredTenant};
use crate::Backend;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wormhole_blobcache::BlobCache;
use wormhole_transport::link::read_frame;
use wormhole_transport::tls::{self, rustls, TlsReader, TlsWriter};
use wormhole_wire::handshake::{self, Hello};
use wormhole_wire::{control, Reader, Writer, FLAG_REPLY};

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
    #[error("cannot read the tenants made at run time")]
    State(#[source] crate::tenants::RegistryError),
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
    /// The API it serves (an index into the server's backends).
    api: usize,
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
    /// SHA-256 of its token, if it has one: presented tokens are compared by digest.
    token_digest: Option<[u8; 32]>,
    /// Made at run time (`wh tenant add`): stored in the state directory, removable.
    stored: Option<StoredTenant>,
    /// Removed at run time: kept until the server stops as a tombstone (workers and guests
    /// name tenants by index), identifying no one and starting no workers.
    removed: bool,
    ledger: Ledger,
    slots: Vec<bool>,
    /// Per API: when the tenant's next standby worker may start (None: one is up).
    standby_at: Vec<Option<Instant>>,
}

impl TenantState {
    fn new(cfg: Tenant, stored: Option<StoredTenant>, apis: usize) -> std::io::Result<TenantState> {
        let ledger = Ledger::create()?;
        ledger.set_max_queued(cfg.max_queued.unwrap_or(0));
        let token_digest = match &stored {
            Some(st) => st.digest(),
            None => cfg
                .token
                .as_deref()
                .map(|t| crate::tenants::digest(t.as_bytes())),
        };
        Ok(TenantState {
            cfg,
            token_digest,
            stored,
            removed: false,
            ledger,
            slots: vec![false; crate::quota::SLOTS],
            standby_at: vec![Some(Instant::now()); apis],
        })
    }

    fn live(&self) -> bool {
        !self.removed
    }
}

/// A guest region and when its next worker may start.
struct GuestState {
    cfg: Guest,
    /// Held open with an exclusive lock: one server per region.
    _lock: nix::fcntl::Flock<std::fs::File>,
    tenant: usize,
    /// The API its sessions speak.
    api: usize,
    /// None while a worker serves the region.
    start_at: Option<Instant>,
}

struct State {
    workers: HashMap<u32, Worker>,
    tenants: Vec<TenantState>,
    guests: Vec<GuestState>,
    /// The tenants' cgroups (CPU weights), or why there are none.
    cpu: Result<CpuGroups, String>,
    /// Where tenants made at run time are kept, or why there is no such place.
    registry: Result<Registry, String>,
}

/// The APIs this server serves, and what each one's workers need in their environment.
struct Apis {
    backends: &'static [&'static dyn Backend],
    env: Vec<Vec<(OsString, OsString)>>,
    /// Per API, whether its driver is installed (judged once, without loading it), or why
    /// not: standby workers are kept only for installed ones, so an API without a driver
    /// costs no process, and `wh devices` says it is not installed instead of failing.
    installed: Vec<Result<(), String>>,
}

impl Apis {
    fn names(&self) -> Vec<&'static str> {
        self.backends.iter().map(|b| b.api()).collect()
    }

    fn index(&self, api: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.api() == api)
    }
}

impl State {
    /// Sessions the tenant at `index` has open (its standby worker is none).
    fn sessions_of(&self, index: usize) -> usize {
        self.workers
            .values()
            .filter(|w| w.tenant == index && w.in_session())
            .count()
    }
}

type Workers = Arc<Mutex<State>>;

/// Runs the server for the APIs of `backends` in the foreground until killed.
pub fn serve(
    mut config: Config,
    backends: &'static [&'static dyn Backend],
) -> Result<(), ServeError> {
    // Workers get the program cache only once it is known to be usable (and safe: the
    // server's own directory).
    config.program_cache = match config.program_cache_dir() {
        Some(d) => match BlobCache::open(&d, config.program_cache_mib << 20) {
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
    create_runtime_dir(&dir).map_err(|source| ServeError::Runtime {
        path: dir.clone(),
        source,
    })?;
    // Before anything is started: a second server would otherwise take the socket over from
    // a live one (the rename in `bind_socket` replaces it) and leave its clients to the first.
    for path in std::iter::once(&config.socket).chain(&config.admin_socket) {
        refuse_if_served(path)?;
    }
    let mut env = Vec::new();
    for b in backends {
        env.push(b.worker_env(&dir).map_err(|source| ServeError::Runtime {
            path: dir.clone(),
            source,
        })?);
    }
    let installed = backends
        .iter()
        .map(|b| {
            b.installed()
                .inspect_err(|why| tracing::info!(api = b.api(), "not installed: {why}"))
        })
        .collect();
    let vendors = Arc::new(Apis {
        backends,
        env,
        installed,
    });
    let tenant_cfgs = if config.tenants.is_empty() {
        vec![Tenant::open()]
    } else {
        config.tenants.clone()
    };
    let runtime_err = |source| ServeError::Runtime {
        path: dir.clone(),
        source,
    };
    let mut tenants = Vec::new();
    for cfg in tenant_cfgs {
        tenants.push(TenantState::new(cfg, None, backends.len()).map_err(runtime_err)?);
    }
    let registry = open_registry(&config);
    if let Ok(reg) = &registry {
        // A state file that cannot be read stops the server: serving on without those tenants
        // would overwrite it at the next `wh tenant add`.
        for st in reg.load().map_err(ServeError::State)? {
            if tenants.iter().any(|t| t.cfg.name == st.name()) {
                tracing::warn!(tenant = %st.name(), path = %reg.path().display(), "a tenant made at run time has the name of a configured tenant; the configured one is served");
                continue;
            }
            tracing::info!(tenant = %st.name(), "tenant made at run time");
            tenants.push(
                TenantState::new(st.settings(), Some(st), backends.len()).map_err(runtime_err)?,
            );
        }
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
        let api = match &g.api {
            Some(name) => vendors.index(name).ok_or_else(|| ServeError::Region {
                path: g.region.clone(),
                source: std::io::Error::other(format!(
                    "api = {name:?}: this server serves {}",
                    vendors.names().join(", ")
                )),
            })?,
            None => 0,
        };
        tracing::info!(region = %g.region.display(), size_mib = g.size_mib, tenant = %tenants[tenant].cfg.name, api = backends[api].api(), "serving a guest region (ivshmem)");
        guests.push(GuestState {
            cfg: g.clone(),
            _lock: lock,
            tenant,
            api,
            start_at: Some(Instant::now()),
        });
    }
    let (config, vendors) = (Arc::new(config), Arc::new(vendors));
    let handshakes = Arc::new(Handshakes::default());
    let cpu = cpu_groups(&config, &tenants);
    let workers: Workers = Arc::new(Mutex::new(State {
        workers: HashMap::new(),
        tenants,
        guests,
        cpu,
        registry,
    }));
    if workers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .cpu
        .is_ok()
    {
        clean_up_on_signals(workers.clone());
    }
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
        let (config, vendors, workers, handshakes) = (
            config.clone(),
            vendors.clone(),
            workers.clone(),
            handshakes.clone(),
        );
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                let Ok(stream) = conn else { continue };
                let peer = stream.peer_addr().ok().map(|a| Peer::Ip(a.ip()));
                let Some(slot) = handshakes.enter(peer) else {
                    // A TLS client could not read a REFUSED frame before its TLS handshake.
                    if tls_cfg.is_none() {
                        refuse_quietly(&Conn::Tcp(stream));
                    }
                    continue;
                };
                let (config, vendors, workers, tls_cfg) = (
                    config.clone(),
                    vendors.clone(),
                    workers.clone(),
                    tls_cfg.clone(),
                );
                // One thread per connection: a slow handshake must not hold up the others.
                spawn_handshake(move || {
                    let _slot = slot;
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
                    if let Err(e) = accept(&config, &vendors, &workers, conn, Door::Sessions) {
                        tracing::warn!("session not started: {e}");
                    }
                });
            }
        });
    }
    // The session socket appears last: its existence tells scripts and tests that every
    // listener (TCP, metrics, admin) is already accepting.
    let listen_err = |source| ServeError::Listen {
        path: config.socket.clone(),
        source,
    };
    if let Some(path) = &config.admin_socket {
        // Root and the server's user only: the peer-credential check stays, this keeps
        // everyone else from even connecting.
        let admin = bind_socket(path, 0o600).map_err(|source| ServeError::Listen {
            path: path.clone(),
            source,
        })?;
        let (config, vendors, workers) = (config.clone(), vendors.clone(), workers.clone());
        std::thread::Builder::new()
            .name("wh-admin".into())
            .spawn(move || {
                for stream in admin.incoming().flatten() {
                    let (config, vendors, workers) =
                        (config.clone(), vendors.clone(), workers.clone());
                    spawn_handshake(move || {
                        let conn = Conn::Unix(stream);
                        if let Err(e) = accept(&config, &vendors, &workers, conn, Door::Admin) {
                            tracing::warn!("admin request failed: {e}");
                        }
                    });
                }
            })
            .map_err(listen_err)?;
    }
    // Tenants are told apart by their peer uid, so any local user must be able to connect
    // (connecting needs write permission); the socket is otherwise created with the umask.
    let listener = bind_socket(&config.socket, 0o666).map_err(listen_err)?;
    warn_if_unreachable(&config);
    tracing::info!(socket = %config.socket.display(), "wormhole server listening");
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let peer = nix::sys::socket::getsockopt(
                    &stream,
                    nix::sys::socket::sockopt::PeerCredentials,
                )
                .ok()
                .map(|c| Peer::Uid(c.uid()));
                let Some(slot) = handshakes.enter(peer) else {
                    refuse_quietly(&Conn::Unix(stream));
                    continue;
                };
                let (config, vendors, workers) = (config.clone(), vendors.clone(), workers.clone());
                // Off the accept thread: a client that connects and says nothing must not hold
                // up anyone else's session for the HELLO timeout.
                spawn_handshake(move || {
                    let _slot = slot;
                    if let Err(e) = accept(
                        &config,
                        &vendors,
                        &workers,
                        Conn::Unix(stream),
                        Door::Sessions,
                    ) {
                        tracing::warn!("session not started: {e}");
                    }
                });
            }
            Err(e) => tracing::warn!("accept failed: {e}"),
        }
    }
    Ok(())
}

/// Refuses a socket another server answers on. One that only lies there (its server was
/// killed) is replaced when this server binds. Two servers starting at the same moment are not
/// told apart: the one that binds last serves.
fn refuse_if_served(path: &std::path::Path) -> Result<(), ServeError> {
    match UnixStream::connect(path) {
        Ok(_) => Err(ServeError::Listen {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another server is serving on it (stop it first, or give this one another socket)",
            ),
        }),
        Err(_) => Ok(()),
    }
}

/// Binds and listens on a Unix socket under a temporary name, then renames it into place: it
/// never exists without a listener (bind and listen are two steps: a client connecting between
/// them is refused).
fn bind_socket(path: &std::path::Path, mode: u32) -> std::io::Result<UnixListener> {
    let mut tmp = path.to_path_buf().into_os_string();
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    std::fs::rename(&tmp, path)?;
    Ok(listener)
}

/// Gives every tenant its cgroup with its CPU weight, if the `cgroup` setting and the system
/// allow; otherwise says why not, once (sessions work either way, unweighted).
fn cpu_groups(config: &Config, tenants: &[TenantState]) -> Result<CpuGroups, String> {
    let dir = match &config.cgroup {
        Some(CgroupSetting::On(false)) => {
            tracing::info!(
                "per-tenant CPU weights off (cgroup = false): workers stay in the server's cgroup"
            );
            return Err("cgroup = false in the configuration".into());
        }
        None if !tenants.iter().any(|t| t.cfg.cpu_weight.is_some()) => {
            tracing::info!("per-tenant CPU weights off: no tenant sets cpu_weight (cgroup = true turns them on)");
            return Err("no tenant sets cpu_weight, and cgroup = true is not set".into());
        }
        None | Some(CgroupSetting::On(true)) => None,
        Some(CgroupSetting::Dir(d)) => Some(d.as_path()),
    };
    let groups = crate::cgroup::setup(dir).and_then(|mut g| {
        for t in tenants {
            if let Err(e) = g.set_weight(&t.cfg.name, t.cfg.weight()) {
                g.cleanup();
                return Err(e.to_string());
            }
        }
        Ok(g)
    });
    match &groups {
        Ok(g) => tracing::info!(dir = %g.dir().display(), version = ?g.version(), "each tenant's workers run in a cgroup of their own, with the tenant's cpu_weight"),
        Err(why) => tracing::warn!("no per-tenant CPU weights: {why}; sessions work, and tenants share the CPU without weights"),
    }
    groups
}

/// On SIGTERM or SIGINT: ends the standby workers (they serve no one) and removes the cgroups
/// the server made that are empty then, before the server dies of the signal as it would have.
/// Call before any thread starts: they all inherit the blocked signals, so this thread alone
/// receives them.
fn clean_up_on_signals(workers: Workers) {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if let Err(e) = set.thread_block() {
        tracing::warn!("cgroups will not be removed at exit: cannot block signals: {e}");
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = set.wait().unwrap_or(Signal::SIGTERM);
            {
                let mut state = workers.lock().unwrap_or_else(|p| p.into_inner());
                for wk in state.workers.values_mut().filter(|w| !w.in_session()) {
                    let _ = wk.child.kill();
                    let _ = wk.child.wait();
                }
                if let Ok(g) = &state.cpu {
                    let kept = g.cleanup();
                    if kept.is_empty() {
                        tracing::info!(%sig, "removed the tenants' cgroups; exiting");
                    } else {
                        tracing::info!(%sig, ?kept, "exiting; cgroups of sessions still running stay (a later server uses them again)");
                    }
                }
                // Held until the end: no worker starts in a group just removed.
                let _ = set.thread_unblock();
                let _ = nix::sys::signal::raise(sig);
            }
            std::process::exit(128 + sig as i32);
        });
    if let Err(e) = spawned {
        let _ = set.thread_unblock();
        tracing::warn!("cgroups will not be removed at exit: {e}");
    }
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
            if let Err(e) = std::io::copy(&mut reader, &mut to_worker) {
                tracing::warn!(
                    "TLS session: relaying the client's frames to the worker stopped: {e}"
                );
            }
            let _ = to_worker.shutdown(std::net::Shutdown::Both);
        });
        std::thread::spawn(move || {
            if let Err(e) = std::io::copy(&mut from_worker, &mut writer) {
                tracing::warn!(
                    "TLS session: relaying the worker's frames to the client stopped: {e}"
                );
            }
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
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_write_timeout(d),
            Conn::Tcp(s) => s.set_write_timeout(d),
            Conn::Tls(t) => t.tcp.set_write_timeout(d),
        }
    }
    fn read_frame(
        &self,
        body: &mut Vec<u8>,
    ) -> Result<wormhole_wire::FrameHeader, wormhole_transport::TransportError> {
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
    send_refused(stream, reason);
}

fn send_refused(stream: &Conn, reason: &str) {
    // A client that never reads must not keep this thread.
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(&handshake::refused(reason));
}

/// Handshakes (waiting for a HELLO, up to 5 s each) that may run at once, in all and per peer:
/// a flood of idle connections costs a bounded number of threads, and one peer's flood leaves
/// room for the others.
const MAX_HANDSHAKES: usize = 256;
const MAX_HANDSHAKES_PER_PEER: usize = 32;

/// Who is at the other end before any HELLO: the local uid, or the remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    Uid(u32),
    Ip(std::net::IpAddr),
}

/// The handshakes in progress, by peer.
#[derive(Default)]
struct Handshakes {
    inner: Mutex<HandshakeCount>,
}

#[derive(Default)]
struct HandshakeCount {
    total: usize,
    per_peer: HashMap<Option<Peer>, usize>,
    /// Connections refused since the last log line about them (a flood logs once a second).
    refused: u64,
    logged_at: Option<Instant>,
}

/// A handshake's place in the bound, given back when dropped.
struct HandshakeSlot {
    handshakes: Arc<Handshakes>,
    peer: Option<Peer>,
}

impl Handshakes {
    /// A place for one more handshake of `peer`, or None (logged) when over the bounds.
    fn enter(self: &Arc<Self>, peer: Option<Peer>) -> Option<HandshakeSlot> {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let of_peer = c.per_peer.get(&peer).copied().unwrap_or(0);
        if c.total >= MAX_HANDSHAKES || of_peer >= MAX_HANDSHAKES_PER_PEER {
            c.refused += 1;
            if c.logged_at
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
            {
                tracing::warn!(
                    ?peer,
                    waiting = c.total,
                    waiting_of_peer = of_peer,
                    refused = c.refused,
                    "refusing connections: too many are waiting for their HELLO (at most {MAX_HANDSHAKES}, {MAX_HANDSHAKES_PER_PEER} per peer)"
                );
                c.refused = 0;
                c.logged_at = Some(Instant::now());
            }
            return None;
        }
        c.total += 1;
        *c.per_peer.entry(peer).or_default() += 1;
        Some(HandshakeSlot {
            handshakes: self.clone(),
            peer,
        })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut c = self
            .handshakes
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        c.total -= 1;
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Runs one connection's handshake on a thread of its own (the thread owns its slot).
fn spawn_handshake(f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new()
        .name("handshake".into())
        .spawn(f)
    {
        // The closure (and with it the connection and its slot) is dropped: the client sees
        // the connection close.
        tracing::error!("cannot start a thread for a connection: {e}");
    }
}

/// Turns a connection away over the handshake bound (already logged, at most once a second).
fn refuse_quietly(stream: &Conn) {
    send_refused(
        stream,
        "server busy: too many connections are waiting for their HELLO",
    );
}

/// Creates the socket's directory (and any missing parent) traversable by every local user,
/// whatever the umask: tenants of other uids must reach the socket. A directory that already
/// exists is the operator's and is left as it is.
fn create_runtime_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let missing: Vec<&std::path::Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
                tracing::info!(dir = %d.display(), "created the runtime directory (mode 0755)");
            }
            // Another process made it meanwhile: then it is theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Warns when a configured tenant uid other than the server's own cannot reach the socket
/// because a directory on its path is not searchable by others (those are not changed).
fn warn_if_unreachable(config: &Config) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let foreign: Vec<u32> = config
        .tenants
        .iter()
        .flat_map(|t| t.uids.iter().copied())
        .filter(|&u| u != me && u != 0)
        .collect();
    if foreign.is_empty() {
        return;
    }
    let Ok(socket) = std::path::absolute(&config.socket) else {
        return;
    };
    for d in socket.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(d) {
            if m.permissions().mode() & 0o001 == 0 {
                tracing::warn!(dir = %d.display(), uids = ?foreign, "tenant uids other than the server's cannot reach the socket: this directory is not searchable by others");
                return;
            }
        }
    }
}

/// Which of the server's sockets a connection came on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Door {
    /// The session socket, TCP or TLS.
    Sessions,
    /// The admin socket (`admin_socket`): tenant administration only.
    Admin,
}

fn accept(
    config: &Config,
    vendors: &Apis,
    workers: &Workers,
    stream: Conn,
    door: Door,
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
            Conn::Unix(s) if body.first() == Some(&crate::admin::DEVICES) => {
                return answer_json(s, &devices(config, vendors));
            }
            Conn::Unix(s) => {
                // With an admin socket, the session socket serves only what everyone may ask.
                let administering = !body.is_empty() && body[0] != crate::admin::STATUS;
                if administering && config.admin_socket.is_some() && door == Door::Sessions {
                    refuse(
                        &stream,
                        "tenant administration is served on the server's admin socket only",
                    );
                    return Ok(());
                }
                return control_request(workers, s, &body);
            }
            Conn::Tcp(_) | Conn::Tls(_) => {
                refuse(&stream, "status is only served on the local socket");
                return Ok(());
            }
        },
        control::HELLO if door == Door::Admin => {
            refuse(&stream, "the admin socket serves no sessions");
            return Ok(());
        }
        control::HELLO => {}
        other => {
            refuse(
                &stream,
                &format!("unexpected opcode {other:#06x} instead of HELLO"),
            );
            return Ok(());
        }
    }
    let (api, token) = match Hello::check(&h, &body, &vendors.names()) {
        Ok(hello) => (
            vendors
                .index(&hello.api)
                .expect("checked against the names"),
            hello.token,
        ),
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
    // Who is this? Whoever presents a token is its tenant's (on any transport); local peers
    // without one are known by uid; on a server without configured tenants they are "default".
    let mut state = workers.lock().unwrap_or_else(|p| p.into_inner());
    // No tenants configured: local users without a token are "default" (index 0), no limits.
    let open = config.tenants.is_empty() && !config.tokens_only;
    let tenant = match (&token, cred) {
        (Some(tok), _) => tenant_of_token(&state.tenants, tok),
        (None, Some(_)) if config.tokens_only => None,
        (None, Some(c)) => state
            .tenants
            .iter()
            .position(|t| t.live() && t.cfg.uids.contains(&c.uid()))
            .or(open.then_some(0)),
        (None, None) => open.then_some(0),
    };
    let Some(tenant) = tenant else {
        let who = match (cred, &token) {
            (_, Some(_)) => "unknown token".to_string(),
            (Some(_), None) if config.tokens_only => {
                "no token: this server identifies sessions by token only (WORMHOLE_TOKEN or WORMHOLE_TOKEN_FILE)".to_string()
            }
            (Some(c), None) => format!("uid {} is not a tenant of this server", c.uid()),
            (None, None) => {
                "no token: TCP sessions must present a tenant token (WORMHOLE_TOKEN)".to_string()
            }
        };
        drop(state);
        refuse(&stream, &who);
        return Ok(());
    };
    // A session whose client just left may still be ending (its worker exits on the client's
    // EOF): a tenant at its limit waits a moment for that before it is refused, so one job
    // run after another is not refused by the first one's shadow.
    let deadline = Instant::now() + SESSION_END_WAIT;
    loop {
        // What ended sessions held is written off before the new one allocates.
        reap_finished(&mut state);
        if !state.tenants[tenant].live() {
            // Removed while this session waited: its token is no longer good.
            drop(state);
            refuse(&stream, "unknown token");
            return Ok(());
        }
        let open_sessions = state.sessions_of(tenant);
        let t = &state.tenants[tenant];
        if t.cfg.max_sessions.is_none_or(|m| open_sessions < m) {
            break;
        }
        if Instant::now() >= deadline {
            let reason = format!(
                "tenant {} is at its limit of {} sessions",
                t.cfg.name, open_sessions
            );
            drop(state);
            refuse(&stream, &reason);
            return Ok(());
        }
        drop(state);
        std::thread::sleep(Duration::from_millis(20));
        state = workers.lock().unwrap_or_else(|p| p.into_inner());
    }
    // A standby worker has its driver loaded already: the session starts without waiting
    // for a process to start and find its devices.
    let pid = match hand_to_standby(&mut state, tenant, api, stream.fd(), transport) {
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
                api,
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

/// The live tenant whose token was presented. Every tenant's digest is compared, each without
/// branching, so the time taken tells nothing about which one matched or where they differ.
fn tenant_of_token(tenants: &[TenantState], presented: &[u8]) -> Option<usize> {
    let presented = crate::tenants::digest(presented);
    let matches: Vec<bool> = tenants
        .iter()
        .map(|t| {
            t.token_digest
                .is_some_and(|d| digests_equal(&d, &presented))
                && t.live()
        })
        .collect();
    matches.iter().position(|&m| m)
}

fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from turning the fold back into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// Whether a presented token is `expected` (compared as the server does: by digest).
#[cfg(test)]
fn token_matches(expected: &str, presented: &[u8]) -> bool {
    digests_equal(
        &crate::tenants::digest(expected.as_bytes()),
        &crate::tenants::digest(presented),
    )
}

/// The state directory for tenants made at run time, locked for this server; or why there is
/// none (those tenants are then refused, the configured ones served as ever).
fn open_registry(config: &Config) -> Result<Registry, String> {
    let Some(dir) = config.state_dir() else {
        let why = "no state directory (set state_dir, or HOME)".to_string();
        tracing::warn!("tenants cannot be added at run time: {why}");
        return Err(why);
    };
    Registry::open(&dir).map_err(|e| {
        tracing::warn!("tenants cannot be added at run time: {e}");
        e.to_string()
    })
}

/// How long a session over its tenant's limit waits for one that is ending. A worker ends
/// within tens of milliseconds of its client's exit on an idle machine, but a loaded one
/// (driver teardown, a large arena unmapped) may take longer than half a second, and a
/// batch system that runs a tenant's jobs one after another must not see the next refused;
/// a session truly over the limit is refused this much later.
const SESSION_END_WAIT: Duration = Duration::from_secs(2);

/// How long after a standby worker takes a session its successor starts.
const STANDBY_DELAY: Duration = Duration::from_millis(250);

/// Hands a session to the tenant's standby worker; its pid, or None if there is none (or it
/// is gone: it is then reaped, and a new one started later).
fn hand_to_standby(
    state: &mut State,
    tenant: usize,
    api: usize,
    fd: std::os::fd::RawFd,
    transport: &str,
) -> Option<u32> {
    let (&pid, wk) = state
        .workers
        .iter_mut()
        .find(|(_, w)| w.tenant == tenant && w.api == api && !w.in_session())?;
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
            state.tenants[tenant].standby_at[api] = Some(Instant::now() + STANDBY_DELAY);
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

/// Starts `wh worker` for one session of `tenant` in its ledger slot `slot`, speaking the
/// API `api`, and records it.
#[allow(clippy::too_many_arguments)]
fn spawn_worker(
    config: &Config,
    vendors: &Apis,
    state: &mut State,
    tenant: usize,
    slot: usize,
    api: usize,
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
    cmd.arg("worker")
        .arg("--api")
        .arg(vendors.backends[api].api());
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
        .envs(vendors.env[api].iter().map(|(k, v)| (k, v)))
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
    if !config.short_slices {
        cmd.arg("--no-short-slices");
    }
    if !config.build_sandbox {
        cmd.arg("--no-build-sandbox");
    }
    if !config.warm_device {
        cmd.arg("--no-warm-device");
    }
    if let Some(d) = config.program_cache_dir() {
        cmd.arg("--program-cache")
            .arg(d)
            .arg("--program-cache-mib")
            .arg(config.program_cache_mib.to_string());
    }
    let ledger_fd = t.ledger.raw_fd();
    // SAFETY: fcntl, dup2 and sigprocmask are async-signal-safe (no allocation: fixed array);
    // the source descriptors stay open until after spawn.
    unsafe {
        cmd.pre_exec(move || {
            // The supervisor may block SIGTERM and SIGINT for its signal thread; a worker is
            // killed by them as ever (a blocked mask survives fork and exec).
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
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
    // Standby, session and guest workers alike: every process of a tenant counts against
    // its CPU weight.
    if let Ok(g) = &mut state.cpu {
        let cfg = &state.tenants[tenant].cfg;
        if let Err(e) = g.add(&cfg.name, cfg.weight(), pid) {
            tracing::warn!(worker = pid, tenant = %cfg.name, "worker runs outside its tenant's cgroup: {e}");
        }
    }
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
            api,
            guest,
            standby: None,
        },
    );
    Ok(pid)
}

/// Reaps finished workers (their sessions' objects died with them).
/// Reaps finished workers (their sessions' objects died with them) and starts a fresh
/// worker for every guest region that has none.
fn reap(config: &Config, vendors: &Apis, workers: Workers) {
    loop {
        let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        reap_finished(state);
        for tenant in 0..state.tenants.len() {
            for api in 0..vendors.backends.len() {
                start_standby(config, vendors, state, tenant, api);
            }
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
                state.guests[index].api,
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

/// Forgets the workers that have ended: their slots free, whatever their sessions still held
/// written off their tenants' memory, their standby or guest successors scheduled.
fn reap_finished(state: &mut State) {
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
                t.standby_at[wk.api] =
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
}

/// Starts the tenant's standby worker for `api` when it is due and a session slot is free.
fn start_standby(config: &Config, vendors: &Apis, state: &mut State, tenant: usize, api: usize) {
    let t = &state.tenants[tenant];
    if vendors.installed[api].is_err()
        || t.removed
        || t.standby_at[api].is_none_or(|at| at > Instant::now())
    {
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
            api,
            Serves::Standby {
                line: theirs.as_raw_fd(),
            },
        )?;
        if let Some(wk) = state.workers.get_mut(&pid) {
            wk.standby = Some(ours);
        }
        Ok(pid)
    });
    state.tenants[tenant].standby_at[api] = match started {
        Ok(pid) => {
            tracing::debug!(worker = pid, tenant = %state.tenants[tenant].cfg.name, api = vendors.backends[api].api(), "standby worker started");
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

/// How long a snapshot waits for all the workers' answers together.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// One snapshot asks the workers at a time: two asking the same worker at once could read
/// each other's answers.
static STATUS_QUERIES: Mutex<()> = Mutex::new(());

fn snapshot(workers: &Workers) -> Snapshot {
    // Under the lock only what is at hand: accepts and the reaper wait for it, and must not
    // wait for a stuck worker's answer.
    struct Asked {
        pid: u32,
        tenant: String,
        peer_pid: Option<i32>,
        peer_uid: Option<u32>,
        guest_region: Option<PathBuf>,
        started: Instant,
        stats: Option<UnixStream>,
    }
    let (tenants, mut asked) = {
        let guard = workers.lock().unwrap_or_else(|p| p.into_inner());
        let state = &*guard;
        let tenants: Vec<TenantStatus> = state
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| t.live())
            .map(|(i, t)| TenantStatus {
                name: t.cfg.name.clone(),
                sessions: state.sessions_of(i),
                mem_bytes: t.ledger.total(),
                mem_quota: t.cfg.mem_quota_mib.map(|q| q << 20),
                standby_worker: state
                    .workers
                    .iter()
                    .find(|(_, w)| w.tenant == i && !w.in_session())
                    .map(|(pid, _)| *pid),
            })
            .collect();
        let asked: Vec<Asked> = state
            .workers
            .iter()
            .filter(|(_, w)| w.in_session())
            .map(|(pid, wk)| Asked {
                pid: *pid,
                tenant: state.tenants[wk.tenant].cfg.name.clone(),
                peer_pid: wk.peer_pid,
                peer_uid: wk.peer_uid,
                guest_region: wk.guest.map(|g| state.guests[g].cfg.region.clone()),
                started: wk.started,
                stats: wk.stats.try_clone().ok(),
            })
            .collect();
        (tenants, asked)
    };
    // Every worker is asked first and all answer at once: a stuck one costs STATUS_TIMEOUT
    // in all, not per worker.
    let _one_at_a_time = STATUS_QUERIES.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = Instant::now() + STATUS_TIMEOUT;
    let mut q = Writer::new(control::STATUS);
    q.u8(0);
    // One byte of body: always within a frame.
    let query = q.finish(0, 0).unwrap_or_default();
    for a in &mut asked {
        let sent = a.stats.as_ref().is_some_and(|s| {
            drain_late_answers(s);
            s.set_write_timeout(Some(STATUS_TIMEOUT)).is_ok() && (&*s).write_all(&query).is_ok()
        });
        if !sent {
            a.stats = None;
        }
    }
    let mut sessions = Vec::new();
    for a in asked {
        let detail: Option<crate::worker::SessionDetail> = a.stats.and_then(|s| {
            let left = deadline.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            let mut body = Vec::new();
            read_frame(&mut &s, &mut body).ok()?;
            serde_json::from_slice(Reader::new(&body).bytes().ok()?).ok()
        });
        let uptime = a.started.elapsed().as_secs_f64();
        sessions.push(SessionStatus {
            worker: a.pid,
            tenant: a.tenant,
            client_pid: a.peer_pid,
            client_uid: a.peer_uid,
            guest_region: a.guest_region,
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

/// Discards answers that came after an earlier snapshot stopped waiting (a worker that was
/// stopped, then resumed), so this snapshot reads the answer to its own question. The worker
/// writes each small answer whole, so only whole frames are discarded.
fn drain_late_answers(s: &UnixStream) {
    if s.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while matches!(std::io::Read::read(&mut &*s, &mut buf), Ok(n) if n > 0) {}
    let _ = s.set_nonblocking(false);
}

/// Answers a request on the local socket that is not a session: `wh status` for everyone,
/// `wh tenant` for root and the server's own user.
fn control_request(workers: &Workers, stream: &UnixStream, body: &[u8]) -> std::io::Result<()> {
    let mut r = Reader::new(body);
    let kind = if body.is_empty() {
        crate::admin::STATUS
    } else {
        r.u8().unwrap_or(u8::MAX)
    };
    if kind == crate::admin::STATUS {
        return answer_json(stream, &snapshot(workers));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let uid = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map(|c| c.uid())
        .ok();
    if !uid.is_some_and(|u| u == 0 || u == me) {
        let reason = format!(
            "only root or the server's own user (uid {me}) may list or change tenants; {} may not",
            uid.map_or("a peer of unknown uid".into(), |u| format!("uid {u}"))
        );
        refuse(&Conn::Unix(stream.try_clone()?), &reason);
        return Ok(());
    }
    let answer = match kind {
        crate::admin::TENANT_LIST => {
            Ok(serde_json::to_value(tenant_list(workers)).unwrap_or_default())
        }
        crate::admin::TENANT_SET => match crate::admin::TenantChange::decode(&mut r) {
            Ok(change) => change_tenant(workers, &change, uid.unwrap_or(0))
                .map(|t| serde_json::to_value(t).unwrap_or_default()),
            Err(e) => Err(format!("malformed tenant change: {e}")),
        },
        crate::admin::TENANT_ADD => match crate::admin::TenantAdd::decode(&mut r) {
            Ok(add) => add_tenant(workers, &add, uid.unwrap_or(0))
                .map(|t| serde_json::to_value(t).unwrap_or_default()),
            Err(e) => Err(format!("malformed tenant: {e}")),
        },
        crate::admin::TENANT_REMOVE => match r.bytes().and_then(|n| r.finish().map(|()| n)) {
            Ok(name) => remove_tenant(workers, &String::from_utf8_lossy(name), uid.unwrap_or(0))
                .map(|t| serde_json::to_value(t).unwrap_or_default()),
            Err(e) => Err(format!("malformed tenant removal: {e}")),
        },
        other => Err(format!("unknown request {other} on the control socket")),
    };
    match answer {
        Ok(json) => answer_json(stream, &json),
        Err(reason) => {
            refuse(&Conn::Unix(stream.try_clone()?), &reason);
            Ok(())
        }
    }
}

/// The devices every API offers, each listed by an inventory worker of its own (the
/// supervisor never loads a driver), and where sessions connect. Anyone may ask, so one
/// inventory runs at a time and a complete answer is reused for a minute.
fn devices(config: &Config, vendors: &Apis) -> crate::admin::Devices {
    const FRESH: Duration = Duration::from_secs(60);
    static LAST: Mutex<Option<(Instant, Vec<crate::admin::ApiDevices>)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let apis = match &*last {
        Some((at, apis)) if at.elapsed() < FRESH => apis.clone(),
        _ => {
            let apis: Vec<_> = vendors
                .backends
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    if let Err(why) = &vendors.installed[i] {
                        // Not a failure: this server has no such driver, so no such devices.
                        return crate::admin::ApiDevices {
                            api: b.api().to_string(),
                            devices: Vec::new(),
                            error: None,
                            not_installed: Some(why.clone()),
                        };
                    }
                    let (devices, error) = match list_devices(config, vendors, i) {
                        Ok(d) => (d, None),
                        Err(e) => {
                            tracing::warn!(api = b.api(), "cannot list the devices: {e}");
                            (Vec::new(), Some(e))
                        }
                    };
                    crate::admin::ApiDevices {
                        api: b.api().to_string(),
                        devices,
                        error,
                        not_installed: None,
                    }
                })
                .collect();
            *last = apis
                .iter()
                .all(|a| a.error.is_none())
                .then(|| (Instant::now(), apis.clone()));
            apis
        }
    };
    crate::admin::Devices {
        apis,
        socket: config.socket.clone(),
        tcp: config.tcp.clone(),
        tls: config.tls_cert.is_some(),
    }
}

/// Runs `wh worker --transport inventory` for one API and reads its JSON answer. A worker
/// that has not answered within `INVENTORY_TIME` (a driver stuck at start, or a process of
/// the driver's keeping the pipe open) is killed with its process group.
fn list_devices(
    config: &Config,
    vendors: &Apis,
    api: usize,
) -> Result<Vec<crate::backend::DeviceInventory>, String> {
    const INVENTORY_TIME: Duration = Duration::from_secs(30);
    let mut cmd = Command::new("/proc/self/exe");
    if let Ok(path) = std::env::current_exe() {
        cmd.arg0(path);
    }
    let mut child = cmd
        .args(["worker", "--api", vendors.backends[api].api()])
        .args([
            "--lanes",
            "1",
            "--ring-kib",
            "64",
            "--transport",
            "inventory",
        ])
        .envs(vendors.env[api].iter().map(|(k, v)| (k, v)))
        .env("WORMHOLE_NAME_PREFIX", &config.name_prefix)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start an inventory worker: {e}"))?;
    let mut out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = tx.send(std::io::Read::read_to_end(&mut out, &mut bytes).map(|_| bytes));
    });
    let answer = rx.recv_timeout(INVENTORY_TIME);
    let status = match answer {
        Ok(_) => child.wait(),
        Err(_) => {
            // SAFETY: kill has no memory preconditions; the group is the worker's own.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err(format!(
                "the inventory worker did not answer within {INVENTORY_TIME:?}"
            ));
        }
    }
    .map_err(|e| format!("cannot wait for the inventory worker: {e}"))?;
    let bytes = answer
        .expect("checked above")
        .map_err(|e| format!("cannot read the inventory worker: {e}"))?;
    if !status.success() {
        return Err(format!(
            "the inventory worker failed ({status}); its log says why"
        ));
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Inventory {
        Devices(Vec<crate::backend::DeviceInventory>),
        Refused { error: String },
    }
    match serde_json::from_slice(&bytes).map_err(|e| format!("malformed inventory: {e}"))? {
        Inventory::Devices(d) => Ok(d),
        Inventory::Refused { error } => Err(error),
    }
}

/// Answers a control request with one JSON document.
fn answer_json(stream: &UnixStream, value: &impl serde::Serialize) -> std::io::Result<()> {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let mut reply = Writer::new(control::STATUS);
    reply.bytes(&json);
    // A client that asks and never reads must not keep this thread.
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    (&*stream).write_all(&reply.finish(FLAG_REPLY, 0)?)
}

fn tenant_settings(state: &State, index: usize) -> crate::admin::TenantSettings {
    let t = &state.tenants[index];
    crate::admin::TenantSettings {
        name: t.cfg.name.clone(),
        added_at_run_time: t.stored.is_some(),
        mem_quota_mib: t.cfg.mem_quota_mib,
        max_sessions: t.cfg.max_sessions,
        cpu_weight: t.cfg.weight(),
        max_queued: t.cfg.max_queued,
        sessions: state.sessions_of(index),
        cgroup: state.cpu.as_ref().ok().map(|g| g.group_of(&t.cfg.name)),
    }
}

fn tenant_list(workers: &Workers) -> crate::admin::TenantList {
    let state = workers.lock().unwrap_or_else(|p| p.into_inner());
    crate::admin::TenantList {
        cgroups: state.cpu.as_ref().ok().map(|g| g.dir().to_path_buf()),
        cgroups_off: state.cpu.as_ref().err().cloned(),
        tenants: (0..state.tenants.len())
            .filter(|&i| state.tenants[i].live())
            .map(|i| tenant_settings(&state, i))
            .collect(),
    }
}

/// `wh tenant set`: a new CPU weight is written to the tenant's cgroup at once (every worker
/// of the tenant is in it); a new `max_queued` to the tenant's ledger, which its running and
/// standby workers read at each enqueue. Both last until the server stops.
fn change_tenant(
    workers: &Workers,
    change: &crate::admin::TenantChange,
    by: u32,
) -> Result<crate::admin::TenantSettings, String> {
    let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    let index = find_tenant(state, &change.name)?;
    if let Some(w) = change.cpu_weight {
        if !Tenant::CPU_WEIGHTS.contains(&w) {
            return Err(format!("cpu weight {w} must be 1..=10000"));
        }
        let groups = state
            .cpu
            .as_mut()
            .map_err(|why| format!("CPU weights are off on this server: {why}"))?;
        groups
            .set_weight(&change.name, w)
            .map_err(|e| e.to_string())?;
    }
    let t = &mut state.tenants[index];
    if let Some(w) = change.cpu_weight {
        tracing::info!(tenant = %t.cfg.name, from = t.cfg.weight(), to = w, by_uid = by, "cpu_weight changed");
        t.cfg.cpu_weight = Some(w);
    }
    if let Some(q) = change.max_queued {
        let q = (q > 0).then_some(q);
        tracing::info!(tenant = %t.cfg.name, from = ?t.cfg.max_queued, to = ?q, by_uid = by, "max_queued changed");
        t.ledger.set_max_queued(q.unwrap_or(0));
        t.cfg.max_queued = q;
    }
    // A tenant made at run time keeps its settings across restarts; configured ones keep
    // those of the file.
    if let Some(st) = &mut t.stored {
        st.spec.cpu_weight = t.cfg.cpu_weight;
        st.spec.max_queued = t.cfg.max_queued;
        if let Err(e) = save_tenants(state) {
            tracing::error!("the change holds until the server stops: {e}");
        }
    }
    Ok(tenant_settings(state, index))
}

/// The live tenant named `name`, or an error listing the names there are.
fn find_tenant(state: &State, name: &str) -> Result<usize, String> {
    state
        .tenants
        .iter()
        .position(|t| t.live() && t.cfg.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = state
                .tenants
                .iter()
                .filter(|t| t.live())
                .map(|t| t.cfg.name.as_str())
                .collect();
            format!("no tenant named {name:?} (tenants: {})", names.join(", "))
        })
}

/// Writes the live tenants made at run time to the state directory.
fn save_tenants(state: &State) -> Result<(), String> {
    let reg = state
        .registry
        .as_ref()
        .map_err(|why| format!("tenants made at run time cannot be kept: {why}"))?;
    let list: Vec<StoredTenant> = state
        .tenants
        .iter()
        .filter(|t| t.live())
        .filter_map(|t| t.stored.clone())
        .collect();
    reg.save(&list)
        .map_err(|e| format!("cannot write {}: {e}", reg.path().display()))
}

/// `wh tenant add`: a tenant identified by a token minted now, stored before it is answered
/// (a tenant the server could not keep is not made).
fn add_tenant(
    workers: &Workers,
    add: &crate::admin::TenantAdd,
    by: u32,
) -> Result<crate::admin::TenantAdded, String> {
    crate::tenants::valid_name(&add.name)?;
    if let Some(w) = add.cpu_weight {
        if !Tenant::CPU_WEIGHTS.contains(&w) {
            return Err(format!("cpu weight {w} must be 1..=10000"));
        }
    }
    if add.max_queued == Some(0) || add.max_sessions == Some(0) || add.max_objects == Some(0) {
        return Err("max_queued, max_sessions and max_objects must be at least 1 (leave one out for no limit)".into());
    }
    let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    if let Err(why) = &state.registry {
        return Err(format!("tenants cannot be added on this server: {why}"));
    }
    if state
        .tenants
        .iter()
        .any(|t| t.live() && t.cfg.name == add.name)
    {
        return Err(format!("a tenant named {:?} exists already", add.name));
    }
    if let Some(w) = add.cpu_weight {
        let groups = state
            .cpu
            .as_mut()
            .map_err(|why| format!("CPU weights are off on this server: {why}"))?;
        groups.set_weight(&add.name, w).map_err(|e| e.to_string())?;
    }
    let token = crate::tenants::mint_token()?;
    let stored = StoredTenant {
        spec: add.clone(),
        token_sha256: crate::tenants::hex(&crate::tenants::digest(token.as_bytes())),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let apis = state.tenants.first().map_or(1, |t| t.standby_at.len());
    let t = TenantState::new(stored.settings(), Some(stored), apis)
        .map_err(|e| format!("cannot make the tenant's memory ledger: {e}"))?;
    // A removed tenant whose last worker is gone gives its place (and its ledger's memory
    // and descriptor) to the new one: a server that makes a tenant per job stays bounded.
    let free = (0..state.tenants.len())
        .find(|&i| state.tenants[i].removed && !state.workers.values().any(|w| w.tenant == i));
    let (index, previous) = match free {
        Some(i) => (i, Some(std::mem::replace(&mut state.tenants[i], t))),
        None => {
            state.tenants.push(t);
            (state.tenants.len() - 1, None)
        }
    };
    if let Err(e) = save_tenants(state) {
        match previous {
            Some(p) => state.tenants[index] = p,
            None => {
                state.tenants.pop();
            }
        }
        return Err(e);
    }
    tracing::info!(tenant = %add.name, mem_quota_mib = ?add.mem_quota_mib, max_sessions = ?add.max_sessions, by_uid = by, "tenant added");
    Ok(crate::admin::TenantAdded {
        tenant: tenant_settings(state, index),
        token,
    })
}

/// How long a removed tenant's sessions have to end by themselves before they are killed.
const REVOKE_GRACE: Duration = Duration::from_secs(2);

/// `wh tenant remove`: the token stops working at once, the tenant leaves the state file, and
/// its sessions end: each worker tells its client why and exits (killed if it has not within
/// [`REVOKE_GRACE`]), and their memory is written off, all before the answer.
fn remove_tenant(
    workers: &Workers,
    name: &str,
    by: u32,
) -> Result<crate::admin::TenantRemoved, String> {
    let mut guard = workers.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    let index = find_tenant(state, name)?;
    if state.tenants[index].stored.is_none() {
        return Err(format!(
            "tenant {name:?} is defined in the configuration file: remove it there and restart the server"
        ));
    }
    state.tenants[index].removed = true;
    if let Err(e) = save_tenants(state) {
        state.tenants[index].removed = false;
        return Err(e);
    }
    let reason = format!("tenant {name} was removed by the server's operator");
    let mut ending = Vec::new();
    for (pid, wk) in state.workers.iter_mut().filter(|(_, w)| w.tenant == index) {
        if wk.in_session() {
            ending.push((*pid, wk.stats.try_clone().ok()));
        } else {
            let _ = wk.child.kill();
        }
    }
    tracing::info!(tenant = %name, sessions = ending.len(), by_uid = by, "tenant removed; its token is revoked");
    let sessions_ended = ending.len();
    drop(guard);
    // Not under the lock: a worker that does not read its stats line must not hold up
    // everyone else's sessions.
    let mut w = Writer::new(control::ENDED);
    w.bytes(reason.as_bytes());
    if let Ok(frame) = w.finish(0, 0) {
        for stats in ending.iter().filter_map(|(_, s)| s.as_ref()) {
            let _ = stats.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = (&*stats).write_all(&frame);
        }
    }
    // The answer comes once the sessions are over (a script that revokes a job's tenant can
    // count on its memory being free): each ends by itself, or is killed after the grace.
    let deadline = Instant::now() + REVOKE_GRACE;
    loop {
        let mut state = workers.lock().unwrap_or_else(|p| p.into_inner());
        let mut left = 0;
        for (pid, _) in &ending {
            // The same worker, not one that got its pid since.
            let Some(wk) = state.workers.get_mut(pid).filter(|w| w.tenant == index) else {
                continue;
            };
            if wk.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            if Instant::now() >= deadline {
                tracing::warn!(worker = pid, "a revoked session did not end; killing it");
                let _ = wk.child.kill();
                let _ = wk.child.wait();
            } else {
                left += 1;
            }
        }
        reap_finished(&mut state);
        if left == 0 {
            break;
        }
        drop(state);
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(crate::admin::TenantRemoved {
        name: name.to_string(),
        sessions_ended,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches("s3cret", b"s3cret"));
        assert!(!token_matches("s3cret", b"s3creT"));
        assert!(!token_matches("s3cret", b"s3cre"));
        assert!(!token_matches("s3cret", b"s3crett"));
        assert!(!token_matches("s3cret", b""));
        assert!(!token_matches("", b"x"));
        // Equal empty tokens are equal (a tenant without a token never gets here).
        assert!(token_matches("", b""));
    }

    #[test]
    fn handshakes_are_bounded_per_peer_and_given_back() {
        let h = Arc::new(Handshakes::default());
        let a = Some(Peer::Uid(1000));
        let held: Vec<HandshakeSlot> = (0..MAX_HANDSHAKES_PER_PEER)
            .map(|_| h.enter(a).expect("within the bound"))
            .collect();
        assert!(h.enter(a).is_none(), "one peer over its bound");
        // Another peer still gets in.
        let other = h.enter(Some(Peer::Uid(1001))).expect("another peer");
        drop(other);
        drop(held);
        let c = h.inner.lock().unwrap();
        assert_eq!(c.total, 0);
        assert!(c.per_peer.is_empty());
        drop(c);
        assert!(h.enter(a).is_some(), "places given back");
    }

    #[test]
    fn handshakes_are_bounded_in_total() {
        let h = Arc::new(Handshakes::default());
        let held: Vec<HandshakeSlot> = (0..MAX_HANDSHAKES as u32)
            .map(|uid| h.enter(Some(Peer::Uid(uid))).expect("within the bound"))
            .collect();
        assert!(h.enter(Some(Peer::Uid(u32::MAX))).is_none());
        drop(held);
        assert!(h.enter(Some(Peer::Uid(u32::MAX))).is_some());
    }
}
