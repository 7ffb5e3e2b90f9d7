//! 2D copies (`cuMemcpy2D*`; cudart's host-to-host `cudaMemcpy` and `cudaMemcpy2D` come this
//! way). Rows of the program's host memory travel packed, in pieces of rows that each fit a
//! frame; host to host is the client's own copy. Arrays are not forwarded.

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::allocations;
use crate::copies::PIECE;
use crate::rt::{self, entry_status, ApiErr};
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    Copy2D, CuMemcpy2D, Message, Side2D, MEMORYTYPE_ARRAY, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST,
    MEMORYTYPE_UNIFIED,
};
use wormhole_cuda_proto::{HandleKind, Op, Reader};
use wormhole_session::host_memory;

/// Where one side's first byte is.
#[derive(Clone, Copy)]
enum At {
    Host(usize),
    Device(u64),
}

/// A side of the copy: its first byte (x and y applied) and its pitch.
fn side(
    kind: u32,
    host: usize,
    device: u64,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<(At, usize), ApiErr> {
    let offset = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
    let at = match kind {
        MEMORYTYPE_HOST => At::Host(host),
        MEMORYTYPE_DEVICE => At::Device(device),
        // One address space: the allocations say which memory it is.
        MEMORYTYPE_UNIFIED if allocations::range_of(device).is_some() => At::Device(device),
        MEMORYTYPE_UNIFIED => At::Host(device as usize),
        MEMORYTYPE_ARRAY => {
            crate::connection::log(
                "cuMemcpy2D with a CUDA array: arrays are not forwarded; returning CUDA_ERROR_NOT_SUPPORTED",
            );
            return Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED));
        }
        _ => return Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
    };
    Ok(match at {
        At::Host(p) => (
            At::Host(
                p.checked_add(offset)
                    .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?,
            ),
            pitch,
        ),
        At::Device(d) => (
            At::Device(
                d.checked_add(offset as u64)
                    .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?,
            ),
            pitch,
        ),
    })
}

/// Waits for the stream a 2D copy (`op`) is ordered on: its own (`Async` forms), or the NULL
/// stream, the thread's own for the per-thread forms. The driver's status.
fn wait_for_stream(op: Op, stream: Option<*mut c_void>) -> i32 {
    // SAFETY: a stream handle of the program's (checked by the call) or NULL.
    unsafe { rt::sync_stream(stream.unwrap_or(std::ptr::null_mut()), per_thread(op)) }
}

/// Whether the NULL stream of `op` is the calling thread's.
fn per_thread(op: Op) -> bool {
    matches!(
        op,
        Op::cuMemcpy2D_v2_ptds | Op::cuMemcpy2DUnaligned_v2_ptds | Op::cuMemcpy2DAsync_v2_ptsz
    )
}

/// Whether the copy's stream is capturing now (only asked once a capture was ever begun).
fn capturing(op: Op, stream: Option<*mut c_void>) -> bool {
    if !crate::capture::ever_begun() {
        return false;
    }
    let (stream, mut status) = (stream.unwrap_or(std::ptr::null_mut()), 0u32);
    // SAFETY: a stream handle of the program's or NULL, and a valid output.
    let st = unsafe {
        match per_thread(op) {
            true => crate::capture::cuStreamIsCapturing_ptsz(stream, &mut status),
            false => crate::capture::cuStreamIsCapturing(stream, &mut status),
        }
    };
    st == CUDA_SUCCESS && status != 0
}

/// Whether a row of `width` bytes from `x` lies within one `pitch` (cuda.h: "srcPitch must be
/// greater than or equal to WidthInBytes + srcXInBytes"); a wider one would run into the next
/// row, which the driver refuses.
fn row_fits(x: usize, width: usize, pitch: usize) -> bool {
    x.checked_add(width).is_some_and(|end| end <= pitch)
}

/// Row `i` of the program's host side, read (a row it does not have is refused).
fn read_row(start: usize, pitch: usize, i: usize, width: usize) -> Result<Vec<u8>, ApiErr> {
    // SAFETY: copy_in reads only memory the program has.
    unsafe { host_memory::copy_in((start + i * pitch) as *const u8, width) }
        .map(|r| r.into_owned())
        .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))
}

