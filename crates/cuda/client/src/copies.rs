//! Copies between the host and the device. Host memory in the session's arena (page-locked
//! memory the worker registered, see `host_memory_pinned`) is copied by the worker's driver
//! where it lies: the request names the range, and an asynchronous copy is not waited for at
//! all (it completes with its stream, as natively). Copies of other host memory from 256 KiB
//! go through a staging range in the arena where the session has one (`staging`). Other host
//! memory travels in the requests and replies, in pieces: one request carries at most what a
//! frame and the worker's output buffer hold, so a copy larger than that travels as several,
//! one after another on the caller's lane (copies to the device are not waited for, so the
//! pieces follow each other without a round trip each). A piece the driver refuses ends the
//! copy with its status: the pieces before it have been copied, where natively nothing is.

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::generated::{self, Handle};
use crate::host_memory_pinned;
use crate::rt;
use crate::staging;
use std::ffi::c_void;
use wormhole_cuda_proto::cu::CUDA_SUCCESS;
use wormhole_cuda_proto::requests::{Message, PinnedCopy};
use wormhole_cuda_proto::{pinned, HandleKind, Writer};

/// How a copy was called: its stream (None: the synchronous entry point) and whether the
/// NULL stream is the calling thread's (`_ptds`, `_ptsz`).
#[derive(Clone, Copy)]
struct Call {
    stream: Option<Handle>,
    per_thread: bool,
}

const SYNC: Call = Call {
    stream: None,
    per_thread: false,
};
const SYNC_PER_THREAD: Call = Call {
    stream: None,
    per_thread: true,
};

fn on(stream: Handle, per_thread: bool) -> Call {
    Call {
        stream: Some(stream),
        per_thread,
    }
}

/// The copy, made by the worker's driver where the host side lies, if it lies in the arena
/// (None: it does not, the bytes must travel). Synchronous copies wait for the worker, as the
/// native ones wait for theirs; asynchronous ones are not waited for.
fn through_arena(to_device: bool, device: u64, host: u64, n: usize, how: Call) -> Option<i32> {
    let offset = host_memory_pinned::arena_offset(host, n as u64).filter(|_| n > 0)?;
    Some(rt::entry_status(|| {
        let stream = match how.stream {
            // SAFETY: `id_of` dereferences only registered objects.
            Some(h) => Some(unsafe { rt::id_of(h, HandleKind::Stream, true) }?),
            None => None,
        };
        let mut w = Writer::new(pinned::COPY);
        PinnedCopy {
            to_device,
            device,
            offset,
            len: n as u64,
            stream,
            per_thread: how.per_thread,
            complete: false,
            signal: None,
            whole: 0,
        }
        .encode(&mut w);
        let reply = match stream {
            Some(_) => rt::call_async(w)?,
            None => rt::call(w)?,
        };
        rt::status_of(&reply)?;
        Ok(CUDA_SUCCESS)
    }))
}

/// A copy that need not travel through the rings: the host side in the arena, or staged
/// through it (`staging`); None: it must.
///
/// # Safety
/// `host` points to `n` bytes of the program's that the copy may read (`to_device`) or write.
unsafe fn without_rings(
    to_device: bool,
    device: u64,
    host: *mut u8,
    n: usize,
    how: Call,
) -> Option<i32> {
    through_arena(to_device, device, host as u64, n, how).or_else(|| {
        // SAFETY: per the contract.
        unsafe { staging::copy(to_device, device, host, n, how.stream, how.per_thread) }
    })
}

/// The largest piece: what the worker returns in one reply.
pub const PIECE: usize = 64 << 20;

/// Runs `copy(offset, length)` for each piece of `n` bytes (one call, also for 0 bytes, when
/// it fits), stopping at the first failure.
fn in_pieces(n: usize, mut copy: impl FnMut(usize, usize) -> i32) -> i32 {
    if n <= PIECE {
        return copy(0, n);
    }
    let mut at = 0;
    while at < n {
        let len = PIECE.min(n - at);
        let status = copy(at, len);
        if status != CUDA_SUCCESS {
            return status;
        }
        at += len;
    }
    CUDA_SUCCESS
}

/// Where piece `at` of a device range begins (the driver checks what wraps).
fn device_at(base: u64, at: usize) -> u64 {
    base.wrapping_add(at as u64)
}

/// `cuMemcpyDtoH_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> i32 {
    // SAFETY: per the contract, `dst` holds `n` writable bytes.
    if let Some(st) = unsafe { without_rings(false, src, dst.cast(), n, SYNC) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: per the contract, `dst` holds `n` bytes, so each piece lies inside them.
        unsafe {
            generated::wire_cuMemcpyDtoH_v2(dst.wrapping_byte_add(at), device_at(src, at), len)
        }
    })
}

