//! Pinned staging for devices that do not compute in host memory (discrete GPUs).
//!
//! A request ring is ordinary, pageable memory. A driver asked to move pageable memory first
//! copies it into page-locked memory of its own, which its DMA engine can reach; a mapping of a
//! device buffer costs a page-locked allocation and a whole transfer before the first byte
//! moves on. Here the worker does that copy itself, straight between the ring and page-locked
//! memory the driver allocated (`CL_MEM_ALLOC_HOST_PTR` buffers, mapped once and kept), in
//! pieces through two slots in turn: while the device moves one piece, the next is copied.
//!
//! CPU devices keep the in-place arena (arena.rs) and mapped transfers, which copy once.
//! `WORMHOLE_PINNED_STAGING` (in the server's environment) chooses: `auto` (the default:
//! devices without host-unified memory), `always` (every device treated as a discrete one, the
//! in-place arena too: how CI checks this path on a CPU device), `never`.

use crate::generated::ffi;
use crate::session::Handle;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use wormhole_opencl_proto::cl::*;
use wormhole_opencl_proto::Op;
use wormhole_transport::TransportError;

/// The bytes of one slot: the largest piece.
const SLOT: usize = 8 << 20;

/// Pieces are never smaller than this: each costs the driver an enqueue and an event.
const MIN_PIECE: usize = 256 << 10;

/// Transfers from this size on are staged (smaller ones travel inside their frames).
const MIN_STAGED: usize = 64 << 10;

/// Blocking reads and writes that went through pinned staging (`wh status`).
pub static STAGED_READS: AtomicU64 = AtomicU64::new(0);
pub static STAGED_WRITES: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Auto,
    Always,
    Never,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("WORMHOLE_PINNED_STAGING").as_deref() {
            Ok("always") => Mode::Always,
            Ok("never") => Mode::Never,
            Ok("auto") | Err(_) => Mode::Auto,
            Ok(other) => {
                tracing::warn!(
                    "WORMHOLE_PINNED_STAGING={other:?} is not auto, always or never: auto"
                );
                Mode::Auto
            }
        },
    )
}

/// Whether every device is to be treated as one that does not compute in host memory
/// (`always`): no in-place arena either, as on a discrete GPU.
pub fn every_device_discrete() -> bool {
    mode() == Mode::Always
}

/// The size of the pieces a transfer of `size` bytes moves in: a quarter of it (so that even
/// a 1 MiB transfer overlaps copy and DMA), within [MIN_PIECE, SLOT], in whole pages.
fn piece_len(size: usize) -> usize {
    (size / 4).next_multiple_of(4096).clamp(MIN_PIECE, SLOT)
}

/// One context's slots: page-locked buffers, mapped for as long as the staging lives.
struct Staging {
    /// The worker's own queue of the context, which maps and unmaps the slots.
    queue: Handle,
    slots: Vec<(Handle, *mut u8)>,
    /// The context's references the staging holds (its queue and mapped buffers, as the
    /// driver counts them: `implicit_refs`): what `CL_CONTEXT_REFERENCE_COUNT` leaves out.
    own_refs: u32,
    /// One transfer at a time uses the slots; another one meanwhile takes the ordinary path.
    busy: AtomicBool,
}

// SAFETY: the handles are the driver's thread-safe objects; the slots' memory is used by the
// one transfer that holds `busy`.
unsafe impl Send for Staging {}
// SAFETY: as above.
unsafe impl Sync for Staging {}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: the slots were mapped on `queue` by `create` and are unmapped once, here;
        // then the staging's own references are given up.
        unsafe {
            for &(mem, ptr) in &self.slots {
                let st = ffi::clEnqueueUnmapMemObject(
                    self.queue,
                    mem,
                    ptr as *mut c_void,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
                if st != CL_SUCCESS {
                    tracing::warn!(status = st, "pinned staging: a slot did not unmap");
                }
            }
            ffi::clFinish(self.queue);
            for &(mem, _) in &self.slots {
                ffi::clReleaseMemObject(mem);
            }
            ffi::clReleaseCommandQueue(self.queue);
        }
    }
}

/// What a context has of staging.
enum Entry {
    Made(Arc<Staging>),
    /// The driver would not make it: not asked again for this context.
    Refused,
    /// The application released its last reference: a staging made now would keep the
    /// context alive with no release to come. Until a context is created at that address.
    Gone,
}

