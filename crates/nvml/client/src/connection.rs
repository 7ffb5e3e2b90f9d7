//! The library's one session with the server, opened by the first `nvmlInit` through the
//! session machinery every API shares (`wormhole-session`).

pub use wormhole_session::{log, CallError, Connection, OnceConnection};

/// What the session needs to know of NVML.
const NVML: wormhole_session::ApiHooks = wormhole_session::ApiHooks {
    api: wormhole_nvml_proto::API,
    // NVML's queries read state; none waits for the device's work.
    waits_for_device: |_| false,
    deliver_callback,
    when_gone: "further NVML calls fail with NVML_ERROR_GPU_IS_LOST",
};

/// No NVML entry point registers a callback: a CALLBACK frame is the server's mistake.
fn deliver_callback(body: &[u8]) {
    log(&format!(
        "ignoring a callback of {} bytes from the server: this client registered none",
        body.len()
    ));
}

/// The session, connecting on first use; Err says why there is none (logged once).
pub fn get() -> Result<&'static Connection, &'static str> {
    static CONNECTION: OnceConnection = OnceConnection::new();
    CONNECTION.get(NVML, "no NVIDIA driver")
}
