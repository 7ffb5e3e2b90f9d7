//! A CUDA session's state in its worker: the handle table, the device memory it allocated
//! (what device addresses from the wire may name), and its limits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use wormhole_blobcache::BlobCache;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::ParamLayout;
use wormhole_cuda_proto::{HandleKind, Writer, STREAM_LEGACY_ID, STREAM_PER_THREAD_ID};
use wormhole_server::handles::{HandleTable, NewIdError};
use wormhole_server::worker::Limits;

pub type Handle = *mut c_void;

/// Most bytes of JIT log buffers the session's link states and libraries may hold in the
/// worker.
pub const MAX_JIT_ARRAYS: usize = 64 << 20;

#[derive(Default)]
pub struct Session {
    handles: HandleTable<HandleKind>,
    /// Device memory the session allocated: start → length and the driver's context it was
    /// allocated in (its address; 0 if unknown), whose end frees it.
    allocations: Mutex<BTreeMap<u64, (u64, usize)>>,
    /// Module and library variables the session found (start → length and the module or
    /// library they belong to): it may name them while that is loaded, never free them, and
    /// they count against no quota.
    globals: Mutex<BTreeMap<u64, (u64, Parent)>>,
    /// The module, library or kernel each function and kernel came from (by id): once that is
    /// unloaded, they are no longer valid handles (the driver freed them).
    parents: Mutex<HashMap<u64, Parent>>,
    /// The nodes the session was told of, per graph (by id): forgotten with their graph.
    graph_nodes: Mutex<HashMap<u64, HashSet<u64>>>,
    /// Bytes of device memory the session holds.
    pub mem_bytes: AtomicI64,
    limits: OnceLock<Arc<Limits>>,
    /// Each function's parameters, by the id the client knows it by (launches are checked
    /// against them).
    layouts: Mutex<HashMap<u64, Arc<ParamLayout>>>,
    /// The server's store of build products: module images the tenant sent, by digest.
    cache: OnceLock<BlobCache>,
    /// The driver's devices the tenant may use (see `rt::visible_devices`).
    pub visible: OnceLock<Vec<i32>>,
    /// Failures of requests the client did not wait for, answered at the next synchronisation
    /// point (CUDA's are the context's: one key for the session).
    pub deferred: wormhole_server::deferred::DeferredErrors,
    /// The JIT options of each link state and library (by id): the driver may write their
    /// logs and slots until the object goes (they go with it, in `forget`).
    jit_arrays: Mutex<HashMap<u64, crate::jit::JitArrays>>,
    /// What the session reserved, created and mapped through virtual memory management.
    vmm: Mutex<crate::vmm::Vmm>,
    /// Held by a virtual memory call from its check to its record (see `vmm_op`).
    vmm_ops: Mutex<()>,
}

