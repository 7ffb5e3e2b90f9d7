//! Coarse-grained shared virtual memory. The server allocates real SVM; the client mirrors each
//! allocation at the *same address* in its own process, so pointers inside SVM data mean the
//! same on both sides. Host and device meet only at map/unmap and copies, which is exactly the
//! coarse-grained contract: maps carry the bytes to the client's mirror, unmaps bring them back.
//! Every address from the client is checked against this session's allocations before the
//! driver sees it (a kernel dereferences SVM pointers as raw addresses).

use super::*;
use crate::session::ReadFrom;
use std::ffi::c_void;
use wormhole_opencl_proto::requests::{self as req, Message, Reply};
use wormhole_opencl_proto::{cl::*, Writer, SVM_SYNC_BATCH};

fn check(s: &Session, ptr: u64, len: usize) -> Result<*mut c_void, i32> {
    let p = usize::try_from(ptr).map_err(|_| CL_INVALID_VALUE)?;
    if s.svm_contains(p, len) {
        Ok(p as *mut c_void)
    } else {
        Err(CL_INVALID_VALUE)
    }
}

pub fn clSVMAlloc(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let req::SvmAlloc {
        context,
        flags,
        size,
        alignment,
    } = req::SvmAlloc::decode(r)?;
    r.finish()?;
    let ptr = (|| -> Option<usize> {
        let ctx = s.resolve(context, HandleKind::Context, false).ok()?;
        // SVM atomics would need memory both processes see coherently at every instant: not
        // offered. Fine-grained buffers are kept coherent at synchronisation points (push/pull).
        if flags & CL_MEM_SVM_ATOMICS != 0 || size == 0 {
            return None;
        }
        // SAFETY: plain allocation call on a live context.
        let p = unsafe { ffi::clSVMAlloc(ctx, flags, size, alignment) } as usize;
        if p == 0 {
            return None;
        }
        let len = size;
        if !s.limits().reserve(len as u64) {
            // SAFETY: just allocated, unknown to anyone else.
            unsafe { ffi::clSVMFree(ctx, p as *mut c_void) };
            return None;
        }
        s.svm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(p, len);
        Some(p)
    })();
    req::SvmAllocReply {
        ptr: ptr.unwrap_or(0) as u64,
    }
    .encode(w);
    Ok(())
}

pub fn clSVMFree(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let req::SvmFree { context, ptr } = req::SvmFree::decode(r)?;
    r.finish()?;
    if let (Ok(ctx), Ok(p)) = (
        s.resolve(context, HandleKind::Context, false),
        usize::try_from(ptr),
    ) {
        let freed = s.svm.lock().unwrap_or_else(|p| p.into_inner()).remove(&p);
        if let Some(len) = freed {
            // SAFETY: `p` is an allocation of this session, freed once.
            unsafe { ffi::clSVMFree(ctx, p as *mut c_void) };
            s.limits().release(len as u64);
        }
    }
    w.i32(CL_SUCCESS);
    Ok(())
}

