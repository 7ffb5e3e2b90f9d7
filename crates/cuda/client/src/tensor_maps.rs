//! Tensor maps (`cuTensorMapEncodeTiled`, `...Im2col`, `...Im2colWide`,
//! `cuTensorMapReplaceAddress`): 128-byte descriptors of a tensor in device memory, which
//! kernels using Hopper's tensor memory accelerator receive as a parameter (cuBLASLt and
//! cuDNN make them for their GEMMs). Their format is the driver's own, so the server's driver
//! makes them; the address they hold is a device address, the same number on both sides. The
//! client reads the arrays at the lengths the rank gives, refuses what no driver accepts
//! (no output, a rank beyond 5, an array missing), and writes the map back.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::rt::{self, entry_status, ApiErr};
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    Message, Reply, TensorMap, TensorMapEncode, TensorMapLayout, TensorMapReplaceAddress,
    TENSOR_MAP_BYTES, TENSOR_MAP_MAX_RANK,
};
use wormhole_cuda_proto::Op;

/// `n` values of `T` at `p` (none to read when `n` is 0, whatever `p`); a NULL or unreadable
/// array is CUDA_ERROR_INVALID_VALUE, as the driver answers it.
///
/// # Safety
/// `p` NULL or pointing to `n` values of `T`.
unsafe fn array<T: Copy>(p: *const c_void, n: u32) -> Result<Vec<T>, ApiErr> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let len = n as usize * std::mem::size_of::<T>();
    // SAFETY: per the contract; an unreadable range is refused, not touched.
    let bytes = unsafe { rt::bytes_in(p as *const u8, Some(len)) }?
        .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
    Ok(bytes
        .chunks_exact(std::mem::size_of::<T>())
        // SAFETY: each chunk holds one `T` of plain integers.
        .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr() as *const T) })
        .collect())
}

/// What every encoder takes: checked, with the global arrays read.
struct Common {
    rank: u32,
    global_dim: Vec<u64>,
    global_strides: Vec<u64>,
}

/// Where an encoder may write a tensor map: cuda.h, "tensorMap address must be aligned to 64
/// bytes" (the driver refuses others; the worker encodes into its own aligned map, so the
/// client checks).
fn encodable_at(map: *mut c_void) -> bool {
    !map.is_null() && (map as usize).is_multiple_of(64)
}

