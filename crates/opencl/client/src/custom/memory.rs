//! Buffer and image creation: host data travels with the request (staged before it when the two
//! do not fit one frame), and the client remembers what it needs later (host pointer, flags,
//! image geometry).

use super::*;
use wormhole_opencl_proto::geometry::{element_size, image_extent};
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
    // One that starts in an SVM allocation but runs past its end is refused, as the spec says
    // (it is not host memory of that size: reading it could fault).
    if flags & CL_MEM_USE_HOST_PTR != 0 && !svm && super::svm::is_svm(host_ptr as usize, 1) {
        return Err(ClErr(CL_INVALID_BUFFER_SIZE));
    }
    let data = if !svm && wants_host_data(flags, host_ptr) && size > 0 {
        // SAFETY: with USE/COPY_HOST_PTR the application promises `size` readable bytes.
        Some(unsafe { std::slice::from_raw_parts(host_ptr as *const u8, size) })
    } else {
        None
    };
    let head = |data| {
        let buffer = req::CreateBuffer {
            new_id,
            context: ctx.id,
            flags,
            size,
            host_ptr: !host_ptr.is_null(),
            svm_ptr: if svm { host_ptr as u64 } else { 0 },
            data,
        };
        match &props {
            Some(props) => encode(
                Op::clCreateBufferWithProperties,
                &req::CreateBufferWithProperties {
                    props: props.clone(),
                    buffer,
                },
            ),
            None => encode(Op::clCreateBuffer, &buffer),
        }
    };
    let reply = super::transfer::call_with_data(head, data, false)?;
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
                    host_pitches: [0, 0],
                    window,
                    size,
                    extent: None,
                    parent: None,
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
/// An image's row and slice pitch in the application's host memory (the slice pitch of a 1D
/// array is its layer pitch; 0 where the type has no slices).
fn host_pitches(d: &ImageDesc, elem: usize) -> Option<[usize; 2]> {
    let row = if d.row_pitch == 0 {
        d.width.checked_mul(elem)?
    } else {
        d.row_pitch
    };
    let slice = match (d.image_type, d.slice_pitch) {
        (CL_MEM_OBJECT_IMAGE1D_ARRAY, 0) => row,
        (CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE2D_ARRAY, 0) => row.checked_mul(d.height)?,
        (CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE2D_ARRAY, s) => s,
        _ => 0,
    };
    Some([row, slice])
}

fn host_size(d: &ImageDesc, elem: usize) -> Option<usize> {
    let [row, slice] = host_pitches(d, elem)?;
    match d.image_type {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => Some(row),
        CL_MEM_OBJECT_IMAGE2D => row.checked_mul(d.height),
        CL_MEM_OBJECT_IMAGE3D => slice.checked_mul(d.depth),
        CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY => {
            slice.checked_mul(d.array_size)
        }
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
    let head = |data| {
        encode(
            op,
            &req::CreateImage {
                new_id,
                context: ctx.id,
                props: props.clone(),
                flags,
                format: fmt,
                desc: wire_desc,
                host_ptr: !host_ptr.is_null(),
                data,
            },
        )
    };
    let reply = super::transfer::call_with_data(head, data, false)?;
    match Reader::new(&reply).i32()? {
        CL_SUCCESS => {
            let image = desc.map(|d| (d.image_type, elem.unwrap_or(0)));
            let host_pitches = desc
                .zip(elem)
                .and_then(|(d, e)| host_pitches(&d, e))
                .unwrap_or_default();
            Ok(objects::new_object(
                HandleKind::Mem,
                new_id,
                Some(objects::MemInfo {
                    flags,
                    host_ptr: host_ptr as usize,
                    image,
                    host_pitches,
                    window: None,
                    size: 0,
                    extent: desc.and_then(|d| {
                        image_extent(
                            d.image_type,
                            [d.width, d.height, d.depth, d.array_size],
                            d.num_mip_levels,
                        )
                    }),
                    parent: None,
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

/// The flags a sub-buffer has: its own, with what it leaves unsaid taken from its parent (the
/// device and host access flags), and always the parent's host pointer flags.
fn sub_buffer_flags(parent: u64, own: u64) -> u64 {
    const DEVICE: u64 = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
    const HOST: u64 = CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
    const HOST_PTR: u64 = CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
    let mut f = own | (parent & HOST_PTR);
    if own & DEVICE == 0 {
        f |= parent & DEVICE;
    }
    if own & HOST == 0 {
        f |= parent & HOST;
    }
    f
}

/// `clCreateSubBuffer`, forwarded as generated; the client then records what it needs of the
/// sub-buffer as of any buffer: a CL_MEM_USE_HOST_PTR parent's sub-buffer has its host memory
/// at the parent's pointer plus the origin (CL_MEM_HOST_PTR, and where maps land).
pub unsafe extern "C" fn clCreateSubBuffer(
    buffer: Handle,
    flags: u64,
    create_type: u32,
    info: *const c_void,
    errcode_ret: *mut i32,
) -> Handle {
    // SAFETY: forwarded with the caller's guarantees; the wire call checks every argument.
    let sub = unsafe {
        crate::generated::wire_clCreateSubBuffer(buffer, flags, create_type, info, errcode_ret)
    };
    // SAFETY: the application's handle (validated by the wire call, which succeeded).
    let parent_obj = unsafe { objects::get(buffer, HandleKind::Mem) };
    let parent_id = parent_obj.map_or(0, |o| o.id);
    let parent = parent_obj.and_then(|o| o.mem());
    // SAFETY: a handle the wire call just made, or NULL.
    let made = unsafe { objects::get(sub, HandleKind::Mem) };
    if let (Some(parent), Some(made)) = (parent, made) {
        if create_type == CL_BUFFER_CREATE_TYPE_REGION && !info.is_null() {
            // SAFETY: a cl_buffer_region (origin, size), as the call that succeeded read it.
            let [origin, size] = unsafe { *(info as *const [usize; 2]) };
            made.set_mem(objects::MemInfo {
                flags: sub_buffer_flags(parent.flags, flags),
                host_ptr: if parent.host_ptr != 0 {
                    parent.host_ptr + origin
                } else {
                    0
                },
                image: None,
                host_pitches: [0, 0],
                window: None,
                size,
                extent: None,
                parent: Some((parent_id, origin)),
            });
        }
    }
    sub
}
