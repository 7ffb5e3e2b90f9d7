//! Reads, writes and mappings. Data travels inline in requests and replies; non-blocking reads
//! are collected at the next synchronisation point (rt::pending). Data too large for one frame
//! travels in pieces: a write's is staged before its request, a read's is collected at once.

use super::*;
use crate::rt::pending::{self, Scatter};
use std::alloc::Layout;
use std::sync::Mutex;
use wormhole_opencl_proto::geometry::{for_each_row, image_span, rect_span, region_within, Span};
use wormhole_opencl_proto::{control, Op, Reader, TRANSFER_CHUNK};

/// Sends a read and puts its data where `scatter` says (now, or at the next sync point).
fn finish_read(
    w: Writer,
    blocking: u32,
    read_id: u64,
    event: *mut Handle,
    ev_id: u64,
    scatter: Scatter,
) -> Result<i32, ClErr> {
    finish_read_into(w, blocking, read_id, event, ev_id, scatter, None)
}

/// As `finish_read`; with `direct`, inline data is read from the transport straight into the
/// application's buffer.
fn finish_read_into(
    w: Writer,
    blocking: u32,
    read_id: u64,
    event: *mut Handle,
    ev_id: u64,
    scatter: Scatter,
    direct: Option<&mut [u8]>,
) -> Result<i32, ClErr> {
    // Reads still pending may land in the same memory; they ran first, so they must land
    // first: this one's bytes then wait for them (below) instead of landing in place.
    let direct = direct.filter(|_| !pending::any());
    let want = direct.as_ref().map(|d| d.len() as u64);
    let (reply, filled) =
        rt::call_bulk(w, &[], direct.map(|d| (req::ReadReply::INLINE_HEAD_LEN, d)))?;
    let mut r = Reader::new(&reply);
    let head = match req::Reply::<req::ReadReply>::decode(&mut r)? {
        Ok(head) => head,
        Err(_) if filled => return Err(ClErr(CL_OUT_OF_RESOURCES)),
        Err(st) => return Ok(st),
    };
    if filled {
        // The transport read the data straight into the application's buffer: the reply
        // held the header alone, which must announce exactly that much.
        if want.map(|len| req::ReadReply::Inline { len }) != Some(head) {
            return Err(ClErr(CL_OUT_OF_RESOURCES));
        }
        r.finish()?;
        // SAFETY: the application's `cl_event *` or NULL.
        unsafe { set_event(event, ev_id) };
        if blocking != 0 {
            rt::after_sync();
        }
        return Ok(CL_SUCCESS);
    }
    let data = head.data(&mut r)?;
    r.finish()?;
    match data {
        // Complete (a blocking read): the reads before it land first.
        Some(data) => {
            rt::after_sync();
            // SAFETY: the scatter addresses are the application's buffer for this read.
            unsafe { pending::scatter(&scatter, data) };
        }
        // A blocking read too large for its reply: complete on the server, fetched now.
        None if blocking != 0 => {
            rt::after_sync();
            pending::fetch(read_id, &scatter)?;
        }
        None => pending::defer(read_id, scatter, true),
    }
    // SAFETY: the application's `cl_event *` or NULL.
    unsafe { set_event(event, ev_id) };
    Ok(CL_SUCCESS)
}

/// Sends `data` under `id` ahead of the request that names it, in STAGE pieces of at most
/// TRANSFER_CHUNK bytes; the status of the first piece the server refused, or CL_SUCCESS.
fn stage(id: u64, data: &[u8]) -> Result<i32, ClErr> {
    let total = data.len() as u64;
    let mut offset = 0u64;
    for piece in data.chunks(TRANSFER_CHUNK) {
        let mut w = Writer::new(control::STAGE);
        req::Stage {
            id,
            total,
            offset,
            len: piece.len() as u64,
        }
        .encode(&mut w);
        w.trailer(piece.len());
        let reply = rt::call_bulk(w, piece, None)?.0;
        let st = Reader::new(&reply).i32()?;
        if st != CL_SUCCESS {
            return Ok(st);
        }
        offset += piece.len() as u64;
    }
    Ok(CL_SUCCESS)
}

