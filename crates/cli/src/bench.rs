//! `wh bench`: measures native OpenCL, Wormhole over shared memory, Wormhole over TCP
//! loopback and Wormhole through a guest region (the ivshmem transport, mapped from the host)
//! side by side in one run, with the same client program (bench/bench_client.c), and prints one
//! table with absolute figures and ratios to native.

mod cuda;
mod oversubscription;
mod torch;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What keeps the drivers from reusing earlier builds: PoCL's kernel cache, NVIDIA's compute
/// cache (a "cold" start compiles every program).
const COLD_DRIVER_CACHES: &[(&str, &str)] =
    &[("POCL_KERNEL_CACHE", "0"), ("CUDA_CACHE_DISABLE", "1")];

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot find the benchmark client {0} (built by scripts/install.sh)")]
    NoClient(PathBuf),
    #[error("{what} failed: {detail}")]
    Run { what: String, detail: String },
    #[error("I/O error")]
    Io(#[from] std::io::Error),
}

type Figures = BTreeMap<String, f64>;

/// The parts of the bench `wh bench --part` picks.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Part {
    /// Every part.
    All,
    /// The call workload, transfers, start-up, idle and fairness table.
    Calls,
    /// The call workload and transfers alone, native against shared memory, 3 rounds: what
    /// one call of the GPU machine has time for (not part of `all`).
    Transfers,
    /// More tenants than cores: a light tenant among idle or flooding ones.
    Oversubscription,
    /// The CUDA table (needs NVIDIA's driver and a GPU; not part of `all`).
    Cuda,
    /// PyTorch training, native vs Wormhole (needs a GPU and PyTorch; not part of `all`).
    Torch,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Native,
    Shm,
    Tcp,
    /// The guest-region transport (what a VM guest uses through ivshmem), its file mapped by a
    /// host process: the polling waiter instead of the futex.
    Guest,
}

/// Whether a server may serve builds from caches (its own program cache, PoCL's kernel cache).
#[derive(Clone, Copy)]
enum Cache {
    Warm,
    Cold,
}

struct Server {
    child: Child,
    socket: PathBuf,
    tcp: String,
    region: PathBuf,
}

impl Server {
    fn start(dir: &Path, cache: Cache) -> Result<Server, BenchError> {
        Self::start_with(dir, cache, false)
    }

