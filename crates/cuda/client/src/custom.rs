//! Entry points whose encoding is hand-written (the description's `custom`): module images,
//! which the client must measure and may not need to send, functions with their parameter
//! layout, and launches, whose arguments only that layout makes readable.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::image;
pub use crate::memory::{cuPointerGetAttribute, cuPointerGetAttributes};
use crate::objects;
use crate::rt::{self, entry_status, ApiErr};
use std::ffi::{c_char, c_void, CStr};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    LaunchArgs, LaunchKernel, Message, ModuleGetFunction, ModuleLoad, ModuleLoaded, ParamLayout,
    IMAGE_INLINE,
};
use wormhole_cuda_proto::{HandleKind, Op};
use wormhole_session::host_memory;

/// The program's `len` bytes at `addr`, if it has them.
fn read(addr: usize, len: usize) -> Option<Vec<u8>> {
    // SAFETY: copy_in checks ranges larger than a page; smaller ones the driver would read
    // directly too.
    unsafe { host_memory::copy_in(addr as *const u8, len) }.map(|c| c.into_owned())
}

fn send<'a, M: Message<'a>>(op: Op, m: &M) -> Result<Vec<u8>, ApiErr> {
    let mut w = rt::request(op);
    m.encode(&mut w);
    rt::call(w)
}

/// Sends without waiting: the caller ruled out every error it can see.
fn send_async<'a, M: Message<'a>>(op: Op, m: &M) -> Result<i32, ApiErr> {
    let mut w = rt::request(op);
    m.encode(&mut w);
    rt::call_async(w)?;
    Ok(CUDA_SUCCESS)
}

/// The launch geometry every CUDA device accepts (compute capability 3.0 on: blocks of at most
/// 1024 threads, 1024 × 1024 × 64; grids of 2³¹−1 × 65535 × 65535): what falls outside is the
/// driver's CUDA_ERROR_INVALID_VALUE, answered here since launches are not waited for.
fn geometry_ok(grid: [u32; 3], block: [u32; 3]) -> bool {
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    grid.iter().chain(&block).all(|&d| d >= 1)
        && grid[0] < 1 << 31
        && grid[1] <= 65535
        && grid[2] <= 65535
        && block[0] <= 1024
        && block[1] <= 1024
        && block[2] <= 64
        && threads <= 1024
}

/// `cuModuleLoadData`: the image (cubin, PTX or fatbin) measured, then sent by its digest
/// first when large (the server may hold it from an earlier session), with its bytes when
/// the server asks for them.
///
/// # Safety
/// `module` NULL or a writable `CUmodule`; `image` NULL or a module image.
pub unsafe fn cuModuleLoadData(module: *mut c_void, image: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { load(Op::cuModuleLoadData, module, image) }
}

/// `cuModuleLoadFatBinary`: as `cuModuleLoadData`, for a fatbin.
///
/// # Safety
/// As [`cuModuleLoadData`].
pub unsafe fn cuModuleLoadFatBinary(module: *mut c_void, fat_cubin: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { load(Op::cuModuleLoadFatBinary, module, fat_cubin) }
}

/// # Safety
/// As [`cuModuleLoadData`].
unsafe fn load(op: Op, module: *mut c_void, image: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if module.is_null() || image.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (at, len) = image::locate(image as usize, &read).map_err(|e| {
            crate::connection::log(&format!("module image at {image:?}: {e:?}"));
            ApiErr(match e {
                image::ImageError::Unreadable => CUDA_ERROR_INVALID_VALUE,
                image::ImageError::Invalid(_) => CUDA_ERROR_INVALID_IMAGE,
            })
        })?;
        let bytes = read(at, len).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
        let new_id = rt::alloc_id();
        let mut request = ModuleLoad {
            new_id,
            digest,
            image: (bytes.len() <= IMAGE_INLINE).then_some(&bytes[..]),
        };
        let mut reply = ModuleLoaded::decode_all(&send(op, &request)?)?;
        if reply.need_image && request.image.is_none() {
            request.image = Some(&bytes);
            reply = ModuleLoaded::decode_all(&send(op, &request)?)?;
        }
        if reply.need_image {
            crate::connection::log("the server asked twice for a module image");
            return Err(ApiErr(CUDA_ERROR_UNKNOWN));
        }
        if reply.status == CUDA_SUCCESS {
            // SAFETY: per the contract.
            unsafe {
                *(module as *mut *mut c_void) = objects::new_object(HandleKind::Module, new_id)
            };
        }
        Ok(reply.status)
    })
}

