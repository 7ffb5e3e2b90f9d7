//! The session's callback channel, as a backend uses it: when the driver calls back (OpenCL's
//! notifications, CUDA's host functions), the worker sends a CALLBACK frame and the client
//! runs the program's function in its own process.

use crate::backend::CallbackSink;
use std::sync::OnceLock;
use wormhole_wire::Writer;

/// Where a session's callback frames go, once the session has begun.
pub struct CallbackChannel(OnceLock<CallbackSink>);

impl CallbackChannel {
    pub const fn new() -> CallbackChannel {
        CallbackChannel(OnceLock::new())
    }

    /// The session's sink (from `SessionSetup::callbacks`; once).
    pub fn connect(&self, sink: CallbackSink) {
        let _ = self.0.set(sink);
    }

    /// Sends one CALLBACK frame (`w` begun with `control::CALLBACK`). The device's output goes
    /// first: natively a kernel's output is written before what follows it runs.
    pub fn send(&self, w: Writer) {
        let frame = match w.finish(0, 0) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::warn!("callback not delivered: {e}");
                return;
            }
        };
        if let Some(s) = self.0.get() {
            crate::output::flush();
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = s.write_all(&frame) {
                tracing::debug!("callback not delivered, client gone: {e}");
            }
        }
    }
}

impl Default for CallbackChannel {
    fn default() -> Self {
        Self::new()
    }
}