    fn start_with(dir: &Path, cache: Cache, guest: bool) -> Result<Server, BenchError> {
        let socket = dir.join("wh.sock");
        let region = dir.join("guest.region");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let tcp = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["serve", "--socket"])
            .arg(&socket)
            .args(["--tcp", &tcp])
            // The bench's own state: it makes no tenants, and must not take the user's.
            .arg("--state-dir")
            .arg(dir.join("state"))
            .stderr(Stdio::null());
        if guest {
            cmd.arg("--guest-region").arg(&region);
        }
        match cache {
            // The server's program cache in the bench's own directory (warmed by the runs).
            Cache::Warm => cmd.arg("--program-cache").arg(dir.join("programs")),
            // Every build compiles: neither Wormhole's cache nor the driver's (PoCL's, or
            // NVIDIA's compute cache).
            Cache::Cold => cmd
                .arg("--no-program-cache")
                .envs(COLD_DRIVER_CACHES.iter().copied()),
        };
        let child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err(BenchError::Run {
                    what: "wh serve".into(),
                    detail: "no socket after 10 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Server {
            child,
            socket,
            tcp,
            region,
        })
    }

    /// CPU seconds of the server and its reaped workers so far.
    fn cpu_seconds(&self) -> f64 {
        proc_cpu(self.child.id(), true)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime+stime (and, with `children`, the reaped children's) of a process, in seconds.
fn proc_cpu(pid: u32, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // rest[0] is field 3 (state); utime is field 14 → index 11.
    let ticks = f.get(11).copied().unwrap_or(0.0)
        + f.get(12).copied().unwrap_or(0.0)
        + if children {
            f.get(13).copied().unwrap_or(0.0) + f.get(14).copied().unwrap_or(0.0)
        } else {
            0.0
        };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

fn client_command(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd_dir: &Path,
    arg: &str,
) -> Command {
    let mut c = Command::new(client);
    c.arg(arg);
    if mode != Mode::Native {
        // Wormhole's platform only: a native ICD named by file (the GPU machine's NVIDIA one)
        // would be listed beside it, and a platform choice ($WH_PLATFORM) could take it.
        c.env_remove("OCL_ICD_FILENAMES")
            .env("OCL_ICD_VENDORS", icd_dir)
            .env("OPENCL_VENDOR_PATH", icd_dir)
            .env("WORMHOLE_SOCKET", &server.socket);
        match mode {
            Mode::Tcp => c.env("WORMHOLE_SERVER", format!("tcp://{}", server.tcp)),
            Mode::Guest => c.env(
                "WORMHOLE_SERVER",
                format!("ivshmem:{}", server.region.display()),
            ),
            _ => c.env_remove("WORMHOLE_SERVER"),
        };
    }
    c
}

fn parse(out: &str) -> Figures {
    out.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn run_calls(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
) -> Result<Figures, BenchError> {
    let cpu0 = server.cpu_seconds();
    let out = client_command(client, mode, server, icd, "calls").output()?;
    if !out.status.success() {
        return Err(BenchError::Run {
            what: "bench client".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut f = parse(&String::from_utf8_lossy(&out.stdout));
    // The worker's CPU reaches the supervisor's account once it is reaped.
    std::thread::sleep(Duration::from_millis(600));
    let server_cpu = if mode == Mode::Native {
        0.0
    } else {
        server.cpu_seconds() - cpu0
    };
    let client_cpu = f.get("client_cpu_s").copied().unwrap_or(0.0);
    f.insert("total_cpu_s".into(), client_cpu + server_cpu);
    Ok(f)
}

fn run_mode(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    arg: &str,
    env: &[(&str, &str)],
) -> Result<Figures, BenchError> {
    let mut c = client_command(client, mode, server, icd, arg);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output()?;
    if !out.status.success() {
        return Err(BenchError::Run {
            what: format!("bench client {arg}"),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

/// Runs `f` while another tenant (another process, another session) floods the device.
fn with_flood<T>(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    f: impl FnOnce() -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let mut flood = client_command(client, mode, server, icd, "flood")
        .env("WH_FLOOD_SECONDS", "30")
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(flood.stdout.take().expect("piped")).read_line(&mut line)?;
    let res = f();
    let _ = flood.kill();
    let _ = flood.wait();
    res
}

fn time_start(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    extra: &[(&str, &str)],
) -> Result<f64, BenchError> {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut c = client_command(client, mode, server, icd, "start");
        for (k, v) in extra {
            c.env(k, v);
        }
        let t = Instant::now();
        let out = c.output()?;
        let el = t.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(BenchError::Run {
                what: "cold start".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        best = best.min(el);
    }
    Ok(best * 1e3)
}

/// CPU use of the session's worker while its tenant sits idle for `secs`.
fn idle_cpu(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    secs: u64,
) -> Result<f64, BenchError> {
    // Earlier phases' sessions (the flooding tenant's, say) may still be draining: wait for a
    // half second in which no worker ran, so that what follows is this tenant's idle alone.
    let busy = || -> f64 {
        workers_of(server.child.id())
            .iter()
            .map(|p| proc_cpu(*p, false))
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let before = busy();
        std::thread::sleep(Duration::from_millis(500));
        if busy() - before < 0.005 || Instant::now() > deadline {
            break;
        }
    }
    let mut child = client_command(client, mode, server, icd, "idle")
        .env("WH_IDLE_SECONDS", (secs + 3).to_string())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    // The session took the standby worker; its successor starts 250 ms later and loads the
    // driver. Once it has, the whole server (supervisor, session, standby) is idle.
    std::thread::sleep(Duration::from_millis(1500));
    let mut pids = workers_of(server.child.id());
    pids.push(server.child.id());
    let before: f64 = pids.iter().map(|p| proc_cpu(*p, false)).sum();
    std::thread::sleep(Duration::from_secs(secs));
    let after: f64 = pids.iter().map(|p| proc_cpu(*p, false)).sum();
    let _ = child.wait();
    Ok((after - before) / secs as f64 * 100.0)
}

fn workers_of(parent: u32) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                v.push(pid);
            }
        }
    }
    v
}

pub fn run(icd_lib: &Path, part: Part) -> Result<(), BenchError> {
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    match part {
        Part::Cuda => return cuda::run(&exe_dir),
        Part::Torch => return torch::run(&exe_dir),
        _ => {}
    }
    let client = std::env::var_os("WORMHOLE_BENCH_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| exe_dir.join("wh-bench-client"));
    if !client.exists() {
        return Err(BenchError::NoClient(client));
    }
    let dir = std::env::temp_dir().join(format!("wormhole-bench-{}", std::process::id()));
    let icd = dir.join("icd");
    std::fs::create_dir_all(&icd)?;
    std::fs::write(icd.join("wormhole.icd"), format!("{}\n", icd_lib.display()))?;
    let plain = Server::start(&dir, Cache::Warm)?;
    if part == Part::Oversubscription {
        oversubscription::run(&client, &plain, &icd)?;
        drop(plain);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if part == Part::Transfers {
        eprintln!("wh bench: call-heavy workload and transfers (native, shared memory)...");
        let modes = [Mode::Native, Mode::Shm];
        let figs = call_rounds(&client, &modes, 3, &icd, |_| &plain)?;
        print_table(&modes, &figs, CALL_ROWS, "medians of 3 alternating rounds");
        drop(plain);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let cold_dir = dir.join("cold");
    std::fs::create_dir_all(&cold_dir)?;
    let cold_plain = Server::start(&cold_dir, Cache::Cold)?;
    // Guest regions get servers of their own: their idle worker must not count in the
    // shared-memory column's idle figure.
    let guest_dir = dir.join("guest");
    std::fs::create_dir_all(&guest_dir)?;
    let guest = Server::start_with(&guest_dir, Cache::Warm, true)?;
    let cold_guest_dir = dir.join("cold-guest");
    std::fs::create_dir_all(&cold_guest_dir)?;
    let cold_guest = Server::start_with(&cold_guest_dir, Cache::Cold, true)?;
    let server_for = |m: Mode| if m == Mode::Guest { &guest } else { &plain };
    let cold_server_for = |m: Mode| {
        if m == Mode::Guest {
            &cold_guest
        } else {
            &cold_plain
        }
    };

    let modes = [Mode::Native, Mode::Shm, Mode::Tcp, Mode::Guest];
    eprintln!("wh bench: call-heavy workload (native, shared memory, TCP, guest region)...");
    let mut figs = call_rounds(&client, &modes, ROUNDS, &icd, server_for)?;
    eprintln!("wh bench: start-up times...");
    for (i, m) in modes.iter().enumerate() {
        let warm = time_start(&client, *m, server_for(*m), &icd, &[])?;
        let cold = time_start(&client, *m, cold_server_for(*m), &icd, COLD_DRIVER_CACHES)?;
        figs[i].insert("start_warm_ms".into(), warm);
        figs[i].insert("start_cold_ms".into(), cold);
    }
    eprintln!("wh bench: one-off program builds...");
    let mut builds: Vec<Figures> = vec![Figures::new(); modes.len()];
    for round in 0..3 {
        for (i, m) in modes.iter().enumerate() {
            let f = run_mode(&client, *m, server_for(*m), &icd, "builds", &[])?;
            let secs = f.get("oneoff_builds_s").copied().unwrap_or(f64::NAN);
            builds[i].insert(format!("round {round}"), secs);
            if *m != Mode::Native {
                // A worker stores the session's new programs after its client has gone (for
                // at most 2 s): the next figure must not share the CPU with that.
                std::thread::sleep(Duration::from_millis(2500));
            }
        }
    }
    for (f, b) in figs.iter_mut().zip(&builds) {
        let mut v: Vec<f64> = b.values().copied().collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        f.insert("oneoff_builds_s".into(), v[v.len() / 2]);
    }
    eprintln!("wh bench: fairness (a light tenant while a heavy one floods the device)...");
    for (i, m) in modes.iter().enumerate().take(2) {
        let server = server_for(*m);
        let alone = run_mode(&client, *m, server, &icd, "light", &[])?;
        let flooded = with_flood(&client, *m, server, &icd, || {
            run_mode(&client, *m, server, &icd, "light", &[])
        })?;
        for (k, v) in [
            ("light_alone_p99_us", alone.get("light_p99_us")),
            ("light_flooded_p99_us", flooded.get("light_p99_us")),
            ("light_flooded_median_us", flooded.get("light_median_us")),
        ] {
            figs[i].insert(k.into(), v.copied().unwrap_or(f64::NAN));
        }
    }
    eprintln!("wh bench: idle server (5 s)...");
    for (i, m) in modes.iter().enumerate().skip(1) {
        figs[i].insert(
            "idle_server_cpu_pct".into(),
            idle_cpu(&client, *m, server_for(*m), &icd, 5)?,
        );
    }
    figs[0].insert("idle_server_cpu_pct".into(), 0.0);

    let rows: Vec<(&str, &str)> = CALL_ROWS.iter().chain(OTHER_ROWS).copied().collect();
    let rounds = format!("medians of {ROUNDS} alternating rounds for the call workload");
    print_table(&modes, &figs, &rows, &rounds);
    println!("(wh-guest: the ivshmem transport of VM guests, its region mapped by a host process; from a real guest see bench/vm_bench.py)");
    drop((cold_plain, guest, cold_guest));
    if part == Part::All {
        oversubscription::run(&client, &plain, &icd)?;
    }
    drop(plain);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Rounds of the call workload in the full table (each figure is their median).
const ROUNDS: usize = 5;

/// The call workload's figures (`run_calls`): key and label.
const CALL_ROWS: &[(&str, &str)] = &[
    (
        "roundtrip_median_us",
        "sync round trip (clGetEventInfo), median µs",
    ),
    ("roundtrip_p99_us", "sync round trip, p99 µs"),
    ("tiny_kernel_median_us", "tiny kernel + clFinish, median µs"),
    ("tiny_kernel_p99_us", "tiny kernel + clFinish, p99 µs"),
    (
        "pipelined_calls_per_s",
        "100k SetKernelArg+NDRange, calls/s (median of 5)",
    ),
    (
        "kernel_per_op_per_s",
        "kernel object per op (OpenCV: create, 2 args, launch, callback), ops/s",
    ),
    ("write_4KiB_GBps", "blocking write 4 KiB, GB/s"),
    ("read_4KiB_GBps", "blocking read 4 KiB, GB/s"),
    ("write_64KiB_GBps", "blocking write 64 KiB, GB/s"),
    ("read_64KiB_GBps", "blocking read 64 KiB, GB/s"),
    ("write_1024KiB_GBps", "blocking write 1 MiB, GB/s"),
    ("read_1024KiB_GBps", "blocking read 1 MiB, GB/s"),
    ("write_16384KiB_GBps", "blocking write 16 MiB, GB/s"),
    ("read_16384KiB_GBps", "blocking read 16 MiB, GB/s"),
    ("write_262144KiB_GBps", "blocking write 256 MiB, GB/s"),
    ("read_262144KiB_GBps", "blocking read 256 MiB, GB/s"),
    ("nbwrite_64KiB_GBps", "non-blocking writes 64 KiB, GB/s"),
    ("nbread_64KiB_GBps", "non-blocking reads 64 KiB, GB/s"),
    ("nbwrite_1024KiB_GBps", "non-blocking writes 1 MiB, GB/s"),
    ("nbread_1024KiB_GBps", "non-blocking reads 1 MiB, GB/s"),
    ("nbwrite_16384KiB_GBps", "non-blocking writes 16 MiB, GB/s"),
    ("nbread_16384KiB_GBps", "non-blocking reads 16 MiB, GB/s"),
    ("total_cpu_s", "CPU s of the workload (client + server)"),
];

/// The full table's other figures: start-up, builds, idle and fairness.
const OTHER_ROWS: &[(&str, &str)] = &[
    (
        "start_cold_ms",
        "new process → first result, cold program cache, ms",
    ),
    (
        "start_warm_ms",
        "new process → first result, warm program cache, ms",
    ),
    (
        "oneoff_builds_s",
        "10 one-off programs: build + first run, s (median of 3)",
    ),
    ("idle_server_cpu_pct", "server CPU with an idle tenant, %"),
    (
        "light_alone_p99_us",
        "light tenant tiny kernel p99 µs, alone",
    ),
    (
        "light_flooded_median_us",
        "light tenant median µs, heavy tenant flooding",
    ),
    (
        "light_flooded_p99_us",
        "light tenant p99 µs, heavy tenant flooding",
    ),
];

/// The call workload in `rounds` rounds that alternate the modes, so that drift on a shared
/// machine hits all columns alike: per mode, each figure's median over the rounds.
fn call_rounds<'a>(
    client: &Path,
    modes: &[Mode],
    rounds: usize,
    icd: &Path,
    server_for: impl Fn(Mode) -> &'a Server,
) -> Result<Vec<Figures>, BenchError> {
    let mut seen: Vec<Vec<Figures>> = vec![Vec::new(); modes.len()];
    for round in 0..rounds {
        for (i, m) in modes.iter().enumerate() {
            let started = Instant::now();
            seen[i].push(run_calls(client, *m, server_for(*m), icd)?);
            // Where a slow machine's time goes (a device call's output is all that comes back).
            eprintln!(
                "wh bench:   round {} of {rounds}, {m:?}: {:.1} s",
                round + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(seen.iter().map(|r| median_of(r)).collect())
}

/// The table: a row per figure (`rows`: key, label), a column per mode, then each Wormhole
/// mode's ratio to native (the first); under it what the figures are (`rounds`) and where
/// they were measured.
fn print_table(modes: &[Mode], figs: &[Figures], rows: &[(&str, &str)], rounds: &str) {
    let name = |m: &Mode| match m {
        Mode::Native => "native",
        Mode::Shm => "wh-shm",
        Mode::Tcp => "wh-tcp",
        Mode::Guest => "wh-guest",
    };
    let ratio_name = |m: &Mode| match m {
        Mode::Native => "",
        Mode::Shm => "shm/nat",
        Mode::Tcp => "tcp/nat",
        Mode::Guest => "guest/nat",
    };
    // As wide as the longest label (char count: the labels hold µ and →).
    let width = rows
        .iter()
        .map(|(_, l)| l.chars().count())
        .max()
        .unwrap_or(0)
        .max(52);
    let mut head = format!("{:<width$}", "measurement");
    for m in modes {
        head.push_str(&format!(" {:>12}", name(m)));
    }
    for m in &modes[1..] {
        head.push_str(&format!(" {:>9}", ratio_name(m)));
    }
    println!("{head}");
    for (key, label) in rows {
        let v: Vec<f64> = figs
            .iter()
            .map(|f| f.get(*key).copied().unwrap_or(f64::NAN))
            .collect();
        let mut line = format!("{label:<width$}");
        for x in &v {
            line.push_str(&format!(" {:>12}", fmt(*x)));
        }
        for x in &v[1..] {
            let r = match v[0] > 0.0 {
                true => format!("{:.2}x", x / v[0]),
                false => "-".into(),
            };
            line.push_str(&format!(" {r:>9}"));
        }
        println!("{line}");
    }
    println!(
        "({rounds}; ratios are Wormhole / native; machine: {} CPUs, {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model()
    );
}

/// Per key, the median over rounds.
fn median_of(rounds: &[Figures]) -> Figures {
    let mut out = Figures::new();
    for key in rounds[0].keys() {
        let mut v: Vec<f64> = rounds.iter().filter_map(|r| r.get(key).copied()).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        out.insert(key.clone(), v[v.len() / 2]);
    }
    out
}

fn fmt(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
