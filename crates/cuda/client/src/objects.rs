//! The objects the program holds (contexts, modules, functions, streams, events). Each is a
//! heap struct tagged with a magic word and its kind, registered while it lives, so a bad,
//! stale or mistyped handle becomes the driver's own error instead of a wild read.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use wormhole_cuda_proto::requests::ParamLayout;
use wormhole_cuda_proto::{HandleKind, FIRST_OBJECT_ID, SERVER_ID_BIT};

const MAGIC: u32 = 0x5743_5544; // "WCUD"

#[repr(C)]
pub struct CuObject {
    magic: u32,
    pub kind: HandleKind,
    pub id: u64,
    /// A function's parameters (what a launch copies from `kernelParams`).
    pub layout: Option<ParamLayout>,
}

impl CuObject {
    fn new(kind: HandleKind, id: u64, layout: Option<ParamLayout>) -> CuObject {
        CuObject {
            magic: MAGIC,
            kind,
            id,
            layout,
        }
    }
}

#[derive(Default)]
struct Registry {
    by_id: HashMap<u64, usize>,
    live: HashSet<usize>,
    /// Functions and kernels by (module or library id, name): the driver answers a lookup of
    /// the same name with the same handle, and a module's go when it is unloaded.
    entries: HashMap<(u64, Vec<u8>), usize>,
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A fresh id for a new object: from a random point of the client's id space (only this
/// session's table gives ids meaning, but they are not guessable either), never one of the
/// special stream ids.
pub fn alloc_id() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        AtomicU64::new(FIRST_OBJECT_ID + ((r >> 24) & 0xff_ffff_ffff))
    });
    next.fetch_add(1, Ordering::Relaxed) & !SERVER_ID_BIT
}

/// The object behind `h` if it is a live object of `kind`.
///
/// # Safety
/// None beyond `h` being a value: it is dereferenced only when registered.
pub unsafe fn get(h: *mut c_void, kind: HandleKind) -> Option<&'static CuObject> {
    let reg = lock();
    if !reg.live.contains(&(h as usize)) {
        return None;
    }
    // SAFETY: registered objects are live boxes (removed from `live` before they are freed).
    let o = unsafe { &*(h as *const CuObject) };
    (o.magic == MAGIC && o.kind == kind).then_some(o)
}

/// A new object for id `id`.
pub fn new_object(kind: HandleKind, id: u64) -> *mut c_void {
    register_in(&mut lock(), CuObject::new(kind, id, None))
}

/// The program's function object for `id` (one the server returned), made with `layout` if
/// the program has none yet.
pub fn function_for_id(id: u64, layout: ParamLayout) -> *mut c_void {
    find_or_make(HandleKind::Function, id, || {
        CuObject::new(HandleKind::Function, id, Some(layout))
    })
}

fn register_in(reg: &mut Registry, o: CuObject) -> *mut c_void {
    let id = o.id;
    let p = Box::into_raw(Box::new(o)) as usize;
    reg.live.insert(p);
    reg.by_id.insert(id, p);
    p as *mut c_void
}

/// The registered object of `kind` for `id`, or the one `make` makes, registered: looked up
/// and made under one lock, so two threads that learn of the same object at once (cudart
/// starting up in two libraries) get the same handle.
fn find_or_make(kind: HandleKind, id: u64, make: impl FnOnce() -> CuObject) -> *mut c_void {
    let mut reg = lock();
    if let Some(&p) = reg.by_id.get(&id) {
        // SAFETY: registered, so live.
        if unsafe { &*(p as *const CuObject) }.kind == kind {
            return p as *mut c_void;
        }
    }
    register_in(&mut reg, make())
}

/// The program's object for `id` (one the server returned: a context it made or found), made
/// if the program has none yet: the same real object is always the same handle.
pub fn object_for_id(kind: HandleKind, id: u64) -> *mut c_void {
    if id == 0 {
        return std::ptr::null_mut();
    }
    find_or_make(kind, id, || CuObject::new(kind, id, None))
}

