//! Virtual memory management's structs (`cuMemCreate`, `cuMemSetAccess`, ...) as cuda.h lays
//! them out. They travel as the program wrote them (`in[32]`, `in[8]`, `in[count*12]` in the
//! description); the worker reads them, checks them and rewrites the device numbers in them
//! (the tenant's on the wire, the driver's in the worker) before the driver sees them.

use crate::requests::Message;
use crate::{DecodeError, Reader, Writer};

/// `CU_MEM_LOCATION_TYPE_DEVICE`: `id` is a device number.
pub const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`: plain device memory.
pub const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the allocation may be exported as a file
/// descriptor (PyTorch's expandable segments ask for it, to share tensors between processes).
pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CuMemLocation {
    pub kind: u32,
    pub id: i32,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CuMemAccessDesc {
    pub location: CuMemLocation,
    pub flags: u32,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CuMemAllocationProp {
    pub kind: u32,
    pub requested_handle_types: u32,
    pub location: CuMemLocation,
    /// A Windows pointer: zero on Linux (the driver requires it).
    pub win32_handle_meta_data: u64,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `cuMemRetainAllocationHandle`: an address in a mapping (the program passes it as a
/// `void *`). Answered by `Reply<GenericHandle>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainAllocationHandle {
    pub addr: u64,
}

impl<'a> Message<'a> for RetainAllocationHandle {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.addr);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(RetainAllocationHandle { addr: r.u64()? })
    }
}

/// A physical allocation's handle (`CUmemGenericAllocationHandle`: the driver's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenericHandle(pub u64);

impl<'a> Message<'a> for GenericHandle {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.0);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(GenericHandle(r.u64()?))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl CuMemLocation {
    pub const SIZE: usize = 8;

    /// The struct in `b` (exactly its size), as the program wrote it.
    pub fn from_bytes(b: &[u8]) -> Option<CuMemLocation> {
        (b.len() == Self::SIZE).then(|| CuMemLocation {
            kind: u32_at(b, 0),
            id: u32_at(b, 4) as i32,
        })
    }

    pub fn to_bytes(self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        b[..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..].copy_from_slice(&self.id.to_le_bytes());
        b
    }
}

impl CuMemAccessDesc {
    pub const SIZE: usize = 12;

    /// The array of descriptors in `b` (a whole number of them).
    pub fn array_from_bytes(b: &[u8]) -> Option<Vec<CuMemAccessDesc>> {
        if !b.len().is_multiple_of(Self::SIZE) {
            return None;
        }
        b.chunks_exact(Self::SIZE)
            .map(|d| {
                Some(CuMemAccessDesc {
                    location: CuMemLocation::from_bytes(&d[..CuMemLocation::SIZE])?,
                    flags: u32_at(d, CuMemLocation::SIZE),
                })
            })
            .collect()
    }
}

impl CuMemAllocationProp {
    pub const SIZE: usize = 32;

    pub fn from_bytes(b: &[u8]) -> Option<CuMemAllocationProp> {
        (b.len() == Self::SIZE).then(|| CuMemAllocationProp {
            kind: u32_at(b, 0),
            requested_handle_types: u32_at(b, 4),
            location: CuMemLocation {
                kind: u32_at(b, 8),
                id: u32_at(b, 12) as i32,
            },
            win32_handle_meta_data: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            compression_type: b[24],
            gpu_direct_rdma_capable: b[25],
            usage: u16::from_le_bytes([b[26], b[27]]),
            reserved: b[28..32].try_into().expect("4 bytes"),
        })
    }

    pub fn to_bytes(self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.requested_handle_types.to_le_bytes());
        b[8..16].copy_from_slice(&self.location.to_bytes());
        b[16..24].copy_from_slice(&self.win32_handle_meta_data.to_le_bytes());
        b[24] = self.compression_type;
        b[25] = self.gpu_direct_rdma_capable;
        b[26..28].copy_from_slice(&self.usage.to_le_bytes());
        b[28..32].copy_from_slice(&self.reserved);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structs_read_back_what_they_wrote_at_cudas_sizes() {
        assert_eq!(std::mem::size_of::<CuMemLocation>(), CuMemLocation::SIZE);
        assert_eq!(
            std::mem::size_of::<CuMemAccessDesc>(),
            CuMemAccessDesc::SIZE
        );
        assert_eq!(
            std::mem::size_of::<CuMemAllocationProp>(),
            CuMemAllocationProp::SIZE
        );
        let prop = CuMemAllocationProp {
            kind: ALLOCATION_TYPE_PINNED,
            requested_handle_types: HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: CuMemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: -2,
            },
            win32_handle_meta_data: 0x1122_3344_5566_7788,
            compression_type: 1,
            gpu_direct_rdma_capable: 1,
            usage: 0x0102,
            reserved: [9, 8, 7, 6],
        };
        assert_eq!(
            CuMemAllocationProp::from_bytes(&prop.to_bytes()),
            Some(prop)
        );
        assert_eq!(CuMemAllocationProp::from_bytes(&[0; 31]), None);
        let mut two = Vec::new();
        for (id, flags) in [(0, 3), (1, 1)] {
            two.extend_from_slice(
                &CuMemLocation {
                    kind: LOCATION_TYPE_DEVICE,
                    id,
                }
                .to_bytes(),
            );
            two.extend_from_slice(&(flags as u32).to_le_bytes());
        }
        let descs = CuMemAccessDesc::array_from_bytes(&two).unwrap();
        assert_eq!(descs.len(), 2);
        assert_eq!((descs[1].location.id, descs[1].flags), (1, 1));
        assert_eq!(CuMemAccessDesc::array_from_bytes(&two[..13]), None);
    }
}
