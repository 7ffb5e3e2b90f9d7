//! The ICD's one session with the server, opened on first use through the session machinery
//! every API shares (`wormhole-session`).

use std::sync::OnceLock;
use wormhole_opencl_proto::Op;
pub use wormhole_session::{log, CallError, Connection};

/// What the session needs to know of OpenCL.
const OPENCL: wormhole_session::ApiHooks = wormhole_session::ApiHooks {
    api: wormhole_opencl_proto::API,
    waits_for_device,
    deliver_callback: crate::rt::callbacks::deliver,
    when_gone: "further OpenCL calls fail with CL_OUT_OF_RESOURCES",
    op_name,
    // No per-thread driver state on the worker's side.
    lane_reused: None,
};

/// What an opcode stands for: an entry point, or one of the requests behind several.
fn op_name(opcode: u16) -> Option<&'static str> {
    use wormhole_opencl_proto::control;
    Op::from_u16(opcode).map(Op::name).or(match opcode {
        control::DIRECT => Some("direct transfer"),
        control::STAGE => Some("staged write piece"),
        control::COLLECT => Some("collected read piece"),
        control::SVM_PUSH => Some("SVM push"),
        control::SVM_PULL => Some("SVM pull"),
        _ => None,
    })
}

fn waits_for_device(opcode: u16) -> bool {
    opcode == Op::clFinish as u16 || opcode == Op::clWaitForEvents as u16
}

/// The session, connecting on first use. `None` when no server could be reached (logged once).
pub fn get() -> Option<&'static Connection> {
    static CONNECTION: OnceLock<Option<Connection>> = OnceLock::new();
    CONNECTION
        .get_or_init(|| match Connection::open(OPENCL) {
            Ok(c) => Some(c),
            Err(e) => {
                log(&format!("no OpenCL platforms: {e}"));
                None
            }
        })
        .as_ref()
}