/// Sends the request that `encode` builds for the way its data travels, and returns its reply
/// body: `data` (None: none travels) follows the request straight from the application's
/// memory when one frame holds both, or is staged before it (if the server refuses a piece,
/// the request is not sent and the reply is that status alone).
/// `pipelined`: the caller ruled out every error the request could return, so a request that
/// holds its data goes without waiting (a staged one still waits: its pieces may be refused).
pub(super) fn call_with_data(
    encode: impl Fn(req::WriteData) -> Writer,
    data: Option<&[u8]>,
    pipelined: bool,
) -> Result<Vec<u8>, ClErr> {
    let reply = match data {
        None => rt::call(encode(req::WriteData::Absent))?,
        Some(data) => {
            let mut w = encode(req::WriteData::Inline(data.len() as u64));
            match req::WriteData::for_len(w.body_len(), data.len(), rt::alloc_id) {
                staged @ req::WriteData::Staged { id, .. } => match stage(id, data)? {
                    CL_SUCCESS => rt::call(encode(staged))?,
                    st => return Ok(st.to_le_bytes().to_vec()),
                },
                _ => {
                    w.trailer(data.len());
                    if pipelined {
                        rt::call_async_bulk(w, data)?
                    } else {
                        rt::call_bulk(w, data, None)?.0
                    }
                }
            }
        }
    };
    Ok(reply)
}

/// Sends a write (see `call_with_data`) and finishes it. Natively the driver reads the
/// application's memory when the write runs, after the reads before it filled it: reads
/// still to land there are waited for, or (`from_read`: a buffer write, whose request may
/// say so) the write takes its bytes from the one read that fills them, on the server.
/// `pipelined`: as for `call_with_data`.
#[allow(clippy::too_many_arguments)]
fn finish_write(
    encode: impl Fn(req::WriteData) -> Writer,
    data: Option<&[u8]>,
    event: *mut Handle,
    ev_id: u64,
    blocking: u32,
    from_read: bool,
    pipelined: bool,
) -> Result<i32, ClErr> {
    let (src, len) = data.map_or((0, 0), |d| (d.as_ptr() as usize, d.len()));
    let reply = pending::write_source(src, len, from_read, |source| match source {
        pending::WriteSource::Read { read, offset } => rt::call(encode(req::WriteData::FromRead {
            read,
            offset,
            len: len as u64,
        })),
        pending::WriteSource::Memory => call_with_data(encode, data, pipelined),
    })?;
    let st = Reader::new(&reply).i32()?;
    if st == CL_SUCCESS {
        // SAFETY: as above.
        unsafe { set_event(event, ev_id) };
        if blocking != 0 {
            rt::after_sync();
        }
    }
    Ok(st)
}

/// The session's buffer arena, when this client maps one.
fn arena() -> Option<&'static wormhole_transport::Arena> {
    crate::connection::get()?.arena()
}

/// Host-access flags under which the driver refuses reads or writes: such calls take the
/// ordinary path, which reports its error.
const HOST_ACCESS_FLAGS: u64 =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

/// A transfer of (offset, size) outside a buffer the client knows the size of is the driver's
/// CL_INVALID_VALUE: answered before the client reads or writes `size` bytes of the
/// application's memory, which need not be there.
fn within_buffer(b: &objects::ClObject, offset: usize, size: usize) -> Result<(), ClErr> {
    match b.mem() {
        Some(m) if m.size > 0 && offset.checked_add(size).is_none_or(|end| end > m.size) => {
            Err(ClErr(CL_INVALID_VALUE))
        }
        _ => Ok(()),
    }
}

