//! Entry points whose encoding is hand-written (the description's `custom`): module images,
//! which the client must measure and may not need to send, functions with their parameter
//! layout, and launches, whose arguments only that layout makes readable.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

pub use crate::capture::*;
pub use crate::copies_2d::*;
pub use crate::host_functions::{
    cuLaunchHostFunc, cuLaunchHostFunc_ptsz, cuStreamAddCallback, cuStreamAddCallback_ptsz,
};
use crate::image;
use crate::jit::ProgramOptions;
pub use crate::links::*;
pub use crate::memory::{cuPointerGetAttribute, cuPointerGetAttributes};
use crate::objects;
use crate::rt::{self, entry_status, ApiErr};
pub use crate::tensor_maps::*;
use std::borrow::Cow;
use std::ffi::{c_char, c_void, CStr};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    launch_attribute_forwarded, CuLaunchConfig, DeviceRange, FunctionOf, GetGlobal, LaunchArgs,
    LaunchAttribute, LaunchKernel, Message, ModuleGetFunction, ModuleLoad, ModuleLoaded, Name,
    ParamLayout, Reply, Value, IMAGE_INLINE, LAUNCH_ATTRIBUTE_COOPERATIVE,
    LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT, LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT,
    MAX_LAUNCH_ATTRIBUTES,
};
use wormhole_cuda_proto::{HandleKind, Op};
use wormhole_session::host_memory;

/// The program's `len` bytes at `addr`, if it has them.
fn read(addr: usize, len: usize) -> Option<Vec<u8>> {
    // SAFETY: copied at once: nothing outlives the call.
    unsafe { read_in_place(addr, len) }.map(Cow::into_owned)
}

/// As `read`, but a range of a page or less is borrowed where it lies, not copied (a
/// launch's arguments: no allocation per argument on the launch path).
///
/// # Safety
/// What is borrowed must not be used once the program may have changed or freed it (past
/// the entry point that was given it).
unsafe fn read_in_place<'a>(addr: usize, len: usize) -> Option<Cow<'a, [u8]>> {
    // SAFETY: copy_in checks ranges larger than a page; smaller ones the driver would read
    // directly too.
    unsafe { host_memory::copy_in(addr as *const u8, len) }
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
    unsafe {
        load(
            Op::cuModuleLoadData,
            HandleKind::Module,
            module,
            image,
            NO_OPTIONS,
        )
    }
}

/// `cuModuleLoadDataEx`: as `cuModuleLoadData`, with JIT options (see [`ProgramOptions`]: the
/// server's driver gets the numbers, logs come back into the program's buffers).
///
/// # Safety
/// As [`cuModuleLoadData`]; `options` and `values` hold `n` entries when `n` is not 0.
pub unsafe fn cuModuleLoadDataEx(
    module: *mut c_void,
    image: *mut c_void,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        let jit = ProgramOptions::new(n, options, values);
        load(
            Op::cuModuleLoadDataEx,
            HandleKind::Module,
            module,
            image,
            jit,
        )
    }
}

/// No JIT options.
const NO_OPTIONS: ProgramOptions = ProgramOptions::none();

/// `cuModuleLoadFatBinary`: as `cuModuleLoadData`, for a fatbin.
///
/// # Safety
/// As [`cuModuleLoadData`].
pub unsafe fn cuModuleLoadFatBinary(module: *mut c_void, fat_cubin: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        load(
            Op::cuModuleLoadFatBinary,
            HandleKind::Module,
            module,
            fat_cubin,
            NO_OPTIONS,
        )
    }
}

/// `cuModuleLoad`: the file read here (the server never opens a tenant's paths) and loaded as
/// `cuModuleLoadData`.
///
/// # Safety
/// `module` NULL or a writable `CUmodule`; `fname` NULL or a C string.
pub unsafe fn cuModuleLoad(module: *mut c_void, fname: *const c_char) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        load_file(
            Op::cuModuleLoadData,
            HandleKind::Module,
            module,
            fname,
            NO_OPTIONS,
        )
    }
}

