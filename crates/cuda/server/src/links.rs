// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

//! JIT linking (`cuLink*`: Numba links every kernel it compiles, CuPy and others link PTX with
//! device libraries): the link state is the worker's driver's, bound under the client's id;
//! its JIT options live as long as it (the driver writes their logs at each input and at the
//! completion), so their arrays are kept beside it; the linked image goes back to the client,
//! and into the tenant's image store, so loading it next costs no second trip of its bytes.

use crate::generated::ffi;
use crate::jit::JitArrays;
use crate::session::{Call, Handle};
use std::ffi::{c_void, CString};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{LinkAdd, LinkCreate, LinkDone, Message};
use wormhole_cuda_proto::{DecodeError, HandleKind, Reader, Writer};

/// `cuLinkCreate`: as `_v2` (the same signature).
pub fn cuLinkCreate(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    cuLinkCreate_v2(s, r, w)
}

/// `cuLinkCreate_v2`: a link state with the program's JIT options.
pub fn cuLinkCreate_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let m = LinkCreate::decode(r)?;
    r.finish()?;
    let done = (|| {
        s.check_new_id(m.new_id).map_err(failed)?;
        let mut jit = JitArrays::new(&m.jit).map_err(failed)?;
        let (options, values) = jit.pointers();
        let mut state: Handle = std::ptr::null_mut();
        // SAFETY: the arrays hold `len` entries and stay with the state (kept below until its
        // destruction); a valid output pointer.
        let st = unsafe {
            ffi::cuLinkCreate_v2(
                jit.len(),
                options.cast(),
                values.cast(),
                (&mut state as *mut Handle).cast(),
            )
        };
        let mut done = LinkDone {
            status: st,
            link_jit: jit.outputs(),
            ..LinkDone::default()
        };
        if st == CUDA_SUCCESS {
            // Bound first, so the id is the state's alone when its arrays are filed under it.
            if let Err(st) = s.bind(m.new_id, HandleKind::LinkState, state) {
                crate::rt::release(HandleKind::LinkState, state);
                done.status = st;
            } else if let Err((st, jit)) = s.keep_jit_arrays(m.new_id, jit) {
                s.forget(m.new_id);
                // The state first: the driver may write into the arrays until it goes.
                crate::rt::release(HandleKind::LinkState, state);
                drop(jit);
                done.status = st;
            }
        }
        Ok::<_, LinkDone>(done)
    })();
    done.unwrap_or_else(|e| e).encode(w);
    Ok(())
}

fn failed(status: i32) -> LinkDone {
    LinkDone {
        status,
        ..LinkDone::default()
    }
}

/// `cuLinkAddData`: as `_v2`.
pub fn cuLinkAddData(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    link_add(s, r, w)
}

/// `cuLinkAddData_v2`: one input, its bytes sent by the client.
pub fn cuLinkAddData_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    link_add(s, r, w)
}

/// `cuLinkAddFile`: the client read the file (the server never opens a tenant's paths).
pub fn cuLinkAddFile(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    link_add(s, r, w)
}

/// `cuLinkAddFile_v2`: as `cuLinkAddFile`.
pub fn cuLinkAddFile_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    link_add(s, r, w)
}

fn link_add(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let m = LinkAdd::decode(r)?;
    r.finish()?;
    let done = (|| {
        let state = s
            .resolve(m.state, HandleKind::LinkState, false)
            .map_err(failed)?;
        if m.data.is_empty() {
            return Err(failed(CUDA_ERROR_INVALID_VALUE));
        }
        let name = CString::new(m.name).map_err(|_| failed(CUDA_ERROR_INVALID_VALUE))?;
        let mut jit = JitArrays::new(&m.jit).map_err(failed)?;
        let (options, values) = jit.pointers();
        // The driver may read the input as wider types: aligned memory.
        let mut data = crate::custom::aligned(m.data);
        // SAFETY: a live link state; `data` holds the input's bytes; the options' arrays hold
        // `len` entries; the state's own arrays are kept with it.
        let st = unsafe {
            ffi::cuLinkAddData_v2(
                state,
                m.input_type,
                data.as_mut_ptr().cast(),
                m.data.len(),
                name.as_ptr(),
                jit.len(),
                options.cast(),
                values.cast(),
            )
        };
        Ok(LinkDone {
            status: st,
            link_jit: s.jit_outputs(m.state),
            call_jit: jit.outputs(),
            image: None,
        })
    })();
    done.unwrap_or_else(|e| e).encode(w);
    Ok(())
}

/// `cuLinkComplete`: the linked image, sent back and kept in the tenant's store.
pub fn cuLinkComplete(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let id = r.u64()?;
    r.finish()?;
    let done = (|| {
        let state = s
            .resolve(id, HandleKind::LinkState, false)
            .map_err(failed)?;
        let mut image: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: a live link state, valid output pointers.
        let st = unsafe {
            ffi::cuLinkComplete(
                state,
                (&mut image as *mut *mut c_void).cast(),
                (&mut size as *mut usize).cast(),
            )
        };
        let bytes = (st == CUDA_SUCCESS && !image.is_null()).then(|| {
            // SAFETY: the driver's image of `size` bytes, valid until the state's destruction.
            unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) }.to_vec()
        });
        if let Some(b) = &bytes {
            let digest = ring::digest::digest(&ring::digest::SHA256, b);
            s.keep_image(digest.as_ref().try_into().expect("SHA-256 is 32 bytes"), b);
        }
        Ok(LinkDone {
            status: st,
            link_jit: s.jit_outputs(id),
            call_jit: Vec::new(),
            image: bytes,
        })
    })();
    done.unwrap_or_else(|e| e).encode(w);
    Ok(())
}

/// `cuLinkDestroy`: the state, and the options' arrays kept for it.
pub fn cuLinkDestroy(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let id = r.u64()?;
    r.finish()?;
    let status = match s.resolve(id, HandleKind::LinkState, false) {
        Err(st) => st,
        Ok(state) => {
            // SAFETY: a live link state, destroyed once (forgotten below).
            let st = unsafe { ffi::cuLinkDestroy(state) };
            if st == CUDA_SUCCESS {
                // Its kept arrays go with it.
                s.forget(id);
            }
            st
        }
    };
    failed(status).encode(w);
    Ok(())
}
