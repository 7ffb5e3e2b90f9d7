//! The CUDA part of `wh bench`: the driver API natively, through Wormhole over shared memory
//! and over TCP loopback, with the same client (bench/cuda_bench_client.c) in alternating
//! rounds: sync calls, tiny kernels, pipelined launches, allocation, pageable and pinned copies,
//! cuBLAS SGEMM (where the client finds cuBLAS), start-up. Needs NVIDIA's driver and a GPU;
//! without them it says so and measures nothing.

use super::{fmt, median_of, parse, BenchError, Cache, Figures, Server};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Native,
    Shm,
    Tcp,
}

const ROUNDS: usize = 3;

/// The client in `mode`: natively as it is, else under `wh run` against `server`.
fn command(client: &Path, mode: Mode, server: &Server, arg: &str) -> Result<Command, BenchError> {
    let mut c = match mode {
        Mode::Native => Command::new(client),
        _ => {
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["run", "--socket"])
                .arg(&server.socket)
                .arg("--")
                .arg(client);
            c
        }
    };
    c.arg(arg);
    match mode {
        Mode::Tcp => c.env("WORMHOLE_SERVER", format!("tcp://{}", server.tcp)),
        _ => c.env_remove("WORMHOLE_SERVER"),
    };
    Ok(c)
}

fn run_client(
    client: &Path,
    mode: Mode,
    server: &Server,
    arg: &str,
) -> Result<Figures, BenchError> {
    let out = command(client, mode, server, arg)?.output()?;
    if !out.status.success() {
        return Err(BenchError::Run {
            what: format!("CUDA bench client {arg}"),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

/// Process start → first kernel result, best of three, in ms.
fn time_start(client: &Path, mode: Mode, server: &Server) -> Result<f64, BenchError> {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        run_client(client, mode, server, "start")?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best * 1e3)
}

pub fn run(exe_dir: &Path) -> Result<(), BenchError> {
    let client = std::env::var_os("WORMHOLE_CUDA_BENCH_CLIENT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| exe_dir.join("wh-cuda-bench-client"));
    if !client.exists() {
        return Err(BenchError::NoClient(client));
    }
    let dir = std::env::temp_dir().join(format!("wormhole-cuda-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let server = Server::start(&dir, Cache::Warm)?;
    // Natively first: without a driver and a GPU there is nothing to compare with.
    if let Err(e) = run_client(&client, Mode::Native, &server, "start") {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(BenchError::Run {
            what: "the CUDA table (it needs NVIDIA's driver and a GPU)".into(),
            detail: format!("natively, {e}"),
        });
    }
    let modes = [Mode::Native, Mode::Shm, Mode::Tcp];
    eprintln!("wh bench: CUDA (native, shared memory, TCP), {ROUNDS} alternating rounds...");
    let mut rounds: Vec<Vec<Figures>> = vec![Vec::new(); modes.len()];
    for _ in 0..ROUNDS {
        for (i, m) in modes.iter().enumerate() {
            rounds[i].push(run_client(&client, *m, &server, "calls")?);
        }
    }
    let mut figs: Vec<Figures> = rounds.iter().map(|r| median_of(r)).collect();
    for (i, m) in modes.iter().enumerate() {
        figs[i].insert("start_ms".into(), time_start(&client, *m, &server)?);
    }
    let mut rows: Vec<(String, String)> = vec![
        (
            "sync_call_median_us".into(),
            "sync call (cuEventQuery, finished), median µs".into(),
        ),
        ("sync_call_p99_us".into(), "sync call, p99 µs".into()),
        (
            "tiny_kernel_median_us".into(),
            "tiny kernel + cuStreamSynchronize, median µs".into(),
        ),
        (
            "tiny_kernel_p99_us".into(),
            "tiny kernel + cuStreamSynchronize, p99 µs".into(),
        ),
        (
            "pipelined_launches_per_s".into(),
            "100k launches then sync, launches/s".into(),
        ),
        (
            "alloc_free_1MiB_median_us".into(),
            "cuMemAlloc + cuMemFree 1 MiB, median µs".into(),
        ),
    ];
    for kind in ["pageable", "pinned"] {
        for (kib, label) in [
            (4, "4 KiB"),
            (64, "64 KiB"),
            (1024, "1 MiB"),
            (16384, "16 MiB"),
            (262144, "256 MiB"),
        ] {
            for (dir, arrow) in [("htod", "host→device"), ("dtoh", "device→host")] {
                rows.push((
                    format!("{kind}_{dir}_{kib}KiB_GBps"),
                    format!("{kind} copy {arrow} {label}, GB/s"),
                ));
            }
        }
    }
    // What PyTorch's `.to()` of pageable memory does: a copy on a stream, then its sync.
    for (kib, label) in [(1024, "1 MiB"), (16384, "16 MiB")] {
        for (dir, arrow) in [("htod", "host→device"), ("dtoh", "device→host")] {
            rows.push((
                format!("pageable_async_{dir}_{kib}KiB_GBps"),
                format!("pageable async+sync {arrow} {label}, GB/s"),
            ));
        }
    }
    rows.push((
        "sgemm_4096_tflops".into(),
        "cuBLAS SGEMM 4096³, 20 on a stream, TFLOP/s".into(),
    ));
    rows.push((
        "start_ms".into(),
        "new process → first kernel result, ms".into(),
    ));
    rows.push(("client_cpu_s".into(), "client CPU s of the workload".into()));
    println!(
        "{:<52} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "measurement (CUDA)", "native", "wh-shm", "wh-tcp", "shm/nat", "tcp/nat"
    );
    for (key, label) in &rows {
        let v: Vec<f64> = figs
            .iter()
            .map(|f| f.get(key).copied().unwrap_or(f64::NAN))
            .collect();
        let ratio = |x: f64| match v[0] > 0.0 && !x.is_nan() {
            true => format!("{:.2}x", x / v[0]),
            false => "-".into(),
        };
        println!(
            "{:<52} {:>12} {:>12} {:>12} {:>9} {:>9}",
            label,
            fmt(v[0]),
            fmt(v[1]),
            fmt(v[2]),
            ratio(v[1]),
            ratio(v[2])
        );
    }
    println!(
        "(medians of {ROUNDS} alternating rounds; ratios are Wormhole / native; '-': not measured, e.g. pinned copies where cuMemAllocHost is refused, SGEMM where cuBLAS is not found)"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
