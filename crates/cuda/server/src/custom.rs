//! The hand-written handlers (`@server_entry`): device memory, which the tenant's quota bounds
//! and whose ranges later calls may name, and the memory figures a tenant sees (its quota is
//! its device's size).

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

pub use crate::capture::*;
pub use crate::contexts::*;
use crate::generated::{args, ffi};
pub use crate::host_functions::{
    cuLaunchHostFunc, cuLaunchHostFunc_ptsz, cuStreamAddCallback, cuStreamAddCallback_ptsz,
};
use crate::jit::JitArrays;
pub use crate::links::*;
use crate::session::{Call, Handle};
pub use crate::tensor_maps::*;
pub use crate::vmm::*;
pub use crate::warm::{
    cuCtxCreate_v2, cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2,
};
use std::ffi::{c_void, CString};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    launch_attribute_forwarded, mempool_attribute_size, Copy2D, CuLaunchAttribute, CuLaunchConfig,
    CuMemcpy2D, DeviceRange, FunctionOf, GetGlobal, LaunchArgs, LaunchAttribute, LaunchKernel,
    Message, ModuleGetFunction, ModuleLoad, ModuleLoaded, Name, ParamLayout, PointerAttributes,
    PointerValues, Reply, Side2D, Value, LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT,
    LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST,
    POINTER_ATTRIBUTE_CONTEXT, POINTER_ATTRIBUTE_MEMPOOL_HANDLE, POINTER_VALUE_MAX,
};
use wormhole_cuda_proto::{DecodeError, HandleKind, Op, Reader, Writer};

/// `cuMemAlloc_v2`: reserved against the tenant's quota first; the range is the session's
/// until `cuMemFree_v2`.
pub fn cuMemAlloc_v2(
    s: &Call<'_>,
    a: args::cuMemAlloc_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    // SAFETY: a valid output pointer.
    allocate(s, a.bytesize, a.dptr_present, w, |d| unsafe {
        ffi::cuMemAlloc_v2(d, a.bytesize)
    });
    Ok(())
}

/// `cuMemAllocAsync`: as `cuMemAlloc_v2`, ordered on the stream (the address is known at once,
/// the memory usable in stream order).
pub fn cuMemAllocAsync(
    s: &Call<'_>,
    a: args::cuMemAllocAsync,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    match ordered_stream(s, a.hStream_id, false) {
        // SAFETY: a valid output pointer and a stream of the session's.
        Ok(stream) => allocate(s, a.bytesize, a.dptr_present, w, |d| unsafe {
            ffi::cuMemAllocAsync(d, a.bytesize, stream)
        }),
        Err(st) => w.i32(st),
    }
    Ok(())
}

/// `cuMemAllocAsync_ptsz`.
pub fn cuMemAllocAsync_ptsz(
    s: &Call<'_>,
    a: args::cuMemAllocAsync_ptsz,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    match ordered_stream(s, a.hStream_id, true) {
        // SAFETY: as in `cuMemAllocAsync`.
        Ok(stream) => allocate(s, a.bytesize, a.dptr_present, w, |d| unsafe {
            ffi::cuMemAllocAsync_ptsz(d, a.bytesize, stream)
        }),
        Err(st) => w.i32(st),
    }
    Ok(())
}