/// The `CUlibraryOption` that only allows the driver to keep reading the caller's image
/// (`CU_LIBRARY_BINARY_IS_PRESERVED`): the server loads its own copy, so it changes nothing.
const LIBRARY_BINARY_IS_PRESERVED: u32 = 1;

/// After `cuInit`, library options: none, or only those that change nothing for a forwarded
/// load. Others (a host function table) are refused, naming them. (JIT options travel, see
/// [`ProgramOptions`].)
///
/// # Safety
/// `lib_options` holds `n_lib` options when `n_lib` is not 0.
unsafe fn check_library_options(lib_options: *const u32, n_lib: u32) -> Result<(), ApiErr> {
    rt::check_initialized()?;
    if n_lib == 0 {
        return Ok(());
    }
    if lib_options.is_null() {
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: per the contract.
    let options = unsafe { std::slice::from_raw_parts(lib_options, n_lib as usize) };
    match options.iter().find(|&&o| o != LIBRARY_BINARY_IS_PRESERVED) {
        None => Ok(()),
        Some(o) => {
            crate::connection::log(&format!(
                "cuLibraryLoad*: library option {o} is not forwarded; answering CUDA_ERROR_NOT_SUPPORTED"
            ));
            Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED))
        }
    }
}

/// `cuLibraryLoadData`: the image as `cuModuleLoadData` sends it.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLibraryLoadData(
    library: *mut c_void,
    code: *mut c_void,
    jit_options: *mut c_void,
    jit_values: *mut c_void,
    n_jit: u32,
    lib_options: *mut c_void,
    _lib_values: *mut c_void,
    n_lib: u32,
) -> i32 {
    // SAFETY: per the contract.
    if let Err(ApiErr(st)) = unsafe { check_library_options(lib_options.cast(), n_lib) } {
        return st;
    }
    // SAFETY: per the contract.
    unsafe {
        let jit = ProgramOptions::new(n_jit, jit_options, jit_values);
        load(
            Op::cuLibraryLoadData,
            HandleKind::Library,
            library,
            code,
            jit,
        )
    }
}

/// `cuLibraryLoadFromFile`: the file read here, then as `cuLibraryLoadData`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLibraryLoadFromFile(
    library: *mut c_void,
    file_name: *const c_char,
    jit_options: *mut c_void,
    jit_values: *mut c_void,
    n_jit: u32,
    lib_options: *mut c_void,
    _lib_values: *mut c_void,
    n_lib: u32,
) -> i32 {
    // SAFETY: per the contract.
    if let Err(ApiErr(st)) = unsafe { check_library_options(lib_options.cast(), n_lib) } {
        return st;
    }
    // SAFETY: per the contract.
    unsafe {
        let jit = ProgramOptions::new(n_jit, jit_options, jit_values);
        load_file(
            Op::cuLibraryLoadData,
            HandleKind::Library,
            library,
            file_name,
            jit,
        )
    }
}

/// The bytes of the file the program named (`what` it is, for the log line): the client reads
/// it, since the server never opens a tenant's paths. After `cuInit`; a NULL name is the
/// driver's `CUDA_ERROR_INVALID_VALUE`, an unreadable file its `CUDA_ERROR_FILE_NOT_FOUND`.
///
/// # Safety
/// `name` NULL or a C string.
pub(crate) unsafe fn read_named_file(name: *const c_char, what: &str) -> Result<Vec<u8>, ApiErr> {
    rt::check_initialized()?;
    if name.is_null() {
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(name) };
    let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes());
    std::fs::read(path).map_err(|e| {
        crate::connection::log(&format!(
            "cannot read {what} {}: {e}",
            name.to_string_lossy()
        ));
        ApiErr(CUDA_ERROR_FILE_NOT_FOUND)
    })
}