/// A 2D copy (`op`); `stream` for the `Async` forms.
///
/// # Safety
/// `p` NULL or a `CUDA_MEMCPY2D` whose host sides are the program's memory (as the driver's
/// contract asks).
unsafe fn copy_2d(op: Op, p: *const c_void, stream: Option<*mut c_void>) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if p.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        let c = unsafe { &*(p as *const CuMemcpy2D) };
        let (src, src_pitch) = side(
            c.src_type,
            c.src_host as usize,
            c.src_device,
            c.src_x,
            c.src_y,
            c.src_pitch,
        )?;
        let (dst, dst_pitch) = side(
            c.dst_type,
            c.dst_host as usize,
            c.dst_device,
            c.dst_x,
            c.dst_y,
            c.dst_pitch,
        )?;
        let (width, height) = (c.width, c.height);
        if width == 0 || height == 0 {
            return Ok(CUDA_SUCCESS);
        }
        if height > 1
            && !(row_fits(c.src_x, width, src_pitch) && row_fits(c.dst_x, width, dst_pitch))
        {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let stream_id = match stream {
            // SAFETY: dereferenced only if it is a registered stream.
            Some(s) => unsafe { rt::id_of(s, HandleKind::Stream, true) }?,
            None => 0,
        };
        // Pieces of whole rows, or of one row each where a row is wider than a piece.
        let blocks: Vec<(usize, usize, usize, usize)> = match PIECE / width {
            0 => (0..height)
                .flat_map(|row| {
                    (0..width)
                        .step_by(PIECE)
                        .map(move |col| (row, 1, col, PIECE.min(width - col)))
                })
                .collect(),
            rows => (0..height)
                .step_by(rows)
                .map(|first| (first, rows.min(height - first), 0, width))
                .collect(),
        };
        let device = |addr: u64, pitch: usize| Side2D::Device {
            addr,
            pitch: pitch as u64,
        };
        // Rows of the session's page-locked arena may still be written by device work on the
        // copy's stream (an async copy lands there, a kernel writes it): that comes first, as
        // the copy would natively run after it. Other host memory no device work touches.
        let in_arena = |at: At| matches!(at, At::Host(p) if crate::host_memory_pinned::arena_offset(p as u64, 1).is_some());
        if in_arena(src) || in_arena(dst) {
            // Waiting for a capturing stream would end the program's capture: such a copy is
            // refused instead (a gap: natively it is captured).
            if capturing(op, stream) {
                crate::connection::log(
                    "a 2D copy of page-locked memory on a capturing stream: not captured through Wormhole; answering CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                );
                return Ok(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let st = wait_for_stream(op, stream);
            if st != CUDA_SUCCESS {
                return Ok(st);
            }
        }
        match (src, dst) {
            (At::Host(s), At::Host(d)) => {
                for i in 0..height {
                    let row = read_row(s, src_pitch, i, width)?;
                    // SAFETY: per the contract, the destination rows are the program's.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            row.as_ptr(),
                            (d + i * dst_pitch) as *mut u8,
                            width,
                        )
                    };
                }
                Ok(CUDA_SUCCESS)
            }
            (At::Host(s), At::Device(d)) => {
                for (first, n, col, cols) in blocks {
                    let mut rows = Vec::with_capacity(n * cols);
                    for i in first..first + n {
                        rows.extend_from_slice(&read_row(s + col, src_pitch, i, cols)?);
                    }
                    let m = Copy2D {
                        src: Side2D::Host,
                        dst: device(d + (first * dst_pitch + col) as u64, dst_pitch),
                        width: cols as u64,
                        height: n as u64,
                        stream: stream_id,
                        rows: Some(&rows),
                    };
                    rt::status_of(&send(op, &m)?)?;
                }
                Ok(CUDA_SUCCESS)
            }
            (At::Device(s), At::Host(d)) => {
                for (first, n, col, cols) in blocks {
                    let m = Copy2D {
                        src: device(s + (first * src_pitch + col) as u64, src_pitch),
                        dst: Side2D::Host,
                        width: cols as u64,
                        height: n as u64,
                        stream: stream_id,
                        rows: None,
                    };
                    let reply = send(op, &m)?;
                    let mut r = Reader::new(&reply);
                    rt::status_of(&reply)?;
                    r.i32()?;
                    let rows = r.bytes()?;
                    r.finish()?;
                    if rows.len() != n * cols {
                        crate::connection::log(
                            "the server answered a 2D copy with another number of bytes",
                        );
                        return Err(ApiErr(CUDA_ERROR_UNKNOWN));
                    }
                    for (i, row) in rows.chunks_exact(cols).enumerate() {
                        let at = d + (first + i) * dst_pitch + col;
                        // SAFETY: per the contract, the destination rows are the program's.
                        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), at as *mut u8, cols) };
                    }
                }
                Ok(CUDA_SUCCESS)
            }
            (At::Device(s), At::Device(d)) => {
                let m = Copy2D {
                    src: device(s, src_pitch),
                    dst: device(d, dst_pitch),
                    width: width as u64,
                    height: height as u64,
                    stream: stream_id,
                    rows: None,
                };
                rt::status_of(&send(op, &m)?)?;
                Ok(CUDA_SUCCESS)
            }
        }
    })
}

