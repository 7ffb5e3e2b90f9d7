//! A session's state in its worker: the handle table and what outlives single calls.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use wormhole_opencl_proto::requests::Stage;
use wormhole_opencl_proto::{cl::*, HandleKind, Writer};
use wormhole_server::handles::{HandleTable, NewIdError};
use wormhole_server::worker::Limits;

pub type Handle = *mut c_void;

/// A non-blocking read's bytes on the server (or a blocking one's too large for its reply),
/// kept until the client collects them once the event completes.
pub struct PendingRead {
    pub from: ReadFrom,
    /// The read's event; null: the read completed before its reply went (a blocking one).
    pub event: Handle,
    /// Bytes the client has collected already (the parts of a read larger than one reply).
    pub sent: usize,
    /// The staging buffer's count in the bytes of transfers in flight, if it is one.
    pub held: Option<InFlight>,
}

/// Bytes of the tenant's data that the worker keeps for a transfer in flight (a non-blocking
/// read's staging buffer until it is collected, a non-blocking write's bytes until the driver
/// has read them), counted in `Session::in_flight` until this is dropped.
pub struct InFlight {
    counter: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// The bytes of write data staged so far, all ids together.
fn staged_bytes(staged: &HashMap<u64, Staged>) -> u64 {
    staged.values().map(|e| e.bytes.len() as u64).sum()
}

/// Where a pending read's bytes are.
pub enum ReadFrom {
    /// A staging buffer the driver reads into (shared with the writes that take their bytes
    /// from it: `WriteData::FromRead`).
    Staging(Arc<Vec<u8>>),
    /// The driver's own mapping (a non-blocking map), read out when collected; the mapping's
    /// unmap drops the pending read first, so the range is mapped whenever it is read.
    Mapping { ptr: usize, len: usize },
    /// A range of the session's shared virtual memory (a non-blocking `clEnqueueSVMMap`), read
    /// out when collected if it is still allocated.
    Svm { ptr: usize, len: usize },
}

impl ReadFrom {
    /// The read's length.
    pub fn len(&self) -> usize {
        match self {
            ReadFrom::Staging(data) => data.len(),
            ReadFrom::Mapping { len, .. } | ReadFrom::Svm { len, .. } => *len,
        }
    }
}

/// A write's data arriving in pieces (STAGE), kept until the request that names it.
pub struct Staged {
    /// The data's announced length.
    pub total: u64,
    /// What has arrived.
    pub bytes: Vec<u8>,
}

/// A region the server mapped on behalf of the client.
pub struct Mapping {
    pub mem: Handle,
    pub ptr: *mut c_void,
    pub len: usize,
    /// What the mapping covers, so its bytes can be read again after the unmap.
    pub region: MapRegion,
}

/// The part of a memory object a mapping covers, and how its bytes lie in the mapping.
#[derive(Clone, Copy)]
pub enum MapRegion {
    Buffer {
        offset: usize,
    },
    Image {
        image_type: u32,
        origin: [usize; 3],
        region: [usize; 3],
        /// The mapping's row and slice pitch.
        pitches: [usize; 2],
    },
}

#[derive(Default)]
pub struct Session {
    handles: HandleTable<HandleKind>,
    pub pending_reads: Mutex<HashMap<u64, PendingRead>>,
    pub mappings: Mutex<HashMap<u64, Mapping>>,
    /// Data of writes too large for one frame, by the client's id, as its pieces arrive.
    pub staged: Mutex<HashMap<u64, Staged>>,
    /// Bytes the worker keeps for transfers in flight (see `InFlight`). With the staged data
    /// they are the tenant's memory in the worker, bounded by its quota (see `stage`).
    in_flight: Arc<AtomicU64>,
    /// Shared virtual memory allocations of this session: start → length.
    pub svm: Mutex<std::collections::BTreeMap<usize, usize>>,
    /// Bytes of device memory held by live memory objects (tracked by destructor callbacks).
    pub mem_bytes: AtomicI64,
    /// Programs whose build came from the program cache, by the real object the id names now
    /// (see custom/program.rs).
    pub cached_programs: Mutex<HashMap<usize, CachedProgram>>,
    /// What the session's tenant may use (from the worker; unlimited until then, as in tests).
    limits: std::sync::OnceLock<Arc<Limits>>,
    /// Failures of pipelined calls, until a synchronisation point reports them (by queue id).
    pub deferred: wormhole_server::deferred::DeferredErrors,
    /// Builds that may swap the object behind a program id take turns.
    pub build_lock: Mutex<()>,
    /// Where the next build of a program looks for headers, as the application's side said
    /// (INCLUDES), by program id (see `includes`).
    pub includes: Mutex<HashMap<u64, crate::includes::Sent>>,
    /// Programs whose build read its headers elsewhere than the application named, by the
    /// real object: what they answer as natively (see `includes`).
    pub build_paths: Mutex<HashMap<usize, crate::includes::BuildPaths>>,
    /// The tenant's limit of queued commands, per command queue (`max_queued`).
    pub admission: crate::admission::Admission,
    /// Enqueue requests so far (any queue): what `idle_queue` is as of.
    pub enqueues: std::sync::atomic::AtomicU64,
    /// A queue (id) seen with every command finished, and `enqueues` then: still idle while
    /// nothing was enqueued since (see `arena::direct`).
    pub idle_queue: Mutex<Option<(u64, u64)>>,
}

impl Session {
    /// Every command enqueued on `queue` by the time `enqueues` was read has finished: the
    /// queue is idle until the next enqueue (see `arena::direct`).
    pub fn queue_idle(&self, queue: u64, enqueues: u64) {
        *self.idle_queue.lock().unwrap_or_else(|p| p.into_inner()) = Some((queue, enqueues));
    }