/// # Safety
/// As the C functions: the arrays hold the lengths the rank gives.
unsafe fn common(
    map: *mut c_void,
    rank: u32,
    global_dim: *mut c_void,
    global_strides: *mut c_void,
) -> Result<Common, ApiErr> {
    rt::check_initialized()?;
    if !encodable_at(map) || rank == 0 || rank > TENSOR_MAP_MAX_RANK {
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: per the contract.
    unsafe {
        Ok(Common {
            rank,
            global_dim: array(global_dim, rank)?,
            global_strides: array(global_strides, rank - 1)?,
        })
    }
}

impl Common {
    /// The encoder's request, with the rest of its arguments.
    fn request(
        self,
        layout: TensorMapLayout,
        data_type: u32,
        address: *mut c_void,
        element_strides: Vec<u32>,
        [interleave, swizzle, l2_promotion, oob_fill]: [u32; 4],
    ) -> TensorMapEncode {
        TensorMapEncode {
            layout,
            data_type,
            rank: self.rank,
            address: address as u64,
            global_dim: self.global_dim,
            global_strides: self.global_strides,
            element_strides,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
        }
    }
}

/// Sends an encoder's request and writes the map it answers into `map`.
///
/// # Safety
/// `map` points to 128 writable bytes.
unsafe fn made(op: Op, map: *mut c_void, request: TensorMapEncode) -> Result<i32, ApiErr> {
    let mut w = rt::request(op);
    request.encode(&mut w);
    // SAFETY: per the contract.
    unsafe { answer(map, &rt::call(w)?) }
}

/// Writes the map a reply carries into the program's `map`.
///
/// # Safety
/// `map` points to 128 writable bytes.
unsafe fn answer(map: *mut c_void, reply: &[u8]) -> Result<i32, ApiErr> {
    let TensorMap(bytes) = Reply::<TensorMap>::decode_all(reply)?.map_err(ApiErr)?;
    // SAFETY: per the contract.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map as *mut u8, TENSOR_MAP_BYTES) };
    Ok(CUDA_SUCCESS)
}

/// `cuTensorMapEncodeTiled`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuTensorMapEncodeTiled(
    map: *mut c_void,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    global_dim: *mut c_void,
    global_strides: *mut c_void,
    box_dim: *mut c_void,
    element_strides: *mut c_void,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> i32 {
    entry_status(|| {
        // SAFETY: per the contract.
        unsafe {
            let c = common(map, rank, global_dim, global_strides)?;
            let layout = TensorMapLayout::Tiled {
                box_dim: array(box_dim, rank)?,
            };
            let element_strides = array(element_strides, rank)?;
            let request = c.request(
                layout,
                data_type,
                address,
                element_strides,
                [interleave, swizzle, l2_promotion, oob_fill],
            );
            made(Op::cuTensorMapEncodeTiled, map, request)
        }
    })
}

/// `cuTensorMapEncodeIm2col`: the pixel box's corners have one entry per spatial dimension
/// (rank − 2; ranks below 3 are the driver's CUDA_ERROR_INVALID_VALUE).
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuTensorMapEncodeIm2col(
    map: *mut c_void,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    global_dim: *mut c_void,
    global_strides: *mut c_void,
    lower_corner: *mut c_void,
    upper_corner: *mut c_void,
    channels_per_pixel: u32,
    pixels_per_column: u32,
    element_strides: *mut c_void,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> i32 {
    entry_status(|| {
        if rank < 3 {
            rt::check_initialized()?;
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract.
        unsafe {
            let c = common(map, rank, global_dim, global_strides)?;
            let layout = TensorMapLayout::Im2col {
                lower_corner: array(lower_corner, rank - 2)?,
                upper_corner: array(upper_corner, rank - 2)?,
                channels_per_pixel,
                pixels_per_column,
            };
            let element_strides = array(element_strides, rank)?;
            let request = c.request(
                layout,
                data_type,
                address,
                element_strides,
                [interleave, swizzle, l2_promotion, oob_fill],
            );
            made(Op::cuTensorMapEncodeIm2col, map, request)
        }
    })
}

/// `cuTensorMapEncodeIm2colWide`.
///
/// # Safety
/// As the C function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cuTensorMapEncodeIm2colWide(
    map: *mut c_void,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    global_dim: *mut c_void,
    global_strides: *mut c_void,
    lower_corner_width: i32,
    upper_corner_width: i32,
    channels_per_pixel: u32,
    pixels_per_column: u32,
    element_strides: *mut c_void,
    interleave: u32,
    mode: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> i32 {
    entry_status(|| {
        // SAFETY: per the contract.
        unsafe {
            let c = common(map, rank, global_dim, global_strides)?;
            let layout = TensorMapLayout::Im2colWide {
                lower_corner_width,
                upper_corner_width,
                channels_per_pixel,
                pixels_per_column,
                mode,
            };
            let element_strides = array(element_strides, rank)?;
            let request = c.request(
                layout,
                data_type,
                address,
                element_strides,
                [interleave, swizzle, l2_promotion, oob_fill],
            );
            made(Op::cuTensorMapEncodeIm2colWide, map, request)
        }
    })
}

/// `cuTensorMapReplaceAddress`: the map is read and written in place.
///
/// # Safety
/// As the C function.
pub unsafe fn cuTensorMapReplaceAddress(map: *mut c_void, address: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if map.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract, `map` is a tensor map of 128 bytes.
        let current: [u8; TENSOR_MAP_BYTES] = unsafe { array(map, TENSOR_MAP_BYTES as u32) }?
            .try_into()
            .map_err(|_| ApiErr(CUDA_ERROR_INVALID_VALUE))?;
        let mut w = rt::request(Op::cuTensorMapReplaceAddress);
        TensorMapReplaceAddress {
            map: TensorMap(current),
            address: address as u64,
        }
        .encode(&mut w);
        // SAFETY: as above.
        unsafe { answer(map, &rt::call(w)?) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_encoded_only_at_64_byte_aligned_addresses() {
        assert!(encodable_at(0x1000 as *mut c_void));
        assert!(encodable_at(0x1040 as *mut c_void));
        assert!(!encodable_at(0x1020 as *mut c_void));
        assert!(!encodable_at(std::ptr::null_mut()));
    }

    #[test]
    fn arrays_are_read_at_their_length_and_missing_ones_refused() {
        let dims = [4u64, 5, 6];
        // SAFETY: three u64s.
        let got: Vec<u64> = unsafe { array(dims.as_ptr() as *const c_void, 3) }.unwrap();
        assert_eq!(got, dims);
        // SAFETY: nothing is read for an empty array, whatever the pointer.
        let none: Vec<u64> = unsafe { array(std::ptr::null(), 0) }.unwrap();
        assert!(none.is_empty());
        // SAFETY: a NULL array of one entry is refused before it is read.
        let missing = unsafe { array::<u32>(std::ptr::null(), 1) };
        assert_eq!(missing, Err(ApiErr(CUDA_ERROR_INVALID_VALUE)));
    }
}