/// `cuMemAllocPitch_v2`: the driver picks the pitch, so the size is known only after it has
/// allocated; an allocation the quota cannot take is freed again (CUDA_ERROR_OUT_OF_MEMORY,
/// as when the device is full).
pub fn cuMemAllocPitch_v2(
    s: &Call<'_>,
    a: args::cuMemAllocPitch_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    if !a.dptr_present || !a.pPitch_present {
        // What the driver answers for a missing output, before anything is allocated.
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    let (mut dptr, mut pitch) = (0u64, 0usize);
    // SAFETY: valid output pointers; the rest are values.
    let st = unsafe {
        ffi::cuMemAllocPitch_v2(
            &mut dptr,
            &mut pitch,
            a.WidthInBytes,
            a.Height,
            a.ElementSizeBytes,
        )
    };
    if st != CUDA_SUCCESS {
        w.i32(st);
        return Ok(());
    }
    let bytes = (pitch as u64).saturating_mul(a.Height as u64);
    if !s.limits().reserve(bytes) {
        // SAFETY: the allocation just made, which nothing else knows.
        unsafe { ffi::cuMemFree_v2(dptr) };
        w.i32(CUDA_ERROR_OUT_OF_MEMORY);
        return Ok(());
    }
    s.allocated(dptr, bytes, crate::rt::current_context());
    w.i32(CUDA_SUCCESS);
    w.u64(dptr);
    w.u64(pitch as u64);
    Ok(())
}

/// An allocation of `bytes` by `alloc`, reserved against the tenant's quota first; the range
/// is the session's until it is freed. Writes the reply.
fn allocate(
    s: &Call<'_>,
    bytesize: usize,
    present: bool,
    w: &mut Writer,
    alloc: impl FnOnce(&mut u64) -> i32,
) {
    if !present {
        // Nowhere to say where: the driver's answer, before anything is allocated.
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return;
    }
    let bytes = bytesize as u64;
    if !s.limits().reserve(bytes) {
        w.i32(CUDA_ERROR_OUT_OF_MEMORY);
        return;
    }
    let mut dptr = 0u64;
    let st = alloc(&mut dptr);
    if st != CUDA_SUCCESS {
        s.limits().release(bytes);
        w.i32(st);
        return;
    }
    s.allocated(dptr, bytes, crate::rt::current_context());
    w.i32(CUDA_SUCCESS);
    w.u64(dptr);
}

/// The stream of a stream-ordered allocation or free: one of the session's, and not
/// capturing. Stream-ordered allocation on a capturing stream becomes graph memory that every
/// launch of the graph allocates anew, which no quota would see: refused, saying why.
fn ordered_stream(s: &Call<'_>, id: u64, per_thread: bool) -> Result<Handle, i32> {
    let stream = s.resolve(id, HandleKind::Stream, true)?;
    if crate::capture::is_capturing(stream, per_thread) {
        tracing::warn!(
            "stream-ordered allocation on a capturing stream (graph memory, beyond the quota): answering CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(stream)
}

/// `cuMemFree_v2`: only the start of an allocation of this session.
pub fn cuMemFree_v2(
    s: &Call<'_>,
    a: args::cuMemFree_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    // SAFETY: a value argument: an allocation of this session.
    w.i32(free(s, a.dptr, |d| unsafe { ffi::cuMemFree_v2(d) }));
    Ok(())
}

/// `cuMemFreeAsync`: as `cuMemFree_v2`, in stream order (the quota is given back now: the
/// tenant can no longer name the memory).
pub fn cuMemFreeAsync(
    s: &Call<'_>,
    a: args::cuMemFreeAsync,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    w.i32(match ordered_stream(s, a.hStream_id, false) {
        // SAFETY: an allocation of this session and a stream of its.
        Ok(stream) => free(s, a.dptr, |d| unsafe { ffi::cuMemFreeAsync(d, stream) }),
        Err(st) => st,
    });
    Ok(())
}

/// `cuMemFreeAsync_ptsz`.
pub fn cuMemFreeAsync_ptsz(
    s: &Call<'_>,
    a: args::cuMemFreeAsync_ptsz,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    w.i32(match ordered_stream(s, a.hStream_id, true) {
        // SAFETY: as in `cuMemFreeAsync`.
        Ok(stream) => free(s, a.dptr, |d| unsafe {
            ffi::cuMemFreeAsync_ptsz(d, stream)
        }),
        Err(st) => st,
    });
    Ok(())
}

/// Frees `dptr` by `release_it` if it starts an allocation of this session; its status.
fn free(s: &Call<'_>, dptr: u64, release_it: impl FnOnce(u64) -> i32) -> i32 {
    if dptr == 0 {
        // The driver's own answer: freeing 0 is free(NULL) (CUDA_SUCCESS), which runtimes
        // rely on (cudart forwards `cudaFree(0)`, cuBLAS's start checks its status).
        return release_it(0);
    }
    let Some((len, ctx)) = s.freed(dptr) else {
        tracing::warn!(
            dptr = format_args!("{dptr:#x}"),
            "free of an address the session did not allocate"
        );
        return CUDA_ERROR_INVALID_VALUE;
    };
    let st = release_it(dptr);
    if st == CUDA_SUCCESS {
        s.limits().release(len);
    } else {
        // Still allocated as far as the driver is concerned.
        s.allocated(dptr, len, ctx);
    }
    st
}

/// The device range a 2D memset touches (`height` rows of `width` elements of `elem` bytes,
/// `pitch` bytes apart) must be the session's: checked here, since its length is no one
/// parameter's.
fn check_2d(
    s: &Call<'_>,
    dst: u64,
    pitch: usize,
    width: usize,
    height: usize,
    elem: usize,
) -> Result<(), i32> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let span = width
        .checked_mul(elem)
        .and_then(|row| pitch.checked_mul(height - 1)?.checked_add(row))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    crate::rt::check_device(s, dst, Some(span))
}

/// The 2D memsets (`cuMemsetD2D{8,16,32}`: `_v2`, `_v2_ptds`, `Async`, `Async_ptsz`), each a
/// handler that checks the range and calls its own driver entry point.
macro_rules! memset_2d {
    ($($name:ident: $value:ident, $elem:expr, $($stream:ident)?;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        pub fn $name(s: &Call<'_>, a: args::$name, w: &mut Writer) -> Result<(), DecodeError> {
            let run = || -> Result<(), i32> {
                check_2d(s, a.dstDevice, a.dstPitch, a.Width, a.Height, $elem)?;
                $(let $stream = s.resolve(a.hStream_id, HandleKind::Stream, true)?;)?
                // SAFETY: a device range of the session's (checked above), values, and a
                // stream of the session's.
                crate::rt::status(unsafe {
                    ffi::$name(a.dstDevice, a.dstPitch, a.$value, a.Width, a.Height $(, $stream)?)
                })
            };
            w.i32(run().err().unwrap_or(CUDA_SUCCESS));
            Ok(())
        }
    )*};
}

memset_2d! {
    cuMemsetD2D8_v2: uc, 1, ;
    cuMemsetD2D8_v2_ptds: uc, 1, ;
    cuMemsetD2D8Async: uc, 1, stream;
    cuMemsetD2D8Async_ptsz: uc, 1, stream;
    cuMemsetD2D16_v2: us, 2, ;
    cuMemsetD2D16_v2_ptds: us, 2, ;
    cuMemsetD2D16Async: us, 2, stream;
    cuMemsetD2D16Async_ptsz: us, 2, stream;
    cuMemsetD2D32_v2: ui, 4, ;
    cuMemsetD2D32_v2_ptds: ui, 4, ;
    cuMemsetD2D32Async: ui, 4, stream;
    cuMemsetD2D32Async_ptsz: ui, 4, stream;
}

/// `cuFuncGetName`: the driver's string, sent as bytes.
pub fn cuFuncGetName(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    name_of(s, r, w, HandleKind::Function)
}

/// `cuKernelGetName`.
pub fn cuKernelGetName(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    name_of(s, r, w, HandleKind::Kernel)
}

fn name_of(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    kind: HandleKind,
) -> Result<(), DecodeError> {
    let id = r.u64()?;
    r.finish()?;
    let named = (|| -> Result<Vec<u8>, i32> {
        let object = s.resolve(id, kind, false)?;
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let out = (&mut name as *mut *const std::ffi::c_char).cast();
        // SAFETY: a live object of the session's and an output for the driver's string.
        crate::rt::status(unsafe {
            match kind {
                HandleKind::Kernel => ffi::cuKernelGetName(out, object),
                _ => ffi::cuFuncGetName(out, object),
            }
        })?;
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the driver returned a NUL-terminated string it keeps.
        Ok(unsafe { std::ffi::CStr::from_ptr(name) }
            .to_bytes()
            .to_vec())
    })();
    let reply: Reply<Name> = named.as_deref().map(Name).map_err(|&e| e);
    reply.encode(w);
    Ok(())
}

/// The device memory a tenant may use: its quota, where that is less than the device's.
fn quota_view(s: &Call<'_>, total: u64, free: u64) -> (u64, u64) {
    match s.limits().mem_quota {
        Some(q) => {
            let held = s.limits().tenant_bytes().max(0) as u64;
            (total.min(q), free.min(q.saturating_sub(held)))
        }
        None => (total, free),
    }
}

/// `cuMemGetInfo_v2`, as the tenant sees it.
pub fn cuMemGetInfo_v2(
    s: &Call<'_>,
    a: args::cuMemGetInfo_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid output pointers.
    let st = unsafe { ffi::cuMemGetInfo_v2(&mut free, &mut total) };
    w.i32(st);
    if st == CUDA_SUCCESS {
        let (total, free) = quota_view(s, total as u64, free as u64);
        if a.free_present {
            w.u64(free);
        }
        if a.total_present {
            w.u64(total);
        }
    }
    Ok(())
}

/// `cuDeviceTotalMem_v2`, as the tenant sees it.
pub fn cuDeviceTotalMem_v2(
    s: &Call<'_>,
    a: args::cuDeviceTotalMem_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let dev = match crate::rt::driver_device(s, a.dev) {
        Ok(d) => d,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let mut bytes = 0usize;
    // SAFETY: a valid output pointer.
    let st = unsafe { ffi::cuDeviceTotalMem_v2(&mut bytes, dev) };
    w.i32(st);
    if st == CUDA_SUCCESS && a.bytes_present {
        w.u64(quota_view(s, bytes as u64, bytes as u64).0);
    }
    Ok(())
}

/// What an image is loaded as.
#[derive(Clone, Copy)]
enum Load {
    Module,
    FatBinary,
    Library,
}

/// `cuModuleLoadData`: an image the client sent, or one of the tenant's the server keeps.
pub fn cuModuleLoadData(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::Module)
}

/// `cuModuleLoad`: the client read the file (the server never opens a tenant's paths), so this
/// is `cuModuleLoadData`.
pub fn cuModuleLoad(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::Module)
}

/// `cuModuleLoadFatBinary`: as `cuModuleLoadData`.
pub fn cuModuleLoadFatBinary(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::FatBinary)
}

/// `cuModuleLoadDataEx`: as `cuModuleLoadData`, with JIT options (`crate::jit`).
pub fn cuModuleLoadDataEx(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::Module)
}

/// `cuLibraryLoadData`: as `cuModuleLoadData`, with JIT options but no library options (the
/// client refuses those it cannot forward).
pub fn cuLibraryLoadData(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::Library)
}

