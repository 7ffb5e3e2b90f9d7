//! Coarse-grained shared virtual memory (see the server's `custom/svm.rs`): each allocation is
//! mirrored in this process at the address the server's driver chose, so SVM pointers — and
//! pointers stored inside SVM data — mean the same on both sides. The host sees device data
//! through maps and copies, as the coarse-grained contract requires.

use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;
use wormhole_opencl_proto::{CallbackKind, Op, Reader, Writer, SVM_SYNC_BATCH};

const PAGE: usize = 4096;

/// SVM allocations of this session: start → length.
static ALLOCS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// Pages of this process that mirror SVM memory, with how many allocations use each (the
/// driver may place two allocations in one page).
static PAGES: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// Fine-grained allocations: the host may touch them without maps, so they are made coherent
/// at synchronisation points. `snapshot` holds the bytes both sides agreed on last.
struct Fine {
    ptr: usize,
    len: usize,
    snapshot: Vec<u8>,
}

static FINE: Mutex<Vec<Fine>> = Mutex::new(Vec::new());
static FINE_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Before a request: send the bytes the host changed in fine-grained SVM since the last
/// agreement (byte-exact runs, so device writes elsewhere in the same memory survive).
pub fn push_fine() {
    if FINE_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return;
    }
    let mut fine = FINE.lock().unwrap_or_else(|e| e.into_inner());
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for f in fine.iter_mut() {
        // SAFETY: the mirror of a live allocation covers [ptr, ptr+len).
        let host = unsafe { std::slice::from_raw_parts(f.ptr as *const u8, f.len) };
        let mut i = 0;
        while i < f.len {
            if host[i] == f.snapshot[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < f.len && host[i] != f.snapshot[i] {
                i += 1;
            }
            f.snapshot[start..i].copy_from_slice(&host[start..i]);
            runs.extend(pieces(f.ptr + start, i - start));
        }
    }
    for batch in batches(&runs) {
        let mut w = Writer::new(wormhole_opencl_proto::control::SVM_PUSH);
        req::SvmPush {
            runs: batch
                .iter()
                .map(|(addr, n)| {
                    // SAFETY: inside a mirror, as above.
                    let bytes = unsafe { std::slice::from_raw_parts(*addr as *const u8, *n) };
                    (*addr as u64, bytes)
                })
                .collect(),
        }
        .encode(&mut w);
        match crate::connection::get().map(|c| c.call(w)) {
            Some(Ok(_)) => {}
            _ => return,
        }
    }
}

/// Splits [addr, addr+len) into pieces of at most one batch each.
fn pieces(addr: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(SVM_SYNC_BATCH)
        .map(move |off| (addr + off, (len - off).min(SVM_SYNC_BATCH)))
}