/// The object (id and kind) another belongs to.
pub type Parent = (u64, HandleKind);

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

    /// The real object behind `id` if it is of `kind`. 0 passes as NULL (the driver answers
    /// for NULL: for a stream, the default stream), the special streams as themselves.
    pub fn resolve(&self, id: u64, kind: HandleKind, _nullable: bool) -> Result<Handle, i32> {
        match (id, kind) {
            (0, _) => Ok(std::ptr::null_mut()),
            (STREAM_LEGACY_ID, HandleKind::Stream) => Ok(1 as Handle),
            (STREAM_PER_THREAD_ID, HandleKind::Stream) => Ok(2 as Handle),
            // A kernel stands in for a function (the driver takes either).
            (_, HandleKind::Function) => self
                .handles
                .get(id, kind)
                .or_else(|| self.handles.get(id, HandleKind::Kernel))
                .filter(|_| self.parent_loaded(id))
                .map(|p| p as Handle)
                .ok_or(kind.invalid_code()),
            (_, HandleKind::Kernel) => self
                .handles
                .get(id, kind)
                .filter(|_| self.parent_loaded(id))
                .map(|p| p as Handle)
                .ok_or(kind.invalid_code()),
            _ => self
                .handles
                .get(id, kind)
                .map(|p| p as Handle)
                .ok_or(kind.invalid_code()),
        }
    }

    fn new_id_error(&self, e: NewIdError) -> i32 {
        match e {
            NewIdError::Invalid => {
                tracing::warn!("client offered an invalid id for a new object");
                CUDA_ERROR_INVALID_VALUE
            }
            NewIdError::TooMany => {
                tracing::warn!(
                    max = self.limits().max_objects,
                    "object refused: the session holds its limit of objects"
                );
                CUDA_ERROR_OUT_OF_MEMORY
            }
        }
    }

    /// A client-chosen id for a new object must be fresh and in the client's id space.
    pub fn check_new_id(&self, id: u64) -> Result<(), i32> {
        if id == STREAM_LEGACY_ID || id == STREAM_PER_THREAD_ID {
            return Err(self.new_id_error(NewIdError::Invalid));
        }
        self.handles
            .check_new(id, self.limits().max_objects)
            .map_err(|e| self.new_id_error(e))
    }

    /// Binds a new object under the id the client chose (checked again under the lock).
    pub fn bind(&self, id: u64, kind: HandleKind, ptr: Handle) -> Result<(), i32> {
        self.check_new_id(id)?;
        self.handles
            .bind_new(id, kind, ptr as usize, self.limits().max_objects)
            .map_err(|e| self.new_id_error(e))
    }

    /// Keeps object `id`'s JIT options for its life (a link state's, a library's), unless the
    /// log buffers the session holds so would pass `MAX_JIT_ARRAYS` (a program could
    /// otherwise make the worker hold up to two mebibytes per object, for as many objects as
    /// it may have).
    /// On failure the arrays come back, for the caller to drop once the object is gone.
    pub fn keep_jit_arrays(
        &self,
        id: u64,
        jit: crate::jit::JitArrays,
    ) -> Result<(), (i32, crate::jit::JitArrays)> {
        let mut kept = self.jit_arrays.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = kept.values().map(|j| j.log_bytes()).sum();
        if held + jit.log_bytes() > MAX_JIT_ARRAYS {
            tracing::warn!("kept JIT logs would exceed {MAX_JIT_ARRAYS} bytes");
            return Err((CUDA_ERROR_OUT_OF_MEMORY, jit));
        }
        match kept.entry(id) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(jit);
                Ok(())
            }
            // The id was bound just now: never another object's arrays.
            std::collections::hash_map::Entry::Occupied(_) => Err((CUDA_ERROR_INVALID_VALUE, jit)),
        }
    }

    /// What the driver has left so far in object `id`'s kept JIT options.
    pub fn jit_outputs(&self, id: u64) -> Vec<wormhole_cuda_proto::jit::JitOut> {
        let kept = self.jit_arrays.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(&id).map(|j| j.outputs()).unwrap_or_default()
    }

    /// Held across a release (`HandleTable::counting`).
    pub fn counting(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.handles.counting()
    }

    /// The application released `id` once (`client_last`: the client counted it as the last
    /// reference; CUDA's destroys all are); the id is forgotten after the last one
    /// (`HandleTable::released`).
    pub fn released(&self, id: u64, client_last: bool) {
        if self.handles.released(id, client_last) {
            self.forget(id);
        }
    }

    /// The object behind `id` was destroyed, and with it what came from it (a module's or a
    /// library's functions and kernels, a kernel's functions): they leave the table, so a
    /// program that loads and unloads modules does not fill it.
    pub fn forget(&self, id: u64) {
        // Its kept JIT arrays before the id: once forgotten, the id may be bound anew.
        self.jit_arrays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let kind = self.handles.forget(id).map(|(kind, _)| kind);
        let children: Vec<u64> = {
            let mut parents = self.parents.lock().unwrap_or_else(|p| p.into_inner());
            parents.remove(&id);
            // Only modules, libraries and kernels have children: no search for the rest
            // (events and streams are destroyed often).
            match kind {
                Some(HandleKind::Module | HandleKind::Library | HandleKind::Kernel) => parents
                    .iter()
                    .filter(|(_, &(parent, _))| parent == id)
                    .map(|(&child, _)| child)
                    .collect(),
                _ => Vec::new(),
            }
        };
        for child in children {
            self.forget(child);
        }
        let nodes = self
            .graph_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        for node in nodes.into_iter().flatten() {
            self.handles.forget(node);
        }
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    pub fn set_layout(&self, function: u64, layout: ParamLayout) {
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(function, Arc::new(layout));
    }

    /// The parameters of the function the client knows as `function` (shared: every launch
    /// asks, and need not copy them).
    pub fn layout(&self, function: u64) -> Option<Arc<ParamLayout>> {
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&function)
            .cloned()
    }

    pub fn set_cache(&self, cache: BlobCache) {
        let _ = self.cache.set(cache);
    }

    /// Where the tenant's image with this digest is kept: images are the tenant's own bytes,
    /// so one tenant's are never offered to another (nor is it told whether another has one).
    fn image_key(&self, digest: &[u8; 32]) -> wormhole_blobcache::Key {
        wormhole_blobcache::key(b"cuda-module", &[self.limits().tenant.as_bytes(), digest])
    }

    /// Keeps a module image the tenant sent (its digest checked) for the tenant's next
    /// sessions.
    pub fn keep_image(&self, digest: &[u8; 32], image: &[u8]) {
        if let Some(c) = self.cache.get() {
            c.store(&self.image_key(digest), &[image]);
        }
    }

    /// The tenant's image with this digest, if the server kept it.
    pub fn kept_image(&self, digest: &[u8; 32]) -> Option<Vec<u8>> {
        let mut parts = self.cache.get()?.load(&self.image_key(digest))?;
        (parts.len() == 1).then(|| parts.remove(0))
    }

    /// The id under which the client knows an object the driver returned (a server id for
    /// one it has not seen).
    pub fn export(&self, kind: HandleKind, ptr: Handle) -> u64 {
        self.handles.export(kind, ptr as usize)
    }

    /// Objects the driver returned (a context made or found), under the ids the client knows
    /// them by, new ones given a server id.
    pub fn export_list(&self, w: &mut Writer, kind: HandleKind, ptrs: &[Handle]) {
        self.handles.write_exported(w, kind, ptrs);
    }

    /// Live objects per kind, for status reports.
    pub fn object_counts(&self) -> Vec<(HandleKind, usize)> {
        self.handles.counts().into_iter().collect()
    }

    /// Device memory the session allocated in context `ctx`, now owned at
    /// `[start, start + len)`. An entry still recorded at `start` (memory its context's end
    /// freed without the session hearing of it) is replaced: its bytes are no longer counted,
    /// and go back to the tenant's quota.
    pub fn allocated(&self, start: u64, len: u64, ctx: Handle) {
        let old = self
            .allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(start, (len, ctx as usize));
        let old = old.map_or(0, |(l, _)| l);
        if old > 0 {
            self.limits().release(old);
        }
        self.mem_bytes
            .fetch_add(len as i64 - old as i64, Ordering::Relaxed);
    }

    /// The allocation that starts at `start`, removed; its length and context.
    pub fn freed(&self, start: u64) -> Option<(u64, Handle)> {
        let (len, ctx) = self
            .allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&start)?;
        self.mem_bytes.fetch_sub(len as i64, Ordering::Relaxed);
        Some((len, ctx as Handle))
    }

    /// Context `ctx` ended (destroyed, or a primary context reset or released for the last
    /// time): the driver freed every allocation made in it. They are forgotten, and their
    /// bytes returned (the caller gives them back to the quota).
    pub fn context_ended(&self, ctx: Handle) -> u64 {
        let mut a = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes = 0u64;
        a.retain(|_, &mut (len, c)| {
            let gone = c == ctx as usize;
            if gone {
                bytes += len;
            }
            !gone
        });
        drop(a);
        self.mem_bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
        bytes
    }

    /// Graph node `node` (an id the session exported) belongs to graph `graph`.
    pub fn graph_node(&self, graph: u64, node: u64) {
        self.graph_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(graph)
            .or_default()
            .insert(node);
    }

    /// Function or kernel `child` came from `parent`.
    pub fn set_parent(&self, child: u64, parent: Parent) {
        self.parents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(child, parent);
    }

    /// Whether what `id` came from (and what that came from) is still loaded.
    fn parent_loaded(&self, id: u64) -> bool {
        let parents = self.parents.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = id;
        // Function → kernel → library at most.
        for _ in 0..3 {
            match parents.get(&at) {
                None => return true,
                Some(&(parent, kind)) => {
                    if self.handles.get(parent, kind).is_none() {
                        return false;
                    }
                    at = parent;
                }
            }
        }
        true
    }

    /// A variable of `parent` (a module or library of the session's), at
    /// `[start, start + len)`.
    pub fn global(&self, start: u64, len: u64, parent: Parent) {
        if len > 0 {
            self.globals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(start, (len, parent));
        }
    }

    pub fn vmm(&self) -> std::sync::MutexGuard<'_, crate::vmm::Vmm> {
        self.vmm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One virtual memory call at a time, from its check through the driver's call to its
    /// record: a release between another lane's check and record of a map would see the
    /// handle unmapped and give its bytes back while the map keeps them. (The table itself
    /// is locked only briefly: every device range check reads it.)
    pub fn vmm_op(&self) -> std::sync::MutexGuard<'_, ()> {
        self.vmm_ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A physical allocation of `bytes` was created (its quota reserved already).
    pub fn vmm_created(&self, bytes: u64) {
        self.mem_bytes.fetch_add(bytes as i64, Ordering::Relaxed);
    }

    /// Physical allocations of `bytes` in all were freed: back to the tenant's quota.
    pub fn vmm_freed(&self, bytes: u64) {
        if bytes > 0 {
            self.limits().release(bytes);
            self.mem_bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
        }
    }

    /// Whether `[addr, addr + len)` lies in one of the session's allocations, variables or
    /// mappings.
    pub fn owns(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let allocated = {
            let a = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
            a.range(..=addr)
                .next_back()
                .is_some_and(|(start, (l, _))| end <= start.saturating_add(*l))
        };
        let mapped = !allocated && self.vmm().owns(addr, len);
        allocated || mapped || {
            let mut g = self.globals.lock().unwrap_or_else(|p| p.into_inner());
            match g.range(..=addr).next_back().map(|(s, v)| (*s, *v)) {
                Some((start, (l, (parent, kind)))) if end <= start.saturating_add(l) => {
                    // The driver may have reused the memory of an unloaded module.
                    let loaded = self.handles.get(parent, kind).is_some();
                    if !loaded {
                        g.remove(&start);
                    }
                    loaded
                }
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ranges_must_lie_in_one_allocation() {
        let s = Session::default();
        let ctx = 0xc000 as Handle;
        s.allocated(0x1000, 0x100, ctx);
        s.allocated(0x1100, 0x100, ctx);
        assert!(s.owns(0x1000, 0x100));
        assert!(s.owns(0x1080, 0x80));
        assert!(!s.owns(0x1080, 0x100), "spans two allocations");
        assert!(!s.owns(0xfff, 1));
        assert!(!s.owns(0x1200, 1));
        assert!(!s.owns(u64::MAX, 2));
        assert_eq!(s.freed(0x1000), Some((0x100, ctx)));
        assert!(!s.owns(0x1000, 1));
        assert_eq!(s.freed(0x1000), None);
        assert_eq!(s.mem_bytes.load(Ordering::Relaxed), 0x100);
        // A module's variable may be named while the module is loaded, never freed, and
        // holds no quota.
        s.bind(500, HandleKind::Module, 0x8000 as Handle).unwrap();
        s.global(0x9000, 0x40, (500, HandleKind::Module));
        assert!(s.owns(0x9000, 0x40));
        assert!(!s.owns(0x9000, 0x41));
        assert_eq!(s.freed(0x9000), None);
        assert_eq!(s.mem_bytes.load(Ordering::Relaxed), 0x100);
        s.forget(500);
        assert!(!s.owns(0x9000, 0x40), "the module was unloaded");
    }

    /// A context's end frees what was allocated in it, and nothing else.
    #[test]
    fn a_contexts_end_forgets_its_allocations() {
        let s = Session::default();
        let (one, two) = (0xc000 as Handle, 0xd000 as Handle);
        s.allocated(0x1000, 0x100, one);
        s.allocated(0x2000, 0x200, two);
        s.allocated(0x3000, 0x300, one);
        assert_eq!(s.context_ended(one), 0x400);
        assert!(!s.owns(0x1000, 1) && !s.owns(0x3000, 1));
        assert!(s.owns(0x2000, 0x200));
        assert_eq!(s.mem_bytes.load(Ordering::Relaxed), 0x200);
        // The driver gives an address again that the session still had recorded.
        s.allocated(0x2000, 0x80, one);
        assert_eq!(s.mem_bytes.load(Ordering::Relaxed), 0x80);
        assert_eq!(s.context_ended(two), 0);
    }

    #[test]
    fn special_streams_resolve_to_themselves_and_ids_are_typed() {
        let s = Session::default();
        assert_eq!(s.resolve(1, HandleKind::Stream, true), Ok(1 as Handle));
        assert_eq!(s.resolve(2, HandleKind::Stream, true), Ok(2 as Handle));
        assert_eq!(
            s.resolve(1, HandleKind::Event, false),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert!(s.check_new_id(STREAM_LEGACY_ID).is_err());
        s.bind(100, HandleKind::Event, 0x5000 as Handle).unwrap();
        assert_eq!(
            s.resolve(100, HandleKind::Event, false),
            Ok(0x5000 as Handle)
        );
        assert_eq!(
            s.resolve(100, HandleKind::Context, false),
            Err(CUDA_ERROR_INVALID_CONTEXT)
        );
        // A kernel stands in for a function, not the other way round; neither outlives its
        // library.
        s.bind(100_000, HandleKind::Library, 0x5500 as Handle)
            .unwrap();
        s.bind(101, HandleKind::Kernel, 0x6000 as Handle).unwrap();
        s.set_parent(101, (100_000, HandleKind::Library));
        s.bind(102, HandleKind::Function, 0x7000 as Handle).unwrap();
        s.set_parent(102, (101, HandleKind::Kernel));
        assert_eq!(
            s.resolve(102, HandleKind::Function, false),
            Ok(0x7000 as Handle)
        );
        assert_eq!(
            s.resolve(101, HandleKind::Function, false),
            Ok(0x6000 as Handle)
        );
        assert_eq!(
            s.resolve(102, HandleKind::Kernel, false),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        s.forget(100_000);
        assert_eq!(
            s.resolve(101, HandleKind::Kernel, false),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            s.resolve(102, HandleKind::Function, false),
            Err(CUDA_ERROR_INVALID_HANDLE),
            "a function of a kernel of an unloaded library"
        );
        // They left the table with it: loading and unloading does not fill it.
        let live = |kind| {
            s.object_counts()
                .into_iter()
                .find(|(k, _)| *k == kind)
                .map_or(0, |(_, n)| n)
        };
        assert_eq!(live(HandleKind::Kernel), 0);
        assert_eq!(live(HandleKind::Function), 0);
    }
}