/// `cuLibraryLoadFromFile`: the client read the file, so this is `cuLibraryLoadData`.
pub fn cuLibraryLoadFromFile(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    module_load(s, r, w, Load::Library)
}

/// The bytes of `data` in memory aligned for any type (a driver may read an image's headers
/// or a parameter as wider types; a frame's bytes have no alignment), followed by at least
/// one zero byte: PTX is read up to its NUL, which a program (or a malicious client) may have
/// left out of the bytes it sent.
pub(crate) fn aligned(data: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; (data.len() + 1).div_ceil(8)];
    // SAFETY: `v` holds at least `data.len()` bytes; u64 has no invalid bit patterns.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), v.as_mut_ptr().cast::<u8>(), data.len())
    };
    v
}

fn module_load(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    load: Load,
) -> Result<(), DecodeError> {
    let m = ModuleLoad::decode(r)?;
    r.finish()?;
    let reply = |status: i32, need_image: bool| ModuleLoaded {
        status,
        need_image,
        jit: Vec::new(),
    };
    let answer = (|| {
        if let Err(st) = s.check_new_id(m.new_id) {
            return reply(st, false);
        }
        let mut jit = match JitArrays::new(&m.jit) {
            Ok(jit) => jit,
            Err(st) => return reply(st, false),
        };
        // The image in aligned memory: one copy, from the frame or from the cache.
        let image = match m.image {
            Some(bytes) => {
                if ring::digest::digest(&ring::digest::SHA256, bytes).as_ref() != m.digest {
                    tracing::warn!("a module image whose digest is not the one sent with it");
                    return reply(CUDA_ERROR_INVALID_VALUE, false);
                }
                IMAGES.received.count(bytes.len());
                aligned(bytes)
            }
            None => match s.kept_image(&m.digest) {
                Some(bytes) => {
                    IMAGES.from_cache.count(bytes.len());
                    aligned(&bytes)
                }
                None => {
                    IMAGES
                        .asked_for
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return reply(CUDA_SUCCESS, true);
                }
            },
        };
        let mut module: Handle = std::ptr::null_mut();
        let out = (&mut module as *mut Handle).cast::<c_void>();
        let code = image.as_ptr() as *mut c_void;
        let null = std::ptr::null_mut();
        let n_jit = jit.len();
        let (options, values) = jit.pointers();
        let (options, values) = (options.cast::<c_void>(), values.cast::<c_void>());
        // SAFETY: `code` is a whole image (measured by the client, digest checked) that lives
        // across the call; `out` is a valid output pointer; the JIT arrays hold `n_jit`
        // entries, their log buffers the sizes their options say.
        let (st, kind) = unsafe {
            match load {
                Load::FatBinary => (ffi::cuModuleLoadFatBinary(out, code), HandleKind::Module),
                Load::Module if n_jit == 0 => {
                    (ffi::cuModuleLoadData(out, code), HandleKind::Module)
                }
                Load::Module => (
                    ffi::cuModuleLoadDataEx(out, code, n_jit, options, values),
                    HandleKind::Module,
                ),
                // The driver copies the image (it is not said to be preserved).
                Load::Library => (
                    ffi::cuLibraryLoadData(out, code, options, values, n_jit, null, null, 0),
                    HandleKind::Library,
                ),
            }
        };
        let loaded = |status: i32| ModuleLoaded {
            status,
            need_image: false,
            jit: jit.outputs(),
        };
        if st != CUDA_SUCCESS {
            return loaded(st);
        }
        if let Err(st) = s.bind(m.new_id, kind, module) {
            crate::rt::release(kind, module);
            return loaded(st);
        }
        let done = loaded(CUDA_SUCCESS);
        // A library may be loaded lazily, at a function's first use, when the driver may
        // write the JIT options' logs and slots: their arrays stay with it until it is
        // unloaded (the logs the program sees are those of the load itself).
        if matches!(load, Load::Library) && jit.len() > 0 {
            if let Err((st, jit)) = s.keep_jit_arrays(m.new_id, jit) {
                s.forget(m.new_id);
                // The library first: the driver may write into the arrays until it goes.
                crate::rt::release(kind, module);
                drop(jit);
                return ModuleLoaded { status: st, ..done };
            }
        }
        // Kept for the tenant's next sessions once the driver took it.
        if let Some(bytes) = m.image {
            s.keep_image(&m.digest, bytes);
        }
        done
    })();
    answer.encode(w);
    Ok(())
}

/// Module images by where they came from, for `wh status`: a framework loads hundreds at
/// start, and a later process of the tenant should find the large ones kept by the server
/// (sent as a digest) rather than send them again.
pub struct ImageCounts {
    /// Sent with the load (small ones always; large ones when the server asked).
    pub received: Tally,
    /// Named by digest and found in the server's cache.
    pub from_cache: Tally,
    /// Named by digest and not kept: the client was asked for the bytes.
    pub asked_for: std::sync::atomic::AtomicU64,
}

/// A count and its bytes.
pub struct Tally {
    pub count: std::sync::atomic::AtomicU64,
    pub bytes: std::sync::atomic::AtomicU64,
}