/// The same for a rectangle of a buffer at `origin` with the buffer-side pitches given.
fn rect_within_buffer(
    b: &objects::ClObject,
    origin: [usize; 3],
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<(), ClErr> {
    match b.mem() {
        Some(m) if m.size > 0 => {
            let span = rect_span(origin, region, row_pitch, slice_pitch, 1)
                .ok_or(ClErr(CL_INVALID_VALUE))?;
            within_buffer(b, span.start, span.len)
        }
        _ => Ok(()),
    }
}

/// The same for a region of an image the client knows the size of.
fn within_image(
    i: &objects::ClObject,
    origin: [usize; 3],
    region: [usize; 3],
) -> Result<(), ClErr> {
    match i.mem().and_then(|m| m.extent) {
        Some(extent) if !region_within(origin, region, extent) => Err(ClErr(CL_INVALID_VALUE)),
        _ => Ok(()),
    }
}

/// How long a non-blocking transfer may wait for its queue to go the direct way, per byte: the
/// ordinary path (through the rings and a staging buffer the driver copies) costs about 1 ns
/// per byte on PoCL, so waiting as long never loses much.
const NON_BLOCKING_WAIT_NS_PER_BYTE: u64 = 1;

/// Smaller non-blocking transfers go the direct way only when the server knows their queue is
/// idle (nothing enqueued since it last saw it finish): looking (a marker, polled) costs tens
/// of µs, as much as the ordinary path takes for them.
const NON_BLOCKING_LOOK_MIN: usize = 64 << 10;

/// A read or write of a windowed buffer (see the server's `arena` module): the server waits as
/// the native call would, then the bytes are copied here, between the application's memory
/// and the buffer's own storage in the shared arena. One copy and no driver command.
/// A non-blocking call is copied so only when the commands before it have finished, or finish
/// within the time the ordinary path would take: it must not keep the application waiting for
/// a busy queue. Copied at once, its bytes are where they must be when it completes, as
/// natively (the application may not touch them before).
/// `None`: the ordinary path must run (no window, out of range, a wait list or an event, or
/// the server declined), and it then answers exactly as the driver does.
///
/// # Safety
/// `app` must hold `size` bytes, readable (`write`) or writable (read).
#[allow(clippy::too_many_arguments)]
unsafe fn direct_copy(
    q: &objects::ClObject,
    b: &objects::ClObject,
    blocking: u32,
    offset: usize,
    size: usize,
    app: *mut u8,
    plain: bool,
    write: bool,
) -> Option<i32> {
    let m = b.mem()?;
    let (off, len) = m.window?;
    if !plain || app.is_null() || size == 0 || m.flags & HOST_ACCESS_FLAGS != 0 {
        return None;
    }
    if offset.checked_add(size)? > len {
        return None;
    }
    let at = crate::connection::get()?
        .arena()?
        .range(off.checked_add(offset as u64)?, size as u64)?;
    let mut w = Writer::new(wormhole_opencl_proto::control::DIRECT);
    req::Direct {
        queue: q.id,
        mem: b.id,
        wait_ns: match blocking {
            0 if size < NON_BLOCKING_LOOK_MIN => 0,
            0 => (size as u64).saturating_mul(NON_BLOCKING_WAIT_NS_PER_BYTE),
            _ => req::WAIT_ALL,
        },
    }
    .encode(&mut w);
    let reply = rt::call(w).ok()?;
    if Reader::new(&reply).i32().ok()? != CL_SUCCESS {
        return None;
    }
    // The queue's earlier commands have finished: the non-blocking reads among them land
    // first, as natively they ran first (this copy may read or write the same memory).
    if blocking != 0 {
        rt::after_sync();
    } else {
        pending::collect();
    }
    // SAFETY: `at` holds `size` bytes of the buffer, which nothing else touches now (the server
    // waited for the queue); `app` holds `size` bytes per the caller.
    unsafe {
        use wormhole_transport::copy::copy_bulk;
        if write {
            copy_bulk(at, app, size);
        } else {
            copy_bulk(app, at, size);
        }
    }
    Some(CL_SUCCESS)
}

pub unsafe extern "C" fn clEnqueueReadBuffer(
    queue: Handle,
    buffer: Handle,
    blocking: u32,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handles and lists.
        let (q, b) = unsafe {
            (
                obj(queue, HandleKind::Queue)?,
                obj(buffer, HandleKind::Mem)?,
            )
        };
        if ptr.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        within_buffer(b, offset, size)?;
        let plain = n == 0 && list.is_null() && event.is_null();
        // SAFETY: the application promises `size` writable bytes at `ptr`.
        let direct =
            unsafe { direct_copy(q, b, blocking, offset, size, ptr as *mut u8, plain, false) };
        if let Some(st) = direct {
            return Ok(st);
        }
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let read_id = rt::alloc_id();
        let w = encode(
            Op::clEnqueueReadBuffer,
            &req::ReadBuffer {
                queue: q.id,
                mem: b.id,
                blocking,
                offset,
                size,
                wait,
                event: ev_id,
                read_id,
            },
        );
        // SAFETY: the application promises `size` writable bytes at `ptr`. (A non-blocking
        // read's bytes come with the reply too when the server ran it at once.)
        let direct = Some(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size) });
        finish_read_into(
            w,
            blocking,
            read_id,
            event,
            ev_id,
            Scatter::Plain {
                dst: ptr as usize,
                len: size,
            },
            direct,
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteBuffer(
    queue: Handle,
    buffer: Handle,
    blocking: u32,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handles and lists.
        let (q, b) = unsafe {
            (
                obj(queue, HandleKind::Queue)?,
                obj(buffer, HandleKind::Mem)?,
            )
        };
        within_buffer(b, offset, size)?;
        // A write like one the driver accepted before (this buffer, this queue, no wait list,
        // in range) is accepted again: a non-blocking one need not wait for the verdict. The
        // direct way (a buffer in the arena) still goes first where it applies: its one copy
        // beat the pipelined write's three (64 KiB writes on PoCL: 15 GB/s against 3); the
        // pipelined write saves the round trip of the ordinary path it declined.
        let like_accepted = n == 0
            && list.is_null()
            && !ptr.is_null()
            && size > 0
            && b.mem().is_some_and(|m| m.size > 0);
        let key = (Op::clEnqueueWriteBuffer as u16, q.id, b.id, 0);
        let pipelined = like_accepted
            && blocking == 0
            && crate::connection::get().is_some_and(|c| size <= c.async_bulk_max())
            && super::buffer_commands::was_accepted(key);
        let plain = n == 0 && list.is_null() && event.is_null();
        // SAFETY: the application promises `size` readable bytes at `ptr`.
        let direct =
            unsafe { direct_copy(q, b, blocking, offset, size, ptr as *mut u8, plain, true) };
        if let Some(st) = direct {
            return Ok(st);
        }
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        // SAFETY: the application promises `size` readable bytes at `ptr`.
        let data =
            (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr as *const u8, size) });
        let head = |data| {
            encode(
                Op::clEnqueueWriteBuffer,
                &req::WriteBuffer {
                    queue: q.id,
                    mem: b.id,
                    blocking,
                    offset,
                    size,
                    wait: wait.clone(),
                    event: ev_id,
                    data,
                },
            )
        };
        let st = finish_write(head, data, event, ev_id, blocking, true, pipelined)?;
        if st == CL_SUCCESS && like_accepted && !pipelined {
            super::buffer_commands::remember_accepted(key);
        }
        Ok(st)
    })
}