    /// For an enqueue request being handled: whether `queue` was known idle before it, with
    /// nothing else enqueued since (the request counted itself first); Some(the count now).
    pub fn queue_idle_but_for_this(&self, queue: u64) -> Option<u64> {
        let enqueues = self.enqueues.load(std::sync::atomic::Ordering::Acquire);
        let idle = *self.idle_queue.lock().unwrap_or_else(|p| p.into_inner());
        (idle == Some((queue, enqueues.wrapping_sub(1)))).then_some(enqueues)
    }

    /// Whether `queue` is known idle (`queue_idle`, and nothing enqueued since).
    pub fn queue_known_idle(&self, queue: u64) -> bool {
        let enqueues = self.enqueues.load(std::sync::atomic::Ordering::Acquire);
        *self.idle_queue.lock().unwrap_or_else(|p| p.into_inner()) == Some((queue, enqueues))
    }

    /// `len` bytes from `offset` of what pending read `id` brings into its staging buffer, for
    /// a write that takes them from there (`WriteData::FromRead`): the buffer, shared, and
    /// where they start in it.
    pub fn staged_read(
        &self,
        id: u64,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Vec<u8>>, usize), i32> {
        let reads = self.pending_reads.lock().unwrap_or_else(|p| p.into_inner());
        let found = match reads.get(&id).map(|p| &p.from) {
            Some(ReadFrom::Staging(data))
                if offset
                    .checked_add(len)
                    .is_some_and(|end| end <= data.len() as u64) =>
            {
                Some((data.clone(), offset as usize))
            }
            _ => None,
        };
        found.ok_or_else(|| {
            tracing::warn!(
                read = id,
                "a write's bytes named a read that does not bring them"
            );
            CL_INVALID_VALUE
        })
    }

    /// Keeps a non-blocking read's bytes (or where they will be) until the client collects
    /// them under `id`.
    pub fn defer_read(&self, id: u64, from: ReadFrom, event: Handle) {
        self.defer_read_held(id, from, event, None);
    }

    /// `defer_read` of bytes counted in flight (`held`, given up with the read).
    pub fn defer_read_held(&self, id: u64, from: ReadFrom, event: Handle, held: Option<InFlight>) {
        self.pending_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                PendingRead {
                    from,
                    event,
                    sent: 0,
                    held,
                },
            );
    }