/// Sends one piece and waits for the reply.
fn send(op: Op, m: &Copy2D<'_>) -> Result<Vec<u8>, ApiErr> {
    let mut w = rt::request(op);
    m.encode(&mut w);
    rt::call(w)
}

/// `cuMemcpy2D_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2D_v2(p: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2D_v2, p, None) }
}

/// `cuMemcpy2D_v2_ptds`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2D_v2_ptds(p: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2D_v2_ptds, p, None) }
}

/// `cuMemcpy2DUnaligned_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2DUnaligned_v2(p: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2DUnaligned_v2, p, None) }
}

/// `cuMemcpy2DUnaligned_v2_ptds`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2DUnaligned_v2_ptds(p: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2DUnaligned_v2_ptds, p, None) }
}

/// `cuMemcpy2DAsync_v2`: waited for (the rows travel with the request, or come back with
/// the reply).
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2DAsync_v2(p: *mut c_void, stream: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2DAsync_v2, p, Some(stream)) }
}

/// `cuMemcpy2DAsync_v2_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy2DAsync_v2_ptsz(p: *mut c_void, stream: *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe { copy_2d(Op::cuMemcpy2DAsync_v2_ptsz, p, Some(stream)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_start_at_their_x_and_y_and_unified_addresses_follow_the_allocations() {
        let host = |r: Result<(At, usize), ApiErr>| match r {
            Ok((At::Host(p), pitch)) => Some((p, pitch)),
            _ => None,
        };
        assert_eq!(
            host(side(MEMORYTYPE_HOST, 0x1000, 0, 4, 2, 64)),
            Some((0x1000 + 132, 64))
        );
        allocations::allocated(0x9_0000_0000, 0x1000);
        assert!(matches!(
            side(MEMORYTYPE_UNIFIED, 0, 0x9_0000_0010, 0, 0, 16),
            Ok((At::Device(0x9_0000_0010), 16))
        ));
        assert_eq!(
            host(side(MEMORYTYPE_UNIFIED, 0, 0x5000, 1, 0, 16)),
            Some((0x5001, 16))
        );
        assert_eq!(
            side(MEMORYTYPE_ARRAY, 0, 0, 0, 0, 0).err(),
            Some(ApiErr(CUDA_ERROR_NOT_SUPPORTED))
        );
        assert_eq!(
            side(9, 0, 0, 0, 0, 0).err(),
            Some(ApiErr(CUDA_ERROR_INVALID_VALUE))
        );
        assert_eq!(
            side(MEMORYTYPE_HOST, 0, 0, 0, usize::MAX, 2).err(),
            Some(ApiErr(CUDA_ERROR_INVALID_VALUE))
        );
        allocations::freed(0x9_0000_0000);
    }

    #[test]
    fn a_row_from_its_x_must_fit_in_the_pitch() {
        assert!(row_fits(0, 64, 64));
        assert!(row_fits(16, 48, 64));
        assert!(!row_fits(16, 64, 64), "x + width beyond the pitch");
        assert!(!row_fits(usize::MAX, 2, usize::MAX));
    }
}
