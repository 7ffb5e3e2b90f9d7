//! JIT linking (`cuLink*`), forwarded to the worker's driver. A link state's JIT options hold
//! for its life, as natively (cuda.h: their arrays must stay valid while output options are
//! used): after each step the logs so far and the driver's counts are written back into the
//! program's buffers and slots. Inputs travel as bytes (`cuLinkAddFile` reads the file here);
//! the linked image `cuLinkComplete` gives is the client's copy, valid until the state is
//! destroyed, as the driver's would be.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::jit::{ProgramOptions, ReadOptions};
use crate::objects;
use crate::rt::{self, entry_status, ApiErr};
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{LinkAdd, LinkCreate, LinkDone, Message};
use wormhole_cuda_proto::{HandleKind, Op};
use wormhole_session::host_memory;

/// What the client keeps per link state: its options as read at its creation (what the
/// driver writes into through the state's life), and the linked image.
struct Link {
    options: ReadOptions,
    image: Option<Vec<u8>>,
}

fn links() -> MutexGuard<'static, HashMap<u64, Link>> {
    static LINKS: OnceLock<Mutex<HashMap<u64, Link>>> = OnceLock::new();
    LINKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn send<'a, M: Message<'a>>(op: Op, m: &M) -> Result<LinkDone, ApiErr> {
    let mut w = rt::request(op);
    m.encode(&mut w);
    Ok(LinkDone::decode_all(&rt::call(w)?)?)
}

/// Writes what the driver left in link `id`'s own options.
fn write_back_link(id: u64, done: &LinkDone) {
    if let Some(link) = links().get(&id) {
        link.options.write_back(&done.link_jit);
    }
}

/// # Safety
/// As `cuLinkCreate_v2`.
pub unsafe fn cuLinkCreate(
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
    state_out: *mut c_void,
) -> i32 {
    // SAFETY: the same signature.
    unsafe { cuLinkCreate_v2(n, options, values, state_out) }
}

/// # Safety
/// `options` and `values` hold `n` entries when `n` is not 0; `state_out` NULL or writable.
pub unsafe fn cuLinkCreate_v2(
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
    state_out: *mut c_void,
) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if state_out.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let jit = unsafe { ProgramOptions::new(n, options, values) }.read()?;
        let new_id = objects::alloc_id();
        let done = send(
            Op::cuLinkCreate_v2,
            &LinkCreate {
                new_id,
                jit: jit.sent(),
            },
        )?;
        jit.write_back(&done.link_jit);
        if done.status == CUDA_SUCCESS {
            links().insert(
                new_id,
                Link {
                    options: jit,
                    image: None,
                },
            );
            // SAFETY: per the contract.
            unsafe {
                *(state_out as *mut *mut c_void) =
                    objects::new_object(HandleKind::LinkState, new_id)
            };
        }
        Ok(done.status)
    })
}

/// # Safety
/// As `cuLinkAddData_v2`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLinkAddData(
    state: *mut c_void,
    input_type: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> i32 {
    // SAFETY: the same signature.
    unsafe { cuLinkAddData_v2(state, input_type, data, size, name, n, options, values) }
}

