//! The library's one session with the server, opened by the first `nvmlInit` through the
//! session machinery every API shares (`wormhole-session`).

pub use wormhole_session::{log, CallError, Connection, OnceConnection};

/// What the session needs to know of NVML.
const NVML: wormhole_session::ApiHooks = wormhole_session::ApiHooks {
    api: wormhole_nvml_proto::API,
    // NVML's queries read state; none waits for the device's work.
    waits_for_device: |_| false,
    // NVML's forwarded entry points register no callbacks.
    deliver_callback: wormhole_session::no_callbacks,
    when_gone: "further NVML calls fail with NVML_ERROR_GPU_IS_LOST",
    op_name: |op| wormhole_nvml_proto::Op::from_u16(op).map(wormhole_nvml_proto::Op::name),
    // No per-thread driver state on the worker's side.
    lane_reused: None,
};

/// The session, connecting on first use; Err says why there is none (logged once).
pub fn get() -> Result<&'static Connection, &'static str> {
    static CONNECTION: OnceConnection = OnceConnection::new();
    CONNECTION.get(NVML, "no NVIDIA driver")
}
