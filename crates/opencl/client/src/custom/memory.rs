//! Buffer and image creation: host data travels with the request, and the client remembers
//! what it needs later (host pointer, flags, image geometry).

use super::*;
use wormhole_opencl_proto::geometry::element_size;
use wormhole_opencl_proto::{Op, Reader};

fn wants_host_data(flags: u64, host_ptr: *const c_void) -> bool {
    !host_ptr.is_null() && flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR) != 0
}

unsafe fn create_buffer(
    context: Handle,
    props: Option<*const u64>,
    flags: u64,
    size: usize,
    host_ptr: *mut c_void,
) -> Result<Handle, ClErr> {
    // SAFETY: the application's handle.
    let ctx = unsafe { obj(context, HandleKind::Context) }?;
    let new_id = rt::alloc_id();
    let props = match props {
        // SAFETY: a zero-terminated list or NULL.
        Some(p) => Some(unsafe { rt::props::words(wormhole_opencl_proto::Props::Plain, p) }?),
        None => None,
    };
    // A buffer over shared virtual memory uses that memory (same address on the server).
    let svm = flags & CL_MEM_USE_HOST_PTR != 0
        && !host_ptr.is_null()
        && super::svm::is_svm(host_ptr as usize, size);
    let data = if !svm && wants_host_data(flags, host_ptr) && size > 0 {
        // SAFETY: with USE/COPY_HOST_PTR the application promises `size` readable bytes.
        Some(unsafe { std::slice::from_raw_parts(host_ptr as *const u8, size) })
    } else {
        None
    };
    let buffer = req::CreateBuffer {
        new_id,
        context: ctx.id,
        flags,
        size,
        host_ptr: !host_ptr.is_null(),
        svm_ptr: if svm { host_ptr as u64 } else { 0 },
        data,
    };
    let w = match props {
        Some(props) => encode(
            Op::clCreateBufferWithProperties,
            &req::CreateBufferWithProperties { props, buffer },
        ),
        None => encode(Op::clCreateBuffer, &buffer),
    };
    let reply = rt::call(w)?;
    let reply = req::CreateBufferReply::decode_all(&reply)?;
    match reply.status {
        CL_SUCCESS => {
            // Where the server put the buffer's bytes in the shared arena, if it did.
            let window = reply.window.map(|o| (o, size));
            Ok(objects::new_object(
                HandleKind::Mem,
                new_id,
                Some(objects::MemInfo {
                    flags,
                    host_ptr: host_ptr as usize,
                    image: None,
                    window,
                }),
            ))
        }
        e => Err(ClErr(e)),
    }
}

pub unsafe extern "C" fn clCreateBuffer(
    context: Handle,
    flags: u64,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_buffer(context, None, flags, size, host_ptr)
    })
}

pub unsafe extern "C" fn clCreateBufferWithProperties(
    context: Handle,
    props: *const u64,
    flags: u64,
    size: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_buffer(context, Some(props), flags, size, host_ptr)
    })
}

/// `cl_image_desc` as the C headers lay it out.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ImageDesc {
    pub image_type: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub array_size: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    pub mem_object: Handle,
}

/// Bytes of host memory an image's host pointer covers.
fn host_size(d: &ImageDesc, elem: usize) -> Option<usize> {
    let row = if d.row_pitch == 0 {
        d.width.checked_mul(elem)?
    } else {
        d.row_pitch
    };
    let slice_2d = if d.slice_pitch == 0 {
        row.checked_mul(d.height)?
    } else {
        d.slice_pitch
    };
    match d.image_type {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => Some(row),
        CL_MEM_OBJECT_IMAGE2D => row.checked_mul(d.height),
        CL_MEM_OBJECT_IMAGE3D => slice_2d.checked_mul(d.depth),
        CL_MEM_OBJECT_IMAGE1D_ARRAY => (if d.slice_pitch == 0 {
            row
        } else {
            d.slice_pitch
        })
        .checked_mul(d.array_size),
        CL_MEM_OBJECT_IMAGE2D_ARRAY => slice_2d.checked_mul(d.array_size),
        _ => None,
    }
}

