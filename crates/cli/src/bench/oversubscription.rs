//! The oversubscription part of `wh bench`: more tenants than cores. A light tenant (tiny
//! kernels + clFinish, 2 ms apart) shares the machine with N-1 other tenants, idle or
//! flooding the device with heavy kernels; native processes against the same processes
//! through Wormhole's shared memory, in alternating rounds. It reports the light tenant's
//! median and p99, and the kernels/s the flooding tenants get (fairness must not be bought
//! by idling the device).

use super::{client_command, parse, BenchError, Figures, Mode, Server};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Instant;

/// Tenants on the machine, the light one included.
const TENANTS: [usize; 3] = [1, 4, 16];
/// Alternating rounds per configuration; each figure is the median over rounds.
const ROUNDS: usize = 3;
/// How long each flooding tenant floods (the light tenant runs inside this window).
const FLOOD_SECONDS: f64 = 8.0;

/// One configuration: how many tenants, and whether the others flood or sit idle.
#[derive(Clone, Copy)]
struct Setup {
    tenants: usize,
    flooding: bool,
}

/// The figures of one run: the light tenant's median and p99 (µs), the others' kernels/s.
#[derive(Clone, Copy, Default)]
struct Outcome {
    median_us: f64,
    p99_us: f64,
    flood_kernels_per_s: f64,
}

/// Starts the other tenants and waits until each is ready (connected, context made).
fn start_others(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    s: Setup,
) -> Result<Vec<Child>, BenchError> {
    let mut others = Vec::new();
    for _ in 1..s.tenants {
        let mut c = client_command(
            client,
            mode,
            server,
            icd,
            if s.flooding { "flood" } else { "idle" },
        );
        c.env("WH_FLOOD_SECONDS", format!("{FLOOD_SECONDS}"))
            .env("WH_IDLE_SECONDS", "600")
            .stdout(Stdio::piped());
        others.push(c.spawn()?);
    }
    for o in &mut others {
        let mut line = String::new();
        BufReader::new(o.stdout.as_mut().expect("piped")).read_line(&mut line)?;
        if !line.ends_with("_ready 1\n") {
            return Err(BenchError::Run {
                what: "an oversubscribing tenant".into(),
                detail: format!("said {line:?} instead of being ready"),
            });
        }
    }
    Ok(others)
}

fn run_once(
    client: &Path,
    mode: Mode,
    server: &Server,
    icd: &Path,
    s: Setup,
) -> Result<Outcome, BenchError> {
    let mut others = start_others(client, mode, server, icd, s)?;
    let started = Instant::now();
    let light = client_command(client, mode, server, icd, "light").output()?;
    let mut launches = 0.0;
    for mut o in others.drain(..) {
        if s.flooding {
            let out = o.wait_with_output()?;
            launches += parse(&String::from_utf8_lossy(&out.stdout))
                .get("flood_launches")
                .copied()
                .unwrap_or(f64::NAN);
        } else {
            let _ = o.kill();
            let _ = o.wait();
        }
    }
    if !light.status.success() {
        return Err(BenchError::Run {
            what: "the light tenant".into(),
            detail: String::from_utf8_lossy(&light.stderr).into_owned(),
        });
    }
    if s.flooding && started.elapsed().as_secs_f64() > FLOOD_SECONDS * 1.5 {
        eprintln!("wh bench: note: the light tenant outlasted the floods' window");
    }
    let f = parse(&String::from_utf8_lossy(&light.stdout));
    Ok(Outcome {
        median_us: f.get("light_median_us").copied().unwrap_or(f64::NAN),
        p99_us: f.get("light_p99_us").copied().unwrap_or(f64::NAN),
        flood_kernels_per_s: if s.flooding {
            launches / FLOOD_SECONDS
        } else {
            f64::NAN
        },
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the part against `server` (shared memory) and prints its table; returns the figures
/// keyed `oversub_<tenants>_<idle|flooding>_<figure>` per mode (native, shm).
pub(super) fn run(client: &Path, server: &Server, icd: &Path) -> Result<[Figures; 2], BenchError> {
    let modes = [Mode::Native, Mode::Shm];
    let mut setups = Vec::new();
    for &tenants in &TENANTS {
        setups.push(Setup {
            tenants,
            flooding: false,
        });
        if tenants > 1 {
            setups.push(Setup {
                tenants,
                flooding: true,
            });
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!(
        "wh bench: oversubscription ({} tenants on {cores} CPUs, {ROUNDS} alternating rounds)...",
        TENANTS.map(|t| t.to_string()).join(", ")
    );
    let mut figs = [Figures::new(), Figures::new()];
    println!();
    println!(
        "{:<30} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "oversubscription",
        "med nat",
        "med shm",
        "ratio",
        "p99 nat",
        "p99 shm",
        "ratio",
        "flood/s n",
        "flood/s s",
        "ratio"
    );
    for s in setups {
        let mut runs: [Vec<Outcome>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            for (i, m) in modes.iter().enumerate() {
                runs[i].push(run_once(client, *m, server, icd, s)?);
            }
        }
        let pick = |i: usize, f: fn(&Outcome) -> f64| median(runs[i].iter().map(f).collect());
        let label = format!(
            "{} tenant{}{}",
            s.tenants,
            if s.tenants == 1 { "" } else { "s" },
            match (s.tenants, s.flooding) {
                (1, _) => ", light alone",
                (_, true) => ", others flooding",
                (_, false) => ", others idle",
            }
        );
        let key = format!(
            "oversub_{}_{}",
            s.tenants,
            if s.flooding { "flooding" } else { "idle" }
        );
        let mut row = Vec::new();
        for (name, f) in [
            (
                "median_us",
                (|o: &Outcome| o.median_us) as fn(&Outcome) -> f64,
            ),
            ("p99_us", |o: &Outcome| o.p99_us),
            ("flood_kernels_per_s", |o: &Outcome| o.flood_kernels_per_s),
        ] {
            let (n, w) = (pick(0, f), pick(1, f));
            figs[0].insert(format!("{key}_{name}"), n);
            figs[1].insert(format!("{key}_{name}"), w);
            row.push((n, w));
        }
        let cell = |v: f64| super::fmt(v);
        let ratio = |(n, w): (f64, f64)| {
            if n > 0.0 && w.is_finite() {
                format!("{:.2}x", w / n)
            } else {
                "-".into()
            }
        };
        println!(
            "{:<30} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
            label,
            cell(row[0].0),
            cell(row[0].1),
            ratio(row[0]),
            cell(row[1].0),
            cell(row[1].1),
            ratio(row[1]),
            cell(row[2].0),
            cell(row[2].1),
            ratio(row[2]),
        );
    }
    println!(
        "(light tenant: 300 tiny kernels + clFinish, 2 ms apart, µs; floods: heavy kernels for {FLOOD_SECONDS} s, kernels/s of all flooding tenants together; medians of {ROUNDS} alternating rounds)"
    );
    Ok(figs)
}
