//! The objects the application holds. Each is a heap struct whose first field is the ICD
//! dispatch table (the Khronos ICD contract), tagged with a magic word and its kind so a bad
//! or mistyped handle becomes the native `CL_INVALID_*` code instead of a wild call.

use crate::generated::DISPATCH;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use wormhole_opencl_proto::HandleKind;

const MAGIC: u32 = 0x574f_524d; // "WORM"

/// What the client remembers of a memory object (immutable once set).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemInfo {
    pub flags: u64,
    pub host_ptr: usize,
    /// (image type, element size) for images.
    pub image: Option<(u32, usize)>,
    /// An image's row and slice pitch in the application's host memory (CL_MEM_USE_HOST_PTR).
    pub host_pitches: [usize; 2],
    /// (arena offset, size) of a buffer whose bytes the client may copy itself.
    pub window: Option<(u64, usize)>,
    /// A buffer's size (0 for images): transfers outside it are refused before the client
    /// touches the application's memory for them, as the driver would refuse them.
    pub size: usize,
    /// An image's size along a transfer's three coordinates (see `geometry::image_extent`;
    /// None when unknown), for the same refusal.
    pub extent: Option<[usize; 3]>,
    /// A sub-buffer's parent (its id) and origin: copies between parts of one buffer must
    /// not overlap.
    pub parent: Option<(u64, usize)>,
}

/// How a kernel argument was set: its size and what its value was (NULL, bytes, a handle of
/// some kind). A repeat of a setting the driver accepted before is accepted again.
pub type ArgSig = (usize, u8);

/// The geometry of an NDRange launch on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSig {
    pub queue: u64,
    pub dims: Vec<usize>,
}

/// What the driver accepted of the kernels of one program and name (one signature: a program
/// cannot be built again while it has kernels). Kernels made with the same name share it, so a
/// library that makes a kernel object per call (OpenCV does) learns once.
#[derive(Debug, Default)]
pub struct KernelShape {
    /// Argument settings accepted, by index.
    pub args: HashSet<(u32, ArgSig)>,
    /// Launches accepted: the geometry with every argument setting the kernel had then.
    pub launches: Vec<(LaunchSig, Vec<(u32, ArgSig)>)>,
}

/// One kernel object: its current argument settings and what its kind of kernel accepted
/// (repeats of those can be pipelined, sent without waiting, with the same outcome guaranteed).
#[derive(Debug, Default)]
pub struct KernelState {
    pub args: std::collections::BTreeMap<u32, ArgSig>,
    pub shape: std::sync::Arc<Mutex<KernelShape>>,
}

impl KernelState {
    /// The kernel's argument settings, as a launch is remembered with them.
    pub fn settings(&self) -> Vec<(u32, ArgSig)> {
        self.args.iter().map(|(i, s)| (*i, *s)).collect()
    }
}

#[repr(C)]
pub struct ClObject {
    dispatch: *const c_void,
    magic: AtomicU32,
    pub kind: HandleKind,
    pub id: u64,
    refs: AtomicU32,
    mem: OnceLock<MemInfo>,
    pub kernel: Option<Mutex<KernelState>>,
    /// References an event's pending callbacks hold (not the application's: its reference
    /// count is reported without them).
    pub callback_holds: AtomicU32,
}

#[derive(Default)]
struct Registry {
    by_id: HashMap<u64, usize>,
    live: HashSet<usize>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

/// Ids start at a random point of the client's id space: only this session's table gives them
/// meaning anyway, but they are not guessable either.
fn next_id() -> &'static AtomicU64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        // Top bit clear (client id space), room for 2^61 objects before it could be reached.
        AtomicU64::new((r >> 3) | 1)
    })
}

/// A fresh id for an object this client creates.
pub fn alloc_id() -> u64 {
    next_id().fetch_add(1, Ordering::Relaxed)
}