impl Tally {
    const fn new() -> Tally {
        Tally {
            count: std::sync::atomic::AtomicU64::new(0),
            bytes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn count(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.count.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }
}

pub static IMAGES: ImageCounts = ImageCounts {
    received: Tally::new(),
    from_cache: Tally::new(),
    asked_for: std::sync::atomic::AtomicU64::new(0),
};

/// Most parameters asked of the driver for one function: what a layout on the wire may hold
/// (CUDA's 32,764 bytes of parameters could be more, of one byte each).
const MAX_PARAMS: usize = wormhole_cuda_proto::requests::MAX_KERNEL_PARAMS;

/// `cuModuleGetFunction`: the function, bound with its parameters' layout (the client copies a
/// launch's arguments by it; a launch is checked against it).
pub fn cuModuleGetFunction(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    get_entry(s, r, w, HandleKind::Function)
}

/// `cuLibraryGetKernel`: the kernel, bound with its parameters' layout, as a module's function.
pub fn cuLibraryGetKernel(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    get_entry(s, r, w, HandleKind::Kernel)
}

/// A module's function or a library's kernel (`kind`) by name.
fn get_entry(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    kind: HandleKind,
) -> Result<(), DecodeError> {
    let m = ModuleGetFunction::decode(r)?;
    r.finish()?;
    let answer = (|| -> Result<ParamLayout, i32> {
        let parent = match kind {
            HandleKind::Kernel => HandleKind::Library,
            _ => HandleKind::Module,
        };
        let parent = s.resolve(m.module, parent, false)?;
        s.check_new_id(m.new_id)?;
        let name = CString::new(m.name).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let mut entry: Handle = std::ptr::null_mut();
        let out = (&mut entry as *mut Handle).cast();
        // SAFETY: valid output pointer, a live module or library, a C string.
        let st = unsafe {
            match kind {
                HandleKind::Kernel => ffi::cuLibraryGetKernel(out, parent, name.as_ptr()),
                _ => ffi::cuModuleGetFunction(out, parent, name.as_ptr()),
            }
        };
        if st != CUDA_SUCCESS {
            return Err(st);
        }
        let layout = param_layout(|i, offset, size| {
            // SAFETY: a live function or kernel, valid output pointers.
            unsafe {
                match kind {
                    HandleKind::Kernel => ffi::cuKernelGetParamInfo(entry, i, offset, size),
                    _ => ffi::cuFuncGetParamInfo(entry, i, offset, size),
                }
            }
        })?;
        s.bind(m.new_id, kind, entry)?;
        s.set_layout(m.new_id, layout.clone());
        let parent_kind = match kind {
            HandleKind::Kernel => HandleKind::Library,
            _ => HandleKind::Module,
        };
        s.set_parent(m.new_id, (m.module, parent_kind));
        Ok(layout)
    })();
    answer.encode(w);
    Ok(())
}

/// A function's (or kernel's) parameters, asked of the driver one by one (`info(index,
/// &offset, &size)`) until it says there are no more. A function with more than a layout
/// holds is refused, never launched with a layout cut short.
fn param_layout(info: impl Fn(usize, &mut usize, &mut usize) -> i32) -> Result<ParamLayout, i32> {
    let mut layout = ParamLayout::default();
    for i in 0..=MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        match info(i, &mut offset, &mut size) {
            CUDA_SUCCESS if i == MAX_PARAMS => {
                tracing::warn!(
                    "a function with more than {MAX_PARAMS} parameters: its launches are not forwarded"
                );
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            CUDA_SUCCESS => layout.params.push((offset as u32, size as u32)),
            // Past the last parameter.
            CUDA_ERROR_INVALID_VALUE => break,
            other => {
                tracing::warn!(
                    status = other,
                    "cuFuncGetParamInfo failed (a driver older than CUDA 12.4?): the function's launches cannot be forwarded"
                );
                return Err(other);
            }
        }
    }
    Ok(layout)
}

/// `cuLibraryGetModule`: the library's module, which goes with its library (unloaded with
/// it, its functions and variables no longer the session's).
pub fn cuLibraryGetModule(
    s: &Call<'_>,
    a: args::cuLibraryGetModule,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let library = match s.resolve(a.library_id, HandleKind::Library, false) {
        Ok(library) => library,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let mut module: Handle = std::ptr::null_mut();
    let out = crate::rt::out_ptr(a.pMod_present, &mut module);
    // SAFETY: a library of the session's and an output for one module (or NULL, as asked).
    let st = unsafe { ffi::cuLibraryGetModule(out, library) };
    w.i32(st);
    if st == CUDA_SUCCESS && a.pMod_present {
        let id = s.export(HandleKind::Module, module);
        s.set_parent(id, (a.library_id, HandleKind::Library));
        s.export_list(w, HandleKind::Module, &[module]);
    }
    Ok(())
}

/// `cuKernelGetFunction`: the kernel's function in the current context, under the id the
/// client knows it by (the same function is the same id), with the kernel's layout.
pub fn cuKernelGetFunction(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let kernel_id = r.u64()?;
    r.finish()?;
    let answer = (|| -> Result<FunctionOf, i32> {
        let kernel = s.resolve(kernel_id, HandleKind::Kernel, false)?;
        let layout = s.layout(kernel_id).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let mut func: Handle = std::ptr::null_mut();
        // SAFETY: valid output pointer, a live kernel.
        let st = unsafe { ffi::cuKernelGetFunction((&mut func as *mut Handle).cast(), kernel) };
        if st != CUDA_SUCCESS {
            return Err(st);
        }
        let id = s.export(HandleKind::Function, func);
        s.set_layout(id, (*layout).clone());
        s.set_parent(id, (kernel_id, HandleKind::Kernel));
        Ok(FunctionOf {
            id,
            layout: (*layout).clone(),
        })
    })();
    answer.encode(w);
    Ok(())
}

/// `cuModuleGetGlobal_v2`: a module's variable, which the session may then name in copies.
pub fn cuModuleGetGlobal_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    get_global(s, r, w, HandleKind::Module)
}

/// `cuLibraryGetGlobal`: as `cuModuleGetGlobal_v2`, of a library.
pub fn cuLibraryGetGlobal(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    get_global(s, r, w, HandleKind::Library)
}

fn get_global(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    kind: HandleKind,
) -> Result<(), DecodeError> {
    let m = GetGlobal::decode(r)?;
    r.finish()?;
    let answer = (|| -> Result<DeviceRange, i32> {
        let parent = s.resolve(m.object, kind, false)?;
        let name = CString::new(m.name).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let (mut dptr, mut bytes) = (0u64, 0usize);
        let (d, b) = (
            (&mut dptr as *mut u64).cast(),
            (&mut bytes as *mut usize).cast(),
        );
        // SAFETY: valid output pointers, a live module or library, a C string.
        let st = unsafe {
            match kind {
                HandleKind::Library => ffi::cuLibraryGetGlobal(d, b, parent, name.as_ptr()),
                _ => ffi::cuModuleGetGlobal_v2(d, b, parent, name.as_ptr()),
            }
        };
        if st != CUDA_SUCCESS {
            return Err(st);
        }
        s.global(dptr, bytes as u64, (m.object, kind));
        Ok(DeviceRange {
            dptr,
            bytes: bytes as u64,
        })
    })();
    answer.encode(w);
    Ok(())
}

/// `cuLaunchKernel`.
pub fn cuLaunchKernel(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    launch(s, r, w, false)
}

/// `cuLaunchKernel_ptsz`.
pub fn cuLaunchKernel_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    launch(s, r, w, true)
}

/// `cuLaunchCooperativeKernel`: the client sends it as a launch with the cooperative attribute
/// (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`, which the driver documents as the same launch).
pub fn cuLaunchCooperativeKernel(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    launch(s, r, w, false)
}

/// `cuLaunchCooperativeKernel_ptsz`.
pub fn cuLaunchCooperativeKernel_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    launch(s, r, w, true)
}

/// `cuLaunchKernelEx`: as `cuLaunchKernel`, with the launch's attributes.
pub fn cuLaunchKernelEx(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    launch(s, r, w, false)
}

/// `cuLaunchKernelEx_ptsz`.
pub fn cuLaunchKernelEx_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    launch(s, r, w, true)
}