fn rows_of(span: &Span, region: [usize; 3], elem: usize) -> Vec<(usize, usize)> {
    let mut rows = Vec::new();
    for_each_row(span, region, elem, |o, n| rows.push((o, n)));
    rows
}

/// The queue's and buffer's ids, the rectangle and its host footprint.
unsafe fn rect_common(
    queue: Handle,
    buffer: Handle,
    bo: *const usize,
    ho: *const usize,
    rg: *const usize,
    pitches: [usize; 4],
) -> Result<(u64, u64, req::Rect, Span), ClErr> {
    // SAFETY: the application's handles and triples.
    let (q, b) = unsafe {
        (
            obj(queue, HandleKind::Queue)?,
            obj(buffer, HandleKind::Mem)?,
        )
    };
    // SAFETY: as above.
    let (bo, ho, rg) = unsafe { (triple(bo)?, triple(ho)?, triple(rg)?) };
    rect_within_buffer(b, bo, rg, pitches[0], pitches[1])?;
    let span = rect_span(ho, rg, pitches[2], pitches[3], 1).ok_or(ClErr(CL_INVALID_VALUE))?;
    let rect = req::Rect {
        buffer_origin: bo,
        host_origin: ho,
        region: rg,
        pitches,
    };
    Ok((q.id, b.id, rect, span))
}