/// Creates the application-visible object for `id` (reference count 1).
pub fn new_object(kind: HandleKind, id: u64, mem: Option<MemInfo>) -> *mut c_void {
    let obj = Box::new(ClObject {
        dispatch: &DISPATCH as *const _ as *const c_void,
        magic: AtomicU32::new(MAGIC),
        kind,
        id,
        refs: AtomicU32::new(1),
        mem: mem.map_or_else(OnceLock::new, OnceLock::from),
        kernel: (kind == HandleKind::Kernel).then(Mutex::default),
        callback_holds: AtomicU32::new(0),
    });
    let p = Box::into_raw(obj) as usize;
    let mut r = lock();
    r.by_id.insert(id, p);
    r.live.insert(p);
    p as *mut c_void
}

impl ClObject {
    /// What the client knows of a memory object (None: not a memory object, or one made by a
    /// generated call that nothing needed to know about).
    pub fn mem(&self) -> Option<MemInfo> {
        self.mem.get().copied()
    }

    /// Records what a generated call that made this memory object could not (sub-buffers);
    /// only before the application has the handle, so it is set once.
    pub fn set_mem(&self, info: MemInfo) {
        let _ = self.mem.set(info);
    }
}

/// The object the server knows as `id`, creating it if this client has not seen it yet.
pub fn object_for_id(kind: HandleKind, id: u64) -> *mut c_void {
    if id == 0 {
        return std::ptr::null_mut();
    }
    if let Some(p) = lock().by_id.get(&id) {
        return *p as *mut c_void;
    }
    new_object(kind, id, None)
}

/// The object behind an application handle, if it is a live Wormhole object of `kind`.
///
/// # Safety
/// `h` must be NULL or a pointer the application got from this ICD (the same contract native
/// OpenCL has); a freed or foreign pointer is detected only as far as its memory still reads.
pub unsafe fn get<'a>(h: *mut c_void, kind: HandleKind) -> Option<&'a ClObject> {
    if h.is_null() || !(h as usize).is_multiple_of(std::mem::align_of::<ClObject>()) {
        return None;
    }
    // SAFETY: per the contract above, `h` points to readable memory of an object of ours.
    let o = unsafe { &*(h as *const ClObject) };
    (o.magic.load(Ordering::Relaxed) == MAGIC
        && o.dispatch == &DISPATCH as *const _ as *const c_void
        && o.kind == kind)
        .then_some(o)
}

/// Whether `v` is the address of a live object (kernel arguments: is this value a cl_mem?).
pub fn live_object(v: usize) -> Option<(HandleKind, u64)> {
    let r = lock();
    if !r.live.contains(&v) {
        return None;
    }
    // SAFETY: the registry holds only live objects; it is locked, so the object cannot be freed
    // while we read it.
    let o = unsafe { &*(v as *const ClObject) };
    Some((o.kind, o.id))
}

pub fn retained(o: &ClObject) {
    o.refs.fetch_add(1, Ordering::Relaxed);
}

/// Drops one reference before the release is forwarded; true if it was the last one.
pub fn release_begin(o: &ClObject) -> bool {
    if o.kind.is_permanent() && o.id & wormhole_opencl_proto::SERVER_ID_BIT != 0 {
        return false;
    }
    o.refs.fetch_sub(1, Ordering::AcqRel) == 1
}

/// Completes a release: frees the object after its last reference, or restores the count if
/// the server refused the release.
pub fn release_end(h: *mut c_void, last: bool, status: i32) {
    // SAFETY: `h` was validated by `get` before the release started and is freed only here.
    let o = unsafe { &*(h as *const ClObject) };
    if status != 0 {
        if !(o.kind.is_permanent() && o.id & wormhole_opencl_proto::SERVER_ID_BIT != 0) {
            o.refs.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    if !last {
        return;
    }
    {
        let mut r = lock();
        if r.by_id.get(&o.id) == Some(&(h as usize)) {
            r.by_id.remove(&o.id);
        }
        r.live.remove(&(h as usize));
    }
    o.magic.store(0, Ordering::Relaxed);
    // SAFETY: created by `Box::into_raw` in `new_object`; this was its last reference.
    drop(unsafe { Box::from_raw(h as *mut ClObject) });
}

/// The application's handle for `id` if it still has one (destructor callbacks may fire after
/// the application released its last reference: then NULL).
pub fn known_object(id: u64) -> *mut c_void {
    lock()
        .by_id
        .get(&id)
        .map_or(std::ptr::null_mut(), |p| *p as *mut c_void)
}