unsafe fn create_image(
    op: Op,
    context: Handle,
    props: Option<*const u64>,
    flags: u64,
    format: *const u32,
    desc: Option<ImageDesc>,
    host_ptr: *mut c_void,
) -> Result<Handle, ClErr> {
    // SAFETY: the application's handle.
    let ctx = unsafe { obj(context, HandleKind::Context) }?;
    let new_id = rt::alloc_id();
    let props = match props {
        // SAFETY: a zero-terminated list or NULL.
        Some(p) => unsafe { rt::props::words(wormhole_opencl_proto::Props::Plain, p) }?,
        None => None,
    };
    // SAFETY: `format` points to a cl_image_format (two cl_uint) or is NULL.
    let fmt = (!format.is_null()).then(|| unsafe { [*format, *format.add(1)] });
    let wire_desc = match &desc {
        Some(d) => Some(req::ImageDesc {
            image_type: d.image_type,
            width: d.width,
            height: d.height,
            depth: d.depth,
            array_size: d.array_size,
            row_pitch: d.row_pitch,
            slice_pitch: d.slice_pitch,
            num_mip_levels: d.num_mip_levels,
            num_samples: d.num_samples,
            // SAFETY: the application's handle or NULL.
            mem_object: unsafe { rt::id_of(d.mem_object, HandleKind::Mem, true) }
                .map_err(|_| ClErr(CL_INVALID_IMAGE_DESCRIPTOR))?,
        }),
        None => None,
    };
    let elem = fmt.and_then(|f| element_size(f[0], f[1]));
    let data = match (wants_host_data(flags, host_ptr), &desc, elem) {
        (true, Some(d), Some(e)) => {
            let n = host_size(d, e).ok_or(ClErr(CL_INVALID_IMAGE_SIZE))?;
            // SAFETY: the application promises host memory of the image's size.
            Some(unsafe { std::slice::from_raw_parts(host_ptr as *const u8, n) })
        }
        (true, _, None) if fmt.is_some() => return Err(ClErr(CL_IMAGE_FORMAT_NOT_SUPPORTED)),
        _ => None,
    };
    let w = encode(
        op,
        &req::CreateImage {
            new_id,
            context: ctx.id,
            props,
            flags,
            format: fmt,
            desc: wire_desc,
            host_ptr: !host_ptr.is_null(),
            data,
        },
    );
    let reply = rt::call(w)?;
    match Reader::new(&reply).i32()? {
        CL_SUCCESS => {
            let image = desc.map(|d| (d.image_type, elem.unwrap_or(0)));
            Ok(objects::new_object(
                HandleKind::Mem,
                new_id,
                Some(objects::MemInfo {
                    flags,
                    host_ptr: host_ptr as usize,
                    image,
                    window: None,
                }),
            ))
        }
        e => Err(ClErr(e)),
    }
}

unsafe fn read_desc(desc: *const ImageDesc) -> Option<ImageDesc> {
    // SAFETY: the application's cl_image_desc or NULL.
    (!desc.is_null()).then(|| unsafe { *desc })
}

pub unsafe extern "C" fn clCreateImage(
    context: Handle,
    flags: u64,
    format: *const u32,
    desc: *const ImageDesc,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_image(
            Op::clCreateImage,
            context,
            None,
            flags,
            format,
            read_desc(desc),
            host_ptr,
        )
    })
}

pub unsafe extern "C" fn clCreateImageWithProperties(
    context: Handle,
    props: *const u64,
    flags: u64,
    format: *const u32,
    desc: *const ImageDesc,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_image(
            Op::clCreateImageWithProperties,
            context,
            Some(props),
            flags,
            format,
            read_desc(desc),
            host_ptr,
        )
    })
}

fn desc_of(
    image_type: u32,
    width: usize,
    height: usize,
    depth: usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> ImageDesc {
    ImageDesc {
        image_type,
        width,
        height,
        depth,
        array_size: 0,
        row_pitch,
        slice_pitch,
        num_mip_levels: 0,
        num_samples: 0,
        mem_object: std::ptr::null_mut(),
    }
}

pub unsafe extern "C" fn clCreateImage2D(
    context: Handle,
    flags: u64,
    format: *const u32,
    width: usize,
    height: usize,
    row_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    let d = desc_of(CL_MEM_OBJECT_IMAGE2D, width, height, 1, row_pitch, 0);
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_image(
            Op::clCreateImage2D,
            context,
            None,
            flags,
            format,
            Some(d),
            host_ptr,
        )
    })
}

pub unsafe extern "C" fn clCreateImage3D(
    context: Handle,
    flags: u64,
    format: *const u32,
    width: usize,
    height: usize,
    depth: usize,
    row_pitch: usize,
    slice_pitch: usize,
    host_ptr: *mut c_void,
    errcode_ret: *mut i32,
) -> Handle {
    let d = desc_of(
        CL_MEM_OBJECT_IMAGE3D,
        width,
        height,
        depth,
        row_pitch,
        slice_pitch,
    );
    // SAFETY: forwarded with the caller's guarantees.
    rt::entry_handle(errcode_ret, || unsafe {
        create_image(
            Op::clCreateImage3D,
            context,
            None,
            flags,
            format,
            Some(d),
            host_ptr,
        )
    })
}