/// `cuModuleGetFunction`: the function and its parameters' layout.
///
/// # Safety
/// `hfunc` NULL or a writable `CUfunction`; `name` NULL or a C string.
pub unsafe fn cuModuleGetFunction(
    hfunc: *mut c_void,
    hmod: *mut c_void,
    name: *const c_char,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if hfunc.is_null() || name.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let module = unsafe { rt::id_of(hmod, HandleKind::Module, false) }?;
        let new_id = rt::alloc_id();
        let reply = send(
            Op::cuModuleGetFunction,
            &ModuleGetFunction {
                new_id,
                module,
                // SAFETY: per the contract.
                name: unsafe { CStr::from_ptr(name) }.to_bytes(),
            },
        )?;
        match <Result<ParamLayout, i32>>::decode_all(&reply)? {
            Ok(layout) => {
                // SAFETY: per the contract.
                unsafe { *(hfunc as *mut *mut c_void) = objects::new_function(new_id, layout) };
                Ok(CUDA_SUCCESS)
            }
            Err(st) => Ok(st),
        }
    })
}

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The parameter buffer `extra` names (`CU_LAUNCH_PARAM_BUFFER_POINTER`/`_SIZE` pairs up to
/// `CU_LAUNCH_PARAM_END`).
///
/// # Safety
/// `extra` points to such a list.
unsafe fn extra_buffer(extra: *const *mut c_void) -> Result<Vec<u8>, ApiErr> {
    let (mut ptr, mut size) = (None, None);
    for i in (0..64).step_by(2) {
        // SAFETY: per the contract: pairs until the end marker.
        let key = unsafe { *extra.add(i) } as usize;
        if key == PARAM_END {
            break;
        }
        // SAFETY: as above.
        let value = unsafe { *extra.add(i + 1) };
        match key {
            PARAM_BUFFER_POINTER => ptr = Some(value),
            PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                size = Some(unsafe { *(value as *const usize) })
            }
            _ => return Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
        }
    }
    match (ptr, size) {
        (Some(p), Some(n)) if !p.is_null() => {
            read(p as usize, n).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))
        }
        _ => Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
    }
}

/// A launch: the arguments copied as the function's layout says.
///
/// # Safety
/// As `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    op: Op,
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        // SAFETY: `f` is dereferenced only if it is a registered function.
        let func = unsafe { objects::get(f, HandleKind::Function) }
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        // SAFETY: as above.
        let stream = unsafe { rt::id_of(stream, HandleKind::Stream, true) }?;
        let layout = func
            .layout
            .as_ref()
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        let copies: Vec<Vec<u8>>;
        let buffer: Vec<u8>;
        let args = match (kernel_params.is_null(), extra.is_null()) {
            (false, true) => {
                let params = kernel_params as *const *const u8;
                copies = layout
                    .params
                    .iter()
                    .enumerate()
                    .map(|(i, &(_, size))| {
                        // SAFETY: kernelParams holds one pointer per parameter (the contract).
                        let p = unsafe { *params.add(i) };
                        read(p as usize, size as usize).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))
                    })
                    .collect::<Result<_, _>>()?;
                LaunchArgs::Each(copies.iter().map(Vec::as_slice).collect())
            }
            (true, false) => {
                // SAFETY: per the contract.
                buffer = unsafe { extra_buffer(extra as *const *mut c_void) }?;
                LaunchArgs::Buffer(&buffer)
            }
            (true, true) if layout.params.is_empty() => LaunchArgs::Each(Vec::new()),
            _ => return Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
        };
        if !geometry_ok(grid, block) {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // Not waited for: what only the driver can refuse (shared memory beyond the
        // function's limit, too many registers for the block) comes at the next
        // synchronisation point.
        send_async(
            op,
            &LaunchKernel {
                function: func.id,
                grid,
                block,
                shared_mem,
                stream,
                args,
            },
        )
    })
}

/// `cuLaunchKernel`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchKernel(
    f: *mut c_void,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared_mem: u32,
    stream: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        launch(
            Op::cuLaunchKernel,
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared_mem,
            stream,
            kernel_params,
            extra,
        )
    }
}

/// `cuLaunchKernel_ptsz`: on the per-thread default stream when `stream` is NULL.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchKernel_ptsz(
    f: *mut c_void,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared_mem: u32,
    stream: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        launch(
            Op::cuLaunchKernel_ptsz,
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared_mem,
            stream,
            kernel_params,
            extra,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_geometry_outside_every_device_is_refused() {
        assert!(geometry_ok([1, 1, 1], [1, 1, 1]));
        assert!(geometry_ok([(1 << 31) - 1, 65535, 65535], [1024, 1, 1]));
        assert!(geometry_ok([1, 1, 1], [32, 32, 1]));
        assert!(!geometry_ok([0, 1, 1], [1, 1, 1]));
        assert!(!geometry_ok([1, 1, 1], [1, 0, 1]));
        assert!(!geometry_ok([1 << 31, 1, 1], [1, 1, 1]));
        assert!(!geometry_ok([1, 65536, 1], [1, 1, 1]));
        assert!(!geometry_ok([1, 1, 1], [1025, 1, 1]));
        assert!(!geometry_ok([1, 1, 1], [1, 1, 65]));
        assert!(!geometry_ok([1, 1, 1], [32, 32, 2]));
    }
}