pub fn clEnqueueSVMFree(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::EnqueueSvmFree {
        queue,
        ptrs,
        wait,
        event: event_id,
        callback,
    } = req::EnqueueSvmFree::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        let (n, list) = wl.resolve(s)?;
        let mut svm = s.svm.lock().unwrap_or_else(|p| p.into_inner());
        let mut raw = Vec::with_capacity(ptrs.len());
        for p in &ptrs {
            let p = usize::try_from(*p).map_err(|_| CL_INVALID_VALUE)?;
            if !svm.contains_key(&p) {
                return Err(CL_INVALID_VALUE);
            }
            raw.push(p as *mut c_void);
        }
        let mut ev = EventOut::new(s, event_id)?;
        // With the application's free function, the driver frees nothing: the function (run
        // in the client) frees the pointers through clSVMFree, which keeps the books then.
        let (f, ud) = crate::callbacks::make_svm_free(callback, queue);
        // SAFETY: every pointer is a live allocation of this session; the driver frees them,
        // or calls `f` with `ud` once.
        let st = unsafe {
            ffi::clEnqueueSVMFree(
                q,
                raw.len() as u32,
                raw.as_mut_ptr() as *mut c_void,
                f as *mut c_void,
                ud,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(false) as *mut c_void,
            )
        };
        if st == CL_SUCCESS && callback != 0 {
            release_own(event_id, ev.finish(s));
        } else if st == CL_SUCCESS {
            for p in &raw {
                if let Some(len) = svm.remove(&(*p as usize)) {
                    s.limits().release(len as u64);
                }
            }
            release_own(event_id, ev.finish(s));
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clEnqueueSVMMemcpy(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SvmMemcpy {
        queue,
        blocking,
        copy,
        dst,
        src,
        size,
        wait,
        event: event_id,
        read,
    } = req::SvmMemcpy::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        let (n, list) = wl.resolve(s)?;
        let mut ev = EventOut::new(s, event_id)?;
        let l = list_ptr(&list) as *mut c_void;
        match copy {
            req::SvmCopy::SvmToSvm => {
                let (d, sp) = (check(s, dst, size)?, check(s, src, size)?);
                // SAFETY: both ranges lie in this session's SVM allocations.
                let st = unsafe {
                    ffi::clEnqueueSVMMemcpy(
                        q,
                        blocking,
                        d,
                        sp,
                        size,
                        n,
                        l,
                        ev.ptr(false) as *mut c_void,
                    )
                };
                if st != CL_SUCCESS {
                    return Err(st);
                }
                release_own(event_id, ev.finish(s));
            }
            req::SvmCopy::HostToSvm(data) => {
                let d = check(s, dst, size)?;
                if data.len() != size {
                    return Err(CL_INVALID_VALUE);
                }
                let staging = data.to_vec();
                // SAFETY: `d` lies in SVM; `staging` holds `size` bytes and lives until the
                // copy completes (kept by the completion hook below).
                let st = unsafe {
                    ffi::clEnqueueSVMMemcpy(
                        q,
                        blocking,
                        d,
                        staging.as_ptr() as *mut c_void,
                        size,
                        n,
                        l,
                        ev.ptr(true) as *mut c_void,
                    )
                };
                if st != CL_SUCCESS {
                    return Err(st);
                }
                let event = ev.finish(s);
                crate::callbacks::on_event_complete(event, move || drop(staging));
                release_own(event_id, event);
            }
            req::SvmCopy::SvmToHost | req::SvmCopy::HostToHost(_) => {
                // A copy between two plain host buffers goes through the device too, from a
                // staging copy of the source, so it is ordered (and its event typed) as natively.
                let staged = match copy {
                    req::SvmCopy::HostToHost(data) if data.len() == size => Some(data.to_vec()),
                    req::SvmCopy::HostToHost(_) => return Err(CL_INVALID_VALUE),
                    _ => None,
                };
                let sp = match &staged {
                    Some(v) => v.as_ptr() as *mut c_void,
                    None => check(s, src, size)?,
                };
                if blocking == 0 {
                    // Into a staging buffer the client collects at its next synchronisation
                    // point, as for a non-blocking read: the copy may wait on a user event only
                    // the client can complete.
                    if read == 0 {
                        return Err(CL_INVALID_VALUE);
                    }
                    let held = s.hold_in_flight(size)?;
                    let mut data = vec![0u8; size];
                    // SAFETY: `sp` lies in SVM or in `staged`; `data` holds `size` bytes; both
                    // live until the copy completes (the pending read, the hook below).
                    let st = unsafe {
                        ffi::clEnqueueSVMMemcpy(
                            q,
                            CL_FALSE,
                            data.as_mut_ptr() as *mut c_void,
                            sp,
                            size,
                            n,
                            l,
                            ev.ptr(true) as *mut c_void,
                        )
                    };
                    if st != CL_SUCCESS {
                        return Err(st);
                    }
                    let event = ev.finish(s);
                    if let Some(v) = staged {
                        crate::callbacks::on_event_complete(event, move || drop(v));
                    }
                    s.defer_read_held(
                        read,
                        ReadFrom::Staging(std::sync::Arc::new(data)),
                        event,
                        Some(held),
                    );
                } else {
                    let mark = w.mark();
                    Reply::Ok(req::SvmCopied {
                        to_host: Some(size as u64),
                    })
                    .encode(w);
                    let evp = ev.ptr(false) as *mut c_void;
                    // The driver copies straight into the reply.
                    let filled = w.filled_by(size, |dst| {
                        // SAFETY: `sp` lies in SVM or in `staged`; `dst` has room for `size`
                        // bytes; the copy is blocking.
                        match unsafe {
                            ffi::clEnqueueSVMMemcpy(
                                q,
                                CL_TRUE,
                                dst as *mut c_void,
                                sp,
                                size,
                                n,
                                l,
                                evp,
                            )
                        } {
                            CL_SUCCESS => Ok(()),
                            st => Err(st),
                        }
                    });
                    if let Err(st) = filled {
                        w.rewind(mark);
                        return Err(st);
                    }
                    release_own(event_id, ev.finish(s));
                    return Ok(());
                }
            }
        }
        Reply::Ok(req::SvmCopied { to_host: None }).encode(w);
        Ok(())
    };
    if let Err(e) = run(w) {
        Reply::<req::SvmCopied>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueSVMMemFill(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SvmMemFill {
        queue,
        ptr,
        pattern,
        size,
        wait,
        event: event_id,
    } = req::SvmMemFill::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        let p = check(s, ptr, size)?;
        let (n, list) = wl.resolve(s)?;
        let mut ev = EventOut::new(s, event_id)?;
        // SAFETY: the range lies in SVM; the driver copies the pattern at enqueue time.
        let st = unsafe {
            ffi::clEnqueueSVMMemFill(
                q,
                p,
                pattern.as_ptr() as *mut c_void,
                pattern.len(),
                size,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(false) as *mut c_void,
            )
        };
        if st == CL_SUCCESS {
            release_own(event_id, ev.finish(s));
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clEnqueueSVMMap(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let req::SvmMap {
        queue,
        blocking,
        flags,
        ptr,
        size,
        wait,
        event: event_id,
        read,
    } = req::SvmMap::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        let p = check(s, ptr, size)?;
        let (n, list) = wl.resolve(s)?;
        let mut ev = EventOut::new(s, event_id)?;
        let invalidates = flags & CL_MAP_WRITE_INVALIDATE_REGION != 0;
        // A blocking map's bytes travel with the reply. A non-blocking one returns at once, as
        // natively (it may wait on a user event only the client can complete), and its bytes
        // are collected under `read` at the client's next synchronisation point.
        let deferred = blocking == 0 && !invalidates;
        if deferred && read == 0 {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the range lies in SVM.
        let st = unsafe {
            ffi::clEnqueueSVMMap(
                q,
                if blocking != 0 { CL_TRUE } else { CL_FALSE },
                flags,
                p,
                size,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(deferred) as *mut c_void,
            )
        };
        if st != CL_SUCCESS {
            return Err(st);
        }
        let event = ev.finish(s);
        if deferred {
            s.defer_read(
                read,
                ReadFrom::Svm {
                    ptr: p as usize,
                    len: size,
                },
                event,
            );
        } else {
            release_own(event_id, event);
        }
        let data = if invalidates || deferred {
            &[][..]
        } else {
            // SAFETY: the mapped range is readable host memory now (a blocking map).
            unsafe { std::slice::from_raw_parts(p as *const u8, size) }
        };
        Reply::Ok(req::SvmMapped { deferred, data }).encode(w);
        Ok(())
    };
    if let Err(e) = run(w) {
        Reply::<req::SvmMapped>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueSVMUnmap(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SvmUnmap {
        queue,
        ptr,
        data,
        wait,
        event: event_id,
    } = req::SvmUnmap::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        let p = check(s, ptr, data.map_or(0, |d| d.len()))?;
        let (n, list) = wl.resolve(s)?;
        // A non-blocking map's bytes not collected yet are not wanted any more.
        let uncollected: Vec<_> = {
            let mut pending = s.pending_reads.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, r)| matches!(r.from, ReadFrom::Svm { ptr, .. } if ptr == p as usize))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        // What the client sends back for a map whose bytes it never received never held them.
        let never_received = !uncollected.is_empty();
        for r in uncollected {
            release_own(0, r.event);
        }
        if let Some(d) = data.filter(|_| !never_received) {
            // SAFETY: the range lies in SVM and is mapped for the host.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), p as *mut u8, d.len()) };
        }
        let mut ev = EventOut::new(s, event_id)?;
        // SAFETY: unmapping what was mapped.
        let st = unsafe {
            ffi::clEnqueueSVMUnmap(
                q,
                p,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(false) as *mut c_void,
            )
        };
        if st == CL_SUCCESS {
            release_own(event_id, ev.finish(s));
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clSetKernelArgSVMPointer(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SetKernelArgSvmPointer { kernel, index, ptr } =
        req::SetKernelArgSvmPointer::decode(r)?;
    r.finish()?;
    let run = || -> Result<i32, i32> {
        let k = s.resolve(kernel, HandleKind::Kernel, false)?;
        let p = if ptr == 0 {
            std::ptr::null_mut()
        } else {
            check(s, ptr, 0).map_err(|_| CL_INVALID_ARG_VALUE)?
        };
        // SAFETY: the pointer is NULL or inside this session's SVM.
        Ok(unsafe { ffi::clSetKernelArgSVMPointer(k, index, p) })
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clSetKernelExecInfo(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SetKernelExecInfo {
        kernel,
        param,
        value,
    } = req::SetKernelExecInfo::decode(r)?;
    r.finish()?;
    let run = || -> Result<i32, i32> {
        let k = s.resolve(kernel, HandleKind::Kernel, false)?;
        if param == CL_KERNEL_EXEC_INFO_SVM_PTRS {
            for c in value.chunks(8) {
                let p = u64::from_le_bytes(c.try_into().map_err(|_| CL_INVALID_VALUE)?);
                // NULL entries are the driver's to judge (it never dereferences them).
                if p != 0 {
                    check(s, p, 0)?;
                }
            }
        }
        // An empty value is NULL, as the application passed it (an empty SVM pointer set
        // clears the kernel's list).
        let ptr = if value.is_empty() {
            std::ptr::null_mut()
        } else {
            value.as_ptr() as *mut c_void
        };
        // SAFETY: `ptr` is NULL or holds `value.len()` bytes; SVM pointers inside were checked.
        Ok(unsafe { ffi::clSetKernelExecInfo(k, param, value.len(), ptr) })
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clEnqueueSVMMigrateMem(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::SvmMigrateMem {
        queue,
        ptrs,
        sizes,
        flags,
        wait,
        event: event_id,
        host_reads,
        host_lens,
    } = req::SvmMigrateMem::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let q = s.resolve(queue, HandleKind::Queue, false)?;
        if sizes.as_ref().is_some_and(|v| v.len() != ptrs.len()) {
            return Err(CL_INVALID_VALUE);
        }
        // A migration to the host brings coarse-grained ranges' bytes into the client's
        // mirror once it completes: memory the host shares with the device (PoCL's) shows
        // them there natively, without a map (Boost.Compute's tests read it so).
        let mut reads = Vec::new();
        if !host_reads.is_empty() {
            if flags & CL_MIGRATE_MEM_OBJECT_HOST == 0
                || host_reads.len() != ptrs.len()
                || host_lens.len() != ptrs.len()
            {
                return Err(CL_INVALID_VALUE);
            }
            for ((&id, &len), &p) in host_reads.iter().zip(&host_lens).zip(&ptrs) {
                if id != 0 && len != 0 {
                    let len = usize::try_from(len).map_err(|_| CL_INVALID_VALUE)?;
                    check(s, p, len)?;
                    reads.push((id, p as usize, len));
                }
            }
        }
        let mut raw = Vec::with_capacity(ptrs.len());
        let mut lens = Vec::with_capacity(ptrs.len());
        for (i, p) in ptrs.iter().enumerate() {
            let len = sizes.as_ref().map_or(0, |v| v[i] as usize);
            // A NULL pointer goes to the driver as it came: what it answers is native.
            raw.push(if *p == 0 {
                std::ptr::null_mut()
            } else {
                check(s, *p, len)?
            });
            lens.push(len);
        }
        let (n, list) = wl.resolve(s)?;
        let mut ev = EventOut::new(s, event_id)?;
        // SAFETY: every range lies in this session's SVM.
        let st = unsafe {
            ffi::clEnqueueSVMMigrateMem(
                q,
                raw.len() as u32,
                raw.as_ptr() as *mut c_void,
                if sizes.is_some() {
                    lens.as_ptr() as *mut c_void
                } else {
                    std::ptr::null_mut()
                },
                flags,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(!reads.is_empty()) as *mut c_void,
            )
        };
        if st == CL_SUCCESS {
            let event = ev.finish(s);
            for (id, ptr, len) in reads {
                // SAFETY: a live event; each deferred read holds a reference of its own.
                unsafe { ffi::clRetainEvent(event) };
                s.defer_read(id, ReadFrom::Svm { ptr, len }, event);
            }
            release_own(event_id, event);
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// Applies the bytes the host changed in fine-grained SVM.
pub fn svm_push(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let runs = req::SvmPush::decode(r)?.runs;
    r.finish()?;
    if runs.iter().map(|(_, b)| b.len()).sum::<usize>() > SVM_SYNC_BATCH {
        tracing::warn!("refused an SVM push larger than a batch");
        w.i32(CL_INVALID_VALUE);
        return Ok(());
    }
    for (addr, bytes) in &runs {
        if check(s, *addr, bytes.len()).is_err() {
            w.i32(CL_INVALID_VALUE);
            return Ok(());
        }
    }
    for (addr, bytes) in runs {
        // SAFETY: the range lies in this session's SVM, which is host-accessible memory for
        // fine-grained allocations; concurrent device writes to the same bytes would be a data
        // race in the application too.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as usize as *mut u8, bytes.len())
        };
    }
    w.i32(CL_SUCCESS);
    Ok(())
}

/// Sends the current contents of fine-grained SVM ranges.
pub fn svm_pull(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let ranges = req::SvmPull::decode(r)?.ranges;
    r.finish()?;
    // The reply must fit a frame, whatever the request asks for.
    let total = ranges
        .iter()
        .try_fold(0usize, |acc, (_, l)| acc.checked_add(*l));
    if total.is_none_or(|t| t > SVM_SYNC_BATCH) {
        tracing::warn!("refused an SVM pull larger than a batch");
        w.i32(CL_INVALID_VALUE);
        return Ok(());
    }
    if ranges.iter().any(|(a, l)| check(s, *a, *l).is_err()) {
        w.i32(CL_INVALID_VALUE);
        return Ok(());
    }
    Reply::Ok(req::SvmPulled {
        ranges: ranges
            .iter()
            // SAFETY: as above; the range was checked.
            .map(|&(addr, len)| unsafe {
                std::slice::from_raw_parts(addr as usize as *const u8, len)
            })
            .collect(),
    })
    .encode(w);
    Ok(())
}
