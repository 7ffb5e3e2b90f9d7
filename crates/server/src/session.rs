//! A session's state in its worker: the handle table and what outlives single calls.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use wormhole_protocol::{cl::*, HandleKind, Writer, SERVER_ID_BIT};

pub type Handle = *mut c_void;

/// Maps the session's handle ids to real objects. Ids are only meaningful inside one session:
/// another session's ids (or made-up ones) resolve to nothing.
#[derive(Default)]
struct HandleTable {
    by_id: HashMap<u64, (HandleKind, usize)>,
    by_ptr: HashMap<usize, u64>,
    next_server_id: u64,
}

/// A buffer the server reads into for a non-blocking read, kept until the client collects it.
pub struct PendingRead {
    pub data: Vec<u8>,
    pub event: Handle,
}

/// A region the server mapped on behalf of the client.
pub struct Mapping {
    pub mem: Handle,
    pub ptr: *mut c_void,
    pub len: usize,
}

#[derive(Default)]
pub struct Session {
    handles: Mutex<HandleTable>,
    pub pending_reads: Mutex<HashMap<u64, PendingRead>>,
    pub mappings: Mutex<HashMap<u64, Mapping>>,
    /// Shared virtual memory allocations of this session: start → length.
    pub svm: Mutex<std::collections::BTreeMap<usize, usize>>,
    /// Bytes of device memory held by live memory objects (tracked by destructor callbacks).
    pub mem_bytes: AtomicI64,
    pub calls: AtomicU64,
    /// Calls sent without waiting that failed anyway (see worker::handle).
    pub async_failures: AtomicU64,
    /// Programs whose build came from the program cache, by the real object the id names now
    /// (see custom/program.rs).
    pub cached_programs: Mutex<HashMap<usize, CachedProgram>>,
    /// Builds that may swap the object behind a program id take turns.
    pub build_lock: Mutex<()>,
}

/// A program the application created from source and whose build the program cache served:
/// its id now names a program created from the cached binary. The source program is kept (one
/// reference of the session's own) for what only it can answer, its source, and for a rebuild
/// with other options.
pub struct CachedProgram {
    pub source_program: Handle,
    /// The options of the build the binary came from, and that build's log.
    pub options: Vec<u8>,
    pub log: Vec<u8>,
}