/// Loads the image in file `name` (its bytes, NUL-terminated for PTX).
///
/// # Safety
/// `out` NULL or writable; `name` NULL or a C string.
unsafe fn load_file(
    op: Op,
    kind: HandleKind,
    out: *mut c_void,
    name: *const c_char,
    jit: ProgramOptions,
) -> i32 {
    // SAFETY: per the contract.
    let mut bytes = match unsafe { read_named_file(name, "module file") } {
        Ok(b) => b,
        Err(ApiErr(st)) => return st,
    };
    bytes.push(0);
    // SAFETY: `bytes` is a whole image that lives across the call.
    unsafe { load(op, kind, out, bytes.as_mut_ptr().cast(), jit) }
}

/// # Safety
/// As [`cuModuleLoadData`].
unsafe fn load(
    op: Op,
    kind: HandleKind,
    module: *mut c_void,
    image: *mut c_void,
    jit: ProgramOptions,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if module.is_null() || image.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let jit = jit.read()?;
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
            jit: jit.sent(),
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
        // The logs and counts, whether the load succeeded or not (an error log says why).
        jit.write_back(&reply.jit);
        if reply.status == CUDA_SUCCESS {
            // SAFETY: per the contract.
            unsafe { *(module as *mut *mut c_void) = objects::new_object(kind, new_id) };
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
    // SAFETY: per the contract.
    unsafe {
        get_entry(
            Op::cuModuleGetFunction,
            HandleKind::Function,
            hfunc,
            hmod,
            name,
        )
    }
}

/// `cuLibraryGetKernel`: the kernel and its parameters' layout.
///
/// # Safety
/// `kernel` NULL or a writable `CUkernel`; `name` NULL or a C string.
pub unsafe fn cuLibraryGetKernel(
    kernel: *mut c_void,
    library: *mut c_void,
    name: *const c_char,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        get_entry(
            Op::cuLibraryGetKernel,
            HandleKind::Kernel,
            kernel,
            library,
            name,
        )
    }
}

/// A module's function or a library's kernel (`kind`), by name.
///
/// # Safety
/// `out` NULL or writable; `name` NULL or a C string.
unsafe fn get_entry(
    op: Op,
    kind: HandleKind,
    out: *mut c_void,
    parent: *mut c_void,
    name: *const c_char,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if out.is_null() || name.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let parent_kind = match kind {
            HandleKind::Kernel => HandleKind::Library,
            _ => HandleKind::Module,
        };
        // SAFETY: per the contract.
        let parent = unsafe { rt::id_of(parent, parent_kind, false) }?;
        // SAFETY: per the contract.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        if let Some(known) = objects::entry_of(parent, name, kind) {
            // The driver gives the same handle for the same name: so does the client, with no
            // round trip and no new object on the server.
            // SAFETY: per the contract.
            unsafe { *(out as *mut *mut c_void) = known };
            return Ok(CUDA_SUCCESS);
        }
        let new_id = rt::alloc_id();
        let reply = send(
            op,
            &ModuleGetFunction {
                new_id,
                module: parent,
                name,
            },
        )?;
        match <Result<ParamLayout, i32>>::decode_all(&reply)? {
            Ok(layout) => {
                let f = objects::new_entry(parent, name, kind, new_id, layout);
                // SAFETY: per the contract.
                unsafe { *(out as *mut *mut c_void) = f };
                Ok(CUDA_SUCCESS)
            }
            Err(st) => Ok(st),
        }
    })
}

/// `cuKernelGetFunction`: the kernel's function in the current context.
///
/// # Safety
/// `pfunc` NULL or a writable `CUfunction`.
pub unsafe fn cuKernelGetFunction(pfunc: *mut c_void, kernel: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        crate::context_facts::kernel_function(pfunc, kernel, || ask_kernel_function(pfunc, kernel))
    }
}