/// Groups ranges (each at most one batch long) into batches of at most SVM_SYNC_BATCH bytes,
/// so that no request or reply of a synchronisation outgrows a frame.
fn batches(ranges: &[(usize, usize)]) -> Vec<&[(usize, usize)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, n)) in ranges.iter().enumerate() {
        if i > start && bytes + n > SVM_SYNC_BATCH {
            out.push(&ranges[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < ranges.len() {
        out.push(&ranges[start..]);
    }
    out
}

/// After a synchronisation point: take what the device changed in fine-grained SVM (where the
/// host did not change the same bytes meanwhile).
pub fn pull_fine() {
    if FINE_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return;
    }
    let mut fine = FINE.lock().unwrap_or_else(|e| e.into_inner());
    for f in fine.iter_mut() {
        let pieces: Vec<(usize, usize)> = pieces(f.ptr, f.len).collect();
        for batch in batches(&pieces) {
            let mut w = Writer::new(wormhole_opencl_proto::control::SVM_PULL);
            req::SvmPull {
                ranges: batch.iter().map(|(addr, n)| (*addr as u64, *n)).collect(),
            }
            .encode(&mut w);
            let Some(Ok(reply)) = crate::connection::get().map(|c| c.call(w)) else {
                return;
            };
            let Ok(Ok(pulled)) = req::Reply::<req::SvmPulled>::decode_all(&reply) else {
                return;
            };
            if pulled.ranges.len() != batch.len() {
                return;
            }
            for ((addr, n), dev) in batch.iter().zip(pulled.ranges) {
                if dev.len() != *n {
                    return;
                }
                let at = addr - f.ptr;
                // SAFETY: the mirror covers [ptr, ptr+len) and this piece lies inside it; only
                // this lock's holder merges into it.
                let host = unsafe { std::slice::from_raw_parts_mut(*addr as *mut u8, *n) };
                let snap = &mut f.snapshot[at..at + n];
                for i in 0..*n {
                    if dev[i] != snap[i] {
                        if host[i] == snap[i] {
                            host[i] = dev[i];
                        }
                        snap[i] = dev[i];
                    }
                }
            }
        }
    }
}

fn forget_fine(p: usize) {
    let mut fine = FINE.lock().unwrap_or_else(|e| e.into_inner());
    let before = fine.len();
    fine.retain(|f| f.ptr != p);
    if fine.len() != before {
        FINE_COUNT.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Open SVM maps: (address, length, writes back on unmap, the id a non-blocking map's bytes
/// are collected under).
static MAPS: Mutex<Vec<(usize, usize, bool, u64)>> = Mutex::new(Vec::new());

fn page_range(p: usize, len: usize) -> Option<std::ops::Range<usize>> {
    let end = p.checked_add(len.max(1))?.checked_add(PAGE - 1)? & !(PAGE - 1);
    Some((p & !(PAGE - 1))..end)
}

/// The length of `[p, p + size)` (`size` 0: to the end of its allocation) if it lies in one
/// coarse-grained allocation; fine-grained memory is made coherent at synchronisation points.
fn coarse_range(p: usize, size: usize) -> Option<usize> {
    let allocs = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
    let (&start, &len) = allocs.range(..=p).next_back()?;
    let end = start.checked_add(len)?;
    let size = if size == 0 { end.checked_sub(p)? } else { size };
    if p >= end || p.checked_add(size)? > end || size == 0 {
        return None;
    }
    drop(allocs);
    let fine = FINE.lock().unwrap_or_else(|e| e.into_inner());
    (!fine.iter().any(|f| f.ptr == start)).then_some(size)
}

/// Whether [p, p+len) lies inside one SVM allocation.
pub fn is_svm(p: usize, len: usize) -> bool {
    let a = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
    match a.range(..=p).next_back() {
        Some((start, n)) => p.checked_add(len).is_some_and(|end| end <= start + n),
        None => false,
    }
}

fn server_free(ctx_id: u64, p: usize) {
    let w = encode(
        Op::clSVMFree,
        &req::SvmFree {
            context: ctx_id,
            ptr: p as u64,
        },
    );
    let _ = rt::call(w);
}

/// Maps fresh memory at exactly `start` (never replacing anything: fails on a collision).
fn map_exact(start: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE fails instead of touching an existing mapping.
    let r = unsafe {
        libc::mmap(
            start as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return false;
    }
    if r as usize != start {
        // Old kernels treat the address as a hint only.
        // SAFETY: we just mapped `r`.
        unsafe { libc::munmap(r, len) };
        return false;
    }
    true
}

/// Mirrors [p, p+len) at the same address: maps the pages no mirror covers yet.
fn mirror(p: usize, len: usize) -> bool {
    let Some(range) = page_range(p, len) else {
        return false;
    };
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    let mut mapped: Vec<(usize, usize)> = Vec::new();
    let mut page = range.start;
    while page < range.end {
        if pages.contains_key(&page) {
            page += PAGE;
            continue;
        }
        let run_start = page;
        while page < range.end && !pages.contains_key(&page) {
            page += PAGE;
        }
        if !map_exact(run_start, page - run_start) {
            for (s, n) in mapped {
                // SAFETY: runs mapped just above.
                unsafe { libc::munmap(s as *mut c_void, n) };
            }
            return false;
        }
        mapped.push((run_start, page - run_start));
    }
    for pg in range.step_by(PAGE) {
        *pages.entry(pg).or_insert(0) += 1;
    }
    ALLOCS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p, len);
    true
}

fn unmirror(p: usize) {
    forget_fine(p);
    let Some(len) = ALLOCS.lock().unwrap_or_else(|e| e.into_inner()).remove(&p) else {
        return;
    };
    let Some(range) = page_range(p, len) else {
        return;
    };
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    for pg in range.step_by(PAGE) {
        if let Some(n) = pages.get_mut(&pg) {
            *n -= 1;
            if *n == 0 {
                pages.remove(&pg);
                // SAFETY: the last allocation mirrored in this page is gone.
                unsafe { libc::munmap(pg as *mut c_void, PAGE) };
            }
        }
    }
}

pub unsafe extern "C" fn clSVMAlloc(
    context: Handle,
    flags: u64,
    size: usize,
    alignment: u32,
) -> *mut c_void {
    // SAFETY: the application's handle.
    let Ok(ctx) = (unsafe { obj(context, HandleKind::Context) }) else {
        return std::ptr::null_mut();
    };
    // The server's address may already be in use here; then ask for another (holding the
    // refused ones so the driver does not hand them out again) and give those back after.
    let mut refused = Vec::new();
    let mut result = std::ptr::null_mut();
    for _ in 0..8 {
        let w = encode(
            Op::clSVMAlloc,
            &req::SvmAlloc {
                context: ctx.id,
                flags,
                size,
                alignment,
            },
        );
        let Ok(reply) = rt::call(w) else { break };
        let p = req::SvmAllocReply::decode_all(&reply).map_or(0, |r| r.ptr) as usize;
        if p == 0 {
            break;
        }
        if mirror(p, size) {
            result = p as *mut c_void;
            if flags & CL_MEM_SVM_FINE_GRAIN_BUFFER != 0 {
                // Start from what the device holds, agreed by both sides.
                let mut fine = FINE.lock().unwrap_or_else(|e| e.into_inner());
                fine.push(Fine {
                    ptr: p,
                    len: size,
                    snapshot: vec![0; size],
                });
                FINE_COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                drop(fine);
                pull_fine();
            }
            break;
        }
        refused.push(p);
    }
    if result.is_null() && !refused.is_empty() {
        crate::connection::log(&format!(
            "clSVMAlloc of {size} bytes fails: none of the {} addresses the server's driver \
             offered is free in this process (SVM lives at the same address on both sides)",
            refused.len()
        ));
    }
    for p in refused {
        server_free(ctx.id, p);
    }
    result
}

pub unsafe extern "C" fn clSVMFree(context: Handle, ptr: *mut c_void) {
    // SAFETY: the application's handle.
    let Ok(ctx) = (unsafe { obj(context, HandleKind::Context) }) else {
        return;
    };
    if ptr.is_null()
        || !ALLOCS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(ptr as usize))
    {
        return;
    }
    server_free(ctx.id, ptr as usize);
    unmirror(ptr as usize);
}

/// An application's SVM free function, with what it is to be called with.
struct FreeCall {
    queue: usize,
    ptrs: Vec<usize>,
    pfn: usize,
    user_data: usize,
}

type SvmFreeFn = unsafe extern "C" fn(*mut c_void, u32, *mut *mut c_void, *mut c_void);

/// Runs on the callback thread when the server's driver reaches a `clEnqueueSVMFree` that
/// named a free function.
unsafe extern "C" fn run_free_call(_queue: *mut c_void, call: *mut c_void) {
    // SAFETY: the Box<FreeCall> registered with this callback, which fires once.
    let mut call = unsafe { Box::from_raw(call as *mut FreeCall) };
    // SAFETY: the application's function of this signature.
    let f = unsafe { std::mem::transmute::<usize, SvmFreeFn>(call.pfn) };
    // SAFETY: the arguments as the API specifies; the pointer array lives through the call.
    unsafe {
        f(
            call.queue as *mut c_void,
            call.ptrs.len() as u32,
            call.ptrs.as_mut_ptr() as *mut *mut c_void,
            call.user_data as *mut c_void,
        )
    };
}

pub unsafe extern "C" fn clEnqueueSVMFree(
    queue: Handle,
    count: u32,
    ptrs: *const *mut c_void,
    pfn: *const c_void,
    ud: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        if count == 0 || ptrs.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: `ptrs` holds `count` pointers.
        let list_ptrs: Vec<u64> = (0..count as usize)
            .map(|i| unsafe { *ptrs.add(i) } as u64)
            .collect();
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        // The application's free function runs here when the server's driver reaches the
        // command; it frees the pointers itself (clSVMFree), so nothing is unmirrored now.
        let callback = if pfn.is_null() {
            0
        } else {
            let call = Box::new(FreeCall {
                queue: queue as usize,
                ptrs: list_ptrs.iter().map(|p| *p as usize).collect(),
                pfn: pfn as usize,
                user_data: ud as usize,
            });
            rt::callbacks::register(
                CallbackKind::ObjectNotify,
                run_free_call as *const c_void,
                Box::into_raw(call) as *mut c_void,
            )?
        };
        let w = encode(
            Op::clEnqueueSVMFree,
            &req::EnqueueSvmFree {
                queue: q.id,
                ptrs: list_ptrs.clone(),
                wait,
                event: ev,
                callback,
            },
        );
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS && callback == 0 {
            list_ptrs.iter().for_each(|p| unmirror(*p as usize));
            // SAFETY: the application's `cl_event *` or NULL.
            unsafe { set_event(event, ev) };
        }
        Ok(st)
    })
}

pub unsafe extern "C" fn clEnqueueSVMMemcpy(
    queue: Handle,
    blocking: u32,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        if dst.is_null() || src.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let copy = match (is_svm(dst as usize, size), is_svm(src as usize, size)) {
            (true, true) => req::SvmCopy::SvmToSvm,
            // SAFETY: `src` holds `size` bytes.
            (true, false) => req::SvmCopy::HostToSvm(unsafe {
                std::slice::from_raw_parts(src as *const u8, size)
            }),
            (false, true) => req::SvmCopy::SvmToHost,
            // Host to host: the device still runs it, in order, with an SVM copy's event.
            // SAFETY: `src` holds `size` bytes.
            (false, false) => req::SvmCopy::HostToHost(unsafe {
                std::slice::from_raw_parts(src as *const u8, size)
            }),
        };
        let to_host = matches!(copy, req::SvmCopy::SvmToHost | req::SvmCopy::HostToHost(_));
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        let deferred = to_host && blocking == 0;
        let read = if deferred { rt::alloc_id() } else { 0 };
        let w = encode(
            Op::clEnqueueSVMMemcpy,
            &req::SvmMemcpy {
                queue: q.id,
                blocking,
                copy,
                dst: dst as u64,
                src: src as u64,
                size,
                wait,
                event: ev,
                read,
            },
        );
        let reply = rt::call(w)?;
        let mut r = Reader::new(&reply);
        let copied = match req::Reply::<req::SvmCopied>::decode(&mut r)? {
            Ok(c) => c,
            Err(st) => return Ok(st),
        };
        let data = copied.data(&mut r)?;
        r.finish()?;
        if deferred {
            // The bytes land at the next synchronisation point, as a non-blocking read's.
            let to = rt::pending::Scatter::Plain {
                dst: dst as usize,
                len: size,
            };
            rt::pending::defer(read, to, true);
        } else if to_host {
            let data = data.ok_or(ClErr(CL_OUT_OF_RESOURCES))?;
            // SAFETY: `dst` holds `size` bytes; the server sent exactly `size`.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len().min(size))
            };
        }
        // SAFETY: as above.
        unsafe { set_event(event, ev) };
        if blocking != 0 {
            // A blocking copy has waited for the queue: earlier non-blocking reads land now.
            rt::after_sync();
        }
        Ok(CL_SUCCESS)
    })
}

