//! Buffer and image creation. Host data travels with the request (or is staged before it);
//! CL_MEM_USE_HOST_PTR gets a server-side shadow of the client's memory that lives as long as
//! the memory object.

use super::*;
use crate::arena::{Placement, NO_WINDOW};
use crate::generated::ffi;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use wormhole_opencl_proto::requests::{self as req, Message};
use wormhole_opencl_proto::{cl::*, Writer};

/// Host memory the driver may use directly (USE_HOST_PTR), page-aligned.
struct Shadow {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the shadow is plain memory owned by one memory object.
unsafe impl Send for Shadow {}

impl Shadow {
    fn new(data: &[u8]) -> Option<Shadow> {
        let layout = Layout::from_size_align(data.len().max(1), 4096).ok()?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` holds at least data.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Some(Shadow { ptr, layout })
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The host pointer to pass the driver: the client's data (copied, or shadowed for
/// USE_HOST_PTR), a dummy non-null pointer when the client passed one without data (the driver
/// then reports the native error for the flags), or NULL.
fn host_ptr(
    flags: u64,
    nonnull: bool,
    data: Option<&[u8]>,
) -> Result<(*mut c_void, Option<Shadow>), i32> {
    static DUMMY: [u8; 8] = [0; 8];
    match data {
        Some(d) if flags & CL_MEM_USE_HOST_PTR != 0 => {
            let sh = Shadow::new(d).ok_or(CL_OUT_OF_HOST_MEMORY)?;
            Ok((sh.ptr as *mut c_void, Some(sh)))
        }
        Some(d) => Ok((d.as_ptr() as *mut c_void, None)),
        None if nonnull => Ok((DUMMY.as_ptr() as *mut c_void, None)),
        None => Ok((std::ptr::null_mut(), None)),
    }
}

fn keep_shadow(mem: Handle, shadow: Option<Shadow>) {
    if let Some(sh) = shadow {
        crate::callbacks::on_mem_destroyed(mem, move || drop(sh));
    }
}

fn create_buffer(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
    with_props: bool,
) -> Result<(), DecodeError> {
    let (buffer, props) = if with_props {
        let b = req::CreateBufferWithProperties::decode(r)?;
        (b.buffer, b.props)
    } else {
        (req::CreateBuffer::decode(r)?, None)
    };
    let inline = buffer.data.inline(r)?;
    r.finish()?;
    let req::CreateBuffer {
        new_id,
        context,
        flags,
        size,
        host_ptr: nonnull,
        svm_ptr,
        data,
    } = buffer;
    let mut window = NO_WINDOW;
    let mut run = || -> Result<i32, i32> {
        let data = write_bytes(s, data, inline)?;
        let data = data.as_ref().map(Bytes::as_slice);
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        if let Some(d) = data {
            if d.len() != size {
                return Err(CL_INVALID_VALUE);
            }
        }
        // Refuse what cannot fit the quota before the driver allocates it.
        s.limits()
            .precheck(size as u64)
            .map_err(|()| CL_MEM_OBJECT_ALLOCATION_FAILURE)?;
        let placement = if svm_ptr == 0 {
            Placement::new(context, flags, size, nonnull, data)
        } else {
            None
        };
        let (flags, (hp, shadow)) = if let Some(p) = &placement {
            let (f, hp) = p.driver_args();
            (f, (hp, None))
        } else if svm_ptr != 0 {
            // A buffer over shared virtual memory uses that memory itself (same address on
            // both sides), once it is known to be this session's.
            let p = usize::try_from(svm_ptr).map_err(|_| CL_INVALID_HOST_PTR)?;
            if !s.svm_contains(p, size) {
                return Err(CL_INVALID_HOST_PTR);
            }
            (flags, (p as *mut c_void, None))
        } else {
            (flags, host_ptr(flags, nonnull, data)?)
        };
        let mut err = CL_SUCCESS;
        // SAFETY: `hp` is NULL, a dummy, or `size` bytes of data; props end with 0.
        let mem = unsafe {
            if with_props {
                ffi::clCreateBufferWithProperties(
                    context,
                    props
                        .as_ref()
                        .map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_void),
                    flags,
                    size,
                    hp,
                    &mut err,
                )
            } else {
                ffi::clCreateBuffer(context, flags, size, hp, &mut err)
            }
        };
        if err == CL_SUCCESS && !mem.is_null() {
            // Bound before anything can destroy the buffer, so its storage outlives it.
            if let Some(p) = placement {
                window = p.bind(mem);
            }
        }
        let st = crate::rt::bind_created(s, new_id, HandleKind::Mem, mem, err);
        if st == CL_SUCCESS {
            keep_shadow(mem, shadow);
        } else {
            window = NO_WINDOW;
        }
        Ok(st)
    };
    let status = run().unwrap_or_else(|e| e);
    // Where the buffer's bytes lie in the session's arena, for the client's own copies.
    req::CreateBufferReply {
        status,
        window: Some(window).filter(|&o| o != NO_WINDOW),
    }
    .encode(w);
    Ok(())
}

pub fn clCreateBuffer(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    create_buffer(s, r, w, false)
}

pub fn clCreateBufferWithProperties(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    create_buffer(s, r, w, true)
}

/// `cl_image_desc` as the C headers lay it out.
#[repr(C)]
struct ImageDesc {
    image_type: u32,
    width: usize,
    height: usize,
    depth: usize,
    array_size: usize,
    row_pitch: usize,
    slice_pitch: usize,
    num_mip_levels: u32,
    num_samples: u32,
    mem_object: Handle,
}

/// All four image-creating entry points share one wire form (the client converts the
/// deprecated 2D/3D calls into a descriptor).
fn create_image(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let head = req::CreateImage::decode(r)?;
    let inline = head.data.inline(r)?;
    r.finish()?;
    let req::CreateImage {
        new_id,
        context,
        props,
        flags,
        format,
        desc,
        host_ptr: nonnull,
        data,
    } = head;
    let run = || -> Result<i32, i32> {
        let data = write_bytes(s, data, inline)?;
        let data = data.as_ref().map(Bytes::as_slice);
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        let desc = match desc {
            Some(d) => Some(ImageDesc {
                image_type: d.image_type,
                width: d.width,
                height: d.height,
                depth: d.depth,
                array_size: d.array_size,
                row_pitch: d.row_pitch,
                slice_pitch: d.slice_pitch,
                num_mip_levels: d.num_mip_levels,
                num_samples: d.num_samples,
                mem_object: s
                    .resolve(d.mem_object, HandleKind::Mem, true)
                    .map_err(|_| CL_INVALID_IMAGE_DESCRIPTOR)?,
            }),
            None => None,
        };
        let (hp, shadow) = host_ptr(flags, nonnull, data)?;
        let fmt_ptr = format
            .as_ref()
            .map_or(std::ptr::null_mut(), |f| f.as_ptr() as *mut c_void);
        let desc_ptr = desc.as_ref().map_or(std::ptr::null_mut(), |d| {
            d as *const ImageDesc as *mut c_void
        });
        let mut err = CL_SUCCESS;
        // SAFETY: format and descriptor are local structs of the C layout; `hp` as in buffers
        // (the client sent the bytes the descriptor implies).
        let mem = unsafe {
            match &props {
                Some(p) => ffi::clCreateImageWithProperties(
                    context,
                    p.as_ptr() as *mut c_void,
                    flags,
                    fmt_ptr,
                    desc_ptr,
                    hp,
                    &mut err,
                ),
                None => ffi::clCreateImage(context, flags, fmt_ptr, desc_ptr, hp, &mut err),
            }
        };
        let st = crate::rt::bind_created(s, new_id, HandleKind::Mem, mem, err);
        if st == CL_SUCCESS {
            keep_shadow(mem, shadow);
        }
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

pub fn clCreateImage(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    create_image(s, r, w)
}
pub fn clCreateImageWithProperties(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    create_image(s, r, w)
}
pub fn clCreateImage2D(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    create_image(s, r, w)
}
pub fn clCreateImage3D(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    create_image(s, r, w)
}
