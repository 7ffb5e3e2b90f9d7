//! How many calls the client carried, per entry point, waited for (a round trip) and not
//! (pipelined): what tells how much of a framework's step pays a round trip. With
//! `WORMHOLE_CALL_COUNTS=1` the client counts and, when the program exits, writes the counts
//! to stderr, beginning with one line a script can read:
//! `wormhole call counts (API): waited=N pipelined=M` (each API's client library counts its
//! own: a CUDA program that loads NVML prints two such reports).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// Names an opcode of the API a session carries (None: not one of its entry points).
pub type OpName = fn(u16) -> Option<&'static str>;

/// Entry point → [waited, pipelined].
type Counts = Mutex<BTreeMap<Cow<'static, str>, [u64; 2]>>;

static COUNTS: OnceLock<Option<Counts>> = OnceLock::new();
/// The API this library carries (the first counted call's).
static API: OnceLock<&'static str> = OnceLock::new();

/// Whether counting is on (`WORMHOLE_CALL_COUNTS=1`, read once).
fn counts() -> Option<&'static Counts> {
    COUNTS
        .get_or_init(|| {
            let on = std::env::var("WORMHOLE_CALL_COUNTS").is_ok_and(|v| v == "1");
            if !on {
                return None;
            }
            // SAFETY: registers a function of ours with no arguments, run at exit.
            unsafe { libc::atexit(report) };
            Some(Mutex::new(BTreeMap::new()))
        })
        .as_ref()
}

/// Counts one call of `opcode` of the API that `name` names (nothing unless counting is on).
pub fn count(api: &'static str, name: OpName, opcode: u16, waited: bool) {
    if let Some(c) = counts() {
        let _ = API.set(api);
        let key = label(api, name, opcode);
        let mut by_op = c.lock().unwrap_or_else(|p| p.into_inner());
        by_op.entry(key).or_default()[usize::from(!waited)] += 1;
    }
}

/// What the report (and the trace) calls `opcode`: its entry point, or its number.
pub(crate) fn label(api: &str, name: OpName, opcode: u16) -> Cow<'static, str> {
    match name(opcode) {
        Some(n) => Cow::Borrowed(n),
        None => Cow::Owned(format!("{api} request {opcode:#06x}")),
    }
}

/// The report: totals, then each entry point, most called first.
fn render(api: &str, c: &Counts) -> String {
    let by_op = c.lock().unwrap_or_else(|p| p.into_inner());
    let waited: u64 = by_op.values().map(|v| v[0]).sum();
    let pipelined: u64 = by_op.values().map(|v| v[1]).sum();
    let mut out = format!("wormhole call counts ({api}): waited={waited} pipelined={pipelined}\n");
    let mut ops: Vec<_> = by_op.iter().collect();
    ops.sort_by_key(|(_, v)| std::cmp::Reverse(v[0] + v[1]));
    for (name, v) in ops {
        out.push_str(&format!(
            "wormhole call counts:   {name} waited={} pipelined={}\n",
            v[0], v[1]
        ));
    }
    out
}

extern "C" fn report() {
    if let Some(Some(c)) = COUNTS.get() {
        use std::io::Write;
        let api = API.get().copied().unwrap_or("no calls");
        let _ = std::io::stderr().write_all(render(api, c).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_totals_and_names_each_entry_point() {
        let c: Counts = Mutex::new(BTreeMap::new());
        {
            let mut m = c.lock().unwrap();
            m.insert(Cow::Borrowed("cuStreamSynchronize"), [3, 0]);
            m.insert(Cow::Owned("cuda request 0xe003".into()), [1, 40]);
        }
        let r = render("cuda", &c);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(
            lines[0],
            "wormhole call counts (cuda): waited=4 pipelined=40"
        );
        assert_eq!(
            lines[1],
            "wormhole call counts:   cuda request 0xe003 waited=1 pipelined=40"
        );
        assert_eq!(
            lines[2],
            "wormhole call counts:   cuStreamSynchronize waited=3 pipelined=0"
        );
    }
}