pub unsafe extern "C" fn clEnqueueSVMMemFill(
    queue: Handle,
    ptr: *mut c_void,
    pattern: *const c_void,
    pattern_size: usize,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        if ptr.is_null() || pattern.is_null() || pattern_size == 0 || pattern_size > 128 {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the pattern has `pattern_size` bytes.
        let pattern = unsafe { std::slice::from_raw_parts(pattern as *const u8, pattern_size) };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        let w = encode(
            Op::clEnqueueSVMMemFill,
            &req::SvmMemFill {
                queue: q.id,
                ptr: ptr as u64,
                pattern,
                size,
                wait,
                event: ev,
            },
        );
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
            // SAFETY: as above.
            unsafe { set_event(event, ev) };
        }
        Ok(st)
    })
}

pub unsafe extern "C" fn clEnqueueSVMMap(
    queue: Handle,
    blocking: u32,
    flags: u64,
    ptr: *mut c_void,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        if ptr.is_null() || size == 0 || !is_svm(ptr as usize, size) {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        let read = rt::alloc_id();
        let w = encode(
            Op::clEnqueueSVMMap,
            &req::SvmMap {
                queue: q.id,
                blocking,
                flags,
                ptr: ptr as u64,
                size,
                wait,
                event: ev,
                read,
            },
        );
        let reply = rt::call(w)?;
        let mapped = match req::Reply::<req::SvmMapped>::decode_all(&reply)? {
            Ok(m) => m,
            Err(st) => return Ok(st),
        };
        if mapped.deferred {
            // A non-blocking map: the bytes land at the next synchronisation point.
            let to = rt::pending::Scatter::Plain {
                dst: ptr as usize,
                len: size,
            };
            rt::pending::defer(read, to, false);
        }
        let data = mapped.data;
        // SAFETY: the mirror covers [ptr, ptr+size) (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len().min(size))
        };
        let writes = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        MAPS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((ptr as usize, size, writes, read));
        // SAFETY: as above.
        unsafe { set_event(event, ev) };
        if blocking != 0 {
            // A blocking map has waited for the queue: earlier non-blocking reads land now.
            rt::after_sync();
        }
        Ok(CL_SUCCESS)
    })
}

