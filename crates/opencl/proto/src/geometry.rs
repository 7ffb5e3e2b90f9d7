//! Host-memory footprints of rectangular transfers, computed the same way on both sides so the
//! client sends (and the server accepts) exactly the bytes a transfer touches.

/// The span of host memory a rect transfer touches: `start` is the offset of its first byte
/// from the host pointer, `len` the bytes from there to its last byte, `row`/`slice` the pitches
/// in effect. `None` when the numbers are degenerate or overflow (the real call then reports
/// the native error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub row: usize,
    pub slice: usize,
}

/// `region[0]` is in bytes (buffer rects) or elements of `elem` bytes (images).
pub fn rect_span(
    origin: [usize; 3],
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
    elem: usize,
) -> Option<Span> {
    if region.contains(&0) || elem == 0 {
        return None;
    }
    let row_bytes = region[0].checked_mul(elem)?;
    let row = if row_pitch == 0 { row_bytes } else { row_pitch };
    let slice = if slice_pitch == 0 {
        row.checked_mul(region[1])?
    } else {
        slice_pitch
    };
    let start = origin[2]
        .checked_mul(slice)?
        .checked_add(origin[1].checked_mul(row)?)?
        .checked_add(origin[0].checked_mul(elem)?)?;
    let len = (region[2] - 1)
        .checked_mul(slice)?
        .checked_add((region[1] - 1).checked_mul(row)?)?
        .checked_add(row_bytes)?;
    Some(Span {
        start,
        len,
        row,
        slice,
    })
}

/// Calls `f(offset_in_span, row_bytes)` for every row of the region, in order.
pub fn for_each_row(span: &Span, region: [usize; 3], elem: usize, mut f: impl FnMut(usize, usize)) {
    let row_bytes = region[0] * elem;
    for z in 0..region[2] {
        for y in 0..region[1] {
            f(z * span.slice + y * span.row, row_bytes);
        }
    }
}

/// The host footprint of an image transfer of `region` (host memory starts at the region's
/// first element), for an image of `image_type` with `elem`-byte elements. For 1D image arrays
/// the second coordinate is the array index and steps by the slice pitch. Returns the span and
/// the region as rows/slices (for [`for_each_row`]).
pub fn image_span(
    image_type: u32,
    region: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
    elem: usize,
) -> Option<(Span, [usize; 3])> {
    let region = if image_type == crate::cl::CL_MEM_OBJECT_IMAGE1D_ARRAY {
        [region[0], 1, region[1]]
    } else {
        region
    };
    let slice_pitch = if image_type == crate::cl::CL_MEM_OBJECT_IMAGE1D_ARRAY && slice_pitch == 0 {
        row_pitch
    } else {
        slice_pitch
    };
    rect_span([0, 0, 0], region, row_pitch, slice_pitch, elem).map(|s| (s, region))
}

/// An image's size along the three coordinates of a transfer's origin and region: width, then
/// height (or a 1D array's array size), then depth (or a 2D array's array size); 1 along the
/// coordinates the image type does not have. `None` for an unknown type or a mipmapped image
/// (whose origin also names a level).
pub fn image_extent(
    image_type: u32,
    [width, height, depth, array_size]: [usize; 4],
    mip_levels: u32,
) -> Option<[usize; 3]> {
    use crate::cl::*;
    if mip_levels > 1 {
        return None;
    }
    Some(match image_type {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => [width, 1, 1],
        CL_MEM_OBJECT_IMAGE1D_ARRAY => [width, array_size, 1],
        CL_MEM_OBJECT_IMAGE2D => [width, height, 1],
        CL_MEM_OBJECT_IMAGE2D_ARRAY => [width, height, array_size],
        CL_MEM_OBJECT_IMAGE3D => [width, height, depth],
        _ => return None,
    })
}

/// Whether `region` at `origin` lies inside `extent` along every coordinate.
pub fn region_within(origin: [usize; 3], region: [usize; 3], extent: [usize; 3]) -> bool {
    (0..3).all(|i| {
        origin[i]
            .checked_add(region[i])
            .is_some_and(|end| end <= extent[i])
    })
}

/// Bytes per element of an image format, or `None` for an unknown one.
#[allow(non_upper_case_globals)]
pub fn element_size(channel_order: u32, channel_type: u32) -> Option<usize> {
    use crate::cl::*;
    let channels = match channel_order {
        CL_R | CL_A | CL_INTENSITY | CL_LUMINANCE | CL_Rx | CL_DEPTH => 1,
        CL_RG | CL_RA | CL_RGx => 2,
        CL_RGB | CL_RGBx | CL_sRGB | CL_sRGBx => 3,
        CL_RGBA | CL_BGRA | CL_ARGB | CL_ABGR | CL_sRGBA | CL_sBGRA | CL_DEPTH_STENCIL => 4,
        _ => return None,
    };
    Some(match channel_type {
        CL_UNORM_SHORT_565 | CL_UNORM_SHORT_555 => 2,
        CL_UNORM_INT_101010 | CL_UNORM_INT_101010_2 | CL_UNORM_INT24 => 4,
        CL_SNORM_INT8 | CL_UNORM_INT8 | CL_SIGNED_INT8 | CL_UNSIGNED_INT8 => channels,
        CL_SNORM_INT16 | CL_UNORM_INT16 | CL_SIGNED_INT16 | CL_UNSIGNED_INT16 | CL_HALF_FLOAT => {
            2 * channels
        }
        CL_SIGNED_INT32 | CL_UNSIGNED_INT32 | CL_FLOAT => 4 * channels,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        let s = rect_span([1, 2, 0], [4, 3, 1], 10, 0, 1).unwrap();
        assert_eq!(
            s,
            Span {
                start: 21,
                len: 24,
                row: 10,
                slice: 30
            }
        );
        assert!(rect_span([0, 0, 0], [0, 1, 1], 0, 0, 1).is_none());
        assert!(rect_span([usize::MAX, 0, 0], [1, 1, 1], 0, 0, 2).is_none());
        let mut rows = vec![];
        for_each_row(&s, [4, 3, 1], 1, |o, n| rows.push((o, n)));
        assert_eq!(rows, vec![(0, 4), (10, 4), (20, 4)]);
    }

    #[test]
    fn image_regions() {
        use crate::cl::*;
        let dims = [64, 32, 7, 8];
        let e2 = image_extent(CL_MEM_OBJECT_IMAGE2D, dims, 0).unwrap();
        assert_eq!(e2, [64, 32, 1]);
        assert_eq!(
            image_extent(CL_MEM_OBJECT_IMAGE1D_ARRAY, dims, 1),
            Some([64, 8, 1])
        );
        assert_eq!(
            image_extent(CL_MEM_OBJECT_IMAGE2D_ARRAY, dims, 0),
            Some([64, 32, 8])
        );
        assert_eq!(
            image_extent(CL_MEM_OBJECT_IMAGE3D, dims, 0),
            Some([64, 32, 7])
        );
        assert_eq!(image_extent(CL_MEM_OBJECT_IMAGE3D, dims, 3), None);
        assert!(region_within([0, 0, 0], [64, 32, 1], e2));
        assert!(region_within([63, 31, 0], [1, 1, 1], e2));
        assert!(!region_within([62, 0, 0], [4, 1, 1], e2));
        assert!(!region_within([0, 32, 0], [1, 1, 1], e2));
        assert!(!region_within([0, 0, 0], [1, 1, 2], e2));
        assert!(!region_within([usize::MAX, 0, 0], [2, 1, 1], e2));
    }
}
