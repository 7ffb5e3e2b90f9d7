//! An NVML session's state in its worker: the devices the tenant was given (the only ones it
//! may name), and its limits.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use wormhole_nvml_proto::{HandleKind, Writer};
use wormhole_server::handles::HandleTable;
use wormhole_server::worker::Limits;

pub type Handle = *mut c_void;

#[derive(Default)]
pub struct Session {
    handles: HandleTable<HandleKind>,
    limits: OnceLock<Arc<Limits>>,
    /// NVML's devices the tenant may use (see `custom::visible_devices`), as addresses.
    pub visible: OnceLock<Vec<usize>>,
}

/// One request being handled (what the generated dispatch passes the handlers).
pub struct Call<'a>(pub &'a Session);

impl std::ops::Deref for Call<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        self.0
    }
}

impl Session {
    pub fn set_limits(&self, limits: Arc<Limits>) {
        let _ = self.limits.set(limits);
    }

    pub fn limits(&self) -> &Limits {
        self.limits.get_or_init(|| Arc::new(Limits::default()))
    }

    /// The real device behind `id`: only one this session was given.
    pub fn resolve(&self, id: u64, kind: HandleKind, _nullable: bool) -> Result<Handle, i32> {
        self.handles
            .get(id, kind)
            .map(|p| p as Handle)
            .ok_or(kind.invalid_code())
    }

    /// Devices NVML returned, under the ids the client knows them by (new ones given a
    /// server id).
    pub fn export_list(&self, w: &mut Writer, kind: HandleKind, ptrs: &[Handle]) {
        self.handles.write_exported(w, kind, ptrs);
    }

    /// Devices known, for status reports.
    pub fn object_counts(&self) -> Vec<(HandleKind, usize)> {
        self.handles.counts().into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant names only the devices it was given: a made-up id, or a device's id under
    /// the wrong kind, is NVML's bad-argument status.
    #[test]
    fn only_devices_given_resolve() {
        let s = Session::default();
        let mut w = Writer::new(0);
        s.export_list(&mut w, HandleKind::Device, &[0x7000 as Handle]);
        // The same device is exported under the same id.
        let id = s.handles.export(HandleKind::Device, 0x7000);
        assert_eq!(
            s.resolve(id, HandleKind::Device, false),
            Ok(0x7000 as Handle)
        );
        assert_eq!(
            s.resolve(id ^ 1, HandleKind::Device, false),
            Err(wormhole_nvml_proto::nv::NVML_ERROR_INVALID_ARGUMENT)
        );
    }
}
