//! Data transfers and mappings. Blocking reads are read by the driver straight into the reply
//! frame; non-blocking ones, and those too large for one reply, land in a staging buffer that
//! the client collects (at its next synchronisation point, or at once), in parts if need be.
//! A write's data comes inline after its request, or staged before it in pieces (STAGE) when
//! the two do not fit one frame. Non-blocking writes keep the data in a staging buffer that
//! lives until the write's event completes.

use super::*;
use crate::generated::ffi;
use crate::session::{Call, MapRegion, Mapping, PendingRead, ReadFrom};
use std::ffi::c_void;
use std::sync::Arc;
use wormhole_opencl_proto::geometry::{image_span, rect_span};
use wormhole_opencl_proto::requests::{self as req, Message, Reply};
use wormhole_opencl_proto::{cl::*, Writer, TRANSFER_CHUNK};
use wormhole_server::backend::{StreamError, Streamed};
use wormhole_transport::TransportError;

/// Largest read whose data travels in its reply (it must fit one frame); larger ones wait for
/// COLLECT, which sends them in parts.
const MAX_TRANSFER: usize = (wormhole_opencl_proto::MAX_BODY as usize) - 4096;

/// A zeroed buffer of `len` bytes, or None if there is no such memory: a length from the
/// client must not abort the worker. Fresh pages are zero already and cost nothing until the
/// driver writes them.
fn zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` comes from the global allocator with the layout of `len` bytes, the
    // allocation a Vec<u8> of capacity `len` has, and all `len` bytes are initialised (zero).
    Some(unsafe { Vec::from_raw_parts(p, len, len) })
}

/// A write's bytes as they arrived: in the request's frame, or staged before it.
pub(crate) enum Bytes<'a> {
    Frame(&'a [u8]),
    Staged(Vec<u8>),
}

impl Bytes<'_> {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Frame(b) => b,
            Bytes::Staged(v) => v,
        }
    }

    /// The bytes in a buffer of their own, for a driver that reads them after the request is
    /// answered (staged bytes have one already).
    fn into_owned(self) -> Vec<u8> {
        match self {
            Bytes::Frame(b) => b.to_vec(),
            Bytes::Staged(v) => v,
        }
    }
}

/// Where a write's driver call reads its bytes.
pub(crate) enum Source<'a> {
    Bytes(Bytes<'a>),
    /// `len` bytes from `offset` of what a pending read brings (`WriteData::FromRead`): the
    /// driver reads them when the write runs, after the read filled them, as natively.
    Read {
        data: Arc<Vec<u8>>,
        offset: usize,
        len: usize,
    },
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.as_slice().len(),
            Source::Read { len, .. } => *len,
        }
    }

    /// Where the driver reads them, for as long as `self` lives.
    fn ptr(&self) -> *const u8 {
        match self {
            Source::Bytes(b) => b.as_slice().as_ptr(),
            // In bounds: checked by `Session::staged_read`.
            Source::Read { data, offset, .. } => data.as_ptr().wrapping_add(*offset),
        }
    }

    /// The bytes kept for a driver that reads them after the request is answered, and where
    /// they are.
    fn keep(self) -> (Box<dyn Send>, *const u8) {
        match self {
            Source::Bytes(b) => {
                let owned = b.into_owned();
                let p = owned.as_ptr();
                (Box::new(owned), p)
            }
            Source::Read { data, offset, .. } => {
                let p = data.as_ptr().wrapping_add(offset);
                (Box::new(data), p)
            }
        }
    }
}

/// The bytes of a buffer write: as `write_bytes`, or what a pending read brings.
fn write_source<'a>(
    s: &Session,
    data: req::WriteData,
    inline: Option<&'a [u8]>,
) -> Result<Option<Source<'a>>, i32> {
    match data {
        req::WriteData::FromRead { read, offset, len } => {
            let (data, offset) = s.staged_read(read, offset, len)?;
            Ok(Some(Source::Read {
                data,
                offset,
                len: len as usize,
            }))
        }
        other => Ok(write_bytes(s, other, inline)?.map(Source::Bytes)),
    }
}

/// A write's bytes (None: the application passed NULL, or no data travels): `inline`, decoded
/// after the request's header, or those staged under the id the request names, taken out of
/// the session whatever happens next. Staged data that did not all arrive is
/// `CL_INVALID_VALUE`.
pub(crate) fn write_bytes<'a>(
    s: &Session,
    data: req::WriteData,
    inline: Option<&'a [u8]>,
) -> Result<Option<Bytes<'a>>, i32> {
    match data {
        req::WriteData::Absent => Ok(None),
        req::WriteData::Inline(_) => Ok(inline.map(Bytes::Frame)),
        req::WriteData::Staged { id, len } => s
            .take_staged(id, len)
            .map(|v| Some(Bytes::Staged(v)))
            .ok_or(CL_INVALID_VALUE),
        req::WriteData::FromRead { .. } => {
            tracing::warn!("only a buffer write may take its bytes from a read");
            Err(CL_INVALID_VALUE)
        }
    }
}

/// STAGE: keeps a piece of a write's data until the request that names it.
pub fn stage(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let piece = req::Stage::decode(r)?;
    let data = piece.data(r)?;
    r.finish()?;
    w.i32(s.stage(&piece, data).err().unwrap_or(CL_SUCCESS));
    Ok(())
}

/// Blocking reads at least this large leave from a mapping of the driver's buffer straight
/// into the reply ring: one copy, overlapped with the client's copy out of the ring, instead of
/// the driver filling a reply buffer that is then copied into the ring.
const MAPPED_READ_MIN: usize = 64 * 1024;

/// Bulk data that follows a reply's body, sent from the driver's memory (a mapped range, which
/// is unmapped once the data has been sent).
pub struct Trailer {
    range: MappedRange,
    len: usize,
}

impl wormhole_server::backend::Trailer for Trailer {
    fn send(
        &mut self,
        out: &mut dyn FnMut(&[u8]) -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        // SAFETY: the range maps `len` bytes and stays mapped until the trailer is released.
        out(unsafe { std::slice::from_raw_parts(self.range.ptr as *const u8, self.len) })
    }
}

/// A range of a buffer mapped by a blocking `clEnqueueMapBuffer`. It holds a reference to the
/// buffer and its queue (another thread of the client may release them meanwhile) and gives
/// both up when unmapped, or when dropped.
struct MappedRange {
    queue: Handle,
    mem: Handle,
    ptr: *mut c_void,
}

impl MappedRange {
    /// Maps `[offset, offset + size)` with `flags` once the wait list completes; None if
    /// anything is amiss, and the ordinary path then answers with what the driver says.
    fn map(
        s: &Session,
        t: &Target,
        wl: &WaitList,
        flags: u64,
        offset: usize,
        size: usize,
    ) -> Option<MappedRange> {
        let (n, list) = wl.resolve(s).ok()?;
        let mut err = CL_SUCCESS;
        // SAFETY: handles resolved from the session's table; the list holds `n` events.
        let ptr = unsafe {
            ffi::clEnqueueMapBuffer(
                t.queue,
                t.mem,
                CL_TRUE,
                flags,
                offset,
                size,
                n,
                list_ptr(&list) as *mut c_void,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        if err != CL_SUCCESS || ptr.is_null() {
            return None;
        }
        // SAFETY: live handles; each retain is paired with a release in `unmap`.
        unsafe {
            ffi::clRetainMemObject(t.mem);
            ffi::clRetainCommandQueue(t.queue);
        }
        Some(MappedRange {
            queue: t.queue,
            mem: t.mem,
            ptr,
        })
    }

    /// Unmaps, returning the driver's status; `event` (if not null) receives the unmap's event.
    fn unmap(self, event: *mut Handle) -> i32 {
        let st = self.release(event);
        std::mem::forget(self);
        st
    }

    fn release(&self, event: *mut Handle) -> i32 {
        // SAFETY: unmaps what `map` mapped, then drops the references `map` took; called once
        // (by `unmap`, which forgets the range, or by `drop`).
        unsafe {
            let st = ffi::clEnqueueUnmapMemObject(
                self.queue,
                self.mem,
                self.ptr,
                0,
                std::ptr::null_mut(),
                event as *mut c_void,
            );
            ffi::clReleaseMemObject(self.mem);
            ffi::clReleaseCommandQueue(self.queue);
            st
        }
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        self.release(std::ptr::null_mut());
    }
}

/// A blocking read through a mapping (see MAPPED_READ_MIN). Returns false, having done
/// nothing, if the driver does not map: the ordinary path then answers (with the native error
/// code, if that is what went wrong).
fn mapped_read(
    s: &Call<'_>,
    w: &mut Writer,
    t: &Target,
    wl: &WaitList,
    offset: usize,
    size: usize,
) -> bool {
    let Some(range) = MappedRange::map(s, t, wl, CL_MAP_READ, offset, size) else {
        return false;
    };
    Reply::Ok(req::ReadReply::Inline { len: size as u64 }).encode(w);
    w.trailer(size);
    s.send_after(Trailer { range, len: size });
    true
}

/// A blocking read through pinned staging (staging.rs): the device fills the slots in turn
/// while the reply's bulk data goes out. False, having done nothing the application can see,
/// where staging does not apply or the read's first piece fails (the ordinary path then
/// answers as the driver does).
fn staged_read(
    s: &Call<'_>,
    w: &mut Writer,
    t: &Target,
    queue_id: u64,
    wl: &WaitList,
    offset: usize,
    size: usize,
) -> bool {
    // Its trailer waits for the device: not where it would hold every lane's replies.
    if wormhole_server::backend::replies_share_a_stream() {
        return false;
    }
    let Some(held) = crate::staging::take(t.queue, t.mem, offset, size) else {
        return false;
    };
    let Ok((_, list)) = wl.resolve(s) else {
        return false;
    };
    // A piece that fails once the reply has gone is the queue's next synchronisation
    // point's failure, as a pipelined call's would be.
    let on_failure = Box::new(move |st: i32| crate::session().deferred.record(queue_id, st));
    let Some(read) = crate::staging::Read::start(
        held,
        t.queue,
        t.mem,
        offset,
        size,
        list.as_deref().unwrap_or(&[]),
        on_failure,
    ) else {
        return false;
    };
    Reply::Ok(req::ReadReply::Inline { len: size as u64 }).encode(w);
    w.trailer(size);
    s.send_after(read);
    true
}

type ReadCall<'a> = dyn Fn(u32, *mut c_void, u32, *const Handle, *mut Handle) -> i32 + 'a;

/// The common part of every read: blocking reads go straight into the reply; non-blocking ones,
/// and those too large for one reply, into a staging buffer kept under `read_id`.
#[allow(clippy::too_many_arguments)]
fn read_common(
    s: &Session,
    w: &mut Writer,
    queue: u64,
    blocking: u32,
    wl: &WaitList,
    event_id: u64,
    read_id: u64,
    len: usize,
    call: &ReadCall<'_>,
) -> Result<(), i32> {
    let (n, list) = wl.resolve(s)?;
    let mut ev = EventOut::new(s, event_id)?;
    let now = at_once(s, queue, blocking, n, len);
    let blocking = if now.is_some() { CL_TRUE } else { blocking };
    if blocking != 0 && len <= MAX_TRANSFER {
        let mark = w.mark();
        Reply::Ok(req::ReadReply::Inline { len: len as u64 }).encode(w);
        let evp = ev.ptr(false);
        // The driver reads straight into the reply (no zeroing, no second buffer).
        let filled = w.filled_by(len, |dst| {
            match call(CL_TRUE, dst as *mut c_void, n, list_ptr(&list), evp) {
                CL_SUCCESS => Ok(()),
                st => Err(st),
            }
        });
        if let Err(st) = filled {
            w.rewind(mark);
            return Err(st);
        }
        let own = ev.finish(s);
        release_own(event_id, own);
        if let Some(enqueues) = now {
            ran_at_once(s, queue, enqueues);
        }
        return Ok(());
    }
    // A blocking read too large for its reply is complete when the reply goes (no event is
    // needed to tell), and the client collects it at once.
    let held = s.hold_in_flight(len)?;
    let mut data = zeroed(len).ok_or(CL_OUT_OF_HOST_MEMORY)?;
    let st = call(
        if blocking != 0 { CL_TRUE } else { CL_FALSE },
        data.as_mut_ptr() as *mut c_void,
        n,
        list_ptr(&list),
        ev.ptr(blocking == 0),
    );
    if st != CL_SUCCESS {
        return Err(st);
    }
    let event = ev.finish(s);
    s.defer_read_held(
        read_id,
        ReadFrom::Staging(Arc::new(data)),
        event,
        Some(held),
    );
    Reply::Ok(req::ReadReply::Deferred).encode(w);
    Ok(())
}

/// Whether a non-blocking transfer of `len` bytes (`waits` events in its wait list) runs at
/// once, as a blocking one: its queue has nothing else to run (nothing was enqueued since it
/// was seen idle but this request), so natively too it would be done about as soon, and its
/// bytes then travel with the reply, not through a staging buffer and a later COLLECT (or a
/// copy kept until the write completes). Some(the enqueue count the queue is idle as of
/// after it) if so.
fn at_once(s: &Session, queue: u64, blocking: u32, waits: u32, len: usize) -> Option<u64> {
    (blocking == 0 && waits == 0 && len <= MAX_TRANSFER)
        .then(|| s.queue_idle_but_for_this(queue))
        .flatten()
}

/// A transfer `at_once` let run succeeded: its queue is idle again.
fn ran_at_once(s: &Session, queue: u64, enqueues: u64) {
    s.queue_idle(queue, enqueues);
    AT_ONCE_TRANSFERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Non-blocking transfers run at once, their queue idle (`wh status`).
pub static AT_ONCE_TRANSFERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

type WriteCall<'a> = dyn Fn(u32, *const c_void, u32, *const Handle, *mut Handle) -> i32 + 'a;

#[allow(clippy::too_many_arguments)]
fn write_common(
    s: &Session,
    queue: u64,
    blocking: u32,
    wl: &WaitList,
    event_id: u64,
    data: Source<'_>,
    call: &WriteCall<'_>,
) -> Result<i32, i32> {
    let (n, list) = wl.resolve(s)?;
    let mut ev = EventOut::new(s, event_id)?;
    let now = at_once(s, queue, blocking, n, data.len());
    if blocking != 0 || now.is_some() {
        let st = call(
            CL_TRUE,
            data.ptr() as *const c_void,
            n,
            list_ptr(&list),
            ev.ptr(false),
        );
        if st == CL_SUCCESS {
            release_own(event_id, ev.finish(s));
            if let Some(enqueues) = now {
                ran_at_once(s, queue, enqueues);
            }
        }
        return Ok(st);
    }
    // Bytes that came with the request are copied to be kept (a read's staging is shared).
    let held = match &data {
        Source::Bytes(b) => Some(s.hold_in_flight(b.as_slice().len())?),
        Source::Read { .. } => None,
    };
    let (staging, at) = data.keep();
    let st = call(
        CL_FALSE,
        at as *const c_void,
        n,
        list_ptr(&list),
        ev.ptr(true),
    );
    if st != CL_SUCCESS {
        return Ok(st);
    }
    let event = ev.finish(s);
    // The driver reads `staging` until the write completes; keep it alive until then.
    crate::callbacks::on_event_complete(event, move || drop((staging, held)));
    release_own(event_id, event);
    Ok(CL_SUCCESS)
}

pub fn clEnqueueReadBuffer(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::ReadBuffer {
        queue,
        mem,
        blocking,
        offset,
        size,
        wait,
        event: event_id,
        read_id,
    } = req::ReadBuffer::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let t = target(s, queue, mem)?;
        if blocking != 0
            && event_id == 0
            && (MAPPED_READ_MIN..=MAX_TRANSFER).contains(&size)
            && (staged_read(s, w, &t, queue, &wl, offset, size)
                || mapped_read(s, w, &t, &wl, offset, size))
        {
            return Ok(());
        }
        read_common(
            s,
            w,
            queue,
            blocking,
            &wl,
            event_id,
            read_id,
            size,
            &|b, p, n, l, e| {
                // SAFETY: `p` holds `size` bytes; list and event pointers come from read_common.
                unsafe {
                    ffi::clEnqueueReadBuffer(
                        t.queue,
                        t.mem,
                        b,
                        offset,
                        size,
                        p,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                    )
                }
            },
        )
    };
    let enqueues = s.enqueues.load(std::sync::atomic::Ordering::Acquire);
    match run(w) {
        Err(e) => Reply::<req::ReadReply>::Err(e).encode(w),
        Ok(()) if blocking != 0 => finished_blocking(s, queue, enqueues),
        Ok(()) => {}
    }
    Ok(())
}

/// After a blocking transfer on `queue` succeeded: on an in-order queue every command before
/// it has finished too, so the queue is idle as of `enqueues` (read before the transfer ran).
fn finished_blocking(s: &Session, queue: u64, enqueues: u64) {
    let in_order = s
        .resolve(queue, HandleKind::Queue, false)
        .ok()
        .and_then(crate::rt::queue_in_order);
    if in_order == Some(true) {
        s.queue_idle(queue, enqueues);
    }
}

pub fn clEnqueueWriteBuffer(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let head = req::WriteBuffer::decode(r)?;
    // Inline data follows the header: the client sends it straight from the application's
    // memory.
    let inline = head.data(r)?;
    r.finish()?;
    let req::WriteBuffer {
        queue,
        mem,
        blocking,
        offset,
        size,
        wait,
        event: event_id,
        data,
    } = head;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let data = write_source(s, data, inline)?;
        let t = target(s, queue, mem)?;
        let data = match data {
            Some(d) if d.len() == size => d,
            Some(_) => return Err(CL_INVALID_VALUE),
            None => {
                // The application passed NULL: let the driver say what it says about that.
                let mut ev: Handle = std::ptr::null_mut();
                let (n, list) = wl.resolve(s)?;
                // SAFETY: a NULL host pointer is rejected by the driver before any access.
                return Ok(unsafe {
                    ffi::clEnqueueWriteBuffer(
                        t.queue,
                        t.mem,
                        blocking,
                        offset,
                        size,
                        std::ptr::null_mut(),
                        n,
                        list_ptr(&list) as *mut c_void,
                        &mut ev as *mut Handle as *mut c_void,
                    )
                });
            }
        };
        write_common(s, queue, blocking, &wl, event_id, data, &|b, p, n, l, e| {
            // SAFETY: `p` holds `size` bytes that live until the write completes.
            unsafe {
                ffi::clEnqueueWriteBuffer(
                    t.queue,
                    t.mem,
                    b,
                    offset,
                    size,
                    p as *mut c_void,
                    n,
                    l as *mut c_void,
                    e as *mut c_void,
                )
            }
        })
    };
    let enqueues = s.enqueues.load(std::sync::atomic::Ordering::Acquire);
    let st = run().unwrap_or_else(|e| e);
    if st == CL_SUCCESS && blocking != 0 {
        finished_blocking(s, queue, enqueues);
    }
    w.i32(st);
    Ok(())
}

pub fn clEnqueueReadBufferRect(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::ReadBufferRect {
        queue,
        mem,
        blocking,
        rect: a,
        wait,
        event: event_id,
        read_id,
    } = req::ReadBufferRect::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let t = target(s, queue, mem)?;
        let span = rect_span(a.host_origin, a.region, a.pitches[2], a.pitches[3], 1)
            .ok_or(CL_INVALID_VALUE)?;
        read_common(
            s,
            w,
            queue,
            blocking,
            &wl,
            event_id,
            read_id,
            span.len,
            &|b, p, n, l, e| {
                let zero = [0usize; 3];
                // SAFETY: `p` holds span.len bytes: the footprint of `region` from host origin 0
                // with the span's pitches.
                unsafe {
                    ffi::clEnqueueReadBufferRect(
                        t.queue,
                        t.mem,
                        b,
                        a.buffer_origin.as_ptr() as *mut c_void,
                        zero.as_ptr() as *mut c_void,
                        a.region.as_ptr() as *mut c_void,
                        a.pitches[0],
                        a.pitches[1],
                        span.row,
                        span.slice,
                        p,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                    )
                }
            },
        )
    };
    if let Err(e) = run(w) {
        Reply::<req::ReadReply>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueWriteBufferRect(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let head = req::WriteBufferRect::decode(r)?;
    let inline = head.data.inline(r)?;
    r.finish()?;
    let req::WriteBufferRect {
        queue,
        mem,
        blocking,
        rect: a,
        wait,
        event: event_id,
        data,
    } = head;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let data = write_bytes(s, data, inline)?.ok_or(CL_INVALID_VALUE)?;
        let t = target(s, queue, mem)?;
        let span = rect_span(a.host_origin, a.region, a.pitches[2], a.pitches[3], 1)
            .ok_or(CL_INVALID_VALUE)?;
        if data.as_slice().len() != span.len {
            return Err(CL_INVALID_VALUE);
        }
        write_common(
            s,
            queue,
            blocking,
            &wl,
            event_id,
            Source::Bytes(data),
            &|b, p, n, l, e| {
                let zero = [0usize; 3];
                // SAFETY: `p` holds the span's bytes, as for reads.
                unsafe {
                    ffi::clEnqueueWriteBufferRect(
                        t.queue,
                        t.mem,
                        b,
                        a.buffer_origin.as_ptr() as *mut c_void,
                        zero.as_ptr() as *mut c_void,
                        a.region.as_ptr() as *mut c_void,
                        a.pitches[0],
                        a.pitches[1],
                        span.row,
                        span.slice,
                        p as *mut c_void,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                    )
                }
            },
        )
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// Element size and type of a real image.
fn image_info(img: Handle) -> Result<(usize, u32), i32> {
    let mut elem = 0usize;
    let mut ty = 0u32;
    // SAFETY: live memory object; outputs are locals of the sizes passed.
    unsafe {
        let st = ffi::clGetImageInfo(
            img,
            CL_IMAGE_ELEMENT_SIZE,
            8,
            &mut elem as *mut usize as *mut c_void,
            std::ptr::null_mut(),
        );
        if st != CL_SUCCESS {
            return Err(if st == CL_INVALID_MEM_OBJECT {
                st
            } else {
                CL_INVALID_MEM_OBJECT
            });
        }
        ffi::clGetMemObjectInfo(
            img,
            CL_MEM_TYPE,
            4,
            &mut ty as *mut u32 as *mut c_void,
            std::ptr::null_mut(),
        );
    }
    Ok((elem, ty))
}

pub fn clEnqueueReadImage(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::ReadImage {
        queue,
        mem,
        blocking,
        image:
            req::ImageRegion {
                origin,
                region,
                row_pitch,
                slice_pitch,
            },
        wait,
        event: event_id,
        read_id,
    } = req::ReadImage::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let t = target(s, queue, mem)?;
        let (elem, ty) = image_info(t.mem)?;
        let (span, _) =
            image_span(ty, region, row_pitch, slice_pitch, elem).ok_or(CL_INVALID_VALUE)?;
        read_common(
            s,
            w,
            queue,
            blocking,
            &wl,
            event_id,
            read_id,
            span.len,
            &|b, p, n, l, e| {
                // SAFETY: `p` holds the region's host footprint with the pitches passed.
                unsafe {
                    ffi::clEnqueueReadImage(
                        t.queue,
                        t.mem,
                        b,
                        origin.as_ptr() as *mut c_void,
                        region.as_ptr() as *mut c_void,
                        row_pitch,
                        slice_pitch,
                        p,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                    )
                }
            },
        )
    };
    if let Err(e) = run(w) {
        Reply::<req::ReadReply>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueWriteImage(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let head = req::WriteImage::decode(r)?;
    let inline = head.data.inline(r)?;
    r.finish()?;
    let req::WriteImage {
        queue,
        mem,
        blocking,
        image:
            req::ImageRegion {
                origin,
                region,
                row_pitch,
                slice_pitch,
            },
        wait,
        event: event_id,
        data,
    } = head;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let data = write_bytes(s, data, inline)?.ok_or(CL_INVALID_VALUE)?;
        let t = target(s, queue, mem)?;
        let (elem, ty) = image_info(t.mem)?;
        let (span, _) =
            image_span(ty, region, row_pitch, slice_pitch, elem).ok_or(CL_INVALID_VALUE)?;
        if data.as_slice().len() != span.len {
            return Err(CL_INVALID_VALUE);
        }
        write_common(
            s,
            queue,
            blocking,
            &wl,
            event_id,
            Source::Bytes(data),
            &|b, p, n, l, e| {
                // SAFETY: `p` holds the region's host footprint.
                unsafe {
                    ffi::clEnqueueWriteImage(
                        t.queue,
                        t.mem,
                        b,
                        origin.as_ptr() as *mut c_void,
                        region.as_ptr() as *mut c_void,
                        row_pitch,
                        slice_pitch,
                        p as *mut c_void,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                    )
                }
            },
        )
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// Maps with (blocking, wait count, wait list, event out, errcode) and returns (pointer,
/// bytes, pitches).
type MapCall<'a> =
    dyn Fn(u32, u32, *const Handle, *mut Handle, &mut i32) -> (*mut c_void, usize, [usize; 2]) + 'a;

/// What a map request asks besides the region.
struct MapAsk {
    blocking: u32,
    flags: u64,
    token: u64,
    in_place_ok: bool,
}

/// Maps through the driver, remembers the mapping under the client's token and answers with
/// where its bytes come from:
/// - in place: the mapping lies in the session's buffer arena and the client maps the arena
///   too (`in_place_ok`): the client hands the application the arena memory itself;
/// - inline: a blocking map's bytes travel with the reply;
/// - deferred: a non-blocking map returns at once, as natively (its wait list may hold a user
///   event only the client can complete, so waiting here could never end), and its bytes are
///   collected under the token at the client's next synchronisation point, like a
///   non-blocking read's; so are a blocking map's bytes too large for one reply, which the
///   client collects at once;
/// - none: an invalidating or empty map.
#[allow(clippy::too_many_arguments)]
fn map_common(
    s: &Session,
    w: &mut Writer,
    ask: MapAsk,
    mem: Handle,
    region: MapRegion,
    wl: &WaitList,
    event_id: u64,
    call: &MapCall<'_>,
) -> Result<(), i32> {
    let (n, list) = wl.resolve(s)?;
    let mut ev = EventOut::new(s, event_id)?;
    let blocking = ask.blocking != 0;
    let mut err = CL_SUCCESS;
    let (ptr, len, pitches) = call(
        if blocking { CL_TRUE } else { CL_FALSE },
        n,
        list_ptr(&list),
        ev.ptr(!blocking),
        &mut err,
    );
    if err != CL_SUCCESS {
        return Err(err);
    }
    if ptr.is_null() && len > 0 {
        return Err(CL_OUT_OF_RESOURCES);
    }
    let event = ev.finish(s);
    let mut region = region;
    if let MapRegion::Image { pitches: p, .. } = &mut region {
        *p = pitches;
    }
    s.mappings.lock().unwrap_or_else(|p| p.into_inner()).insert(
        ask.token,
        Mapping {
            mem,
            ptr,
            len,
            region,
        },
    );
    let in_place = crate::arena::offset_of(ptr, len).filter(|_| ask.in_place_ok);
    let no_bytes =
        in_place.is_some() || ask.flags & CL_MAP_WRITE_INVALIDATE_REGION != 0 || len == 0;
    // A blocking map's bytes too large for one reply wait for COLLECT as a non-blocking map's
    // do (complete already: the client collects them at once).
    let deferred = !no_bytes && (!blocking || len > MAX_TRANSFER);
    if deferred {
        s.defer_read(
            ask.token,
            ReadFrom::Mapping {
                ptr: ptr as usize,
                len,
            },
            event,
        );
    } else {
        release_own(event_id, event);
    }
    let data = if no_bytes || deferred {
        &[][..]
    } else {
        // SAFETY: the driver mapped `len` readable bytes at `ptr` (a blocking map).
        unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
    };
    Reply::Ok(req::Mapped {
        pitches,
        in_place,
        len: len as u64,
        deferred,
        data,
    })
    .encode(w);
    Ok(())
}

pub fn clEnqueueMapBuffer(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::MapBuffer {
        queue,
        mem,
        blocking,
        flags,
        offset,
        size,
        wait,
        event: event_id,
        token,
        in_place_ok,
    } = req::MapBuffer::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let t = target(s, queue, mem)?;
        map_common(
            s,
            w,
            MapAsk {
                blocking,
                flags,
                token,
                in_place_ok,
            },
            t.mem,
            MapRegion::Buffer { offset },
            &wl,
            event_id,
            &|b, n, l, e, err| {
                // SAFETY: list and event pointers come from map_common.
                let p = unsafe {
                    ffi::clEnqueueMapBuffer(
                        t.queue,
                        t.mem,
                        b,
                        flags,
                        offset,
                        size,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                        err,
                    )
                };
                (p, size, [0, 0])
            },
        )
    };
    if let Err(e) = run(w) {
        Reply::<req::Mapped>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueMapImage(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::MapImage {
        queue,
        mem,
        blocking,
        flags,
        origin,
        region,
        wait,
        event: event_id,
        token,
        in_place_ok,
    } = req::MapImage::decode(r)?;
    r.finish()?;
    let wl = WaitList(wait);
    let run = |w: &mut Writer| -> Result<(), i32> {
        let t = target(s, queue, mem)?;
        let (elem, ty) = image_info(t.mem)?;
        map_common(
            s,
            w,
            MapAsk {
                blocking,
                flags,
                token,
                in_place_ok,
            },
            t.mem,
            // The pitches are the driver's, filled in once it has mapped.
            MapRegion::Image {
                image_type: ty,
                origin,
                region,
                pitches: [0, 0],
            },
            &wl,
            event_id,
            &|b, n, l, e, err| {
                let mut row = 0usize;
                let mut slice = 0usize;
                // SAFETY: pitches are locals; list and event pointers come from map_common.
                let p = unsafe {
                    ffi::clEnqueueMapImage(
                        t.queue,
                        t.mem,
                        b,
                        flags,
                        origin.as_ptr() as *mut c_void,
                        region.as_ptr() as *mut c_void,
                        &mut row as *mut usize as *mut c_void,
                        &mut slice as *mut usize as *mut c_void,
                        n,
                        l as *mut c_void,
                        e as *mut c_void,
                        err,
                    )
                };
                let len = image_span(ty, region, row, slice, elem).map_or(0, |(s, _)| s.len);
                (p, len, [row, slice])
            },
        )
    };
    if let Err(e) = run(w) {
        Reply::<req::Mapped>::Err(e).encode(w);
    }
    Ok(())
}

pub fn clEnqueueUnmapMemObject(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let head = req::UnmapMemObject::decode(r)?;
    let inline = head.data.inline(r)?;
    r.finish()?;
    let req::UnmapMemObject {
        queue,
        mem,
        token,
        wait,
        event: event_id,
        data,
        keep_bytes,
    } = head;
    let wl = WaitList(wait);
    let run = || -> Result<i32, i32> {
        let data = write_bytes(s, data, inline)?;
        let t = target(s, queue, mem)?;
        let (n, list) = wl.resolve(s)?;
        let m = s
            .mappings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token)
            .ok_or(CL_INVALID_VALUE)?;
        if m.mem != t.mem {
            s.mappings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(token, m);
            return Err(CL_INVALID_VALUE);
        }
        // Checked before the map's read is taken out (and perhaps read again): nothing
        // returns early after that.
        let mut ev = EventOut::new(s, event_id)?;
        // Held until the map's bytes are due again (if they are): a collection meanwhile
        // would find the read gone and tell the client it failed.
        let mut pending = s.pending_reads.lock().unwrap_or_else(|p| p.into_inner());
        // A non-blocking map's bytes not collected yet are never read from an unmapped range,
        // and what the client sends back for it never held them: the object keeps its bytes.
        // Where the client's mapping is the application's own memory, native puts the bytes
        // there when the map completes, looked at or not (Boost.Compute unmaps, then waits):
        // they are read again once the map is done, the unmap waits for that read (so a wait
        // for the unmap finds them), and they stay due under the map's token.
        let uncollected = pending.remove(&token);
        if let Some(d) = data
            .as_ref()
            .map(Bytes::as_slice)
            .filter(|_| uncollected.is_none())
        {
            if d.len() > m.len {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the mapping holds m.len writable bytes; d fits.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), m.ptr as *mut u8, d.len()) };
        }
        let again = match &uncollected {
            Some(p) if keep_bytes => match s
                .hold_in_flight(m.len)
                .and_then(|held| Ok((read_mapped_again(&t, &m, p.event)?, held)))
            {
                Ok(again) => Some(again),
                Err(e) => {
                    tracing::warn!(
                        "a map's bytes could not be read again for its unmap ({e}): the \
                         application's memory keeps its old bytes"
                    );
                    None
                }
            },
            _ => None,
        };
        if let Some(p) = uncollected {
            release_own(0, p.event);
        }
        let list = match &again {
            Some(((_, read), _)) => Some(list.into_iter().flatten().chain([*read]).collect()),
            None => list,
        };
        let n = n + u32::from(again.is_some());
        // SAFETY: unmapping what the driver mapped for this memory object.
        let st = unsafe {
            ffi::clEnqueueUnmapMemObject(
                t.queue,
                t.mem,
                m.ptr,
                n,
                list_ptr(&list) as *mut c_void,
                ev.ptr(false) as *mut c_void,
            )
        };
        if st == CL_SUCCESS {
            release_own(event_id, ev.finish(s));
        }
        if let Some(((bytes, event), held)) = again {
            pending.insert(
                token,
                PendingRead {
                    from: ReadFrom::Staging(Arc::new(bytes)),
                    event,
                    sent: 0,
                    held: Some(held),
                },
            );
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// Reads what mapping `m` covered into a staging buffer of its own once `after` (the map; none
/// if null) is done, laid out as the mapping was: the bytes of a map its client could not
/// collect before the unmap. Returns the bytes (filled when the returned event completes) and
/// the event.
fn read_mapped_again(t: &Target, m: &Mapping, after: Handle) -> Result<(Vec<u8>, Handle), i32> {
    let mut bytes = zeroed(m.len).ok_or(CL_OUT_OF_HOST_MEMORY)?;
    let mut event: Handle = std::ptr::null_mut();
    let wait = [after];
    let waits = u32::from(!after.is_null());
    let st = match m.region {
        // SAFETY: `bytes` holds the `m.len` bytes read (the buffer's heap storage stays put
        // when the Vec moves); one event to wait for; the event goes to a local.
        MapRegion::Buffer { offset } => unsafe {
            ffi::clEnqueueReadBuffer(
                t.queue,
                t.mem,
                CL_FALSE,
                offset,
                m.len,
                bytes.as_mut_ptr() as *mut c_void,
                waits,
                wait.as_ptr() as *mut c_void,
                &mut event as *mut Handle as *mut c_void,
            )
        },
        MapRegion::Image {
            image_type,
            origin,
            region,
            pitches: [row, slice],
        } => {
            // A read's slice pitch is 0 for images without slices, whatever a map answers.
            let slice = match image_type {
                CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER | CL_MEM_OBJECT_IMAGE2D => 0,
                _ => slice,
            };
            // SAFETY: as above; the mapping's pitches give the `m.len` bytes it spans.
            unsafe {
                ffi::clEnqueueReadImage(
                    t.queue,
                    t.mem,
                    CL_FALSE,
                    origin.as_ptr() as *mut c_void,
                    region.as_ptr() as *mut c_void,
                    row,
                    slice,
                    bytes.as_mut_ptr() as *mut c_void,
                    waits,
                    wait.as_ptr() as *mut c_void,
                    &mut event as *mut Handle as *mut c_void,
                )
            }
        }
    };
    match st {
        CL_SUCCESS => Ok((bytes, event)),
        e => Err(e),
    }
}

/// Bytes `at..at + n` of a pending read, or None if they cannot be read (an SVM range freed
/// meanwhile). The whole of a staging buffer is handed over without a copy.
fn read_piece(s: &Session, from: &mut ReadFrom, at: usize, n: usize) -> Option<Vec<u8>> {
    let end = at.checked_add(n).filter(|&end| end <= from.len())?;
    match from {
        // Whole, and no write takes its bytes from it: handed over.
        ReadFrom::Staging(data) if at == 0 && end == data.len() => Some(
            Arc::get_mut(data)
                .map(std::mem::take)
                .unwrap_or_else(|| data.to_vec()),
        ),
        ReadFrom::Staging(data) => Some(data[at..end].to_vec()),
        ReadFrom::Mapping { ptr, .. } => {
            // SAFETY: the map completed and is still mapped (an unmap takes the pending read
            // out under the lock the caller holds before it unmaps); `at..end` lies in its
            // `len` bytes.
            let bytes = unsafe { std::slice::from_raw_parts((*ptr + at) as *const u8, n) };
            Some(bytes.to_vec())
        }
        ReadFrom::Svm { ptr, .. } => s.read_svm(*ptr + at, n),
    }
}

/// Sends the data of every listed pending read whose event has completed, at most
/// TRANSFER_CHUNK bytes in all: a read with more left than that sends a part, and the client
/// asks again for the rest.
pub fn collect(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let ids = req::Collect::decode(r)?.reads;
    r.finish()?;
    /// Where a read stands; a finished one's data, out of the table, lives until the reply.
    enum Outcome {
        Pending,
        Done(Vec<u8>),
        Part(Vec<u8>),
        Failed,
    }
    let mut budget = TRANSFER_CHUNK;
    let mut outcomes = Vec::with_capacity(ids.len());
    let mut pending = s.pending_reads.lock().unwrap_or_else(|p| p.into_inner());
    for id in ids {
        let Some(p) = pending.get_mut(&id) else {
            outcomes.push((id, Outcome::Failed));
            continue;
        };
        let mut st: i32 = CL_COMPLETE;
        if !p.event.is_null() {
            st = 1;
            // SAFETY: a live event we hold a reference to; the output is a local i32.
            unsafe {
                ffi::clGetEventInfo(
                    p.event,
                    CL_EVENT_COMMAND_EXECUTION_STATUS,
                    4,
                    &mut st as *mut i32 as *mut c_void,
                    std::ptr::null_mut(),
                )
            };
        }
        if st != CL_COMPLETE && st >= 0 {
            outcomes.push((id, Outcome::Pending));
            continue;
        }
        let left = p.from.len().saturating_sub(p.sent);
        let n = left.min(budget);
        let piece = (st == CL_COMPLETE)
            .then(|| read_piece(s, &mut p.from, p.sent, n))
            .flatten();
        let outcome = match piece {
            Some(data) if n < left => {
                budget -= n;
                p.sent += n;
                Outcome::Part(data)
            }
            done => {
                budget -= done.as_ref().map_or(0, Vec::len);
                let p = pending.remove(&id).expect("present");
                release_own(0, p.event);
                done.map_or(Outcome::Failed, Outcome::Done)
            }
        };
        outcomes.push((id, outcome));
    }
    drop(pending);
    req::CollectReply {
        reads: outcomes
            .iter()
            .map(|(id, o)| {
                let state = match o {
                    Outcome::Pending => req::Collected::Pending,
                    Outcome::Done(data) => req::Collected::Done(data),
                    Outcome::Part(data) => req::Collected::Part(data),
                    Outcome::Failed => req::Collected::Failed,
                };
                (*id, state)
            })
            .collect(),
    }
    .encode(w);
    Ok(())
}

/// Blocking writes at least this large are streamed: the data goes from the request ring
/// straight into a mapping of the driver's buffer as it arrives (one copy, overlapped with the
/// client's copy into the ring), instead of being gathered into a request buffer first and
/// then copied again by the driver.
pub const STREAMED_WRITE_MIN: u64 = 64 * 1024;

/// Receives the header of a request of `total` body bytes through `recv` into `body`, just as
/// far as its own decoder reads: `min` bytes (no header is shorter) first, then, while the
/// decoder finds a variable part (a list, a length) longer than what arrived, the bytes it says
/// are missing. So nothing after the header is received before the header says where it goes.
/// Returns the header, the bytes received (`body[..n]`) and how many of them lie beyond the
/// header (none, if `min` is right). `body` only grows (no zeroing of a lane's reused buffer
/// per request).
fn recv_header<M: for<'a> Message<'a>>(
    recv: &mut dyn FnMut(&mut [u8]) -> Result<(), StreamError>,
    min: usize,
    total: u64,
    body: &mut Vec<u8>,
) -> Result<(M, usize, usize), StreamError> {
    let mut filled = 0usize;
    let mut more = min as u64;
    loop {
        if filled as u64 + more > total {
            return Err(StreamError::Malformed(DecodeError::Truncated {
                need: filled as u64 + more,
                have: total as usize,
            }));
        }
        let end = filled + more as usize;
        if body.len() < end {
            body.resize(end, 0);
        }
        recv(&mut body[filled..end])?;
        filled = end;
        let mut r = Reader::new(&body[..filled]);
        match M::decode(&mut r) {
            Ok(head) => return Ok((head, filled, r.remaining())),
            Err(DecodeError::Truncated { need, have }) => {
                more = need.saturating_sub(have as u64).max(1)
            }
            Err(e) => return Err(StreamError::Malformed(e)),
        }
    }
}

/// A blocking write through pinned staging (staging.rs), its bytes taken from the ring as
/// they arrive; None, having taken nothing, where staging does not apply.
fn staged_write(
    s: &Session,
    link: &mut dyn wormhole_transport::BulkIn,
    t: Option<&Target>,
    wl: &WaitList,
    offset: usize,
    size: usize,
) -> Result<Option<i32>, StreamError> {
    let Some(t) = t else { return Ok(None) };
    let Some(held) = crate::staging::take(t.queue, t.mem, offset, size) else {
        return Ok(None);
    };
    let Ok((_, list)) = wl.resolve(s) else {
        return Ok(None);
    };
    let st = crate::staging::write(
        &held,
        t.queue,
        t.mem,
        offset,
        size,
        list.as_deref().unwrap_or(&[]),
        &mut |dst, n| {
            let mut at = 0;
            link.recv_in_place(n as u64, &mut |src| {
                // SAFETY: `dst` holds `n` bytes and the ring hands over `n` in all.
                unsafe { src.copy_to(dst.add(at)) };
                at += src.len();
            })
        },
    )?;
    Ok(Some(st))
}

/// Receives a `clEnqueueWriteBuffer` request whose frame header `h` was just read from `link`,
/// streaming its data into the driver's buffer when it can (blocking, no event asked for, the
/// driver maps the range); otherwise reads the rest of the body into `body`.
pub fn stream_write(
    s: &Session,
    link: &mut dyn wormhole_transport::BulkIn,
    h: &wormhole_opencl_proto::FrameHeader,
    body: &mut Vec<u8>,
    w: &mut Writer,
) -> Result<Streamed, StreamError> {
    let total = u64::from(h.len);
    let (head, filled, leftover) = recv_header::<req::WriteBuffer>(
        &mut |b| Ok(link.recv_exact(b)?),
        req::WriteBuffer::MIN_LEN,
        total,
        body,
    )?;
    let rest = total - filled as u64;
    // Bytes beyond the header would be data already received: the ordinary path takes those.
    let streamable = leftover == 0
        && head.blocking != 0
        && head.event == 0
        && head.data == req::WriteData::Inline(rest)
        && rest == head.size as u64
        && rest >= STREAMED_WRITE_MIN;
    let (offset, size) = (head.offset, head.size);
    let wl = WaitList(head.wait);
    let t = streamable
        .then(|| target(s, head.queue, head.mem).ok())
        .flatten();
    // An enqueue, counted as the ordinary path counts one (lib.rs): from here no queue is
    // known idle (another thread's transfer must not skip its wait), and once this blocking
    // write has succeeded, its in-order queue is.
    let enqueues = t
        .as_ref()
        .map(|_| s.enqueues.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1);
    let finished = |st: i32| {
        if let (CL_SUCCESS, Some(enqueues)) = (st, enqueues) {
            finished_blocking(s, head.queue, enqueues);
        }
        st
    };
    if let Some(st) = staged_write(s, link, t.as_ref(), &wl, offset, size)? {
        w.i32(finished(st));
        return Ok(Streamed::Done);
    }
    let mapped =
        t.and_then(|t| MappedRange::map(s, &t, &wl, CL_MAP_WRITE_INVALIDATE_REGION, offset, size));
    let head_len = filled;
    let Some(range) = mapped else {
        // The ordinary path decodes the whole request and answers as the driver does.
        if body.len() < total as usize {
            body.resize(total as usize, 0);
        }
        link.recv_exact(&mut body[head_len..total as usize])?;
        return Ok(Streamed::Body);
    };
    let mut at = 0usize;
    link.recv_in_place(rest, &mut |src| {
        let n = src.len();
        // SAFETY: the mapping holds `size` (= rest) bytes and `at + n <= rest`.
        unsafe { src.copy_to((range.ptr as *mut u8).add(at)) };
        at += n;
    })?;
    // The write is done once the unmap is: wait for it, as a blocking write returns only then.
    let mut ev: Handle = std::ptr::null_mut();
    let st = range.unmap(&mut ev);
    if st == CL_SUCCESS && !ev.is_null() {
        // SAFETY: `ev` is a live event we own; waited for, then released.
        unsafe {
            ffi::clWaitForEvents(1, &ev);
            ffi::clReleaseEvent(ev);
        }
    }
    STREAMED_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    w.i32(finished(st));
    Ok(Streamed::Done)
}

/// Blocking writes whose data went into the driver's mapping as it arrived (`wh status`).
pub static STREAMED_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream over `bytes` that records how far it was read.
    fn receive(
        bytes: &[u8],
        total: u64,
        min: usize,
    ) -> (Result<(req::WriteBuffer, usize, usize), StreamError>, usize) {
        let mut at = 0;
        let mut body = vec![0xAA; 3]; // a lane's reused buffer
        let got = recv_header::<req::WriteBuffer>(
            &mut |b| {
                let src = bytes
                    .get(at..at + b.len())
                    .ok_or(StreamError::Malformed(DecodeError::BadValue("read past")))?;
                b.copy_from_slice(src);
                at += b.len();
                Ok(())
            },
            min,
            total,
            &mut body,
        );
        (got, at)
    }

    fn write(wait: Option<Vec<u64>>, data_len: Option<u64>) -> req::WriteBuffer {
        req::WriteBuffer {
            queue: 1,
            mem: 2,
            blocking: 1,
            offset: 0,
            size: data_len.unwrap_or(0) as usize,
            wait,
            event: 0,
            data: data_len.map_or(req::WriteData::Absent, req::WriteData::Inline),
        }
    }

    /// Asks COLLECT for `ids` and returns the answer, owned.
    fn collect_now(s: &Session, ids: &[u64]) -> Vec<(u64, Option<bool>, Vec<u8>)> {
        let mut q = Writer::new(0);
        req::Collect {
            reads: ids.to_vec(),
        }
        .encode(&mut q);
        let body = q.body().to_vec();
        let mut w = Writer::new(0);
        collect(s, &mut Reader::new(&body), &mut w).unwrap();
        let reply = req::CollectReply::decode_all(w.body()).unwrap();
        reply
            .reads
            .into_iter()
            .map(|(id, st)| match st {
                req::Collected::Done(d) => (id, Some(true), d.to_vec()),
                req::Collected::Part(d) => (id, Some(false), d.to_vec()),
                req::Collected::Failed => (id, None, vec![]),
                req::Collected::Pending => panic!("no event is pending here"),
            })
            .collect()
    }

    #[test]
    fn reads_larger_than_a_reply_are_collected_in_parts() {
        let s = Session::default();
        let big: Vec<u8> = (0..2 * TRANSFER_CHUNK + 5)
            .map(|i| (i % 251) as u8)
            .collect();
        // Complete already (a blocking read's): no event.
        s.defer_read(
            1,
            ReadFrom::Staging(Arc::new(big.clone())),
            std::ptr::null_mut(),
        );
        s.defer_read(
            2,
            ReadFrom::Staging(Arc::new(b"small".to_vec())),
            std::ptr::null_mut(),
        );
        let mut got = Vec::new();
        let mut small = None;
        for round in 0.. {
            assert!(round < 4, "a part every round");
            let answer = collect_now(&s, &[1, 2]);
            let total: usize = answer.iter().map(|(_, _, d)| d.len()).sum();
            assert!(total <= TRANSFER_CHUNK, "one chunk per reply");
            let (_, done, data) = &answer[0];
            got.extend_from_slice(data);
            match &answer[1] {
                (2, Some(true), d) => small = Some(d.clone()),
                // No room left in this reply: a part without bytes.
                (2, Some(false), d) => assert!(d.is_empty()),
                other => panic!("{other:?}"),
            }
            if *done == Some(true) {
                break;
            }
        }
        assert_eq!(got, big);
        assert_eq!(small.as_deref(), Some(&b"small"[..]));
        // Collected means gone.
        assert_eq!(
            collect_now(&s, &[1, 2]),
            vec![(1, None, vec![]), (2, None, vec![])]
        );
        assert!(s.pending_reads.lock().unwrap().is_empty());
    }

    #[test]
    fn write_headers_are_received_without_their_data() {
        for wait in [None, Some(vec![]), Some(vec![7, 8, 9])] {
            for data_len in [None, Some(0), Some(100)] {
                let head = write(wait.clone(), data_len);
                let mut w = Writer::new(0);
                head.encode(&mut w);
                let head_len = w.body_len();
                let mut bytes = w.body().to_vec();
                bytes.resize(head_len + data_len.unwrap_or(0) as usize, 0x55);
                let (got, read) = receive(&bytes, bytes.len() as u64, req::WriteBuffer::MIN_LEN);
                let (decoded, filled, leftover) = got.unwrap();
                assert_eq!((decoded, filled, leftover), (head, head_len, 0));
                assert_eq!(read, head_len, "only the header was taken from the stream");
            }
        }
    }

    #[test]
    fn bad_write_headers_are_malformed_requests() {
        let head = write(Some(vec![7, 8, 9]), Some(100));
        let mut w = Writer::new(0);
        head.encode(&mut w);
        let bytes = w.body().to_vec();
        // The frame ends inside the header (the wait list says more events than it holds).
        for total in [
            0,
            10,
            req::WriteBuffer::MIN_LEN as u64,
            bytes.len() as u64 - 1,
        ] {
            let (got, read) = receive(&bytes, total, req::WriteBuffer::MIN_LEN);
            assert!(matches!(got, Err(StreamError::Malformed(_))), "{total}");
            assert!(read as u64 <= total);
        }
        // A presence flag that is neither 0 nor 1.
        let mut bad = bytes.clone();
        bad[36] = 7;
        let (got, _) = receive(&bad, bad.len() as u64, req::WriteBuffer::MIN_LEN);
        assert!(matches!(got, Err(StreamError::Malformed(_))));
        // A wait list that claims more events than any frame holds.
        let mut huge = bytes.clone();
        huge[37..41].copy_from_slice(&u32::MAX.to_le_bytes());
        let (got, read) = receive(&huge, huge.len() as u64, req::WriteBuffer::MIN_LEN);
        assert!(matches!(got, Err(StreamError::Malformed(_))));
        assert!(read <= huge.len());
        // A receiver that starts with too long a prefix takes data bytes too, and says so.
        let mut full = bytes.clone();
        full.resize(bytes.len() + 100, 0x55);
        let (got, _) = receive(&full, full.len() as u64, bytes.len() + 5);
        assert_eq!(got.unwrap().2, 5);
    }
}