/// The driver's form of a launch's attributes: an event named in one resolved to the
/// session's event (a bad one is the driver's CUDA_ERROR_INVALID_HANDLE).
fn attributes_for_driver(
    s: &Call<'_>,
    attributes: &[LaunchAttribute],
) -> Result<Vec<CuLaunchAttribute>, i32> {
    attributes
        .iter()
        .map(|a| {
            if !launch_attribute_forwarded(a.id) {
                tracing::warn!(id = a.id, "a launch attribute Wormhole does not forward");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            let mut value = [0u64; 8];
            for (v, b) in value.iter_mut().zip(a.value.chunks_exact(8)) {
                *v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            if a.id == LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT
                || a.id == LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT
            {
                value[0] = s.resolve(value[0], HandleKind::Event, false)? as u64;
            }
            Ok(CuLaunchAttribute {
                id: a.id,
                pad: 0,
                value,
            })
        })
        .collect()
}

/// A cluster occupancy question: the launch configuration arrives as a `LaunchKernel` without
/// arguments; the answer is the driver's `int`.
fn cluster_occupancy(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    op: Op,
) -> Result<(), DecodeError> {
    let m = LaunchKernel::decode(r)?;
    r.finish()?;
    let reply: Reply<Value> = (|| {
        let func = s.resolve(m.function, HandleKind::Function, false)?;
        let stream = s.resolve(m.stream, HandleKind::Stream, true)?;
        let mut attrs = attributes_for_driver(s, &m.attributes)?;
        let config = CuLaunchConfig {
            grid: m.grid,
            block: m.block,
            shared_mem: m.shared_mem,
            stream,
            attrs: attrs.as_mut_ptr(),
            num_attrs: attrs.len() as u32,
        };
        let config = (&config as *const CuLaunchConfig).cast_mut().cast();
        let mut value = 0i32;
        let out = (&mut value as *mut i32).cast();
        // SAFETY: a live function, a launch configuration whose attributes live across the
        // call, and an `int` for the answer.
        let st = unsafe {
            match op {
                Op::cuOccupancyMaxActiveClusters => {
                    ffi::cuOccupancyMaxActiveClusters(out, func, config)
                }
                _ => ffi::cuOccupancyMaxPotentialClusterSize(out, func, config),
            }
        };
        crate::rt::status(st).map(|()| Value(value))
    })();
    reply.encode(w);
    Ok(())
}

/// `cuOccupancyMaxActiveClusters`.
pub fn cuOccupancyMaxActiveClusters(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    cluster_occupancy(s, r, w, Op::cuOccupancyMaxActiveClusters)
}

/// `cuOccupancyMaxPotentialClusterSize`.
pub fn cuOccupancyMaxPotentialClusterSize(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    cluster_occupancy(s, r, w, Op::cuOccupancyMaxPotentialClusterSize)
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`, `CU_LAUNCH_PARAM_END`.
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

/// A launch whose arguments match the function's layout: each parameter exactly its size, or
/// a whole buffer.
fn launch(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    per_thread: bool,
) -> Result<(), DecodeError> {
    let m = LaunchKernel::decode(r)?;
    r.finish()?;
    let status = (|| -> Result<i32, i32> {
        // A kernel launches as its function in the current context (see `resolve`).
        let func = s.resolve(m.function, HandleKind::Function, false)?;
        let stream = s.resolve(m.stream, HandleKind::Stream, true)?;
        let layout = s.layout(m.function).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let storage: Vec<Vec<u64>>;
        let mut pointers: Vec<*mut c_void>;
        let mut buffer_size: usize;
        let mut extra: [*mut c_void; 5];
        let (params, extra_ptr) = match &m.args {
            LaunchArgs::Each(args) => {
                let fits = args.len() == layout.params.len()
                    && args
                        .iter()
                        .zip(&layout.params)
                        .all(|(a, &(_, size))| a.len() == size as usize);
                if !fits {
                    tracing::warn!("a launch's arguments do not match the function's parameters");
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                storage = args.iter().map(|a| aligned(a)).collect();
                pointers = storage.iter().map(|v| v.as_ptr() as *mut c_void).collect();
                (pointers.as_mut_ptr().cast::<c_void>(), std::ptr::null_mut())
            }
            LaunchArgs::Buffer(b) => {
                storage = vec![aligned(b)];
                buffer_size = b.len();
                extra = [
                    PARAM_BUFFER_POINTER as *mut c_void,
                    storage[0].as_ptr() as *mut c_void,
                    PARAM_BUFFER_SIZE as *mut c_void,
                    (&mut buffer_size as *mut usize).cast(),
                    PARAM_END as *mut c_void,
                ];
                (std::ptr::null_mut(), extra.as_mut_ptr().cast::<c_void>())
            }
        };
        let [gx, gy, gz] = m.grid;
        let [bx, by, bz] = m.block;
        if !m.attributes.is_empty() {
            let mut attrs = attributes_for_driver(s, &m.attributes)?;
            let config = CuLaunchConfig {
                grid: m.grid,
                block: m.block,
                shared_mem: m.shared_mem,
                stream,
                attrs: attrs.as_mut_ptr(),
                num_attrs: attrs.len() as u32,
            };
            let config = (&config as *const CuLaunchConfig).cast_mut().cast();
            // SAFETY: as below, with a launch configuration whose attributes live across the
            // call.
            return Ok(unsafe {
                if per_thread {
                    ffi::cuLaunchKernelEx_ptsz(config, func, params, extra_ptr)
                } else {
                    ffi::cuLaunchKernelEx(config, func, params, extra_ptr)
                }
            });
        }
        // SAFETY: a live function and stream; `params` holds one pointer per parameter, each
        // to a copy of exactly the parameter's size, or `extra` a buffer list; both live
        // across the call.
        Ok(unsafe {
            if per_thread {
                ffi::cuLaunchKernel_ptsz(
                    func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    m.shared_mem,
                    stream,
                    params,
                    extra_ptr,
                )
            } else {
                ffi::cuLaunchKernel(
                    func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    m.shared_mem,
                    stream,
                    params,
                    extra_ptr,
                )
            }
        })
    })();
    w.i32(status.unwrap_or_else(|e| e));
    Ok(())
}

/// A host address of the worker's own that CUDA knows nothing of: what the driver is asked
/// about in place of the client's own memory (its address means nothing here), so that it
/// answers as it would for the program's: not a CUDA pointer.
static UNKNOWN_TO_CUDA: u8 = 0;

/// `cuPointerGetAttribute`.
pub fn cuPointerGetAttribute(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    pointer_attributes(s, r, w)
}

/// `cuPointerGetAttributes`.
pub fn cuPointerGetAttributes(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    pointer_attributes(s, r, w)
}

/// Attributes of a device address of the session's (or of none): each value exactly as the
/// driver wrote it. The driver is asked twice, over buffers filled with two patterns, and
/// a value is as long as the bytes it wrote in either: the client then writes no more into
/// the program's variable than the driver would (sizes differ by attribute, and some are a C
/// `bool`).
fn pointer_attributes(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let m = PointerAttributes::decode(r)?;
    r.finish()?;
    let n = m.attributes.len();
    if m.single && n != 1 {
        return Err(DecodeError::BadValue(
            "cuPointerGetAttribute asks for one attribute",
        ));
    }
    let mut answer = |status, values| PointerValues { status, values }.encode(w);
    if m.attributes.contains(&POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
        answer(CUDA_ERROR_NOT_SUPPORTED, Vec::new());
        return Ok(());
    }
    let ptr = match m.ptr {
        0 => &UNKNOWN_TO_CUDA as *const u8 as u64,
        p => match crate::rt::check_device(s, p, Some(1)) {
            Ok(()) => p,
            Err(st) => {
                answer(st, Vec::new());
                return Ok(());
            }
        },
    };
    let ask = |fill: u8| {
        let mut bufs = vec![[fill; POINTER_VALUE_MAX]; n];
        let status = if m.single {
            // SAFETY: the buffer holds more than any attribute's value.
            unsafe { ffi::cuPointerGetAttribute(bufs[0].as_mut_ptr().cast(), m.attributes[0], ptr) }
        } else {
            let mut slots: Vec<*mut c_void> =
                bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
            // SAFETY: `n` attributes and `n` buffers, each larger than any attribute's value.
            unsafe {
                ffi::cuPointerGetAttributes(
                    n as u32,
                    m.attributes.as_ptr() as *mut c_void,
                    slots.as_mut_ptr().cast(),
                    ptr,
                )
            }
        };
        (status, bufs)
    };
    let (status, a) = ask(0xa5);
    if status != CUDA_SUCCESS {
        answer(status, Vec::new());
        return Ok(());
    }
    let (_, b) = ask(0x5a);
    let values = m
        .attributes
        .iter()
        .zip(a.iter().zip(&b))
        .map(|(attribute, (a, b))| {
            let written = (0..POINTER_VALUE_MAX)
                .rev()
                .find(|&k| a[k] != 0xa5 || b[k] != 0x5a)
                .map_or(0, |k| k + 1);
            let value = &a[..written];
            if *attribute == POINTER_ATTRIBUTE_CONTEXT && written == 8 {
                let ctx = u64::from_le_bytes(value.try_into().expect("8 bytes"));
                s.export(HandleKind::Context, ctx as Handle)
                    .to_le_bytes()
                    .to_vec()
            } else {
                value.to_vec()
            }
        })
        .collect();
    answer(CUDA_SUCCESS, values);
    Ok(())
}

/// Device attributes that advertise what Wormhole refuses: managed memory (83, 89, 101); the
/// device reaching the program's pageable memory (88, 100: that memory is in another process
/// than the worker); sharing memory or events with other processes (a POSIX file descriptor,
/// a fabric handle, a pool's handles, dma-buf, IPC events: a handle means nothing outside the
/// worker); multicast objects; memory on the host through virtual memory management or
/// pools. Answered 0, so that programs and libraries that choose a path by them (NCCL,
/// PyTorch's symmetric memory) choose one that works.
const REFUSED_FEATURES: [i32; 17] = [
    83, 88, 89, 100, 101, 103, 119, 124, 125, 128, 132, 141, 142, 143, 144, 145, 146,
];

/// `cuDeviceGetAttribute`: the driver's answer, but 0 for `REFUSED_FEATURES`.
pub fn cuDeviceGetAttribute(
    s: &Call<'_>,
    a: args::cuDeviceGetAttribute,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let dev = match crate::rt::driver_device(s, a.dev) {
        Ok(d) => d,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let mut value = 0u32;
    let out = match a.pi_present {
        true => &mut value as *mut u32,
        false => std::ptr::null_mut(),
    };
    // SAFETY: a valid output pointer (or NULL, which the driver refuses).
    let st = unsafe { ffi::cuDeviceGetAttribute(out, a.attrib, dev) };
    w.i32(st);
    if st == CUDA_SUCCESS && a.pi_present {
        w.u32(match REFUSED_FEATURES.contains(&a.attrib) {
            true => 0,
            false => value,
        });
    }
    Ok(())
}

/// `cuDeviceGetCount`: the devices the tenant may use.
pub fn cuDeviceGetCount(
    s: &Call<'_>,
    a: args::cuDeviceGetCount,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    if !a.count_present {
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    w.i32(CUDA_SUCCESS);
    w.u32(crate::rt::visible_devices(s).len() as u32);
    Ok(())
}

/// `cuDeviceGet`: the tenant's devices are numbered from 0, and a device is its number.
pub fn cuDeviceGet(s: &Call<'_>, a: args::cuDeviceGet, w: &mut Writer) -> Result<(), DecodeError> {
    match crate::rt::driver_device(s, a.ordinal) {
        Err(st) => w.i32(st),
        Ok(_) if !a.device_present => w.i32(CUDA_ERROR_INVALID_VALUE),
        Ok(_) => {
            w.i32(CUDA_SUCCESS);
            w.u32(a.ordinal as u32);
        }
    }
    Ok(())
}

/// The reply of a query whose answer is a driver's device: the tenant's number for it.
fn reply_device(s: &Call<'_>, st: i32, dev: u32, present: bool, w: &mut Writer) {
    if st != CUDA_SUCCESS || !present {
        w.i32(st);
        return;
    }
    match crate::rt::tenant_device(s, dev as i32) {
        Some(n) => {
            w.i32(CUDA_SUCCESS);
            w.u32(n as u32);
        }
        None => {
            tracing::warn!(
                dev,
                "a context of the session is on a device the tenant may not use"
            );
            w.i32(CUDA_ERROR_INVALID_DEVICE);
        }
    }
}

/// `cuDeviceGetByPCIBusId`: the device at a PCI address, by the tenant's number; one the
/// tenant may not use is no device of its (CUDA_ERROR_INVALID_DEVICE, as for an address with
/// no device).
pub fn cuDeviceGetByPCIBusId(
    s: &Call<'_>,
    a: args::cuDeviceGetByPCIBusId,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let bus_id = a
        .pciBusId_str
        .as_ref()
        .map_or(std::ptr::null(), |c| c.as_ptr());
    let mut dev = 0u32;
    let out = crate::rt::out_ptr(a.dev_present, &mut dev);
    // SAFETY: an output (or NULL, as asked) and a C string (or NULL).
    let st = unsafe { ffi::cuDeviceGetByPCIBusId(out, bus_id) };
    if st == CUDA_SUCCESS && a.dev_present && crate::rt::tenant_device(s, dev as i32).is_none() {
        w.i32(CUDA_ERROR_INVALID_DEVICE);
        return Ok(());
    }
    reply_device(s, st, dev, a.dev_present, w);
    Ok(())
}

/// A stream's device (`per_thread`: the NULL stream is the thread's), by the tenant's number.
fn stream_device(s: &Call<'_>, stream_id: u64, present: bool, per_thread: bool, w: &mut Writer) {
    let stream = match s.resolve(stream_id, HandleKind::Stream, true) {
        Ok(stream) => stream,
        Err(st) => return w.i32(st),
    };
    let mut dev = 0u32;
    let out = crate::rt::out_ptr(present, &mut dev);
    // SAFETY: a stream of the session's and an output (or NULL, as asked).
    let st = unsafe {
        match per_thread {
            true => ffi::cuStreamGetDevice_ptsz(stream, out),
            false => ffi::cuStreamGetDevice(stream, out),
        }
    };
    reply_device(s, st, dev, present, w);
}

/// `cuStreamGetDevice`.
pub fn cuStreamGetDevice(
    s: &Call<'_>,
    a: args::cuStreamGetDevice,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    stream_device(s, a.hStream_id, a.device_present, false, w);
    Ok(())
}

/// `cuStreamGetDevice_ptsz`.
pub fn cuStreamGetDevice_ptsz(
    s: &Call<'_>,
    a: args::cuStreamGetDevice_ptsz,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    stream_device(s, a.hStream_id, a.device_present, true, w);
    Ok(())
}

/// `cuCtxGetDevice`: the current context's device, by the tenant's number.
pub fn cuCtxGetDevice(
    s: &Call<'_>,
    a: args::cuCtxGetDevice,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let mut dev = 0u32;
    // SAFETY: a valid output pointer.
    let st = unsafe { ffi::cuCtxGetDevice(crate::rt::out_ptr(a.device_present, &mut dev)) };
    reply_device(s, st, dev, a.device_present, w);
    Ok(())
}

/// `cuCtxGetDevice_v2`: a context's device, by the tenant's number.
pub fn cuCtxGetDevice_v2(
    s: &Call<'_>,
    a: args::cuCtxGetDevice_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let ctx = match s.resolve(a.ctx_id, HandleKind::Context, true) {
        Ok(c) => c,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let mut dev = 0u32;
    // SAFETY: a valid output pointer; `ctx` is NULL or a context of the session.
    let st = unsafe { ffi::cuCtxGetDevice_v2(crate::rt::out_ptr(a.device_present, &mut dev), ctx) };
    reply_device(s, st, dev, a.device_present, w);
    Ok(())
}

/// Which `cuMemcpy2D*` a [`Copy2D`] request stands for.
#[derive(Clone, Copy)]
enum Copy2DKind {
    Plain,
    PlainPerThread,
    Unaligned,
    UnalignedPerThread,
    Async,
    AsyncPerThread,
}

/// `cuMemcpy2D_v2`.
pub fn cuMemcpy2D_v2(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::Plain)
}

/// `cuMemcpy2D_v2_ptds`.
pub fn cuMemcpy2D_v2_ptds(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::PlainPerThread)
}

/// `cuMemcpy2DUnaligned_v2`.
pub fn cuMemcpy2DUnaligned_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::Unaligned)
}

/// `cuMemcpy2DUnaligned_v2_ptds`.
pub fn cuMemcpy2DUnaligned_v2_ptds(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::UnalignedPerThread)
}

/// `cuMemcpy2DAsync_v2`.
pub fn cuMemcpy2DAsync_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::Async)
}

/// `cuMemcpy2DAsync_v2_ptsz`.
pub fn cuMemcpy2DAsync_v2_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    copy_2d(s, r, w, Copy2DKind::AsyncPerThread)
}

/// The bytes a side of `height` rows of `width` spans in device memory: whole pitches but the
/// last row's.
fn device_span(pitch: u64, width: u64, height: u64) -> Option<u64> {
    if height > 1 && width > pitch {
        return None;
    }
    height
        .checked_sub(1)?
        .checked_mul(pitch)?
        .checked_add(width)
}

/// A 2D copy between device memory of the session's and device memory or the program's rows
/// (packed here: in the request, or back in the reply).
fn copy_2d(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
    kind: Copy2DKind,
) -> Result<(), DecodeError> {
    let m = Copy2D::decode(r)?;
    r.finish()?;
    let mut back: Vec<u8> = Vec::new();
    let status = (|| -> Result<i32, i32> {
        let stream = s.resolve(m.stream, HandleKind::Stream, true)?;
        let mut c = CuMemcpy2D {
            src_x: 0,
            src_y: 0,
            src_type: MEMORYTYPE_HOST,
            src_host: std::ptr::null(),
            src_device: 0,
            src_array: std::ptr::null_mut(),
            src_pitch: m.width as usize,
            dst_x: 0,
            dst_y: 0,
            dst_type: MEMORYTYPE_HOST,
            dst_host: std::ptr::null_mut(),
            dst_device: 0,
            dst_array: std::ptr::null_mut(),
            dst_pitch: m.width as usize,
            width: m.width as usize,
            height: m.height as usize,
        };
        for (side, is_src) in [(m.src, true), (m.dst, false)] {
            if let Side2D::Device { addr, pitch } = side {
                let span = device_span(pitch, m.width, m.height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                crate::rt::check_device(s, addr, usize::try_from(span).ok())?;
                if is_src {
                    (c.src_type, c.src_device, c.src_pitch) =
                        (MEMORYTYPE_DEVICE, addr, pitch as usize);
                } else {
                    (c.dst_type, c.dst_device, c.dst_pitch) =
                        (MEMORYTYPE_DEVICE, addr, pitch as usize);
                }
            }
        }
        // An asynchronous copy with host rows (packed here, gone with the request) is not
        // captured into a graph, which would keep their address; nor is one back to the host,
        // whose stream is waited for below (a capturing stream refuses that, ending the
        // program's capture). As for 1D copies (`rt::check_slot`).
        let per_thread = matches!(kind, Copy2DKind::AsyncPerThread);
        if matches!(kind, Copy2DKind::Async | Copy2DKind::AsyncPerThread)
            && (m.rows.is_some() || m.dst == Side2D::Host)
            && crate::capture::is_capturing(stream, per_thread)
        {
            tracing::warn!(
                "an asynchronous 2D copy of the program's rows on a capturing stream: they cannot outlive the request in a graph; answering CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (copy from page-locked memory, cuMemHostAlloc, to capture it)"
            );
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let rows = m.rows.map(aligned);
        if let Some(rows) = &rows {
            c.src_host = rows.as_ptr().cast();
        }
        if m.dst == Side2D::Host {
            back = vec![0; (m.width * m.height) as usize];
            c.dst_host = back.as_mut_ptr().cast();
        }
        let p = (&c as *const CuMemcpy2D).cast_mut().cast();
        // SAFETY: a copy description whose device ranges the session owns and whose host
        // buffers (the packed rows) live across the call; a stream of the session's.
        let st = unsafe {
            match kind {
                Copy2DKind::Plain => ffi::cuMemcpy2D_v2(p),
                Copy2DKind::PlainPerThread => ffi::cuMemcpy2D_v2_ptds(p),
                Copy2DKind::Unaligned => ffi::cuMemcpy2DUnaligned_v2(p),
                Copy2DKind::UnalignedPerThread => ffi::cuMemcpy2DUnaligned_v2_ptds(p),
                Copy2DKind::Async => ffi::cuMemcpy2DAsync_v2(p, stream),
                Copy2DKind::AsyncPerThread => ffi::cuMemcpy2DAsync_v2_ptsz(p, stream),
            }
        };
        // Rows coming back must have landed before they are sent.
        if st == CUDA_SUCCESS && m.dst == Side2D::Host {
            match kind {
                // SAFETY: a stream of the session's.
                Copy2DKind::Async => return Ok(unsafe { ffi::cuStreamSynchronize(stream) }),
                Copy2DKind::AsyncPerThread => {
                    // SAFETY: as above (NULL: this thread's own, as `_ptsz` named it).
                    return Ok(unsafe { ffi::cuStreamSynchronize_ptsz(stream) });
                }
                _ => {}
            }
        }
        Ok(st)
    })()
    .unwrap_or_else(|e| e);
    w.i32(status);
    if status == CUDA_SUCCESS && m.dst == Side2D::Host {
        w.bytes(&back);
    }
    Ok(())
}

/// The attributes cuda.h names for streams (`CU_STREAM_ATTRIBUTE_*`: an access policy window,
/// the synchronisation policy, the priority, the memory synchronisation domain and its map;
/// and the NVLink-centric scheduling hint, "valid for streams"): plain values. The other launch attributes share the ids' space and some hold handles of
/// the program's, which the driver must never see.
fn is_stream_attribute(attr: u32) -> bool {
    matches!(attr, 1 | 3 | 8 | 9 | 10 | 16)
}

/// `cuStreamSetAttribute`: a stream attribute's value.
pub fn cuStreamSetAttribute(
    s: &Call<'_>,
    a: args::cuStreamSetAttribute,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let st = set_stream_attribute(s, a.hStream_id, a.attr, a.value_bytes, |h, v| {
        // SAFETY: a live stream (or NULL), a 64-byte value.
        unsafe { ffi::cuStreamSetAttribute(h, a.attr, v) }
    });
    w.i32(st);
    Ok(())
}

/// `cuStreamSetAttribute_ptsz`: as `cuStreamSetAttribute`.
pub fn cuStreamSetAttribute_ptsz(
    s: &Call<'_>,
    a: args::cuStreamSetAttribute_ptsz,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let st = set_stream_attribute(s, a.hStream_id, a.attr, a.value_bytes, |h, v| {
        // SAFETY: a live stream (or NULL), a 64-byte value.
        unsafe { ffi::cuStreamSetAttribute_ptsz(h, a.attr, v) }
    });
    w.i32(st);
    Ok(())
}

fn set_stream_attribute(
    s: &Call<'_>,
    stream: u64,
    attr: u32,
    value: Option<Vec<u8>>,
    set: impl FnOnce(Handle, *const c_void) -> i32,
) -> i32 {
    if !is_stream_attribute(attr) {
        tracing::warn!("cuStreamSetAttribute of launch attribute {attr}, not a stream's");
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(value) = value.filter(|v| v.len() == 64) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let value = aligned(&value);
    match s.resolve(stream, HandleKind::Stream, true) {
        Ok(h) => set(h, value.as_ptr().cast()),
        Err(st) => st,
    }
}

/// `cuMemPoolGetAttribute`: only the attributes of cuda.h 13.0, whose values fit the 8 bytes
/// the driver gets (a newer driver's wider attribute would write past them).
pub fn cuMemPoolGetAttribute(
    s: &Call<'_>,
    a: args::cuMemPoolGetAttribute,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let answer = (|| {
        let pool = s.resolve(a.pool_id, HandleKind::MemPool, false)?;
        known_pool_attribute(a.attr)?;
        let mut value = 0u64;
        let out = crate::rt::out_ptr(a.value_present, &mut value).cast();
        // SAFETY: a pool of the session's device, an 8-byte output (or NULL).
        let st = unsafe { ffi::cuMemPoolGetAttribute(pool, a.attr, out) };
        Ok((st, value))
    })();
    match answer {
        Ok((st, value)) => {
            w.i32(st);
            if st == CUDA_SUCCESS && a.value_present {
                w.bytes(&value.to_le_bytes());
            }
        }
        Err(st) => w.i32(st),
    }
    Ok(())
}

/// `cuMemPoolSetAttribute`: as `cuMemPoolGetAttribute`, the value read from 8 bytes.
pub fn cuMemPoolSetAttribute(
    s: &Call<'_>,
    a: args::cuMemPoolSetAttribute,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let st = (|| {
        let pool = s.resolve(a.pool_id, HandleKind::MemPool, false)?;
        known_pool_attribute(a.attr)?;
        let value = match a.value_bytes.as_deref() {
            Some(v) if v.len() == 8 => aligned(v),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: a pool of the session's device, an 8-byte value.
        Ok(unsafe { ffi::cuMemPoolSetAttribute(pool, a.attr, value.as_ptr().cast()) })
    })()
    .unwrap_or_else(|st| st);
    w.i32(st);
    Ok(())
}

fn known_pool_attribute(attr: u32) -> Result<(), i32> {
    if mempool_attribute_size(attr).is_none() {
        tracing::warn!("memory pool attribute {attr} is not one of cuda.h 13.0's: refused");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;
    use std::sync::Arc;
    use wormhole_server::quota::Ledger;
    use wormhole_server::worker::Limits;

    fn session(quota: u64) -> Session {
        let s = Session::default();
        s.set_limits(Arc::new(Limits {
            ledger: Some(Ledger::create().unwrap()),
            mem_quota: Some(quota),
            ..Default::default()
        }));
        s
    }

    /// Layouts are asked of the driver until it says there are no more; one too long for a
    /// layout is refused rather than cut short.
    #[test]
    fn parameter_layouts_end_where_the_driver_says_or_are_refused() {
        let three = param_layout(|i, offset, size| {
            if i < 3 {
                (*offset, *size) = (i * 8, 8);
                CUDA_SUCCESS
            } else {
                CUDA_ERROR_INVALID_VALUE
            }
        });
        assert_eq!(three.map(|l| l.params), Ok(vec![(0, 8), (8, 8), (16, 8)]));
        let endless = param_layout(|i, offset, size| {
            (*offset, *size) = (i, 1);
            CUDA_SUCCESS
        });
        assert_eq!(
            endless.map(|l| l.params.len()),
            Err(CUDA_ERROR_NOT_SUPPORTED)
        );
        let old_driver = param_layout(|_, _, _| CUDA_ERROR_NOT_FOUND);
        assert_eq!(
            old_driver.map(|l| l.params.len()),
            Err(CUDA_ERROR_NOT_FOUND)
        );
    }

    /// An allocation recorded again at an address the session still had (its context ended
    /// unseen) gives the old one's bytes back to the quota: the tenant holds only the new.
    #[test]
    fn an_allocation_replacing_a_stale_one_gives_its_bytes_back() {
        let s = session(1 << 30);
        let base = s.limits().tenant_bytes();
        let ctx = 0xc000 as Handle;
        assert!(s.limits().reserve(0x20_0000));
        s.allocated(0x40_0000, 0x20_0000, ctx);
        assert!(s.limits().reserve(0x10_0000));
        s.allocated(0x40_0000, 0x10_0000, ctx);
        assert_eq!(s.limits().tenant_bytes() - base, 0x10_0000);
        assert_eq!(s.freed(0x40_0000), Some((0x10_0000, ctx)));
        s.limits().release(0x10_0000);
        assert_eq!(s.limits().tenant_bytes(), base);
    }

    /// A 2D memset may touch only the session's memory: the last row ends within it.
    #[test]
    fn memsets_2d_stay_in_the_sessions_memory() {
        let s = session(1 << 30);
        s.allocated(0x10_0000, 512 * 10, std::ptr::null_mut());
        let c = Call(&s);
        assert_eq!(check_2d(&c, 0x10_0000, 512, 100, 10, 4), Ok(()));
        assert_eq!(check_2d(&c, 0x10_0000, 512, 128, 10, 4), Ok(()));
        assert_eq!(
            check_2d(&c, 0x10_0000, 512, 129, 10, 4),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            check_2d(&c, 0x10_0000, 512, 100, 11, 4),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            check_2d(&c, 0x10_0000, usize::MAX, 1, 3, 1),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            check_2d(&c, 0x20_0000, 512, 0, 10, 4),
            Ok(()),
            "nothing touched"
        );
        let mut w = Writer::new(0);
        let a = args::cuMemsetD2D32Async {
            dstDevice: 0x10_0000,
            dstPitch: 512,
            ui: 7,
            Width: 100,
            Height: 11,
            hStream_id: 0,
        };
        cuMemsetD2D32Async(&c, a, &mut w).unwrap();
        assert_eq!(w.status(), CUDA_ERROR_INVALID_VALUE);
    }

    /// Stream-ordered allocations are bounded by the quota like `cuMemAlloc`, and what the
    /// driver refuses gives the reservation back; frees name the session's allocations only.
    #[test]
    fn stream_ordered_allocations_hold_the_quota() {
        let s = session(1 << 20);
        let c = Call(&s);
        let alloc = |bytes: usize, stream: u64| {
            let mut w = Writer::new(0);
            let a = args::cuMemAllocAsync {
                dptr_present: true,
                bytesize: bytes,
                hStream_id: stream,
            };
            cuMemAllocAsync(&c, a, &mut w).unwrap();
            w.status()
        };
        assert_eq!(alloc(2 << 20, 0), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(alloc(4096, 999), CUDA_ERROR_INVALID_HANDLE);
        // No driver here: refused, and the reservation is given back (the whole quota fits).
        assert_eq!(alloc(1 << 20, 0), CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(s.limits().tenant_bytes(), 0);
        let mut w = Writer::new(0);
        let f = args::cuMemFreeAsync {
            dptr: 0x7000_0000,
            hStream_id: 0,
        };
        cuMemFreeAsync(&c, f, &mut w).unwrap();
        assert_eq!(w.status(), CUDA_ERROR_INVALID_VALUE);
    }
}
