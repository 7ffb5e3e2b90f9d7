//! The PyTorch part of `wh bench`: bench/torch_train.py (an MLP and a small cuDNN CNN from
//! fixed seeds) natively and through Wormhole over shared memory, in alternating rounds:
//! training steps/s, whether the losses agree, and the synchronous round trips one step costs
//! through Wormhole (from the client's call counts: two runs that differ only in their steps).
//! Needs a GPU and PyTorch (`WORMHOLE_TORCH_PYTHON`, else `python3`); without them it says so.

use super::{fmt, BenchError, Cache, Server};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROUNDS: usize = 2;
const STEPS: u32 = 500;

fn python() -> String {
    std::env::var("WORMHOLE_TORCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The training script: `WORMHOLE_TORCH_TRAIN`, else the checkout's (beside `target/`), else
/// the working directory's `bench/torch_train.py`.
fn script(exe_dir: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("WORMHOLE_TORCH_TRAIN") {
        return p.into();
    }
    let beside = exe_dir.join("../../bench/torch_train.py");
    match beside.exists() {
        true => beside,
        false => PathBuf::from("bench/torch_train.py"),
    }
}

struct Run {
    stdout: String,
    stderr: String,
}

fn train(
    script: &Path,
    server: Option<&Server>,
    args: &[&str],
    counts: bool,
) -> Result<Run, BenchError> {
    let mut c = match server {
        None => Command::new(python()),
        Some(s) => {
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["run", "--socket"])
                .arg(&s.socket)
                .arg("--")
                .arg(python());
            c
        }
    };
    c.arg(script).args(args).env_remove("WORMHOLE_SERVER");
    if counts {
        c.env("WORMHOLE_CALL_COUNTS", "1");
    }
    let out = c.output()?;
    let run = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if !out.status.success() {
        return Err(BenchError::Run {
            what: format!(
                "{} training {}",
                if server.is_some() {
                    "Wormhole's"
                } else {
                    "native"
                },
                args.join(" ")
            ),
            detail: format!("{}{}", run.stdout, run.stderr),
        });
    }
    Ok(run)
}

/// Steps/s of `model` in a run's last line (JSON).
fn steps_per_s(run: &Run, model: &str) -> f64 {
    let last = run.stdout.lines().last().unwrap_or("");
    serde_json::from_str::<serde_json::Value>(last)
        .ok()
        .and_then(|v| v[model]["steps_per_s"].as_f64())
        .unwrap_or(f64::NAN)
}

/// The losses line of `model`.
fn losses<'a>(run: &'a Run, model: &str) -> Option<&'a str> {
    let prefix = format!("{model}: losses ");
    run.stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
}

fn waited(run: &Run) -> Option<f64> {
    let line = run
        .stderr
        .lines()
        .find(|l| l.starts_with("wormhole call counts (cuda): waited="))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("waited="))?
        .parse()
        .ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(exe_dir: &Path) -> Result<(), BenchError> {
    let script = script(exe_dir);
    if !script.exists() {
        return Err(BenchError::NoClient(script));
    }
    let steps = STEPS.to_string();
    let args = ["--steps", steps.as_str()];
    // Natively first: without a GPU and PyTorch there is nothing to compare with.
    let first = train(&script, None, &args, false).map_err(|e| BenchError::Run {
        what: "the PyTorch table (it needs a GPU and PyTorch)".into(),
        detail: format!("natively, {e}"),
    })?;
    let dir = std::env::temp_dir().join(format!("wormhole-torch-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let server = Server::start(&dir, Cache::Warm)?;
    eprintln!("wh bench: PyTorch training (native, shared memory), {ROUNDS} alternating rounds...");
    let mut native = vec![first];
    let mut ours = Vec::new();
    for round in 0..ROUNDS {
        if round > 0 {
            native.push(train(&script, None, &args, false)?);
        }
        ours.push(train(&script, Some(&server), &args, false)?);
    }
    let short = train(
        &script,
        Some(&server),
        &["--model", "mlp", "--steps", "100"],
        true,
    )?;
    let long = train(
        &script,
        Some(&server),
        &["--model", "mlp", "--steps", "300"],
        true,
    )?;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{:<52} {:>12} {:>12} {:>9}",
        "measurement (PyTorch)", "native", "wh-shm", "shm/nat"
    );
    for (model, label) in [
        ("mlp", "MLP 256→512→10, batch 64, steps/s"),
        ("cnn", "CNN (cuDNN), batch 64, steps/s"),
    ] {
        let n = median(
            &mut native
                .iter()
                .map(|r| steps_per_s(r, model))
                .collect::<Vec<_>>(),
        );
        let w = median(
            &mut ours
                .iter()
                .map(|r| steps_per_s(r, model))
                .collect::<Vec<_>>(),
        );
        println!(
            "{:<52} {:>12} {:>12} {:>8.2}x",
            label,
            fmt(n),
            fmt(w),
            w / n
        );
        let same = ours
            .iter()
            .all(|r| losses(r, model).is_some() && losses(r, model) == losses(&native[0], model));
        println!(
            "{:<52} {:>12} {:>12}",
            format!("{model} losses as native's"),
            "",
            if same { "same" } else { "DIFFERENT" }
        );
    }
    let per_step = match (waited(&short), waited(&long)) {
        (Some(a), Some(b)) => (b - a) / 200.0,
        _ => f64::NAN,
    };
    println!(
        "{:<52} {:>12} {:>12}",
        "MLP synchronous round trips per step",
        "",
        fmt(per_step)
    );
    println!("(medians of {ROUNDS} alternating rounds of {STEPS} steps after 20 warm-up steps; round trips from WORMHOLE_CALL_COUNTS, 300 steps minus 100)");
    Ok(())
}