    /// Counts `bytes` more of the tenant's data kept in the worker for a transfer in flight,
    /// until the returned guard drops. Past the tenant's memory quota (with the staged data)
    /// CL_OUT_OF_HOST_MEMORY, as a driver that cannot allocate them answers, and a log line:
    /// natively these bytes are the application's own memory, here the worker's, and without
    /// a bound non-blocking transfers that wait (for a user event, say) could fill the host.
    /// The bound is the quota itself, as for staged data: the bytes come from or go to device
    /// memory whose size the quota bounds.
    pub fn hold_in_flight(&self, bytes: usize) -> Result<InFlight, i32> {
        let bytes = bytes as u64;
        let before = self.in_flight.fetch_add(bytes, Ordering::SeqCst);
        let held = InFlight {
            counter: self.in_flight.clone(),
            bytes,
        };
        if let Some(quota) = self.limits().mem_quota {
            let staged = staged_bytes(&self.staged.lock().unwrap_or_else(|p| p.into_inner()));
            if before.saturating_add(staged).saturating_add(bytes) > quota {
                tracing::warn!(
                    bytes,
                    in_flight = before,
                    staged,
                    quota,
                    "a non-blocking transfer refused (CL_OUT_OF_HOST_MEMORY): the worker would \
                     keep more of the tenant's data for transfers in flight than its memory quota"
                );
                return Err(CL_OUT_OF_HOST_MEMORY);
            }
        }
        Ok(held)
    }

    /// Keeps a piece of a write's data (see `requests::Stage`): the first piece starts it,
    /// each next one must follow the last. Anything else (a piece out of order, past the
    /// announced length or larger than a chunk) drops what the id holds. Memory grows with
    /// the bytes that arrive, never with the length a client announces, and is bounded by
    /// the tenant's memory quota (it is the tenant's memory in the worker: without a bound,
    /// staging alone could fill the host). The bound is the quota itself, not what is left of
    /// it: the data is bound for device memory the tenant holds already (or is about to),
    /// whose size the quota bounds. Past it the piece is CL_OUT_OF_HOST_MEMORY and what the
    /// id held is dropped.
    pub fn stage(&self, piece: &Stage, data: &[u8]) -> Result<(), i32> {
        let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        if piece.offset == 0 {
            staged.insert(
                piece.id,
                Staged {
                    total: piece.total,
                    bytes: Vec::new(),
                },
            );
        }
        let held = staged_bytes(&staged) + self.in_flight.load(Ordering::SeqCst);
        let fits = self
            .limits()
            .mem_quota
            .is_none_or(|q| held.saturating_add(data.len() as u64) <= q);
        let entry = staged.get_mut(&piece.id).ok_or(CL_INVALID_VALUE)?;
        let in_order = piece.total == entry.total
            && piece.offset == entry.bytes.len() as u64
            && data.len() <= wormhole_opencl_proto::TRANSFER_CHUNK
            && piece
                .offset
                .checked_add(data.len() as u64)
                .is_some_and(|end| end <= entry.total);
        if !in_order {
            staged.remove(&piece.id);
            return Err(CL_INVALID_VALUE);
        }
        if !fits {
            tracing::warn!(
                held,
                quota = self.limits().mem_quota,
                "staged write data refused: over the tenant's memory quota"
            );
        }
        if !fits || entry.bytes.try_reserve(data.len()).is_err() {
            staged.remove(&piece.id);
            return Err(CL_OUT_OF_HOST_MEMORY);
        }
        entry.bytes.extend_from_slice(data);
        Ok(())
    }

    /// Takes the data staged under `id`, if all `len` bytes of it arrived.
    pub fn take_staged(&self, id: u64, len: u64) -> Option<Vec<u8>> {
        let staged = self
            .staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)?;
        (staged.total == len && staged.bytes.len() as u64 == len).then_some(staged.bytes)
    }
}