/// # Safety
/// As [`cuKernelGetFunction`].
unsafe fn ask_kernel_function(pfunc: *mut c_void, kernel: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if pfunc.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let kernel = unsafe { rt::id_of(kernel, HandleKind::Kernel, false) }?;
        let mut w = rt::request(Op::cuKernelGetFunction);
        w.u64(kernel);
        match <Result<FunctionOf, i32>>::decode_all(&rt::call(w)?)? {
            Ok(f) => {
                // SAFETY: per the contract.
                unsafe { *(pfunc as *mut *mut c_void) = objects::function_for_id(f.id, f.layout) };
                Ok(CUDA_SUCCESS)
            }
            Err(st) => Ok(st),
        }
    })
}

/// `cuModuleGetGlobal_v2`: a module's variable, which the program may then copy to and from.
///
/// # Safety
/// `dptr` and `bytes` NULL or writable; `name` NULL or a C string.
pub unsafe fn cuModuleGetGlobal_v2(
    dptr: *mut c_void,
    bytes: *mut c_void,
    hmod: *mut c_void,
    name: *const c_char,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        get_global(
            Op::cuModuleGetGlobal_v2,
            HandleKind::Module,
            dptr,
            bytes,
            hmod,
            name,
        )
    }
}

/// `cuLibraryGetGlobal`: as `cuModuleGetGlobal_v2`, of a library.
///
/// # Safety
/// As [`cuModuleGetGlobal_v2`].
pub unsafe fn cuLibraryGetGlobal(
    dptr: *mut c_void,
    bytes: *mut c_void,
    library: *mut c_void,
    name: *const c_char,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        get_global(
            Op::cuLibraryGetGlobal,
            HandleKind::Library,
            dptr,
            bytes,
            library,
            name,
        )
    }
}