pub unsafe extern "C" fn clEnqueueSVMUnmap(
    queue: Handle,
    ptr: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        let (addr, size, writes, read) = {
            let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|m| m.0 == ptr as usize)
                .ok_or(ClErr(CL_INVALID_VALUE))?;
            maps.remove(i)
        };
        // Bytes of the map not collected yet must not land after the unmap, and the mirror
        // (which never received them) does not go back either.
        let uncollected = rt::pending::forget(read);
        // SAFETY: the mirror covers the mapped range.
        let data = (writes && !uncollected)
            .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, size) });
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        let w = encode(
            Op::clEnqueueSVMUnmap,
            &req::SvmUnmap {
                queue: q.id,
                ptr: addr as u64,
                data,
                wait,
                event: ev,
            },
        );
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
            // SAFETY: as above.
            unsafe { set_event(event, ev) };
        } else {
            MAPS.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((addr, size, writes, read));
        }
        Ok(st)
    })
}

pub unsafe extern "C" fn clSetKernelArgSVMPointer(
    kernel: Handle,
    index: u32,
    value: *const c_void,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let k = unsafe { obj(kernel, HandleKind::Kernel) }?;
        let w = encode(
            Op::clSetKernelArgSVMPointer,
            &req::SetKernelArgSvmPointer {
                kernel: k.id,
                index,
                ptr: value as u64,
            },
        );
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
            // A launch is known by every setting the kernel had, this one too.
            super::kernel::note_setting(k, index, (value as usize, super::kernel::ARG_SVM));
        }
        Ok(st)
    })
}