pub unsafe extern "C" fn clEnqueueReadBufferRect(
    queue: Handle,
    buffer: Handle,
    blocking: u32,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    brp: usize,
    bsp: usize,
    hrp: usize,
    hsp: usize,
    ptr: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        if ptr.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the application's arguments.
        let (queue, mem, rect, span) = unsafe {
            rect_common(
                queue,
                buffer,
                buffer_origin,
                host_origin,
                region,
                [brp, bsp, hrp, hsp],
            )
        }?;
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let read_id = rt::alloc_id();
        let w = encode(
            Op::clEnqueueReadBufferRect,
            &req::ReadBufferRect {
                queue,
                mem,
                blocking,
                rect,
                wait,
                event: ev_id,
                read_id,
            },
        );
        let dst = ptr as usize + span.start;
        finish_read(
            w,
            blocking,
            read_id,
            event,
            ev_id,
            Scatter::Rows {
                dst,
                rows: rows_of(&span, rect.region, 1),
            },
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteBufferRect(
    queue: Handle,
    buffer: Handle,
    blocking: u32,
    buffer_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    brp: usize,
    bsp: usize,
    hrp: usize,
    hsp: usize,
    ptr: *const c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        if ptr.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the application's arguments.
        let (queue, mem, rect, span) = unsafe {
            rect_common(
                queue,
                buffer,
                buffer_origin,
                host_origin,
                region,
                [brp, bsp, hrp, hsp],
            )
        }?;
        // SAFETY: the rect's host footprint lies in the application's memory.
        let data =
            unsafe { std::slice::from_raw_parts((ptr as *const u8).add(span.start), span.len) };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let head = |data| {
            encode(
                Op::clEnqueueWriteBufferRect,
                &req::WriteBufferRect {
                    queue,
                    mem,
                    blocking,
                    rect,
                    wait: wait.clone(),
                    event: ev_id,
                    data,
                },
            )
        };
        finish_write(head, Some(data), event, ev_id, blocking, false, false)
    })
}

/// (image type, element size) of an image, from what the client remembers or from the server.
fn image_meta(image: Handle, o: &objects::ClObject) -> Result<(u32, usize), ClErr> {
    if let Some((ty, elem)) = o.mem().and_then(|m| m.image) {
        if elem != 0 {
            return Ok((ty, elem));
        }
    }
    let mut elem = 0usize;
    let mut ty = 0u32;
    // SAFETY: valid handle and local outputs of the sizes passed.
    unsafe {
        let st = crate::generated::wire_clGetImageInfo(
            image,
            CL_IMAGE_ELEMENT_SIZE,
            8,
            &mut elem as *mut usize as *mut c_void,
            std::ptr::null_mut(),
        );
        if st != CL_SUCCESS {
            return Err(ClErr(st));
        }
        crate::generated::wire_clGetMemObjectInfo(
            image,
            CL_MEM_TYPE,
            4,
            &mut ty as *mut u32 as *mut c_void,
            std::ptr::null_mut(),
        );
    }
    Ok((ty, elem))
}

/// An image transfer's arguments as they travel, and its host footprint.
struct ImageArgs {
    queue: u64,
    mem: u64,
    image: req::ImageRegion,
    span: Span,
    rows: [usize; 3],
    elem: usize,
}

unsafe fn image_common(
    queue: Handle,
    image: Handle,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<ImageArgs, ClErr> {
    // SAFETY: the application's handles and triples.
    let (q, i) = unsafe { (obj(queue, HandleKind::Queue)?, obj(image, HandleKind::Mem)?) };
    // SAFETY: as above.
    let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
    within_image(i, origin, region)?;
    let (ty, elem) = image_meta(image, i)?;
    let (span, rows) =
        image_span(ty, region, row_pitch, slice_pitch, elem).ok_or(ClErr(CL_INVALID_VALUE))?;
    let image = req::ImageRegion {
        origin,
        region,
        row_pitch,
        slice_pitch,
    };
    Ok(ImageArgs {
        queue: q.id,
        mem: i.id,
        image,
        span,
        rows,
        elem,
    })
}

pub unsafe extern "C" fn clEnqueueReadImage(
    queue: Handle,
    image: Handle,
    blocking: u32,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
    ptr: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        if ptr.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the application's arguments.
        let ImageArgs {
            queue,
            mem,
            image,
            span,
            rows,
            elem,
        } = unsafe { image_common(queue, image, origin, region, row_pitch, slice_pitch) }?;
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let read_id = rt::alloc_id();
        let w = encode(
            Op::clEnqueueReadImage,
            &req::ReadImage {
                queue,
                mem,
                blocking,
                image,
                wait,
                event: ev_id,
                read_id,
            },
        );
        finish_read(
            w,
            blocking,
            read_id,
            event,
            ev_id,
            Scatter::Rows {
                dst: ptr as usize,
                rows: rows_of(&span, rows, elem),
            },
        )
    })
}

