//! `wh`: the Wormhole command line.

mod bench;

use clap::{Parser, Subcommand};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use wormhole_opencl_proto::{control, Reader, Writer};
use wormhole_server::{Backend, Config};

/// The APIs this server serves, each plugged in as a backend (the first one is the default of
/// guest regions).
static BACKENDS: &[&dyn Backend] = &[
    &wormhole_opencl_server::OPENCL,
    &wormhole_cuda_server::CUDA,
    &wormhole_nvml_server::NVML,
];

#[derive(Parser)]
#[command(
    name = "wh",
    version,
    about = "Wormhole: share accelerators by forwarding their API"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server in the foreground.
    Serve {
        /// TOML configuration file (flags override it).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Unix socket to listen on [default: $WORMHOLE_SOCKET or /tmp/wormhole/wormhole.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Most sessions served at once.
        #[arg(long)]
        max_sessions: Option<usize>,
        /// Also accept sessions over TCP at this address (e.g. 127.0.0.1:7700).
        #[arg(long)]
        tcp: Option<String>,
        /// Serve Prometheus metrics at http://ADDR/metrics.
        #[arg(long)]
        metrics: Option<String>,
        /// Certificate (PEM) for TLS on the TCP listener (see `wh gen-cert`).
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// Private key (PEM) of --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Serve a VM guest through this ivshmem backing file (created at 16 MiB if missing;
        /// give it to QEMU as the memory of an `ivshmem-plain` device). Repeatable.
        #[arg(long = "guest-region")]
        guest_regions: Vec<PathBuf>,
        /// Keep built programs for every session in DIR [default: ~/.cache/wormhole/programs].
        #[arg(long, conflicts_with = "no_program_cache")]
        program_cache: Option<PathBuf>,
        /// Compile every program (no program cache).
        #[arg(long)]
        no_program_cache: bool,
        /// Keep tenants made at run time (`wh tenant add`) in DIR [default:
        /// ~/.local/state/wormhole].
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Serve `wh tenant` on this socket only (mode 0600), not on the session socket: for a
        /// session socket handed to containers, whose root must not administer the server.
        #[arg(long)]
        admin_socket: Option<PathBuf>,
        /// Identify sessions by token only: a local peer's uid makes it no tenant (for a
        /// socket handed to containers, whose tenants are minted with `wh tenant add`).
        #[arg(long)]
        tokens_only: bool,
    },
    /// Write a self-signed certificate and key for testing TLS (cert.pem, key.pem in DIR).
    GenCert {
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Names the certificate is valid for.
        #[arg(long, default_values_t = vec!["localhost".to_string(), "127.0.0.1".to_string()])]
        name: Vec<String>,
    },
    /// Run PROGRAM with the OpenCL ICD loader pointed at Wormhole only.
    Run {
        /// Unix socket of the server [default: $WORMHOLE_SOCKET or /tmp/wormhole/wormhole.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<String>,
    },
    /// Measure native OpenCL, Wormhole over shared memory and over TCP side by side.
    Bench {
        /// Which part: everything, the call workload's table, or more tenants than cores.
        #[arg(long, value_enum, default_value_t = bench::Part::All)]
        part: bench::Part,
    },
    /// Show the server's sessions, their objects and memory.
    Status {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// The devices the server offers, per API, and where sessions connect (JSON).
    Devices {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Add, remove, list or change tenants while the server runs (root or the server's own
    /// user only).
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// (internal) Serve one session; started by `wh serve`.
    #[command(hide = true)]
    Worker {
        /// The API the session speaks.
        #[arg(long)]
        api: String,
        #[arg(long)]
        lanes: u32,
        #[arg(long)]
        ring_kib: u64,
        /// unix, tcp, tls, guest, or standby (warm up, then wait for a session's socket).
        #[arg(long, default_value = "unix")]
        transport: String,
        #[arg(long, default_value = "default")]
        tenant: String,
        #[arg(long, default_value_t = 0)]
        slot: usize,
        #[arg(long)]
        mem_quota: Option<u64>,
        #[arg(long)]
        max_objects: Option<usize>,
        /// A device the tenant may use (substring of its name); repeatable.
        #[arg(long = "device")]
        devices: Vec<String>,
        /// The guest region (transport "guest").
        #[arg(long)]
        region: Option<PathBuf>,
        /// The program cache shared by all sessions (checked by the supervisor).
        #[arg(long)]
        program_cache: Option<PathBuf>,
        #[arg(long, default_value_t = 256)]
        program_cache_mib: u64,
        /// Leave every thread at the kernel's default time slice (`short_slices = false`).
        #[arg(long)]
        no_short_slices: bool,
        /// Let every build read what the worker may (`build_sandbox = false`).
        #[arg(long)]
        no_build_sandbox: bool,
        /// A standby worker loads the driver only (`warm_device = false`).
        #[arg(long)]
        no_warm_device: bool,
    },
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Make a tenant and mint its token (printed once, or written to --token-file). Sessions
    /// that present the token (WORMHOLE_TOKEN) are the tenant's. Kept across restarts.
    Add {
        /// Its name: letters, digits, '.', '_', '-'.
        name: String,
        /// Device memory all its sessions may hold together, MiB.
        #[arg(long)]
        mem_quota_mib: Option<u64>,
        /// Sessions it may have open at once.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_sessions: Option<u64>,
        /// Objects one session may hold at once.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_objects: Option<u64>,
        /// A device it may use (substring of its name); repeatable.
        #[arg(long = "device")]
        devices: Vec<String>,
        /// Its share of the CPU against the other tenants (1..=10000; 100 is ordinary).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10000))]
        cpu_weight: Option<u32>,
        /// The most commands one session may have queued per command queue.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_queued: Option<u64>,
        /// Write the token to this file (mode 0600, made anew) instead of printing it.
        #[arg(long)]
        token_file: Option<PathBuf>,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Remove a tenant made with `add`: its token stops working and its sessions end (their
    /// calls fail as when the server goes away, with a line saying why).
    Remove {
        name: String,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Every tenant's CPU weight, queue limit, sessions and cgroup (JSON).
    List {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Change a tenant's settings for its running sessions and the ones to come.
    #[command(group(clap::ArgGroup::new("change").required(true).multiple(true).args(["cpu_weight", "max_queued"])))]
    Set {
        /// The tenant's name (as in the configuration).
        name: String,
        /// Its share of the CPU against the other tenants (1..=10000; 100 is ordinary).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10000))]
        cpu_weight: Option<u32>,
        /// The most commands one session may have queued per command queue (0: no limit).
        #[arg(long)]
        max_queued: Option<u64>,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] wormhole_server::config::ConfigError),
    #[error(transparent)]
    Serve(#[from] wormhole_server::supervisor::ServeError),
    #[error("worker failed")]
    Worker(#[from] wormhole_server::worker::WorkerError),
    #[error("cannot find Wormhole's ICD library {0} (set WORMHOLE_ICD_LIB)")]
    NoIcd(PathBuf),
    #[error("refusing to use {dir}: it must be a directory of uid {uid} that no one else can write (remove it, or set TMPDIR elsewhere)")]
    UnsafeIcdDir { dir: PathBuf, uid: u32 },
    #[error("cannot run {program}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the server at {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad answer from the server: {0}")]
    Answer(String),
    #[error("the server refused: {0}")]
    Refused(String),
    #[error("benchmark failed")]
    Bench(#[from] bench::BenchError),
    #[error("I/O error")]
    Io(#[from] std::io::Error),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WORMHOLE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain: what failed and why.
            let mut msg = format!("wh: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn socket_or_default(s: Option<PathBuf>) -> PathBuf {
    s.unwrap_or_else(wormhole_opencl_proto::default_socket_path)
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Serve {
            config,
            socket,
            max_sessions,
            tcp,
            metrics,
            tls_cert,
            tls_key,
            guest_regions,
            program_cache,
            no_program_cache,
            state_dir,
            admin_socket,
            tokens_only,
        } => {
            let mut c = match config {
                Some(p) => Config::load(&p)?,
                None => Config::default(),
            };
            if let Some(s) = socket {
                c.socket = s;
            }
            if let Some(m) = max_sessions {
                c.max_sessions = m;
            }
            if tcp.is_some() {
                c.tcp = tcp;
            }
            if metrics.is_some() {
                c.metrics = metrics;
            }
            if tls_cert.is_some() {
                c.tls_cert = tls_cert;
                c.tls_key = tls_key;
            }
            for region in guest_regions {
                c.guests.push(wormhole_server::config::Guest {
                    region,
                    size_mib: wormhole_server::config::Guest::default_size_mib(),
                    tenant: None,
                    api: None,
                });
            }
            if let Some(d) = program_cache {
                c.program_cache = wormhole_server::config::ProgramCacheSetting::Dir(d);
            }
            if no_program_cache {
                c.program_cache = wormhole_server::config::ProgramCacheSetting::On(false);
            }
            if state_dir.is_some() {
                c.state_dir = state_dir;
            }
            if admin_socket.is_some() {
                c.admin_socket = admin_socket;
            }
            c.tokens_only |= tokens_only;
            c.validate()?;
            wormhole_server::supervisor::serve(c, BACKENDS)?;
            Ok(())
        }
        Cmd::Worker {
            api,
            lanes,
            ring_kib,
            transport,
            tenant,
            slot,
            mem_quota,
            max_objects,
            devices,
            region,
            program_cache,
            program_cache_mib,
            no_short_slices,
            no_build_sandbox,
            no_warm_device,
        } => {
            let backend = *BACKENDS
                .iter()
                .find(|b| b.api() == api)
                .ok_or_else(|| CliError::Answer(format!("no backend for the API {api:?}")))?;
            let args = wormhole_server::worker::WorkerArgs {
                api,
                layout: wormhole_transport::Layout {
                    lanes,
                    ring_capacity: ring_kib * 1024,
                },
                transport,
                tenant,
                slot,
                mem_quota,
                max_objects,
                devices,
                region,
                build_cache: program_cache,
                build_cache_bytes: program_cache_mib << 20,
                short_slices: !no_short_slices,
                build_sandbox: !no_build_sandbox,
                warm_device: !no_warm_device,
            };
            wormhole_server::worker::main(args, backend)?;
            Ok(())
        }
        Cmd::Run { socket, program } => run_program(socket, program),
        Cmd::Status { socket } => status(socket_or_default(socket)),
        Cmd::Devices { socket } => {
            let mut w = Writer::new(control::STATUS);
            w.u8(wormhole_server::admin::DEVICES);
            print_json(&ask(&socket_or_default(socket), w)?);
            Ok(())
        }
        Cmd::Tenant {
            cmd: TenantCmd::List { socket },
        } => {
            let mut w = Writer::new(control::STATUS);
            w.u8(wormhole_server::admin::TENANT_LIST);
            print_json(&ask(&socket_or_default(socket), w)?);
            Ok(())
        }
        Cmd::Tenant {
            cmd:
                TenantCmd::Set {
                    name,
                    cpu_weight,
                    max_queued,
                    socket,
                },
        } => {
            let mut w = Writer::new(control::STATUS);
            wormhole_server::admin::TenantChange {
                name,
                cpu_weight,
                max_queued,
            }
            .encode(&mut w);
            print_json(&ask(&socket_or_default(socket), w)?);
            Ok(())
        }
        Cmd::Tenant {
            cmd:
                TenantCmd::Add {
                    name,
                    mem_quota_mib,
                    max_sessions,
                    max_objects,
                    devices,
                    cpu_weight,
                    max_queued,
                    token_file,
                    socket,
                },
        } => {
            let mut w = Writer::new(control::STATUS);
            wormhole_server::admin::TenantAdd {
                name,
                mem_quota_mib,
                max_sessions: max_sessions.map(|n| n as usize),
                max_objects: max_objects.map(|n| n as usize),
                devices,
                cpu_weight,
                max_queued,
            }
            .encode(&mut w);
            let answer = ask(&socket_or_default(socket), w)?;
            let mut added: serde_json::Value =
                serde_json::from_slice(&answer).map_err(|e| CliError::Answer(e.to_string()))?;
            if let Some(path) = token_file {
                let token = added["token"].as_str().unwrap_or_default().to_string();
                write_secret(&path, &token)?;
                added["token"] =
                    serde_json::Value::String(format!("(written to {})", path.display()));
            }
            print_json(&serde_json::to_vec(&added).unwrap_or_default());
            Ok(())
        }
        Cmd::Tenant {
            cmd: TenantCmd::Remove { name, socket },
        } => {
            let mut w = Writer::new(control::STATUS);
            wormhole_server::admin::encode_remove(&mut w, &name);
            print_json(&ask(&socket_or_default(socket), w)?);
            Ok(())
        }
        Cmd::Bench { part } => Ok(bench::run(&icd_library()?, part)?),
        Cmd::GenCert { dir, name } => {
            let cert = rcgen::generate_simple_self_signed(name)
                .map_err(|e| CliError::Answer(format!("cannot generate a certificate: {e}")))?;
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("cert.pem"), cert.cert.pem())?;
            std::fs::write(dir.join("key.pem"), cert.key_pair.serialize_pem())?;
            println!("wrote {0}/cert.pem and {0}/key.pem (self-signed; clients trust it with WORMHOLE_CA={0}/cert.pem)", dir.display());
            Ok(())
        }
    }
}

/// Where `libwormhole_opencl.so` is: $WORMHOLE_ICD_LIB, or next to this binary.
fn icd_library() -> Result<PathBuf, CliError> {
    if let Some(p) = std::env::var_os("WORMHOLE_ICD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for candidate in [
        dir.join("libwormhole_opencl.so"),
        dir.join("../lib/libwormhole_opencl.so"),
    ] {
        if candidate.exists() {
            return Ok(candidate.canonicalize()?);
        }
    }
    Err(CliError::NoIcd(dir.join("libwormhole_opencl.so")))
}

/// A library of Wormhole's that stands in for a vendor's, found on the library path by the
/// programs `wh run` starts (and by what they `dlopen`).
struct StandIn {
    /// The names it is found by. Beside the soname, the unversioned name a driver's
    /// development files add: `dlopen("libcuda.so")` (Numba tries it first) and a linker's
    /// `-lcuda` (Triton builds its kernel launcher with it when a program runs) would
    /// otherwise find the vendor's library where one is installed, or nothing where none is.
    names: &'static [&'static str],
    /// The variable that may name Wormhole's library.
    var: &'static str,
    /// Its file name next to `wh`.
    file: &'static str,
    /// A variable that tells programs which directory holds it: Triton looks there before it
    /// asks ldconfig, which names the vendor's where one is installed.
    dir_var: Option<&'static str>,
}

const STAND_INS: &[StandIn] = &[
    StandIn {
        names: &["libcuda.so.1", "libcuda.so"],
        var: "WORMHOLE_CUDA_LIB",
        file: "libwormhole_cuda.so",
        dir_var: Some("TRITON_LIBCUDA_PATH"),
    },
    StandIn {
        names: &["libnvidia-ml.so.1", "libnvidia-ml.so"],
        var: "WORMHOLE_NVML_LIB",
        file: "libwormhole_nvml.so",
        dir_var: None,
    },
];

/// Where a stand-in library is: the variable's path, or the file next to this binary (or in
/// ../lib); None if it was not built (that API is not forwarded then).
fn stand_in_library(var: &str, file: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(file), dir.join("../lib").join(file)]
        .into_iter()
        .find(|c| c.exists())
        .and_then(|c| c.canonicalize().ok())
}

fn run_program(socket: Option<PathBuf>, program: Vec<String>) -> Result<(), CliError> {
    let lib = icd_library()?;
    // A vendor directory holding only Wormhole, so the application sees forwarded platforms only.
    // One directory per user and library, rewritten each time (no leftovers per run).
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    // The stand-ins found, in the tag too: runs with other libraries get a directory of
    // their own, not links flipped under each other.
    let stand_ins: Vec<(&StandIn, PathBuf)> = STAND_INS
        .iter()
        .filter_map(|s| Some((s, stand_in_library(s.var, s.file)?)))
        .collect();
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        lib.hash(&mut h);
        for (_, path) in &stand_ins {
            path.hash(&mut h);
        }
        h.finish()
    };
    let dir = std::env::temp_dir().join(format!("wormhole-icd-{uid}-{tag:016x}"));
    private_dir(&dir, uid)?;
    // Programs started at the same moment share the file: replace it atomically (a loader
    // reading it half-written would find no platform), and only when it differs.
    let icd = dir.join("wormhole.icd");
    let line = format!("{}\n", lib.display());
    if std::fs::read_to_string(&icd).ok().as_deref() != Some(line.as_str()) {
        let tmp = dir.join(format!("wormhole.icd.{}", std::process::id()));
        std::fs::write(&tmp, &line)?;
        std::fs::rename(&tmp, &icd)?;
    }
    let mut cmd = std::process::Command::new(&program[0]);
    cmd.args(&program[1..])
        .env("OCL_ICD_VENDORS", &dir)
        .env("OPENCL_VENDOR_PATH", &dir);
    // ICDs named by file are loaded beside the vendor directory's: a native one there (how
    // the GPU machine reaches NVIDIA's OpenCL) would let the program bypass the server.
    if std::env::var_os("OCL_ICD_FILENAMES").is_some() {
        eprintln!("wh run: OCL_ICD_FILENAMES is not passed on: the program sees Wormhole's platforms only");
        cmd.env_remove("OCL_ICD_FILENAMES");
    }
    // CUDA programs (and cudart's dlopen), and NVML's users, find those libraries by their
    // sonames on the library path: the same directory holds links to Wormhole's.
    let linked = !stand_ins.is_empty();
    for (stand_in, ours) in &stand_ins {
        for name in stand_in.names {
            link_in(&dir, name, ours, std::process::id())?;
        }
        if let Some(var) = stand_in.dir_var {
            if std::env::var_os(var).is_some_and(|p| p != dir.as_os_str()) {
                eprintln!(
                    "wh run: {var} is not passed on: the program finds Wormhole's library there"
                );
            }
            cmd.env(var, &dir);
        }
    }
    if stand_ins.iter().any(|(s, _)| s.dir_var.is_some())
        && std::env::var_os("TRITON_CACHE_DIR").is_none()
    {
        // What Triton builds here links Wormhole's directory (its run path): kept apart from
        // what it builds for native runs, which share no key with these.
        if let Some(cache) = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        {
            cmd.env("TRITON_CACHE_DIR", cache.join("wormhole").join("triton"));
        }
    }
    if linked {
        let mut path = std::ffi::OsString::from(&dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", path);
    }
    if let Some(s) = socket {
        cmd.env("WORMHOLE_SOCKET", s);
    }
    let err = cmd.exec();
    Err(CliError::Exec {
        program: program[0].clone(),
        source: err,
    })
}

/// Points `dir/name` at `target` unless it already does, atomically (programs started at the
/// same moment read the directory). The temporary name is one no link has: as a container's
/// first process `wh` has pid 1, and `libcuda.so.{pid}` would be the soname's own link.
fn link_in(dir: &Path, name: &str, target: &Path, pid: u32) -> std::io::Result<()> {
    let link = dir.join(name);
    if std::fs::read_link(&link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    let tmp = dir.join(format!(".{name}.{pid}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, &link)
}

/// Makes `dir` (mode 0700) or checks the one there: its name is predictable in a shared
/// temporary directory, and another user who made it first, or may write it, could hand the
/// program their own library as the ICD.
fn private_dir(dir: &std::path::Path, uid: u32) -> Result<(), CliError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    // Not followed if it is a link: a link is not our directory.
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(CliError::UnsafeIcdDir {
            dir: dir.to_path_buf(),
            uid,
        });
    }
    Ok(())
}

fn status(path: PathBuf) -> Result<(), CliError> {
    let mut w = Writer::new(control::STATUS);
    w.u8(wormhole_server::admin::STATUS);
    print_json(&ask(&path, w)?);
    Ok(())
}

/// Sends the supervisor one control request and returns its JSON answer (the bytes as they
/// came if they are not JSON).
fn ask(path: &std::path::Path, request: Writer) -> Result<Vec<u8>, CliError> {
    let sock = UnixStream::connect(path).map_err(|source| CliError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    std::io::Write::write_all(
        &mut &sock,
        &request.finish(0, 0).map_err(std::io::Error::from)?,
    )?;
    let mut body = Vec::new();
    let h = wormhole_transport::link::read_frame(&mut &sock, &mut body)
        .map_err(|e| CliError::Answer(e.to_string()))?;
    let text = Reader::new(&body)
        .bytes()
        .map_err(|e| CliError::Answer(e.to_string()))?;
    match h.opcode {
        control::STATUS => Ok(text.to_vec()),
        control::REFUSED => Err(CliError::Refused(
            String::from_utf8_lossy(text).into_owned(),
        )),
        other => Err(CliError::Answer(format!("opcode {other:#06x}"))),
    }
}

/// Writes a token to a new file only its owner may read (an existing file is replaced, never
/// written through: it could be a link planted elsewhere).
fn write_secret(path: &std::path::Path, secret: &str) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    std::io::Write::write_all(&mut f, format!("{secret}\n").as_bytes())?;
    Ok(())
}

/// Indented for people; still JSON for scripts.
fn print_json(json: &[u8]) {
    match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(_) => println!("{}", String::from_utf8_lossy(json)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As a container's first process (pid 1) too, every name ends up linked: the temporary
    /// link of `libcuda.so` was once named `libcuda.so.1`, and replaced the soname's link.
    #[test]
    fn every_name_is_linked_whatever_the_pid() {
        for pid in [1, 2, 12345] {
            let dir =
                std::env::temp_dir().join(format!("wh-link-test-{}-{pid}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let target = Path::new("/nonexistent/libwormhole_cuda.so");
            for name in [
                "libcuda.so.1",
                "libcuda.so",
                "libnvidia-ml.so.1",
                "libnvidia-ml.so",
            ] {
                link_in(&dir, name, target, pid).unwrap();
            }
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(
                names,
                [
                    "libcuda.so",
                    "libcuda.so.1",
                    "libnvidia-ml.so",
                    "libnvidia-ml.so.1"
                ],
                "pid {pid}"
            );
            for name in &names {
                assert_eq!(std::fs::read_link(dir.join(name)).unwrap(), target);
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