/// # Safety
/// As [`cuModuleGetGlobal_v2`].
unsafe fn get_global(
    op: Op,
    kind: HandleKind,
    dptr: *mut c_void,
    bytes: *mut c_void,
    parent: *mut c_void,
    name: *const c_char,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if name.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let object = unsafe { rt::id_of(parent, kind, false) }?;
        let reply = send(
            op,
            &GetGlobal {
                object,
                // SAFETY: per the contract.
                name: unsafe { CStr::from_ptr(name) }.to_bytes(),
            },
        )?;
        match <Result<DeviceRange, i32>>::decode_all(&reply)? {
            Ok(range) => {
                // Device memory the program may name in copies until its module goes.
                crate::allocations::variable(object, range.dptr, range.bytes);
                if !dptr.is_null() {
                    // SAFETY: per the contract.
                    unsafe { *(dptr as *mut u64) = range.dptr };
                }
                if !bytes.is_null() {
                    // SAFETY: per the contract.
                    unsafe { *(bytes as *mut usize) = range.bytes as usize };
                }
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
    // cuda.h: without BUFFER_SIZE the pointer "will have no effect", and the pointer is
    // required only "if the value associated with CU_LAUNCH_PARAM_BUFFER_SIZE is not zero".
    match (ptr, size.unwrap_or(0)) {
        (_, 0) => Ok(Vec::new()),
        (Some(p), n) if !p.is_null() => read(p as usize, n).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE)),
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
    attributes: Vec<LaunchAttribute>,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        // SAFETY: `f` is dereferenced only if it is a registered function or kernel (a
        // kernel launches as its function in the current context).
        let func = unsafe { objects::get(f, HandleKind::Function) }
            .or_else(|| unsafe { objects::get(f, HandleKind::Kernel) })
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        // SAFETY: as above.
        let stream = unsafe { rt::id_of(stream, HandleKind::Stream, true) }?;
        let layout = func
            .layout
            .as_ref()
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        let copies: Vec<Cow<'_, [u8]>>;
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
                        // SAFETY: encoded into the request before this entry point returns.
                        unsafe { read_in_place(p as usize, size as usize) }
                            .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))
                    })
                    .collect::<Result<_, _>>()?;
                LaunchArgs::Each(copies.iter().map(|c| &c[..]).collect())
            }
            (true, false) => {
                // SAFETY: per the contract.
                buffer = unsafe { extra_buffer(extra as *const *mut c_void) }?;
                match (buffer.is_empty(), layout.params.is_empty()) {
                    // No parameters given, none taken.
                    (true, true) => LaunchArgs::Each(Vec::new()),
                    (true, false) => return Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
                    _ => LaunchArgs::Buffer(&buffer),
                }
            }
            (true, true) if layout.params.is_empty() => LaunchArgs::Each(Vec::new()),
            _ => return Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
        };
        if !geometry_ok(grid, block) {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let cooperative = attributes
            .iter()
            .any(|a| a.id == LAUNCH_ATTRIBUTE_COOPERATIVE);
        let request = LaunchKernel {
            function: func.id,
            grid,
            block,
            shared_mem,
            stream,
            args,
            attributes,
        };
        if cooperative {
            // A grid too large to be resident at once is refused by the call itself (not
            // sticky: programs probe with it and retry smaller), so this one is waited for.
            rt::status_of(&send(op, &request)?)?;
            return Ok(CUDA_SUCCESS);
        }
        // Not waited for: what only the driver can refuse (shared memory beyond the
        // function's limit, too many registers for the block) comes at the next
        // synchronisation point.
        send_async(op, &request)
    })
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE` set: what `cuLaunchCooperativeKernel` is, as a launch
/// attribute (the driver documents the two as the same launch).
fn cooperative() -> LaunchAttribute {
    let mut value = [0u8; 64];
    value[..4].copy_from_slice(&1i32.to_le_bytes());
    LaunchAttribute {
        id: LAUNCH_ATTRIBUTE_COOPERATIVE,
        value,
    }
}

/// `cuLaunchCooperativeKernel`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchCooperativeKernel(
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
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        launch(
            Op::cuLaunchCooperativeKernel,
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared_mem,
            stream,
            kernel_params,
            std::ptr::null_mut(),
            vec![cooperative()],
        )
    }
}

/// `cuLaunchCooperativeKernel_ptsz`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchCooperativeKernel_ptsz(
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
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        launch(
            Op::cuLaunchCooperativeKernel_ptsz,
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared_mem,
            stream,
            kernel_params,
            std::ptr::null_mut(),
            vec![cooperative()],
        )
    }
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
            Vec::new(),
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
            Vec::new(),
        )
    }
}

/// A launch configuration's attributes, as they travel.
///
/// # Safety
/// `config.attrs` holds `config.num_attrs` attributes when that is not 0.
unsafe fn launch_attributes(config: &CuLaunchConfig) -> Result<Vec<LaunchAttribute>, ApiErr> {
    let n = config.num_attrs as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    if config.attrs.is_null() || n > MAX_LAUNCH_ATTRIBUTES {
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: per the contract.
    let attrs = unsafe { std::slice::from_raw_parts(config.attrs, n) };
    attrs
        .iter()
        .map(|a| {
            if !launch_attribute_forwarded(a.id) {
                crate::connection::log(&format!(
                    "cuLaunchKernelEx: launch attribute {} is not forwarded; answering CUDA_ERROR_NOT_SUPPORTED",
                    a.id
                ));
                return Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED));
            }
            let mut value = [0u8; 64];
            for (b, v) in value.chunks_exact_mut(8).zip(a.value) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            if a.id == LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT
                || a.id == LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT
            {
                let event = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
                // SAFETY: dereferenced only if it is a registered event.
                let id = unsafe { rt::id_of(event as *mut c_void, HandleKind::Event, false) }?;
                value[..8].copy_from_slice(&id.to_le_bytes());
            }
            Ok(LaunchAttribute { id: a.id, value })
        })
        .collect()
}

/// `cuLaunchKernelEx` (`per_thread`: `_ptsz`).
///
/// # Safety
/// As the C function.
unsafe fn launch_ex(
    op: Op,
    config: *const c_void,
    f: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    // Before cuInit every call answers that, whatever its arguments.
    if let Err(ApiErr(st)) = rt::check_initialized() {
        return st;
    }
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: per the contract, a launch configuration.
    let config = unsafe { &*(config as *const CuLaunchConfig) };
    // SAFETY: as above.
    let attributes = match unsafe { launch_attributes(config) } {
        Ok(a) => a,
        Err(ApiErr(st)) => return st,
    };
    // SAFETY: per the contract.
    unsafe {
        launch(
            op,
            f,
            config.grid,
            config.block,
            config.shared_mem,
            config.stream,
            kernel_params,
            extra,
            attributes,
        )
    }
}

/// `cuLaunchKernelEx`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuLaunchKernelEx(
    config: *mut c_void,
    f: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe { launch_ex(Op::cuLaunchKernelEx, config, f, kernel_params, extra) }
}

/// `cuLaunchKernelEx_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuLaunchKernelEx_ptsz(
    config: *mut c_void,
    f: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe { launch_ex(Op::cuLaunchKernelEx_ptsz, config, f, kernel_params, extra) }
}