/// Each context's staging, by its address.
fn stagings() -> std::sync::MutexGuard<'static, HashMap<usize, Entry>> {
    static MAP: OnceLock<Mutex<HashMap<usize, Entry>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether each device computes in host memory (asked once per device).
fn host_unified(device: Handle) -> bool {
    static KNOWN: OnceLock<Mutex<HashMap<usize, bool>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
    *known.entry(device as usize).or_insert_with(|| {
        // SAFETY: a live device; the output is a cl_bool.
        let v: Option<u32> = scalar(|n, p| unsafe {
            ffi::clGetDeviceInfo(
                device,
                CL_DEVICE_HOST_UNIFIED_MEMORY,
                n,
                p,
                std::ptr::null_mut(),
            )
        });
        // Not answered (OpenCL 2.0 deprecated it): a GPU is taken to be discrete.
        v.map_or_else(|| !is_gpu(device), |v| v != 0)
    })
}

fn is_gpu(device: Handle) -> bool {
    // SAFETY: a live device; the output is a cl_device_type.
    let t: Option<u64> = scalar(|n, p| unsafe {
        ffi::clGetDeviceInfo(device, CL_DEVICE_TYPE, n, p, std::ptr::null_mut())
    });
    t.is_some_and(|t| t & CL_DEVICE_TYPE_GPU != 0)
}

/// A scalar info value, read by `call(size, value)`.
fn scalar<T: Copy + Default>(call: impl FnOnce(usize, *mut c_void) -> i32) -> Option<T> {
    let mut v = T::default();
    (call(std::mem::size_of::<T>(), &mut v as *mut T as *mut c_void) == CL_SUCCESS).then_some(v)
}

/// A scalar of a live queue of the session (`T` of the parameter's type).
fn queue_info<T: Copy + Default>(queue: Handle, param: u32) -> Option<T> {
    // SAFETY: a live queue; the output is a T, as large as the size passed.
    scalar(|n, p| unsafe { ffi::clGetCommandQueueInfo(queue, param, n, p, std::ptr::null_mut()) })
}

/// A scalar of a live memory object of the session (`T` of the parameter's type).
fn mem_info<T: Copy + Default>(mem: Handle, param: u32) -> Option<T> {
    // SAFETY: a live memory object; the output is a T, as large as the size passed.
    scalar(|n, p| unsafe { ffi::clGetMemObjectInfo(mem, param, n, p, std::ptr::null_mut()) })
}

fn context_refs(context: Handle) -> Option<u32> {
    // SAFETY: a live context; the output is a cl_uint.
    scalar(|n, p| unsafe {
        ffi::clGetContextInfo(
            context,
            CL_CONTEXT_REFERENCE_COUNT,
            n,
            p,
            std::ptr::null_mut(),
        )
    })
}

/// How many references to its context the driver counts for a queue and two mapped buffers
/// (PoCL: one each; a driver may count none), found once per device on a context of the
/// worker's own, where no other thread creates or releases anything meanwhile.
/// A probe that failed (no memory for a context, say) is tried again at the next transfer.
fn implicit_refs(device: Handle) -> Option<u32> {
    let mut known = refs_known();
    if let Some(&n) = known.get(&(device as usize)) {
        return Some(n);
    }
    let n = probe_implicit_refs(device)?;
    known.insert(device as usize, n);
    Some(n)
}

/// What `implicit_refs` found, per device; held while a probe runs, so that one runs at a time
/// and a transfer that needs the answer waits for it.
fn refs_known() -> std::sync::MutexGuard<'static, HashMap<usize, u32>> {
    known_refs_map().lock().unwrap_or_else(|p| p.into_inner())
}

fn known_refs_map() -> &'static Mutex<HashMap<usize, u32>> {
    static KNOWN: OnceLock<Mutex<HashMap<usize, u32>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

/// Whether `device` still wants a probe: not answered yet, and none under way (a probe holds
/// the map, and the context being created need not wait for it).
fn probe_wanted(device: Handle) -> bool {
    match known_refs_map().try_lock() {
        Ok(known) => !known.contains_key(&(device as usize)),
        Err(std::sync::TryLockError::Poisoned(p)) => {
            !p.into_inner().contains_key(&(device as usize))
        }
        Err(std::sync::TryLockError::WouldBlock) => false,
    }
}

