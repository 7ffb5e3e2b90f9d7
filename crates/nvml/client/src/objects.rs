//! The devices the program holds (`nvmlDevice_t`). Each is a heap struct tagged with a magic
//! word, one per device the server returned, kept for the life of the process (NVML's device
//! handles stay valid until the library is unloaded), so a bad or made-up handle becomes
//! NVML_ERROR_INVALID_ARGUMENT instead of a wild read, and the same device is always the same
//! handle.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};
use wormhole_nvml_proto::HandleKind;

const MAGIC: u32 = 0x574e_564d; // "WNVM"

#[repr(C)]
struct NvmlObject {
    magic: u32,
    kind: HandleKind,
    id: u64,
}

/// The objects by id, and the set of their addresses (what a handle from the program must be).
#[derive(Default)]
struct Registry {
    by_id: HashMap<u64, usize>,
    by_address: HashMap<usize, (HandleKind, u64)>,
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The id of `h` if it is an object of `kind` (never dereferenced: the registry knows it).
pub fn id_of(h: *mut c_void, kind: HandleKind) -> Option<u64> {
    match lock().by_address.get(&(h as usize)) {
        Some(&(k, id)) if k == kind => Some(id),
        _ => None,
    }
}

/// The program's object for `id`, made the first time the server returns it.
pub fn object_for_id(kind: HandleKind, id: u64) -> *mut c_void {
    if id == 0 {
        return std::ptr::null_mut();
    }
    let mut reg = lock();
    if let Some(&p) = reg.by_id.get(&id) {
        return p as *mut c_void;
    }
    // Never freed: handles stay valid for the life of the process, as NVML's do.
    let p = Box::into_raw(Box::new(NvmlObject {
        magic: MAGIC,
        kind,
        id,
    })) as usize;
    reg.by_id.insert(id, p);
    reg.by_address.insert(p, (kind, id));
    p as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_always_the_same_handle_and_made_up_handles_are_refused() {
        let a = object_for_id(HandleKind::Device, 0x8000_0000_0000_0001);
        assert_eq!(a, object_for_id(HandleKind::Device, 0x8000_0000_0000_0001));
        assert_ne!(a, object_for_id(HandleKind::Device, 0x8000_0000_0000_0002));
        assert_eq!(id_of(a, HandleKind::Device), Some(0x8000_0000_0000_0001));
        assert_eq!(id_of(0x1000 as *mut c_void, HandleKind::Device), None);
        assert_eq!(id_of(std::ptr::null_mut(), HandleKind::Device), None);
        assert!(object_for_id(HandleKind::Device, 0).is_null());
    }
}