/// A cluster occupancy question about `f` launched with `config`: the configuration travels as
/// a launch's would (a `LaunchKernel` without arguments, its attributes giving the cluster's
/// shape), and the driver's answer is written to `out`.
///
/// # Safety
/// `out` NULL or a writable `int`; `config` NULL or a launch configuration.
unsafe fn cluster_occupancy(
    op: Op,
    out: *mut c_void,
    f: *mut c_void,
    config: *const c_void,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if out.is_null() || config.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let config = unsafe { &*(config as *const CuLaunchConfig) };
        // SAFETY: as above.
        let attributes = unsafe { launch_attributes(config) }?;
        // SAFETY: `f` is dereferenced only if it is a registered function or kernel.
        let func = unsafe { objects::get(f, HandleKind::Function) }
            .or_else(|| unsafe { objects::get(f, HandleKind::Kernel) })
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        let query = LaunchKernel {
            function: func.id,
            grid: config.grid,
            block: config.block,
            shared_mem: config.shared_mem,
            // SAFETY: `id_of` dereferences only registered objects.
            stream: unsafe { rt::id_of(config.stream, HandleKind::Stream, true) }?,
            args: LaunchArgs::Each(Vec::new()),
            attributes,
        };
        let value = match Reply::<Value>::decode_all(&send(op, &query)?)? {
            Ok(Value(v)) => v,
            Err(st) => return Err(ApiErr(st)),
        };
        // SAFETY: per the contract.
        unsafe { *(out as *mut i32) = value };
        Ok(CUDA_SUCCESS)
    })
}

/// `cuMemRetainAllocationHandle`: the handle of the physical allocation mapped at `addr`, one
/// more reference to it (the server checks that the address lies in the program's mappings).
///
/// # Safety
/// `handle` NULL or a writable `CUmemGenericAllocationHandle`.
pub unsafe fn cuMemRetainAllocationHandle(handle: *mut c_void, addr: *mut c_void) -> i32 {
    use wormhole_cuda_proto::vmm::{GenericHandle, RetainAllocationHandle};
    entry_status(|| {
        rt::check_initialized()?;
        if handle.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let query = RetainAllocationHandle { addr: addr as u64 };
        match Reply::<GenericHandle>::decode_all(&send(Op::cuMemRetainAllocationHandle, &query)?)? {
            Ok(GenericHandle(h)) => {
                // SAFETY: per the contract.
                unsafe { (handle as *mut u64).write_unaligned(h) };
                Ok(CUDA_SUCCESS)
            }
            Err(st) => Err(ApiErr(st)),
        }
    })
}

/// `cuOccupancyMaxActiveClusters` (CUTLASS sizes its persistent Hopper kernels with it).
///
/// # Safety
/// As the C function.
pub unsafe fn cuOccupancyMaxActiveClusters(
    num_clusters: *mut c_void,
    f: *mut c_void,
    config: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe { cluster_occupancy(Op::cuOccupancyMaxActiveClusters, num_clusters, f, config) }
}