pub unsafe extern "C" fn clEnqueueWriteImage(
    queue: Handle,
    image: Handle,
    blocking: u32,
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
    ptr: *const c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        if ptr.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: the application's arguments.
        let ImageArgs {
            queue,
            mem,
            image,
            span,
            ..
        } = unsafe { image_common(queue, image, origin, region, row_pitch, slice_pitch) }?;
        // SAFETY: the image region's host footprint lies in the application's memory.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, span.len) };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let head = |data| {
            encode(
                Op::clEnqueueWriteImage,
                &req::WriteImage {
                    queue,
                    mem,
                    blocking,
                    image,
                    wait: wait.clone(),
                    event: ev_id,
                    data,
                },
            )
        };
        finish_write(head, Some(data), event, ev_id, blocking, false, false)
    })
}

/// Where a map of an image at `origin` starts in its CL_MEM_USE_HOST_PTR memory, if the
/// driver's mapping (`mapped` pitches) lays the bytes out as the application's memory does.
fn image_host_offset(
    ty: u32,
    elem: usize,
    origin: [usize; 3],
    host: [usize; 2],
    mapped: [usize; 2],
) -> Option<usize> {
    let [row, slice] = host;
    let x = origin[0].checked_mul(elem)?;
    let (off, same) = match ty {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => (Some(x), true),
        // The array index is origin[1]; a layer is `slice` bytes apart.
        CL_MEM_OBJECT_IMAGE1D_ARRAY => (
            x.checked_add(origin[1].checked_mul(slice)?),
            mapped[1] == slice,
        ),
        CL_MEM_OBJECT_IMAGE2D => (x.checked_add(origin[1].checked_mul(row)?), mapped[0] == row),
        CL_MEM_OBJECT_IMAGE2D_ARRAY | CL_MEM_OBJECT_IMAGE3D => (
            x.checked_add(origin[1].checked_mul(row)?)?
                .checked_add(origin[2].checked_mul(slice)?),
            mapped == host,
        ),
        _ => (None, false),
    };
    off.filter(|_| same)
}

/// A region the application has mapped: where it lives in the client and how to give it back.
struct MapEntry {
    ptr: usize,
    mem_id: u64,
    token: u64,
    len: usize,
    writes: bool,
    owned: Option<Layout>,
}

static MAPS: Mutex<Vec<MapEntry>> = Mutex::new(Vec::new());

