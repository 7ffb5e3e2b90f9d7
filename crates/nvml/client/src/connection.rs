//! The library's one session with the server, opened by the first `nvmlInit` through the
//! session machinery every API shares (`wormhole-session`).

use std::sync::OnceLock;
pub use wormhole_session::{log, CallError, Connection};

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
    static CONNECTION: OnceLock<Result<Connection, String>> = OnceLock::new();
    CONNECTION
        .get_or_init(|| {
            Connection::open(NVML).map_err(|e| {
                let why = e.to_string();
                log(&format!("no NVIDIA driver: {why}"));
                why
            })
        })
        .as_ref()
        .map_err(String::as_str)
}