fn probe_implicit_refs(device: Handle) -> Option<u32> {
    crate::rt::check_slot(device, Op::clCreateContext).ok()?;
    let mut err = CL_SUCCESS;
    // SAFETY: one live device; no properties, no callback.
    let context = unsafe {
        ffi::clCreateContext(
            std::ptr::null(),
            1,
            &device,
            std::ptr::null(),
            std::ptr::null_mut(),
            &mut err,
        )
    };
    if context.is_null() || err != CL_SUCCESS {
        return None;
    }
    let counted = (|| {
        let alone = context_refs(context)?;
        let staging = create_slots(context, device, PROBE_SLOT)?;
        let with = context_refs(context)?;
        drop(staging);
        Some(with.saturating_sub(alone))
    })();
    // SAFETY: the context made above, released once (its objects went with `staging`).
    unsafe { ffi::clReleaseContext(context) };
    counted
}

/// The slots' size when only the driver's reference counting is probed.
const PROBE_SLOT: usize = 4096;

/// Makes a context's staging: a queue of its own on `device`, and the slots, mapped.
fn create(context: Handle, device: Handle, own_refs: u32) -> Option<Staging> {
    let mut staging = create_slots(context, device, SLOT)?;
    staging.own_refs = own_refs;
    tracing::debug!(own_refs, "pinned staging: slots made for a context");
    Some(staging)
}