/// `cuMemcpyDtoH_v2_ptds`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) -> i32 {
    // SAFETY: per the contract, `dst` holds `n` writable bytes.
    if let Some(st) = unsafe { without_rings(false, src, dst.cast(), n, SYNC_PER_THREAD) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyDtoH_v2`.
        unsafe {
            generated::wire_cuMemcpyDtoH_v2_ptds(dst.wrapping_byte_add(at), device_at(src, at), len)
        }
    })
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract, `dst` holds `n` writable bytes.
    if let Some(st) = unsafe { without_rings(false, src, dst.cast(), n, on(stream, false)) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyDtoH_v2`.
        unsafe {
            generated::wire_cuMemcpyDtoHAsync_v2(
                dst.wrapping_byte_add(at),
                device_at(src, at),
                len,
                stream,
            )
        }
    })
}

/// `cuMemcpyDtoHAsync_v2_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: Handle,
) -> i32 {
    // SAFETY: per the contract, `dst` holds `n` writable bytes.
    if let Some(st) = unsafe { without_rings(false, src, dst.cast(), n, on(stream, true)) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyDtoH_v2`.
        unsafe {
            generated::wire_cuMemcpyDtoHAsync_v2_ptsz(
                dst.wrapping_byte_add(at),
                device_at(src, at),
                len,
                stream,
            )
        }
    })
}

/// `cuMemcpyHtoD_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> i32 {
    // SAFETY: per the contract, `src` holds `n` readable (only read: to the device) bytes.
    if let Some(st) = unsafe { without_rings(true, dst, src as *mut u8, n, SYNC) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: per the contract, `src` holds `n` bytes, so each piece lies inside them.
        unsafe {
            generated::wire_cuMemcpyHtoD_v2(device_at(dst, at), src.wrapping_byte_add(at), len)
        }
    })
}

/// `cuMemcpyHtoD_v2_ptds`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) -> i32 {
    // SAFETY: per the contract, `src` holds `n` readable (only read: to the device) bytes.
    if let Some(st) = unsafe { without_rings(true, dst, src as *mut u8, n, SYNC_PER_THREAD) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyHtoD_v2`.
        unsafe {
            generated::wire_cuMemcpyHtoD_v2_ptds(device_at(dst, at), src.wrapping_byte_add(at), len)
        }
    })
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract, `src` holds `n` readable (only read: to the device) bytes.
    if let Some(st) = unsafe { without_rings(true, dst, src as *mut u8, n, on(stream, false)) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyHtoD_v2`.
        unsafe {
            generated::wire_cuMemcpyHtoDAsync_v2(
                device_at(dst, at),
                src.wrapping_byte_add(at),
                len,
                stream,
            )
        }
    })
}

/// `cuMemcpyHtoDAsync_v2_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: Handle,
) -> i32 {
    // SAFETY: per the contract, `src` holds `n` readable (only read: to the device) bytes.
    if let Some(st) = unsafe { without_rings(true, dst, src as *mut u8, n, on(stream, true)) } {
        return st;
    }
    in_pieces(n, |at, len| {
        // SAFETY: as in `cuMemcpyHtoD_v2`.
        unsafe {
            generated::wire_cuMemcpyHtoDAsync_v2_ptsz(
                device_at(dst, at),
                src.wrapping_byte_add(at),
                len,
                stream,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(n: usize, fail_at: Option<usize>) -> (i32, Vec<(usize, usize)>) {
        let mut seen = Vec::new();
        let st = in_pieces(n, |at, len| {
            seen.push((at, len));
            if Some(at) == fail_at {
                1
            } else {
                CUDA_SUCCESS
            }
        });
        (st, seen)
    }

    #[test]
    fn a_copy_that_fits_is_one_request_even_when_empty() {
        assert_eq!(pieces_of(0, None), (0, vec![(0, 0)]));
        assert_eq!(pieces_of(PIECE, None), (0, vec![(0, PIECE)]));
    }

    #[test]
    fn a_larger_copy_goes_in_pieces_that_cover_it() {
        let (st, seen) = pieces_of(2 * PIECE + 5, None);
        assert_eq!(st, 0);
        assert_eq!(seen, vec![(0, PIECE), (PIECE, PIECE), (2 * PIECE, 5)]);
    }

    #[test]
    fn a_refused_piece_ends_the_copy_with_its_status() {
        let (st, seen) = pieces_of(3 * PIECE, Some(PIECE));
        assert_eq!(st, 1);
        assert_eq!(seen.len(), 2);
    }
}
