//! The shared region of a session: a header, then `lanes` lanes, each holding the control
//! blocks and data areas of a request ring and a reply ring.
//!
//! ```text
//! 0                       header (RegionHeader, padded to 4 KiB)
//! lanes_offset + i*stride lane i: [req RingCtrl][reply RingCtrl] pad to 4 KiB,
//!                                 [req data: ring_capacity][reply data: ring_capacity]
//! ```
//! The creator writes the header; the other side reads it once, validates every field against
//! the size of its own mapping, and keeps its own copy of the layout.

use crate::ring::{Ring, RingCtrl, CTRL_SIZE};
use crate::TransportError;
use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};

pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"WHREGION");
pub const REGION_VERSION: u32 = 1;
const PAGE: u64 = 4096;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHeader {
    pub magic: u64,
    pub version: u32,
    pub lanes: u32,
    pub lanes_offset: u64,
    pub lane_stride: u64,
    pub ring_capacity: u64,
    pub total_size: u64,
}

/// The geometry of a region, as agreed by both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub lanes: u32,
    pub ring_capacity: u64,
}

impl Layout {
    pub fn lane_stride(&self) -> u64 {
        PAGE + 2 * self.ring_capacity
    }
    pub fn total_size(&self) -> u64 {
        PAGE + u64::from(self.lanes) * self.lane_stride()
    }
    fn header(&self) -> RegionHeader {
        RegionHeader {
            magic: REGION_MAGIC,
            version: REGION_VERSION,
            lanes: self.lanes,
            lanes_offset: PAGE,
            lane_stride: self.lane_stride(),
            ring_capacity: self.ring_capacity,
            total_size: self.total_size(),
        }
    }
}

impl Default for Layout {
    fn default() -> Self {
        // 16 lanes (one per application thread that calls OpenCL, so one thread's blocking call
        // never stalls another's) of 2 x 256 KiB.
        Layout {
            lanes: 16,
            ring_capacity: 256 * 1024,
        }
    }
}

/// A mapped region. Rings handed out by it borrow its mapping, which lives as long as it does.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    layout: Layout,
    file: File,
}

impl Region {
    /// Creates a fresh region in an anonymous memfd (server side of a local session).
    pub fn create_memfd(layout: Layout) -> Result<Region, TransportError> {
        let fd = nix::sys::memfd::memfd_create(
            c"wormhole-session",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )?;
        let file = File::from(fd);
        file.set_len(layout.total_size())?;
        Self::init(file, layout)
    }

    /// Creates (or re-initialises) a region in a file, e.g. the backing file of an ivshmem device.
    pub fn create_file(path: &std::path::Path, layout: Layout) -> Result<Region, TransportError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < layout.total_size() {
            file.set_len(layout.total_size())?;
        }
        Self::init(file, layout)
    }

    fn init(file: File, layout: Layout) -> Result<Region, TransportError> {
        let map = MmapRaw::map_raw(&file)?;
        let region = Region { map, layout, file };
        // SAFETY: the mapping is at least total_size bytes long and we are its only user yet.
        unsafe {
            std::ptr::write_bytes(region.map.as_mut_ptr(), 0, layout.total_size() as usize);
            std::ptr::write(
                region.map.as_mut_ptr() as *mut RegionHeader,
                layout.header(),
            );
        }
        Ok(region)
    }

    /// Maps a region created by the peer and validates its header against the mapping.
    pub fn open_fd(fd: OwnedFd) -> Result<Region, TransportError> {
        Self::open_file(File::from(fd))
    }

    pub fn open_file(file: File) -> Result<Region, TransportError> {
        let map = MmapRaw::map_raw(&file)?;
        let size = map.len() as u64;
        if size < std::mem::size_of::<RegionHeader>() as u64 {
            return Err(TransportError::Layout(
                "region smaller than its header".into(),
            ));
        }
        // SAFETY: the mapping holds at least a header; read it once into a private copy.
        let h: RegionHeader =
            unsafe { std::ptr::read_volatile(map.as_ptr() as *const RegionHeader) };
        let layout = Layout {
            lanes: h.lanes,
            ring_capacity: h.ring_capacity,
        };
        if h.magic != REGION_MAGIC || h.version != REGION_VERSION {
            return Err(TransportError::Layout("bad magic or version".into()));
        }
        if h.lanes == 0
            || h.lanes > 1024
            || !h.ring_capacity.is_power_of_two()
            || h.ring_capacity < 4096
            || h.ring_capacity > (1 << 30)
        {
            return Err(TransportError::Layout(format!(
                "implausible geometry {h:?}"
            )));
        }
        if layout.header() != h || layout.total_size() > size {
            return Err(TransportError::Layout(format!(
                "header {h:?} does not fit a {size}-byte mapping"
            )));
        }
        Ok(Region { map, layout, file })
    }

    /// Maps a raw file (ivshmem BAR or backing file) that the creator already initialised.
    pub fn open_path(path: &std::path::Path) -> Result<Region, TransportError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Self::open_file(file)
    }

    /// # Safety
    /// `fd` must be an owned, open file descriptor.
    pub unsafe fn open_raw_fd(fd: i32) -> Result<Region, TransportError> {
        // SAFETY: the caller transfers ownership of `fd`.
        Self::open_fd(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The (request, reply) rings of lane `i`.
    pub fn lane(&self, i: u32) -> Option<(Ring, Ring)> {
        if i >= self.layout.lanes {
            return None;
        }
        let base = PAGE + u64::from(i) * self.layout.lane_stride();
        let cap = self.layout.ring_capacity;
        // SAFETY: `open_file`/`init` checked that every lane lies inside the mapping; the
        // control blocks are 64-byte aligned (page-aligned lane + 256-byte blocks).
        unsafe {
            let p = self.map.as_mut_ptr().add(base as usize);
            let req_ctrl = p as *const RingCtrl;
            let rep_ctrl = p.add(CTRL_SIZE) as *const RingCtrl;
            let req_data = p.add(PAGE as usize);
            let rep_data = req_data.add(cap as usize);
            Some((
                Ring::new(req_ctrl, req_data, cap),
                Ring::new(rep_ctrl, rep_data, cap),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_stable() {
        assert_eq!(std::mem::size_of::<RegionHeader>(), 48);
        assert_eq!(CTRL_SIZE, 256);
    }

    #[test]
    fn peer_view_validates_and_matches() {
        let layout = Layout {
            lanes: 2,
            ring_capacity: 4096,
        };
        let a = Region::create_memfd(layout).unwrap();
        let b = Region::open_file(a.file().try_clone().unwrap()).unwrap();
        assert_eq!(b.layout(), layout);
        assert!(b.lane(2).is_none());
    }

    #[test]
    fn garbage_region_is_rejected() {
        let f = tempfile_with(&[0xAB; 8192]);
        assert!(matches!(
            Region::open_file(f),
            Err(TransportError::Layout(_))
        ));
    }

    fn tempfile_with(bytes: &[u8]) -> File {
        let fd =
            nix::sys::memfd::memfd_create(c"t", nix::sys::memfd::MemFdCreateFlag::empty()).unwrap();
        let mut f = File::from(fd);
        std::io::Write::write_all(&mut f, bytes).unwrap();
        f
    }
}
