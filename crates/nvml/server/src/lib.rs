//! Wormhole's NVML backend: what a worker runs for an NVML session. It asks the system's real
//! `libnvidia-ml.so.1` (never Wormhole's own) about the devices, maps client handles to real
//! devices in the session's table, and answers each request through the generated decoders
//! and dispatch (`crates/apigen`), with hand-written handlers in `custom` for memory, which a
//! tenant sees through its quota. The server core (`wormhole-server`) does everything that is
//! not NVML's own.

mod custom;
mod driver;
mod rt;
mod session;

/// The generated decoders and dispatch (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_parens,
    unused_imports,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/server_gen.rs"));
}

use std::sync::OnceLock;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{DecodeError, FrameHeader, Op, Reader, Writer};
use wormhole_server::backend::{DeviceInventory, Reply, SessionSetup};

/// The worker's one NVML session.
fn session() -> &'static session::Session {
    static SESSION: OnceLock<session::Session> = OnceLock::new();
    SESSION.get_or_init(session::Session::default)
}

/// The NVML backend.
pub struct Nvml;

/// The NVML backend, for the server's list of APIs.
pub static NVML: Nvml = Nvml;

/// Runs one request against `s` (the whole body in `r`), writing the reply body.
pub fn run(
    s: &session::Session,
    opcode: u16,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<i32, DecodeError> {
    let op = Op::from_u16(opcode).ok_or(DecodeError::UnknownOp(opcode))?;
    generated::dispatch(&session::Call(s), op, r, w)?;
    // Every reply body begins with the call's nvmlReturn_t.
    Ok(w.status())
}

impl wormhole_server::Backend for Nvml {
    fn api(&self) -> &'static str {
        wormhole_nvml_proto::API
    }

    fn out_of_memory(&self) -> i32 {
        NVML_ERROR_MEMORY
    }

    fn installed(&self) -> Result<(), String> {
        // From files alone: the supervisor loads no driver.
        driver::LIBRARY.installed()
    }

    fn load(&self) -> Result<(), String> {
        driver::DRIVER.load().map_err(str::to_string)
    }

    fn warm_up(&self, _: &std::sync::Arc<wormhole_server::worker::Limits>, _: bool) {
        // An NVML that cannot be loaded is logged; the session that comes is refused.
        let _ = driver::DRIVER.load();
    }

    /// NVML manages the GPUs the CUDA backend offers: they are listed, and published to a
    /// cluster, once, under `cuda` (listing them here too would count each GPU twice).
    fn inventory(&self) -> Result<Vec<DeviceInventory>, String> {
        Ok(Vec::new())
    }

    fn begin(&self, setup: SessionSetup) {
        session().set_limits(setup.limits);
    }

    fn handle(
        &self,
        h: &FrameHeader,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<Reply, DecodeError> {
        let status = run(session(), h.opcode, r, w)?;
        Ok(Reply {
            status,
            trailer: None,
        })
    }

    fn objects(&self) -> std::collections::BTreeMap<String, usize> {
        session()
            .object_counts()
            .into_iter()
            .map(|(k, n)| (format!("{k:?}").to_lowercase(), n))
            .collect()
    }

    /// NVML sessions hold no device memory.
    fn mem_bytes(&self) -> i64 {
        0
    }
}

/// Fuzzing entry (fuzz/fuzz_targets/nvml_request.rs): a request as a worker receives it, its
/// first two bytes the opcode, the rest the body, against a fresh session: decoding,
/// validation and handle checks must turn any input into a status or a clean "malformed"
/// verdict, never a crash.
pub fn fuzz_request(data: &[u8]) {
    let Some((op, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let op = u16::from_le_bytes(*op);
    let s = session::Session::default();
    let mut w = Writer::new(op);
    let _ = run(&s, op, &mut Reader::new(body), &mut w);
}