/// `cuOccupancyMaxPotentialClusterSize`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuOccupancyMaxPotentialClusterSize(
    cluster_size: *mut c_void,
    f: *mut c_void,
    config: *mut c_void,
) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        cluster_occupancy(
            Op::cuOccupancyMaxPotentialClusterSize,
            cluster_size,
            f,
            config,
        )
    }
}

/// A function's or kernel's name as the driver keeps it: asked of the server once per object,
/// then kept here for the process (the driver's string lives as long as its module).
///
/// # Safety
/// `name` NULL or a writable `const char *`.
unsafe fn name_of(op: Op, kind: HandleKind, name: *mut c_void, f: *mut c_void) -> i32 {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashMap<u64, CString>>> = Mutex::new(None);
    entry_status(|| {
        rt::check_initialized()?;
        if name.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: `id_of` dereferences only registered objects.
        let id = unsafe { rt::id_of(f, kind, false) }?;
        let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
        let names = names.get_or_insert_with(HashMap::new);
        let kept = match names.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let mut w = rt::request(op);
                w.u64(id);
                let reply = rt::call(w)?;
                let Name(bytes) = Reply::<Name>::decode_all(&reply)?.map_err(ApiErr)?;
                e.insert(CString::new(bytes).map_err(|_| ApiErr(CUDA_ERROR_UNKNOWN))?)
            }
        };
        // SAFETY: per the contract; the string lives in `NAMES` for the process.
        unsafe { *(name as *mut *const c_char) = kept.as_ptr() };
        Ok(CUDA_SUCCESS)
    })
}

/// `cuFuncGetName`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuFuncGetName(name: *mut c_void, f: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { name_of(Op::cuFuncGetName, HandleKind::Function, name, f) }
}

/// `cuKernelGetName` (cudart asks it of kernels from `cudaLibraryGetKernel`).
///
/// # Safety
/// As the C function.
pub unsafe fn cuKernelGetName(name: *mut c_void, f: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { name_of(Op::cuKernelGetName, HandleKind::Kernel, name, f) }
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

    /// `extra` lists as cuda.h describes them: a size of zero (or none) needs no pointer.
    #[test]
    fn extra_lists_give_their_buffer_or_none() {
        let args = [7u8, 8, 9, 10];
        let size = args.len();
        let zero = 0usize;
        let end = PARAM_END as *mut c_void;
        let (pointer, size_key) = (
            PARAM_BUFFER_POINTER as *mut c_void,
            PARAM_BUFFER_SIZE as *mut c_void,
        );
        let buffer = |list: &[*mut c_void]| {
            // SAFETY: each list ends with its end marker.
            unsafe { extra_buffer(list.as_ptr()) }
        };
        let whole = [
            pointer,
            args.as_ptr() as *mut c_void,
            size_key,
            &size as *const usize as *mut c_void,
            end,
        ];
        assert_eq!(buffer(&whole), Ok(args.to_vec()));
        assert_eq!(buffer(&[end]), Ok(Vec::new()), "nothing but the end");
        let no_pointer = [size_key, &zero as *const usize as *mut c_void, end];
        assert_eq!(buffer(&no_pointer), Ok(Vec::new()), "a size of zero");
        let pointer_alone = [pointer, args.as_ptr() as *mut c_void, end];
        assert_eq!(
            buffer(&pointer_alone),
            Ok(Vec::new()),
            "no effect without a size"
        );
        let size_alone = [size_key, &size as *const usize as *mut c_void, end];
        assert_eq!(buffer(&size_alone), Err(ApiErr(CUDA_ERROR_INVALID_VALUE)));
        let unknown = [9 as *mut c_void, std::ptr::null_mut(), end];
        assert_eq!(buffer(&unknown), Err(ApiErr(CUDA_ERROR_INVALID_VALUE)));
    }
}
