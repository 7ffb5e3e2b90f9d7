//! Tensor maps (see the client's `tensor_maps`): made by the driver from the arrays the client
//! read. The address a map holds is not checked against the session's memory: the map only
//! describes it, and a kernel that uses it reaches memory through the session's own context,
//! as any pointer it is given.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::generated::ffi;
use crate::session::Call;
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    Message, Reply, TensorMap, TensorMapEncode, TensorMapLayout, TensorMapReplaceAddress,
    TENSOR_MAP_BYTES, TENSOR_MAP_MAX_RANK,
};
use wormhole_cuda_proto::{DecodeError, Reader, Writer};

/// `CUtensorMap`'s storage: the driver expects it 64-byte aligned.
#[repr(C, align(64))]
struct Aligned([u8; TENSOR_MAP_BYTES]);

/// Whether the arrays have the lengths the rank gives (a client that sends others is refused
/// before the driver reads them).
fn lengths_agree(m: &TensorMapEncode) -> bool {
    let rank = m.rank as usize;
    let layout_ok = match &m.layout {
        TensorMapLayout::Tiled { box_dim } => box_dim.len() == rank,
        TensorMapLayout::Im2col {
            lower_corner,
            upper_corner,
            ..
        } => rank >= 3 && lower_corner.len() == rank - 2 && upper_corner.len() == rank - 2,
        TensorMapLayout::Im2colWide { .. } => true,
    };
    (1..=TENSOR_MAP_MAX_RANK).contains(&m.rank)
        && m.global_dim.len() == rank
        && m.global_strides.len() == rank - 1
        && m.element_strides.len() == rank
        && layout_ok
}

fn encode(m: &TensorMapEncode) -> Result<TensorMap, i32> {
    if !lengths_agree(m) {
        tracing::warn!(
            rank = m.rank,
            "refused a tensor map whose arrays do not match its rank"
        );
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut out = Aligned([0; TENSOR_MAP_BYTES]);
    let map = out.0.as_mut_ptr() as *mut c_void;
    let address = m.address as *mut c_void;
    let dim = m.global_dim.as_ptr() as *mut c_void;
    let strides = m.global_strides.as_ptr() as *mut c_void;
    let elements = m.element_strides.as_ptr() as *mut c_void;
    // SAFETY: a 64-byte aligned output of 128 bytes; every array has the length the rank
    // gives (checked above), which is what the driver reads; the rest are values.
    let st = unsafe {
        match &m.layout {
            TensorMapLayout::Tiled { box_dim } => ffi::cuTensorMapEncodeTiled(
                map,
                m.data_type,
                m.rank,
                address,
                dim,
                strides,
                box_dim.as_ptr() as *mut c_void,
                elements,
                m.interleave,
                m.swizzle,
                m.l2_promotion,
                m.oob_fill,
            ),
            TensorMapLayout::Im2col {
                lower_corner,
                upper_corner,
                channels_per_pixel,
                pixels_per_column,
            } => ffi::cuTensorMapEncodeIm2col(
                map,
                m.data_type,
                m.rank,
                address,
                dim,
                strides,
                lower_corner.as_ptr() as *mut c_void,
                upper_corner.as_ptr() as *mut c_void,
                *channels_per_pixel,
                *pixels_per_column,
                elements,
                m.interleave,
                m.swizzle,
                m.l2_promotion,
                m.oob_fill,
            ),
            TensorMapLayout::Im2colWide {
                lower_corner_width,
                upper_corner_width,
                channels_per_pixel,
                pixels_per_column,
                mode,
            } => ffi::cuTensorMapEncodeIm2colWide(
                map,
                m.data_type,
                m.rank,
                address,
                dim,
                strides,
                *lower_corner_width,
                *upper_corner_width,
                *channels_per_pixel,
                *pixels_per_column,
                elements,
                m.interleave,
                *mode,
                m.swizzle,
                m.l2_promotion,
                m.oob_fill,
            ),
        }
    };
    crate::rt::status(st).map(|()| TensorMap(out.0))
}

fn encode_request(r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let m = TensorMapEncode::decode_rest(r)?;
    let reply: Reply<TensorMap> = encode(&m);
    reply.encode(w);
    Ok(())
}

/// `cuTensorMapEncodeTiled`.
pub fn cuTensorMapEncodeTiled(
    _s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    encode_request(r, w)
}

/// `cuTensorMapEncodeIm2col`.
pub fn cuTensorMapEncodeIm2col(
    _s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    encode_request(r, w)
}

/// `cuTensorMapEncodeIm2colWide`.
pub fn cuTensorMapEncodeIm2colWide(
    _s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    encode_request(r, w)
}

/// `cuTensorMapReplaceAddress`: the program's map, changed by the driver.
pub fn cuTensorMapReplaceAddress(
    _s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let m = TensorMapReplaceAddress::decode_rest(r)?;
    let mut map = Aligned(m.map.0);
    // SAFETY: a 64-byte aligned tensor map of 128 bytes, changed in place.
    let st = unsafe {
        ffi::cuTensorMapReplaceAddress(map.0.as_mut_ptr() as *mut c_void, m.address as *mut c_void)
    };
    let reply: Reply<TensorMap> = crate::rt::status(st).map(|()| TensorMap(map.0));
    reply.encode(w);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled(rank: u32, dims: usize, strides: usize, boxes: usize) -> TensorMapEncode {
        TensorMapEncode {
            layout: TensorMapLayout::Tiled {
                box_dim: vec![8; boxes],
            },
            data_type: 0,
            rank,
            address: 0,
            global_dim: vec![64; dims],
            global_strides: vec![512; strides],
            element_strides: vec![1; dims],
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
        }
    }

    /// The driver reads each array at the length the rank gives: a request whose arrays are
    /// shorter never reaches it.
    #[test]
    fn arrays_must_match_the_rank() {
        assert!(lengths_agree(&tiled(2, 2, 1, 2)));
        assert!(!lengths_agree(&tiled(2, 2, 0, 2)), "a stride missing");
        assert!(
            !lengths_agree(&tiled(2, 2, 1, 1)),
            "a box dimension missing"
        );
        assert!(!lengths_agree(&tiled(0, 0, 0, 0)));
        assert!(!lengths_agree(&tiled(3, 2, 1, 2)));
        let mut im2col = tiled(3, 3, 2, 0);
        im2col.layout = TensorMapLayout::Im2col {
            lower_corner: vec![0],
            upper_corner: vec![0],
            channels_per_pixel: 8,
            pixels_per_column: 8,
        };
        assert!(lengths_agree(&im2col));
        im2col.rank = 2;
        assert!(!lengths_agree(&im2col));
        assert_eq!(encode(&tiled(2, 2, 0, 2)), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