/// A queue of its own on `device` and two mapped page-locked buffers of `slot` bytes.
fn create_slots(context: Handle, device: Handle, slot: usize) -> Option<Staging> {
    crate::rt::check_slot(context, Op::clCreateCommandQueueWithProperties).ok()?;
    let mut err = CL_SUCCESS;
    // SAFETY: a live context and device; no properties.
    let queue = unsafe {
        ffi::clCreateCommandQueueWithProperties(context, device, std::ptr::null(), &mut err)
    };
    if queue.is_null() || err != CL_SUCCESS {
        tracing::info!(
            status = err,
            "pinned staging: no queue of its own; transfers go as before"
        );
        return None;
    }
    let mut staging = Staging {
        queue,
        slots: Vec::new(),
        own_refs: 0,
        busy: AtomicBool::new(false),
    };
    for _ in 0..2 {
        // SAFETY: a live context; no host pointer with ALLOC_HOST_PTR.
        let mem = unsafe {
            ffi::clCreateBuffer(
                context,
                CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                slot,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        if mem.is_null() || err != CL_SUCCESS {
            tracing::info!(
                status = err,
                "pinned staging: no page-locked buffer; transfers go as before"
            );
            return None; // dropping `staging` gives back what was made
        }
        // SAFETY: a live queue and buffer of one context; blocking, so the pointer is valid
        // when the call returns, and stays so until the unmap in `drop`.
        let ptr = unsafe {
            ffi::clEnqueueMapBuffer(
                queue,
                mem,
                CL_TRUE,
                CL_MAP_READ | CL_MAP_WRITE,
                0,
                slot,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut err,
            )
        };
        if ptr.is_null() || err != CL_SUCCESS {
            // SAFETY: created above, never mapped.
            unsafe { ffi::clReleaseMemObject(mem) };
            tracing::info!(
                status = err,
                "pinned staging: a slot did not map; transfers go as before"
            );
            return None;
        }
        staging.slots.push((mem, ptr as *mut u8));
    }
    Some(staging)
}

/// The slots of one context, held by one transfer until dropped.
pub struct Held {
    staging: Arc<Staging>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.staging.busy.store(false, Ordering::Release);
    }
}

/// The staging a blocking transfer of `size` bytes at `offset` of buffer `mem`, on `queue`,
/// goes through, if it should: a device that does not compute in host memory (or `always`),
/// a buffer of the queue's context that holds the range, and slots no other transfer holds.
/// None sends the transfer the ordinary way, which answers as the driver does.
pub fn take(queue: Handle, mem: Handle, offset: usize, size: usize) -> Option<Held> {
    let mode = mode();
    if mode == Mode::Never || size < MIN_STAGED {
        return None;
    }
    let context: Handle = queue_info(queue, CL_QUEUE_CONTEXT)?;
    let device: Handle = queue_info(queue, CL_QUEUE_DEVICE)?;
    if mode == Mode::Auto && host_unified(device) {
        return None;
    }
    let mem_context: Handle = mem_info(mem, CL_MEM_CONTEXT)?;
    let mem_type: u32 = mem_info(mem, CL_MEM_TYPE)?;
    let mem_size: usize = mem_info(mem, CL_MEM_SIZE)?;
    if mem_context != context
        || mem_type != CL_MEM_OBJECT_BUFFER
        || offset.checked_add(size).is_none_or(|end| end > mem_size)
    {
        return None;
    }
    // Asked before the map is locked: a probe still running holds up this transfer only.
    let own_refs = implicit_refs(device)?;
    let staging = {
        let mut map = stagings();
        let entry = map.entry(context as usize).or_insert_with(|| {
            create(context, device, own_refs).map_or(Entry::Refused, |s| Entry::Made(Arc::new(s)))
        });
        match entry {
            Entry::Made(s) => s.clone(),
            Entry::Refused | Entry::Gone => return None,
        }
    };
    staging
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .ok()?;
    Some(Held { staging })
}

/// The application released its last reference to `context`: the staging's references are
/// all that keep it (with the application's objects), so it goes, and the context with it
/// (its destructor callbacks run); none is made for it again.
pub fn forget_context(context: Handle) {
    let mut map = stagings();
    // Dropped under the lock, so that no reference count is read halfway through.
    drop(map.insert(context as usize, Entry::Gone));
}

/// The application created `context`: one at that address before it is gone for good.
/// Its discrete devices' probe (`implicit_refs`: a context of the worker's own, which on a GPU
/// takes a while to make) starts now, beside the application's own set-up, rather than at its
/// first large transfer.
pub fn context_created(context: Handle) {
    {
        let mut map = stagings();
        if matches!(map.get(&(context as usize)), Some(Entry::Gone)) {
            map.remove(&(context as usize));
        }
    }
    if mode() == Mode::Never {
        return;
    }
    for device in crate::arena::context_devices(context).unwrap_or_default() {
        if (mode() == Mode::Always || !host_unified(device)) && probe_wanted(device) {
            // A device handle is the driver's, valid in any thread of the process.
            let device = device as usize;
            let probe = std::thread::Builder::new()
                .name("staging-probe".into())
                .spawn(move || implicit_refs(device as Handle));
            if let Err(e) = probe {
                tracing::debug!("pinned staging: no thread to probe the driver early ({e})");
            }
        }
    }
}

/// `CL_CONTEXT_REFERENCE_COUNT` as native would answer it: without the staging's references.
/// Read under the lock a staging is made and dropped under, so never halfway through.
pub fn visible_refs(context: Handle) -> Option<u32> {
    let map = stagings();
    let own = match map.get(&(context as usize)) {
        Some(Entry::Made(s)) => s.own_refs,
        _ => 0,
    };
    Some(context_refs(context)?.saturating_sub(own))
}

/// A wait list as the driver takes it (NULL when empty, as the API requires).
fn list(wait: &[Handle]) -> *mut c_void {
    if wait.is_empty() {
        std::ptr::null_mut()
    } else {
        wait.as_ptr() as *mut c_void
    }
}

/// The objects a transfer names, retained for as long as its pieces are being asked for:
/// another thread of the application may release its last reference meanwhile, as natively
/// it may while one blocking call is in the driver (whose command keeps what it uses).
struct Objects {
    queue: Handle,
    mem: Handle,
    /// The transfer's wait list, which every piece waits for (the queue may be out of order).
    wait: Vec<Handle>,
}

impl Objects {
    fn retain(queue: Handle, mem: Handle, wait: &[Handle]) -> Objects {
        // SAFETY: live handles of the session; each retain is paired with a release in drop.
        unsafe {
            ffi::clRetainCommandQueue(queue);
            ffi::clRetainMemObject(mem);
            for &ev in wait {
                ffi::clRetainEvent(ev);
            }
        }
        Objects {
            queue,
            mem,
            wait: wait.to_vec(),
        }
    }

    /// The status a blocking transfer answers for a piece that failed with `st`: as natively,
    /// the wait list's failure where an event of it failed.
    fn failure(&self, st: i32) -> i32 {
        let dependency_failed = self.wait.iter().any(|&ev| {
            // SAFETY: a retained event; the output is a cl_int.
            let status: Option<i32> = scalar(|n, p| unsafe {
                ffi::clGetEventInfo(
                    ev,
                    CL_EVENT_COMMAND_EXECUTION_STATUS,
                    n,
                    p,
                    std::ptr::null_mut(),
                )
            });
            status.is_some_and(|s| s < 0)
        });
        if dependency_failed {
            CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST
        } else {
            st
        }
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        // SAFETY: the references `retain` took.
        unsafe {
            for &ev in &self.wait {
                ffi::clReleaseEvent(ev);
            }
            ffi::clReleaseMemObject(self.mem);
            ffi::clReleaseCommandQueue(self.queue);
        }
    }
}

/// The events of the pieces in the slots (null: none pending there).
struct InFlight([Handle; 2]);

impl InFlight {
    /// Waits for slot `i`'s piece; its failure, if it failed.
    fn settle(&mut self, i: usize) -> Result<(), i32> {
        let ev = std::mem::replace(&mut self.0[i], std::ptr::null_mut());
        if ev.is_null() {
            return Ok(());
        }
        // SAFETY: a live event this transfer owns; waited for, then released once.
        unsafe {
            let st = ffi::clWaitForEvents(1, &ev);
            let status: Option<i32> = scalar(|n, p| {
                ffi::clGetEventInfo(
                    ev,
                    CL_EVENT_COMMAND_EXECUTION_STATUS,
                    n,
                    p,
                    std::ptr::null_mut(),
                )
            });
            ffi::clReleaseEvent(ev);
            match (st, status) {
                (_, Some(s)) if s < 0 => Err(s),
                (CL_SUCCESS, _) => Ok(()),
                (e, _) => Err(e),
            }
        }
    }

    fn settle_all(&mut self) -> Result<(), i32> {
        let a = self.settle(0);
        let b = self.settle(1);
        a.and(b)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The slots are not handed to another transfer while the device still uses them.
        let _ = self.settle_all();
    }
}

/// A blocking write of `size` bytes at `offset` of `mem` on `queue` (after the `wait` list),
/// whose bytes `fill(dst, n)` copies, n at a time, from where they arrive. Every byte is taken
/// from `fill` whatever the driver says, so the request is consumed whole; the first failure
/// is the answer.
pub fn write(
    held: &Held,
    queue: Handle,
    mem: Handle,
    offset: usize,
    size: usize,
    wait: &[Handle],
    fill: &mut dyn FnMut(*mut u8, usize) -> Result<(), TransportError>,
) -> Result<i32, TransportError> {
    let objects = Objects::retain(queue, mem, wait);
    let piece = piece_len(size);
    // Dropped (settled) before `objects`, which the pieces use.
    let mut flight = InFlight([std::ptr::null_mut(); 2]);
    let mut failed = None;
    let mut at = 0;
    for (k, slot) in (0..2).cycle().enumerate() {
        if at >= size {
            break;
        }
        let n = piece.min(size - at);
        if let Err(st) = flight.settle(slot) {
            failed.get_or_insert(objects.failure(st));
        }
        let dst = held.staging.slots[slot].1;
        fill(dst, n)?;
        if failed.is_none() {
            // SAFETY: `dst` holds `n` <= SLOT bytes the driver reads until the event
            // completes (settled before the slot is filled again); the range was checked in
            // `take`; the objects are retained.
            let st = unsafe {
                ffi::clEnqueueWriteBuffer(
                    objects.queue,
                    objects.mem,
                    CL_FALSE,
                    offset + at,
                    n,
                    dst as *mut c_void,
                    objects.wait.len() as u32,
                    list(&objects.wait),
                    &mut flight.0[slot] as *mut Handle as *mut c_void,
                )
            };
            if st != CL_SUCCESS {
                if k > 0 {
                    tracing::warn!(
                        status = st,
                        "pinned staging: a piece of a write was refused"
                    );
                }
                failed = Some(st);
            }
        }
        at += n;
    }
    if let Err(st) = flight.settle_all() {
        failed.get_or_insert(objects.failure(st));
    }
    STAGED_WRITES.fetch_add(1, Ordering::Relaxed);
    Ok(failed.unwrap_or(CL_SUCCESS))
}

/// A blocking read sent as the bulk data after its reply: the device fills the slots in turn
/// while the pieces already read travel. The first piece is read before the reply goes, so
/// that a read that fails (the driver refuses it, its wait list failed) is answered the
/// ordinary way instead, with the driver's own status.
pub struct Read {
    // Field order is drop order: the pieces in flight settle before the objects they use go
    // and before the slots are free for another transfer.
    flight: InFlight,
    objects: Objects,
    held: Held,
    offset: usize,
    size: usize,
    piece: usize,
    /// Where the next piece not yet asked for begins.
    asked: usize,
    /// A piece failed after the reply went: the rest go as zeros.
    failed: bool,
    /// Where such a failure goes: the queue's next synchronisation point.
    on_failure: Box<dyn Fn(i32)>,
}

impl Read {
    /// Reads the first piece and asks for the second; None, having changed nothing the
    /// application can see, if the first did not arrive.
    pub fn start(
        held: Held,
        queue: Handle,
        mem: Handle,
        offset: usize,
        size: usize,
        wait: &[Handle],
        on_failure: Box<dyn Fn(i32)>,
    ) -> Option<Read> {
        let mut read = Read {
            flight: InFlight([std::ptr::null_mut(); 2]),
            objects: Objects::retain(queue, mem, wait),
            held,
            offset,
            size,
            piece: piece_len(size),
            asked: 0,
            failed: false,
            on_failure,
        };
        read.ask(0).ok()?;
        if read.asked < size {
            // No reply has gone yet: the ordinary path answers as the driver does.
            read.ask(1).ok()?;
        }
        // The first piece is sent first anyway: waiting for it here costs nothing.
        if read.flight.settle(0).is_err() {
            return None;
        }
        STAGED_READS.fetch_add(1, Ordering::Relaxed);
        Some(read)
    }

    /// Asks the device for the next piece into `slot`.
    fn ask(&mut self, slot: usize) -> Result<(), i32> {
        let n = self.piece.min(self.size - self.asked);
        let dst = self.held.staging.slots[slot].1;
        // SAFETY: `dst` holds `n` <= SLOT bytes, written by the driver until the event
        // completes (settled before they are read or the slot is reused); the range was
        // checked in `take`; the objects are retained.
        let st = unsafe {
            ffi::clEnqueueReadBuffer(
                self.objects.queue,
                self.objects.mem,
                CL_FALSE,
                self.offset + self.asked,
                n,
                dst as *mut c_void,
                self.objects.wait.len() as u32,
                list(&self.objects.wait),
                &mut self.flight.0[slot] as *mut Handle as *mut c_void,
            )
        };
        self.asked += n;
        if st == CL_SUCCESS {
            Ok(())
        } else {
            Err(st)
        }
    }

    /// A piece failed with `st` after the reply went.
    fn fail(&mut self, st: i32) {
        if !self.failed {
            tracing::warn!(status = st, "pinned staging: a piece of a read failed");
            (self.on_failure)(self.objects.failure(st));
        }
        self.failed = true;
    }
}

impl wormhole_server::backend::Trailer for Read {
    fn send(
        &mut self,
        out: &mut dyn FnMut(&[u8]) -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        let mut sent = 0;
        for slot in (0..2).cycle() {
            if sent >= self.size {
                break;
            }
            let n = self.piece.min(self.size - sent);
            if let Err(st) = self.flight.settle(slot) {
                self.fail(st);
            }
            if self.failed {
                // The frame keeps its announced length; the bytes are not the device's.
                out(&vec![0; n])?;
            } else {
                // SAFETY: the slot holds the `n` bytes the settled piece read.
                out(unsafe { std::slice::from_raw_parts(self.held.staging.slots[slot].1, n) })?;
            }
            sent += n;
            if self.asked < self.size && !self.failed {
                if let Err(st) = self.ask(slot) {
                    self.fail(st);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces overlap copy and DMA even for small transfers, never below the floor, never
    /// beyond a slot, in whole pages.
    #[test]
    fn piece_sizes() {
        assert_eq!(piece_len(64 << 10), MIN_PIECE);
        assert_eq!(piece_len(1 << 20), MIN_PIECE);
        assert_eq!(piece_len(4 << 20), 1 << 20);
        assert_eq!(piece_len(10_000_000) % 4096, 0);
        assert_eq!(piece_len(1 << 30), SLOT);
    }
}