/// Finishes a map: the data goes to the application's host memory (USE_HOST_PTR buffers) or to
/// fresh memory the client owns until the unmap. A non-blocking map's data follows at the next
/// synchronisation point (collected under the map's token), as a non-blocking read's does.
#[allow(clippy::too_many_arguments)]
fn finish_map(
    w: Writer,
    o: &objects::ClObject,
    offset: usize,
    origin: Option<[usize; 3]>,
    blocking: u32,
    flags: u64,
    token: u64,
    event: *mut Handle,
    ev_id: u64,
) -> Result<(*mut c_void, [usize; 2]), ClErr> {
    let reply = rt::call(w)?;
    let mapped = req::Reply::<req::Mapped>::decode_all(&reply)?.map_err(ClErr)?;
    let pitches = mapped.pitches;
    // The mapping's length (an invalidating map comes without its bytes).
    let len = usize::try_from(mapped.len).map_err(|_| ClErr(CL_OUT_OF_RESOURCES))?;
    if let Some(in_place) = mapped.in_place {
        // The mapping is the buffer's own storage in the arena: nothing to copy now, nothing
        // to send back at the unmap.
        let ptr = arena()
            .and_then(|a| a.range(in_place, len as u64))
            .ok_or(ClErr(CL_OUT_OF_RESOURCES))?;
        MAPS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(MapEntry {
                ptr: ptr as usize,
                mem_id: o.id,
                token,
                len,
                writes: false,
                owned: None,
            });
        // SAFETY: the application's `cl_event *` or NULL.
        unsafe { set_event(event, ev_id) };
        if blocking != 0 {
            rt::after_sync();
        }
        return Ok((ptr as *mut c_void, pitches));
    }
    let data = mapped.data;
    if !data.is_empty() && data.len() != len {
        return Err(ClErr(CL_OUT_OF_RESOURCES));
    }
    // A CL_MEM_USE_HOST_PTR object is mapped in the application's own memory, as natively:
    // a buffer at its offset, an image at its origin when the driver's mapping has the
    // application's pitches (the bytes then lie alike on both sides).
    let use_host = o
        .mem()
        .filter(|m| m.flags & CL_MEM_USE_HOST_PTR != 0 && m.host_ptr != 0)
        .and_then(|m| match (m.image, origin) {
            (None, _) => Some(m.host_ptr + offset),
            (Some((ty, elem)), Some(origin)) => {
                image_host_offset(ty, elem, origin, m.host_pitches, pitches)
                    .map(|off| m.host_ptr + off)
            }
            (Some(_), None) => None,
        });
    let (ptr, owned) = match use_host {
        Some(p) => (p as *mut u8, None),
        None => {
            let layout = Layout::from_size_align(len.max(1), 128)
                .map_err(|_| ClErr(CL_OUT_OF_HOST_MEMORY))?;
            // SAFETY: non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Err(ClErr(CL_OUT_OF_HOST_MEMORY));
            }
            (p, Some(layout))
        }
    };
    if !data.is_empty() {
        // SAFETY: `ptr` has room for `len` bytes (fresh, or the application's mapped range).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, len) };
    }
    if mapped.deferred && blocking != 0 {
        // A blocking map's bytes too large for one reply: complete on the server, fetched now.
        let to = rt::pending::Scatter::Plain {
            dst: ptr as usize,
            len,
        };
        let fetched = rt::pending::fetch(token, &to);
        if let Err(e) = fetched {
            if let Some(layout) = owned {
                // SAFETY: allocated just above with this layout; never handed out.
                unsafe { std::alloc::dealloc(ptr, layout) };
            }
            return Err(e);
        }
    } else if mapped.deferred {
        // The mapping (and so `ptr`) lives until the unmap, which forgets an uncollected one.
        let to = rt::pending::Scatter::Plain {
            dst: ptr as usize,
            len,
        };
        rt::pending::defer(token, to, false);
    }
    let writes = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
    MAPS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(MapEntry {
            ptr: ptr as usize,
            mem_id: o.id,
            token,
            len: if len == 0 { 0 } else { len },
            writes,
            owned,
        });
    // SAFETY: the application's `cl_event *` or NULL.
    unsafe { set_event(event, ev_id) };
    if blocking != 0 {
        rt::after_sync();
    }
    Ok((ptr as *mut c_void, pitches))
}

pub unsafe extern "C" fn clEnqueueMapBuffer(
    queue: Handle,
    buffer: Handle,
    blocking: u32,
    flags: u64,
    offset: usize,
    size: usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
    errcode_ret: *mut i32,
) -> *mut c_void {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handles.
        let (q, b) = unsafe {
            (
                obj(queue, HandleKind::Queue)?,
                obj(buffer, HandleKind::Mem)?,
            )
        };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let token = rt::alloc_id();
        let w = encode(
            Op::clEnqueueMapBuffer,
            &req::MapBuffer {
                queue: q.id,
                mem: b.id,
                blocking,
                flags,
                offset,
                size,
                wait,
                event: ev_id,
                token,
                in_place_ok: arena().is_some(),
            },
        );
        finish_map(w, b, offset, None, blocking, flags, token, event, ev_id).map(|(p, _)| p)
    })
}