/// One request being handled: the session it belongs to, and what the handler leaves for the
/// reply besides its body (bulk data sent from a mapping of the driver's buffer). Handlers
/// that need only the session take `&Session` (a `&Call` derefs to it).
pub struct Call<'a> {
    session: &'a Session,
    trailer: std::cell::RefCell<Option<Box<dyn wormhole_server::backend::Trailer>>>,
}

impl<'a> Call<'a> {
    pub fn new(session: &'a Session) -> Call<'a> {
        Call {
            session,
            trailer: std::cell::RefCell::new(None),
        }
    }

    /// Bulk data to send after the reply's body (the body announced its length).
    pub fn send_after(&self, t: impl wormhole_server::backend::Trailer + 'static) {
        *self.trailer.borrow_mut() = Some(Box::new(t));
    }

    /// The bulk data the handler left, if any.
    pub fn take_trailer(&self) -> Option<Box<dyn wormhole_server::backend::Trailer>> {
        self.trailer.borrow_mut().take()
    }
}

impl std::ops::Deref for Call<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        self.session
    }
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
    /// Sets the tenant's limits (once, when the session begins).
    pub fn set_limits(&self, limits: Arc<Limits>) {
        let _ = self.limits.set(limits);
    }

    pub fn limits(&self) -> &Limits {
        self.limits.get_or_init(|| Arc::new(Limits::default()))
    }

    /// The limits, to keep in a callback that outlives the call.
    pub fn limits_handle(&self) -> Arc<Limits> {
        self.limits
            .get_or_init(|| Arc::new(Limits::default()))
            .clone()
    }

    /// The real object behind `id`, if it is of `kind`. NULL (id 0) passes through so the real
    /// call reports exactly what native OpenCL reports for NULL.
    pub fn resolve(&self, id: u64, kind: HandleKind, _nullable: bool) -> Result<Handle, i32> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        self.handles
            .get(id, kind)
            .map(|p| p as Handle)
            .ok_or(kind.invalid_code())
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
        match self.handles.get_all(ids, kind) {
            Some(v) => Ok(Some(v.into_iter().map(|p| p as Handle).collect())),
            None => Err(code),
        }
    }

    fn new_id_error(&self, e: NewIdError) -> i32 {
        match e {
            NewIdError::Invalid => {
                tracing::warn!("client offered an invalid id for a new object");
                CL_INVALID_VALUE
            }
            NewIdError::TooMany => {
                tracing::warn!(
                    max = self.limits().max_objects,
                    "object refused: the session holds its limit of objects"
                );
                CL_OUT_OF_HOST_MEMORY
            }
        }
    }

    /// A client-allocated id for a new object must be fresh and in the client's id space
    /// (checked before the driver creates the object; [`Session::bind`] settles it).
    pub fn check_new_id(&self, id: u64) -> Result<(), i32> {
        self.handles
            .check_new(id, self.limits().max_objects)
            .map_err(|e| self.new_id_error(e))
    }

    /// Binds a new object under the id the client chose; the id is checked again under the
    /// table's lock, so two lanes offering the same id cannot both bind it.
    pub fn bind(&self, id: u64, kind: HandleKind, ptr: Handle) -> Result<(), i32> {
        self.handles
            .bind_new(id, kind, ptr as usize, self.limits().max_objects)
            .map_err(|e| self.new_id_error(e))
    }

    /// The application's references to `id` (`HandleTable::refs`).
    pub fn app_refs(&self, id: u64) -> Option<u32> {
        self.handles.refs(id)
    }

    /// Points an existing id at another real object of its kind.
    pub fn rebind(&self, id: u64, kind: HandleKind, ptr: Handle) {
        self.handles.rebind(id, kind, ptr as usize);
    }

    /// Held across a retain or release (`HandleTable::counting`).
    pub fn counting(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.handles.counting()
    }

    /// Held while an id's references move to another object (`HandleTable::repointing`).
    pub fn repointing(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.handles.repointing()
    }

    /// The application retained `id` once more (`HandleTable::refs`).
    pub fn retained(&self, id: u64) {
        self.handles.retained(id);
    }

    /// The application released `id` once (`client_last`: the client counted it as the last
    /// reference); the id is forgotten after the last one (`HandleTable::released`).
    pub fn released(&self, id: u64, client_last: bool) {
        if self.handles.released(id, client_last) {
            self.forget(id);
        }
    }

    /// The client dropped its last reference to `id`.
    pub fn forget(&self, id: u64) {
        let forgotten = self.handles.forget(id);
        if matches!(forgotten, Some((HandleKind::Program, _))) {
            // Headers sent for a build that never came.
            self.includes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
        if let Some((HandleKind::Context, c)) = forgotten {
            crate::staging::forget_context(c as Handle);
        }
        if let Some((HandleKind::Program, p)) = forgotten {
            let cached = self
                .cached_programs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&p);
            if let Some(c) = cached {
                crate::custom::release_program(c.source_program);
            }
            self.build_paths
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&p);
        }
    }

    /// The id under which the client knows `ptr`, assigning a server id to objects the client
    /// has not seen yet (devices, objects returned by info queries).
    pub fn export(&self, kind: HandleKind, ptr: Handle) -> u64 {
        self.handles.export(kind, ptr as usize)
    }

    pub fn export_list(&self, w: &mut Writer, kind: HandleKind, ptrs: &[Handle]) {
        self.handles.write_exported(w, kind, ptrs);
    }

    /// Live objects per kind, for status reports.
    pub fn object_counts(&self) -> Vec<(HandleKind, usize)> {
        let mut v: Vec<_> = self.handles.counts().into_iter().collect();
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

    /// A copy of `len` bytes of SVM at `ptr`, if the range is allocated; the allocation table
    /// stays locked during the copy, so a free on another lane cannot come in between.
    pub fn read_svm(&self, ptr: usize, len: usize) -> Option<Vec<u8>> {
        let svm = self.svm.lock().unwrap_or_else(|p| p.into_inner());
        let (start, n) = svm.range(..=ptr).next_back()?;
        if ptr.checked_add(len).is_none_or(|end| end > start + n) {
            return None;
        }
        // SAFETY: the range lies in an SVM allocation, which stays allocated while `svm` is
        // locked (frees take the lock).
        Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec())
    }

    pub fn mem_bytes(&self) -> i64 {
        self.mem_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transfers in flight and staged data together stay within the quota, and what a
    /// finished transfer held is given back.
    #[test]
    fn bytes_in_flight_are_bounded_by_the_quota() {
        let s = Session::default();
        s.set_limits(Arc::new(Limits {
            mem_quota: Some(100),
            ..Limits::default()
        }));
        let a = s.hold_in_flight(60).unwrap();
        assert_eq!(s.hold_in_flight(41).err(), Some(CL_OUT_OF_HOST_MEMORY));
        let b = s.hold_in_flight(40).unwrap();
        drop(a);
        let piece = Stage {
            id: 1,
            offset: 0,
            total: 50,
            len: 50,
        };
        s.stage(&piece, &[7; 50]).unwrap();
        // 40 in flight and 50 staged: 10 more at most.
        assert_eq!(s.hold_in_flight(11).err(), Some(CL_OUT_OF_HOST_MEMORY));
        drop(b);
        let _c = s.hold_in_flight(50).unwrap();
        // Without a quota, nothing is refused.
        let free = Session::default();
        let _big = free.hold_in_flight(usize::MAX >> 1).unwrap();
    }

    #[test]
    fn handles_are_typed_and_session_local() {
        let s = Session::default();
        let fake = 0x1000 as Handle;
        s.check_new_id(5).unwrap();
        s.bind(5, HandleKind::Mem, fake).unwrap();
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
        assert_eq!(
            s.check_new_id(wormhole_opencl_proto::SERVER_ID_BIT | 1),
            Err(CL_INVALID_VALUE)
        );
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
        assert_ne!(dev & wormhole_opencl_proto::SERVER_ID_BIT, 0);
        assert_eq!(s.export(HandleKind::Device, 0x2000 as Handle), dev);
    }

    fn piece(id: u64, total: u64, offset: u64, len: u64) -> Stage {
        Stage {
            id,
            total,
            offset,
            len,
        }
    }

    #[test]
    fn staged_data_is_taken_whole_or_not_at_all() {
        let s = Session::default();
        // In order: taken once, with the length announced.
        s.stage(&piece(1, 5, 0, 3), b"abc").unwrap();
        s.stage(&piece(1, 5, 3, 2), b"de").unwrap();
        assert_eq!(s.take_staged(1, 5).as_deref(), Some(&b"abcde"[..]));
        assert_eq!(s.take_staged(1, 5), None);
        // Incomplete, or named with another length: dropped all the same.
        s.stage(&piece(2, 5, 0, 3), b"abc").unwrap();
        assert_eq!(s.take_staged(2, 5), None);
        s.stage(&piece(3, 2, 0, 2), b"ab").unwrap();
        assert_eq!(s.take_staged(3, 3), None);
        assert!(s.staged.lock().unwrap().is_empty());
        // Out of order, past the end, another total, or nothing to follow: refused and dropped.
        for bad in [
            piece(4, 5, 1, 2),
            piece(4, 5, 0, 6),
            piece(4, 6, 3, 2),
            piece(4, 5, 3, 3),
        ] {
            s.stage(&piece(4, 5, 0, 3), b"abc").unwrap();
            let data = vec![0; bad.len as usize];
            // (A piece at offset 0 starts anew: this one is too long for its total.)
            assert_eq!(s.stage(&bad, &data), Err(CL_INVALID_VALUE));
            assert_eq!(s.take_staged(4, 5), None);
        }
        assert_eq!(s.stage(&piece(5, 5, 3, 2), b"de"), Err(CL_INVALID_VALUE));
        // A piece larger than a chunk.
        let big = vec![0; wormhole_opencl_proto::TRANSFER_CHUNK + 1];
        let p = piece(6, big.len() as u64, 0, big.len() as u64);
        assert_eq!(s.stage(&p, &big), Err(CL_INVALID_VALUE));
        // An announced length far beyond memory costs nothing until bytes arrive.
        s.stage(&piece(7, u64::MAX, 0, 1), b"a").unwrap();
        assert!(s.staged.lock().unwrap()[&7].bytes.capacity() < 1 << 20);
    }

    /// Staged bytes are bounded by the tenant's memory quota: past it a piece is refused and
    /// what its id held is dropped; bytes taken or dropped leave room again.
    #[test]
    fn staged_data_is_bounded_by_the_quota() {
        let s = Session::default();
        s.set_limits(Arc::new(Limits {
            mem_quota: Some(10),
            ..Limits::default()
        }));
        s.stage(&piece(1, 6, 0, 4), b"abcd").unwrap();
        s.stage(&piece(2, 8, 0, 4), b"efgh").unwrap();
        // 8 + 4 > 10: refused, and id 2 dropped with its 4 bytes.
        assert_eq!(
            s.stage(&piece(2, 8, 4, 4), b"ijkl"),
            Err(CL_OUT_OF_HOST_MEMORY)
        );
        assert_eq!(s.take_staged(2, 8), None);
        // Room again for 6 more; a piece of the same id started anew replaces the old one.
        s.stage(&piece(3, 9, 0, 4), b"abcd").unwrap();
        s.stage(&piece(3, 9, 0, 2), b"ab").unwrap();
        s.stage(&piece(1, 6, 4, 2), b"ef").unwrap();
        assert_eq!(s.take_staged(1, 6).as_deref(), Some(&b"abcdef"[..]));
        s.stage(&piece(3, 9, 2, 7), b"cdefghi").unwrap();
        assert_eq!(s.take_staged(3, 9).as_deref(), Some(&b"abcdefghi"[..]));
        // One piece alone beyond the quota.
        assert_eq!(
            s.stage(&piece(4, 11, 0, 11), &[0; 11]),
            Err(CL_OUT_OF_HOST_MEMORY)
        );
        assert!(s.staged.lock().unwrap().is_empty());
    }
}