pub unsafe extern "C" fn clSetKernelExecInfo(
    kernel: Handle,
    param: u32,
    size: usize,
    value: *const c_void,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let k = unsafe { obj(kernel, HandleKind::Kernel) }?;
        // (0, NULL) is an empty SVM pointer set; the driver judges it for other params.
        if (value.is_null() && size != 0) || size > 1 << 20 {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let value = if value.is_null() {
            &[][..]
        } else {
            // SAFETY: `value` holds `size` bytes.
            unsafe { std::slice::from_raw_parts(value as *const u8, size) }
        };
        let w = encode(
            Op::clSetKernelExecInfo,
            &req::SetKernelExecInfo {
                kernel: k.id,
                param,
                value,
            },
        );
        Ok(Reader::new(&rt::call(w)?).i32()?)
    })
}

pub unsafe extern "C" fn clEnqueueSVMMigrateMem(
    queue: Handle,
    count: u32,
    ptrs: *const *const c_void,
    sizes: *const usize,
    flags: u64,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handle.
        let q = unsafe { obj(queue, HandleKind::Queue) }?;
        if count == 0 || ptrs.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: `ptrs` (and `sizes` if given) hold `count` entries.
        let p: Vec<u64> = (0..count as usize)
            .map(|i| unsafe { *ptrs.add(i) } as u64)
            .collect();
        let s: Option<Vec<u64>> = (!sizes.is_null()).then(|| {
            (0..count as usize)
                // SAFETY: `sizes` holds `count` entries.
                .map(|i| unsafe { *sizes.add(i) } as u64)
                .collect()
        });
        // A migration to the host brings each coarse-grained range's bytes into the mirror
        // when it completes (landing at the next synchronisation point, as a read's do).
        let reads: Vec<(u64, usize, usize)> = if flags & CL_MIGRATE_MEM_OBJECT_HOST != 0 {
            p.iter()
                .enumerate()
                .map(|(i, &ptr)| {
                    let size = s.as_ref().map_or(0, |v| v[i] as usize);
                    match coarse_range(ptr as usize, size) {
                        Some(len) => (rt::alloc_id(), ptr as usize, len),
                        None => (0, ptr as usize, 0),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev) = unsafe { wait_and_event(n, list, event) }?;
        let w = encode(
            Op::clEnqueueSVMMigrateMem,
            &req::SvmMigrateMem {
                queue: q.id,
                ptrs: p,
                sizes: s,
                flags,
                wait,
                event: ev,
                host_reads: reads.iter().map(|r| r.0).collect(),
                host_lens: reads.iter().map(|r| r.2 as u64).collect(),
            },
        );
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
            for (id, dst, len) in reads.into_iter().filter(|r| r.0 != 0) {
                rt::pending::defer(id, rt::pending::Scatter::Plain { dst, len }, false);
            }
            // SAFETY: as above.
            unsafe { set_event(event, ev) };
        }
        Ok(st)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronisations_are_split_into_bounded_batches() {
        let big: Vec<_> = pieces(0x1000, 3 * SVM_SYNC_BATCH + 5).collect();
        assert_eq!(big.len(), 4);
        assert!(big.iter().all(|(_, n)| *n <= SVM_SYNC_BATCH));
        assert_eq!(
            big.iter().map(|(_, n)| n).sum::<usize>(),
            3 * SVM_SYNC_BATCH + 5
        );
        assert_eq!(big[3], (0x1000 + 3 * SVM_SYNC_BATCH, 5));
        let small = [(0, 10), (100, SVM_SYNC_BATCH - 10), (200, 1), (300, 2)];
        let b = batches(&small);
        assert_eq!(b, vec![&small[..2], &small[2..]]);
        for batch in batches(&big) {
            assert!(batch.iter().map(|(_, n)| n).sum::<usize>() <= SVM_SYNC_BATCH);
        }
        assert!(batches(&[]).is_empty());
    }
}