pub unsafe extern "C" fn clEnqueueMapImage(
    queue: Handle,
    image: Handle,
    blocking: u32,
    flags: u64,
    origin: *const usize,
    region: *const usize,
    row_pitch: *mut usize,
    slice_pitch: *mut usize,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
    errcode_ret: *mut i32,
) -> *mut c_void {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handles and triples.
        let (q, i) = unsafe { (obj(queue, HandleKind::Queue)?, obj(image, HandleKind::Mem)?) };
        if row_pitch.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        // SAFETY: as above.
        let (origin, region) = unsafe { (triple(origin)?, triple(region)?) };
        // SAFETY: the application's wait list and event pointer.
        let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
        let token = rt::alloc_id();
        let w = encode(
            Op::clEnqueueMapImage,
            &req::MapImage {
                queue: q.id,
                mem: i.id,
                blocking,
                flags,
                origin,
                region,
                wait,
                event: ev_id,
                token,
                in_place_ok: arena().is_some(),
            },
        );
        let (p, pitches) = finish_map(w, i, 0, Some(origin), blocking, flags, token, event, ev_id)?;
        // SAFETY: the application's outputs (row_pitch checked above).
        unsafe {
            *row_pitch = pitches[0];
            if !slice_pitch.is_null() {
                *slice_pitch = pitches[1];
            }
        }
        Ok(p)
    })
}

pub unsafe extern "C" fn clEnqueueUnmapMemObject(
    queue: Handle,
    memobj: Handle,
    mapped: *mut c_void,
    n: u32,
    list: *const Handle,
    event: *mut Handle,
) -> i32 {
    rt::entry_status(|| {
        // SAFETY: the application's handles.
        let (q, m) = unsafe {
            (
                obj(queue, HandleKind::Queue)?,
                obj(memobj, HandleKind::Mem)?,
            )
        };
        let entry = {
            let mut maps = MAPS.lock().unwrap_or_else(|p| p.into_inner());
            let i = maps
                .iter()
                .position(|e| e.ptr == mapped as usize && e.mem_id == m.id)
                .ok_or(ClErr(CL_INVALID_VALUE))?;
            maps.swap_remove(i)
        };
        // A non-blocking map's bytes not collected yet never land in the range once it is
        // unmapped (and perhaps freed); the server drops them too. Nor does the range go back:
        // it never held the object's bytes, and the application never synchronised with the
        // map, so it had no right to write there. Unless the range is the application's own
        // memory (CL_MEM_USE_HOST_PTR): native puts the object's bytes there when the map
        // completes, looked at or not, so they stay due (the server reads them again).
        let keep_bytes = entry.owned.is_none() && rt::pending::is_due(entry.token);
        let uncollected = keep_bytes || rt::pending::forget(entry.token);
        // SAFETY: the mapped range holds `len` bytes the application may have written.
        let data = (entry.writes && !uncollected)
            .then(|| unsafe { std::slice::from_raw_parts(entry.ptr as *const u8, entry.len) });
        let res = (|| {
            // SAFETY: the application's wait list and event pointer.
            let (wait, ev_id) = unsafe { wait_and_event(n, list, event) }?;
            let head = |data| {
                encode(
                    Op::clEnqueueUnmapMemObject,
                    &req::UnmapMemObject {
                        queue: q.id,
                        mem: m.id,
                        token: entry.token,
                        wait: wait.clone(),
                        event: ev_id,
                        data,
                        keep_bytes,
                    },
                )
            };
            let st = Reader::new(&call_with_data(head, data, false)?).i32()?;
            if st == CL_SUCCESS {
                // SAFETY: as above.
                unsafe { set_event(event, ev_id) };
            }
            Ok(st)
        })();
        match (&res, entry.owned) {
            (Ok(CL_SUCCESS), Some(layout)) => {
                // SAFETY: allocated in `finish_map` with this layout; the mapping is over.
                unsafe { std::alloc::dealloc(entry.ptr as *mut u8, layout) };
            }
            (Ok(CL_SUCCESS), None) => {}
            _ => MAPS.lock().unwrap_or_else(|p| p.into_inner()).push(entry),
        }
        res
    })
}