// SAFETY: the raw pointers inside are OpenCL objects and host buffers owned by this session;
// OpenCL objects are thread-safe and the buffers are only touched under the mutexes above.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl Session {
    /// The real object behind `id`, if it is of `kind`. NULL (id 0) passes through so the real
    /// call reports exactly what native OpenCL reports for NULL.
    pub fn resolve(&self, id: u64, kind: HandleKind, _nullable: bool) -> Result<Handle, i32> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        match self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .get(&id)
        {
            Some((k, p)) if *k == kind => Ok(*p as Handle),
            _ => Err(kind.invalid_code()),
        }
    }

    /// Resolves a list; `count` must match what the client sent.
    pub fn resolve_list(
        &self,
        ids: Option<&[u64]>,
        count: usize,
        kind: HandleKind,
        code: i32,
    ) -> Result<Option<Vec<Handle>>, i32> {
        let Some(ids) = ids else { return Ok(None) };
        if ids.len() != count {
            return Err(CL_INVALID_VALUE);
        }
        let t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter()
            .map(|id| match t.by_id.get(id) {
                Some((k, p)) if *k == kind => Ok(*p as Handle),
                _ => Err(code),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A client-allocated id for a new object must be fresh and in the client's id space.
    pub fn check_new_id(&self, id: u64) -> Result<(), i32> {
        let t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if id == 0 || id & SERVER_ID_BIT != 0 || t.by_id.contains_key(&id) {
            tracing::warn!(id, "client offered an invalid id for a new object");
            return Err(CL_INVALID_VALUE);
        }
        if let Some(max) = crate::worker::limits().max_objects {
            if t.by_id.len() >= max {
                tracing::warn!(
                    max,
                    "object refused: the session holds its limit of objects"
                );
                return Err(CL_OUT_OF_HOST_MEMORY);
            }
        }
        Ok(())
    }

    pub fn bind(&self, id: u64, kind: HandleKind, ptr: Handle) {
        let mut t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        t.by_id.insert(id, (kind, ptr as usize));
        t.by_ptr.insert(ptr as usize, id);
    }

    /// Points an existing id at another real object of its kind.
    pub fn rebind(&self, id: u64, kind: HandleKind, ptr: Handle) {
        let mut t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, old)) = t.by_id.insert(id, (kind, ptr as usize)) {
            if t.by_ptr.get(&old) == Some(&id) {
                t.by_ptr.remove(&old);
            }
        }
        t.by_ptr.insert(ptr as usize, id);
    }

    /// The client dropped its last reference to `id`.
    pub fn forget(&self, id: u64) {
        let mut t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((kind, p)) = t.by_id.remove(&id) {
            if t.by_ptr.get(&p) == Some(&id) {
                t.by_ptr.remove(&p);
            }
            if kind == HandleKind::Program {
                drop(t);
                let cached = self
                    .cached_programs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&p);
                if let Some(c) = cached {
                    crate::custom::release_program(c.source_program);
                }
            }
        }
    }

    /// The id under which the client knows `ptr`, assigning a server id to objects the client
    /// has not seen yet (devices, objects returned by info queries).
    pub fn export(&self, kind: HandleKind, ptr: Handle) -> u64 {
        if ptr.is_null() {
            return 0;
        }
        let mut t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = t.by_ptr.get(&(ptr as usize)) {
            if t.by_id.get(id).map(|e| e.0) == Some(kind) {
                return *id;
            }
        }
        if t.next_server_id == 0 {
            // A random start: ids are meaningful only in this table, and not guessable.
            use std::hash::{BuildHasher, Hasher};
            t.next_server_id = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
                >> 4;
        }
        t.next_server_id += 1;
        let id = SERVER_ID_BIT | t.next_server_id;
        t.by_id.insert(id, (kind, ptr as usize));
        t.by_ptr.insert(ptr as usize, id);
        id
    }

    pub fn export_list(&self, w: &mut Writer, kind: HandleKind, ptrs: &[Handle]) {
        w.u32(ptrs.len() as u32);
        for p in ptrs {
            w.u64(self.export(kind, *p));
        }
    }

    /// Live objects per kind, for status reports.
    pub fn object_counts(&self) -> Vec<(HandleKind, usize)> {
        let t = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: HashMap<HandleKind, usize> = HashMap::new();
        for (k, _) in t.by_id.values() {
            *counts.entry(*k).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|(k, _)| *k as u8);
        v
    }

    /// Whether [ptr, ptr+len) lies inside one SVM allocation of this session. Kernels get SVM
    /// pointers as raw addresses, so nothing else may pass.
    pub fn svm_contains(&self, ptr: usize, len: usize) -> bool {
        let svm = self.svm.lock().unwrap_or_else(|p| p.into_inner());
        match svm.range(..=ptr).next_back() {
            Some((start, n)) => ptr.checked_add(len).is_some_and(|end| end <= start + n),
            None => false,
        }
    }

    pub fn mem_bytes(&self) -> i64 {
        self.mem_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_typed_and_session_local() {
        let s = Session::default();
        let fake = 0x1000 as Handle;
        s.check_new_id(5).unwrap();
        s.bind(5, HandleKind::Mem, fake);
        assert_eq!(s.resolve(5, HandleKind::Mem, false), Ok(fake));
        assert_eq!(
            s.resolve(5, HandleKind::Kernel, false),
            Err(CL_INVALID_KERNEL)
        );
        assert_eq!(
            s.resolve(6, HandleKind::Mem, false),
            Err(CL_INVALID_MEM_OBJECT)
        );
        assert_eq!(s.check_new_id(5), Err(CL_INVALID_VALUE));
        assert_eq!(s.check_new_id(SERVER_ID_BIT | 1), Err(CL_INVALID_VALUE));
        assert_eq!(s.export(HandleKind::Mem, fake), 5);
        let other = Session::default();
        assert_eq!(
            other.resolve(5, HandleKind::Mem, false),
            Err(CL_INVALID_MEM_OBJECT)
        );
        s.forget(5);
        assert_eq!(
            s.resolve(5, HandleKind::Mem, false),
            Err(CL_INVALID_MEM_OBJECT)
        );
        let dev = s.export(HandleKind::Device, 0x2000 as Handle);
        assert_ne!(dev & SERVER_ID_BIT, 0);
        assert_eq!(s.export(HandleKind::Device, 0x2000 as Handle), dev);
    }
}