/// # Safety
/// `data` holds `size` bytes; `name` NULL or a C string; options as `cuLinkCreate_v2`'s.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLinkAddData_v2(
    state: *mut c_void,
    input_type: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> i32 {
    entry_status(|| {
        if data.is_null() || size == 0 {
            rt::check_initialized()?;
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: copy_in checks that the program has the range.
        let bytes = unsafe { host_memory::copy_in(data as *const u8, size) }
            .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
        // SAFETY: per the contract.
        unsafe { add(state, input_type, &bytes, name, n, options, values) }
    })
}

/// # Safety
/// As `cuLinkAddFile_v2`.
pub unsafe fn cuLinkAddFile(
    state: *mut c_void,
    input_type: u32,
    path: *const c_char,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> i32 {
    // SAFETY: the same signature.
    unsafe { cuLinkAddFile_v2(state, input_type, path, n, options, values) }
}

/// The file read here (the server never opens a tenant's paths), then as `cuLinkAddData_v2`,
/// named by its path as natively in the logs.
///
/// # Safety
/// `path` NULL or a C string; options as `cuLinkCreate_v2`'s.
pub unsafe fn cuLinkAddFile_v2(
    state: *mut c_void,
    input_type: u32,
    path: *const c_char,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> i32 {
    entry_status(|| {
        // SAFETY: per the contract.
        let bytes = unsafe { crate::custom::read_named_file(path, "link input") }?;
        if bytes.is_empty() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        unsafe { add(state, input_type, &bytes, path, n, options, values) }
    })
}

/// # Safety
/// `name` NULL or a C string; options as `cuLinkCreate_v2`'s.
unsafe fn add(
    state: *mut c_void,
    input_type: u32,
    data: &[u8],
    name: *const c_char,
    n: u32,
    options: *mut c_void,
    values: *mut c_void,
) -> Result<i32, ApiErr> {
    // SAFETY: `id_of` dereferences only registered objects.
    let id = unsafe { rt::id_of(state, HandleKind::LinkState, false) }?;
    // SAFETY: per the contract.
    let name = unsafe { rt::cstr_in(name) }.unwrap_or_default();
    // SAFETY: per the contract.
    let jit = unsafe { ProgramOptions::new(n, options, values) }.read()?;
    let done = send(
        Op::cuLinkAddData_v2,
        &LinkAdd {
            state: id,
            input_type,
            name,
            data,
            jit: jit.sent(),
        },
    )?;
    write_back_link(id, &done);
    jit.write_back(&done.call_jit);
    Ok(done.status)
}

/// # Safety
/// `cubin_out` NULL or writable; `size_out` NULL (it is optional) or writable.
pub unsafe fn cuLinkComplete(
    state: *mut c_void,
    cubin_out: *mut c_void,
    size_out: *mut c_void,
) -> i32 {
    entry_status(|| {
        // SAFETY: `id_of` dereferences only registered objects.
        let id = unsafe { rt::id_of(state, HandleKind::LinkState, false) }?;
        if cubin_out.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let mut w = rt::request(Op::cuLinkComplete);
        w.u64(id);
        let done = LinkDone::decode_all(&rt::call(w)?)?;
        write_back_link(id, &done);
        if done.status != CUDA_SUCCESS {
            return Ok(done.status);
        }
        let Some(image) = done.image else {
            crate::connection::log("cuLinkComplete: the server sent no image");
            return Err(ApiErr(CUDA_ERROR_UNKNOWN));
        };
        let mut table = links();
        let link = table
            .get_mut(&id)
            .ok_or(ApiErr(CUDA_ERROR_INVALID_HANDLE))?;
        let image = link.image.insert(image);
        // SAFETY: per the contract (the size is optional); the image stays with the state
        // until its destruction.
        unsafe {
            *(cubin_out as *mut *mut c_void) = image.as_mut_ptr().cast();
            if !size_out.is_null() {
                *(size_out as *mut usize) = image.len();
            }
        }
        Ok(CUDA_SUCCESS)
    })
}

/// # Safety
/// None beyond the C function's.
pub unsafe fn cuLinkDestroy(state: *mut c_void) -> i32 {
    entry_status(|| {
        // SAFETY: `id_of` dereferences only registered objects.
        let id = unsafe { rt::id_of(state, HandleKind::LinkState, false) }?;
        let mut w = rt::request(Op::cuLinkDestroy);
        w.u64(id);
        let done = LinkDone::decode_all(&rt::call(w)?)?;
        if done.status == CUDA_SUCCESS {
            links().remove(&id);
            objects::destroy(state);
        }
        Ok(done.status)
    })
}