/// The function or kernel (`kind`) named `name` of module or library `parent` (an id), if
/// the program looked it up before.
pub fn entry_of(parent: u64, name: &[u8], kind: HandleKind) -> Option<*mut c_void> {
    live_entry(&lock(), parent, name, kind)
}

fn live_entry(reg: &Registry, parent: u64, name: &[u8], kind: HandleKind) -> Option<*mut c_void> {
    let &p = reg.entries.get(&(parent, name.to_vec()))?;
    // SAFETY: entries are registered objects (removed with them).
    (reg.live.contains(&p) && unsafe { &*(p as *const CuObject) }.kind == kind)
        .then_some(p as *mut c_void)
}

/// A new function or kernel (`kind`, with its layout) named `name` of `parent`.
pub fn new_entry(
    parent: u64,
    name: &[u8],
    kind: HandleKind,
    id: u64,
    layout: ParamLayout,
) -> *mut c_void {
    let mut reg = lock();
    // Another thread that looked the same name up at once may have registered it first: one
    // handle for the name (the server forgets the other id with the module).
    if let Some(p) = live_entry(&reg, parent, name, kind) {
        return p;
    }
    let p = register_in(&mut reg, CuObject::new(kind, id, Some(layout)));
    reg.entries.insert((parent, name.to_vec()), p as usize);
    p
}

/// The object is gone on the server: the handle is no longer valid, nor are the functions
/// or kernels of a module or library.
pub fn destroy(h: *mut c_void) {
    let mut reg = lock();
    if !reg.live.remove(&(h as usize)) {
        return;
    }
    // SAFETY: it was registered, so it is a box from `new_object`, freed once (it is no
    // longer registered).
    let o = unsafe { Box::from_raw(h as *mut CuObject) };
    if reg.by_id.get(&o.id) == Some(&(h as usize)) {
        reg.by_id.remove(&o.id);
    }
    // Only modules and libraries have entries, and only functions and kernels are entries:
    // nothing to search for the rest (events and streams are destroyed often).
    let mut children = Vec::new();
    if matches!(
        o.kind,
        HandleKind::Module | HandleKind::Library | HandleKind::Function | HandleKind::Kernel
    ) {
        reg.entries.retain(|(parent, _), child| {
            let of_it = *parent == o.id || *child == h as usize;
            if of_it && *child != h as usize {
                children.push(*child);
            }
            !of_it
        });
    }
    drop(reg);
    for child in children {
        destroy(child as *mut c_void);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name looked up again is the same handle; a module's go when it is unloaded.
    #[test]
    fn entries_are_one_handle_per_name_until_their_module_goes() {
        let module_id = alloc_id();
        let module = object_for_id(HandleKind::Module, module_id);
        let f = new_entry(
            module_id,
            b"vadd",
            HandleKind::Function,
            alloc_id(),
            ParamLayout::default(),
        );
        assert_eq!(entry_of(module_id, b"vadd", HandleKind::Function), Some(f));
        assert_eq!(entry_of(module_id, b"vadd", HandleKind::Kernel), None);
        assert_eq!(entry_of(module_id, b"other", HandleKind::Function), None);
        destroy(module);
        assert_eq!(entry_of(module_id, b"vadd", HandleKind::Function), None);
        // SAFETY: only looked up: dereferenced if registered.
        let gone = unsafe { get(f, HandleKind::Function) }.is_none();
        assert!(gone, "gone with its module");
    }

    /// Threads that learn of the same objects at once get one handle for each.
    #[test]
    fn one_object_is_one_handle_whatever_thread_learns_of_it() {
        let first = alloc_id();
        let ids: Vec<u64> = (0..200).map(|i| first + 1_000_000 + i).collect();
        let seen: Vec<Vec<usize>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        ids.iter()
                            .map(|&id| object_for_id(HandleKind::Context, id) as usize)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for other in &seen[1..] {
            assert_eq!(other, &seen[0]);
        }
        for &h in &seen[0] {
            // SAFETY: a registered object.
            assert!(unsafe { get(h as *mut c_void, HandleKind::Context) }.is_some());
            destroy(h as *mut c_void);
        }
    }
}
