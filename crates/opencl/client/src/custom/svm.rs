//! Coarse-grained shared virtual memory (see the server's `custom/svm.rs`): each allocation is
//! mirrored in this process at the address the server's driver chose, so SVM pointers — and
//! pointers stored inside SVM data — mean the same on both sides. The host sees device data
//! through maps and copies, as the coarse-grained contract requires.

use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;
use wormhole_opencl_proto::{Op, Reader, Writer, SVM_SYNC_BATCH};

const PAGE: usize = 4096;
const COPY_SVM_TO_SVM: u8 = 0;
const COPY_HOST_TO_SVM: u8 = 1;
const COPY_SVM_TO_HOST: u8 = 2;

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
        w.u32(batch.len() as u32);
        for (addr, n) in batch {
            w.u64(*addr as u64);
            // SAFETY: inside a mirror, as above.
            w.bytes(unsafe { std::slice::from_raw_parts(*addr as *const u8, *n) });
        }
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
            w.u32(batch.len() as u32);
            for (addr, n) in batch {
                w.u64(*addr as u64);
                w.usize(*n);
            }
            let Some(Ok(reply)) = crate::connection::get().map(|c| c.call(w)) else {
                return;
            };
            let mut r = Reader::new(&reply);
            if r.i32() != Ok(CL_SUCCESS) {
                return;
            }
            for (addr, n) in batch {
                let Ok(dev) = r.bytes() else { return };
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

/// Open SVM maps: (address, length, writes back on unmap).
static MAPS: Mutex<Vec<(usize, usize, bool)>> = Mutex::new(Vec::new());

fn page_range(p: usize, len: usize) -> Option<std::ops::Range<usize>> {
    let end = p.checked_add(len.max(1))?.checked_add(PAGE - 1)? & !(PAGE - 1);
    Some((p & !(PAGE - 1))..end)
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
    let mut w = rt::request(Op::clSVMFree);
    w.u64(ctx_id);
    w.u64(p as u64);
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
        let mut w = rt::request(Op::clSVMAlloc);
        w.u64(ctx.id);
        w.u64(flags);
        w.usize(size);
        w.u32(alignment);
        let Ok(reply) = rt::call(w) else { break };
        let p = Reader::new(&reply).u64().unwrap_or(0) as usize;
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

pub unsafe extern "C" fn clEnqueueSVMFree(
    queue: Handle,
    count: u32,
    ptrs: *const *mut c_void,
    pfn: *const c_void,
    _ud: *mut c_void,
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
        if !pfn.is_null() {
            rt::log_unsupported("clEnqueueSVMFree with a free callback");
            return Err(ClErr(CL_INVALID_OPERATION));
        }
        // SAFETY: `ptrs` holds `count` pointers.
        let list_ptrs: Vec<u64> = (0..count as usize)
            .map(|i| unsafe { *ptrs.add(i) } as u64)
            .collect();
        let mut w = rt::request(Op::clEnqueueSVMFree);
        w.u64(q.id);
        w.opt_u64s(Some(&list_ptrs));
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
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
        let mode = match (is_svm(dst as usize, size), is_svm(src as usize, size)) {
            (true, true) => COPY_SVM_TO_SVM,
            (true, false) => COPY_HOST_TO_SVM,
            (false, true) => COPY_SVM_TO_HOST,
            (false, false) => {
                // Host to host: nothing for the device to do but order the event.
                // SAFETY: the application promises `size` bytes at both.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size) };
                // SAFETY: forwarded.
                return Ok(unsafe {
                    crate::generated::wire_clEnqueueMarkerWithWaitList(queue, n, list, event)
                });
            }
        };
        let mut w = rt::request(Op::clEnqueueSVMMemcpy);
        w.u64(q.id);
        w.u32(blocking);
        w.u8(mode);
        w.u64(dst as u64);
        w.u64(src as u64);
        w.usize(size);
        if mode == COPY_HOST_TO_SVM {
            // SAFETY: `src` holds `size` bytes.
            w.bytes(unsafe { std::slice::from_raw_parts(src as *const u8, size) });
        }
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
        let reply = rt::call(w)?;
        let mut r = Reader::new(&reply);
        let st = r.i32()?;
        if st != CL_SUCCESS {
            return Ok(st);
        }
        if mode == COPY_SVM_TO_HOST {
            let data = r.bytes()?;
            // SAFETY: `dst` holds `size` bytes; the server sent exactly `size`.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len().min(size))
            };
        }
        // SAFETY: as above.
        unsafe { set_event(event, ev) };
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
        let mut w = rt::request(Op::clEnqueueSVMMemFill);
        w.u64(q.id);
        w.u64(ptr as u64);
        // SAFETY: the pattern has `pattern_size` bytes.
        w.bytes(unsafe { std::slice::from_raw_parts(pattern as *const u8, pattern_size) });
        w.usize(size);
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
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
        let mut w = rt::request(Op::clEnqueueSVMMap);
        w.u64(q.id);
        w.u32(blocking);
        w.u64(flags);
        w.u64(ptr as u64);
        w.usize(size);
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
        let reply = rt::call(w)?;
        let mut r = Reader::new(&reply);
        let st = r.i32()?;
        if st != CL_SUCCESS {
            return Ok(st);
        }
        let data = r.bytes()?;
        // SAFETY: the mirror covers [ptr, ptr+size) (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len().min(size))
        };
        let writes = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        MAPS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((ptr as usize, size, writes));
        // SAFETY: as above.
        unsafe { set_event(event, ev) };
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
        let (addr, size, writes) = {
            let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|m| m.0 == ptr as usize)
                .ok_or(ClErr(CL_INVALID_VALUE))?;
            maps.remove(i)
        };
        let mut w = rt::request(Op::clEnqueueSVMUnmap);
        w.u64(q.id);
        w.u64(addr as u64);
        // SAFETY: the mirror covers the mapped range.
        w.opt_bytes(writes.then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, size) }));
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
            // SAFETY: as above.
            unsafe { set_event(event, ev) };
        } else {
            MAPS.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((addr, size, writes));
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
        let mut w = rt::request(Op::clSetKernelArgSVMPointer);
        w.u64(k.id);
        w.u32(index);
        w.u64(value as u64);
        Ok(Reader::new(&rt::call(w)?).i32()?)
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
        if value.is_null() || size > 1 << 20 {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let mut w = rt::request(Op::clSetKernelExecInfo);
        w.u64(k.id);
        w.u32(param);
        // SAFETY: `value` holds `size` bytes.
        w.bytes(unsafe { std::slice::from_raw_parts(value as *const u8, size) });
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
        let mut w = rt::request(Op::clEnqueueSVMMigrateMem);
        w.u64(q.id);
        w.opt_u64s(Some(&p));
        w.opt_u64s(s.as_deref());
        w.u64(flags);
        // SAFETY: the application's wait list and event pointer.
        let ev = unsafe { wait_and_event(&mut w, n, list, event) }?;
        let st = Reader::new(&rt::call(w)?).i32()?;
        if st == CL_SUCCESS {
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
