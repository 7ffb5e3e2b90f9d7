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

use crate::copy::zero_shared;
use crate::rendezvous::{Rendezvous, RENDEZVOUS_OFFSET, STATE_INIT, STATE_READY};
use crate::ring::{Ring, RingCtrl, CTRL_SIZE};
use crate::TransportError;
use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

impl Layout {
    /// The largest layout of `lanes` lanes that fits in `size` bytes (ring capacity a power of
    /// two, at least 4 KiB), e.g. for an ivshmem region whose size the VM configuration fixes.
    pub fn fitting(size: u64, lanes: u32) -> Option<Layout> {
        let per_lane = size.checked_sub(PAGE)? / u64::from(lanes.max(1));
        let ring = per_lane.checked_sub(PAGE)? / 2;
        if ring < 4096 {
            return None;
        }
        let ring_capacity = 1u64 << (63 - ring.leading_zeros());
        Some(Layout {
            lanes,
            ring_capacity: ring_capacity.min(1 << 30),
        })
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

/// A mapped region. Rings handed out by it hold it (see [`Region::lane`]).
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    layout: Layout,
    file: File,
}

/// An anonymous, sparse, close-on-exec memory file of `size` bytes, to share by its descriptor.
pub(crate) fn memfd(name: &std::ffi::CStr, size: u64) -> Result<File, TransportError> {
    let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
    let file = File::from(fd);
    file.set_len(size)?;
    Ok(file)
}

impl Region {
    /// Creates a fresh region in an anonymous memfd (server side of a local session).
    pub fn create_memfd(layout: Layout) -> Result<Region, TransportError> {
        Self::init(memfd(c"wormhole-session", layout.total_size())?, layout)
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
        // SAFETY: the mapping is at least total_size bytes long and page-aligned. Volatile:
        // another process (QEMU, a guest) may map the file of `create_file` already.
        unsafe {
            zero_shared(region.map.as_mut_ptr(), layout.total_size() as usize);
            std::ptr::write_volatile(
                region.map.as_mut_ptr() as *mut RegionHeader,
                layout.header(),
            );
        }
        Ok(region)
    }

    /// (Re)initialises a region in an existing file of fixed size (the backing file of an
    /// ivshmem device, which QEMU keeps mapped): the rendezvous is marked INIT while
    /// everything is zeroed, then the epoch moves on and the region is READY for a client.
    pub fn reset_file(path: &std::path::Path, layout: Layout) -> Result<Region, TransportError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let size = file.metadata()?.len();
        if layout.total_size() > size {
            return Err(TransportError::Layout(format!(
                "{} is {size} bytes, the layout needs {}",
                path.display(),
                layout.total_size()
            )));
        }
        let map = MmapRaw::map_raw(&file)?;
        let region = Region { map, layout, file };
        let rv = region.rendezvous();
        rv.server_state.store(STATE_INIT, Ordering::SeqCst);
        let epoch = rv.server_epoch.load(Ordering::SeqCst);
        // SAFETY: the mapping is at least total_size bytes long (checked above) and
        // page-aligned. A guest may map it concurrently (hence volatile stores), but sees
        // STATE_INIT and waits until READY.
        unsafe {
            zero_shared(region.map.as_mut_ptr(), layout.total_size() as usize);
            std::ptr::write_volatile(
                region.map.as_mut_ptr() as *mut RegionHeader,
                layout.header(),
            );
        }
        rv.server_epoch
            .store(epoch.wrapping_add(1).max(1), Ordering::SeqCst);
        rv.server_state.store(STATE_READY, Ordering::SeqCst);
        Ok(region)
    }

    /// A guest client's side of the rendezvous: maps the region at `path` (an ivshmem BAR, or
    /// the backing file on the host), waits until a worker has it READY, and claims it with
    /// `nonce`. Returns the region and the worker's epoch. Fails when no worker's heartbeat
    /// moves for `silence`, or nothing is READY for `patience` (another process holds it).
    pub fn claim_guest(
        path: &std::path::Path,
        nonce: u32,
        silence: std::time::Duration,
        patience: std::time::Duration,
    ) -> Result<(Region, u32), TransportError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let map = MmapRaw::map_raw(&file)?;
        if (map.len() as u64) < PAGE {
            return Err(TransportError::Layout(format!(
                "{} is smaller than a page",
                path.display()
            )));
        }
        // SAFETY: the mapping holds the header page; the rendezvous fields are atomics.
        let rv = unsafe { &*(map.as_ptr().add(RENDEZVOUS_OFFSET) as *const Rendezvous) };
        let server =
            crate::rendezvous::BeatWatch::new(rv.server_beat.load(Ordering::Acquire), silence);
        let start = std::time::Instant::now();
        loop {
            if rv.server_state.load(Ordering::Acquire) == STATE_READY {
                let epoch = rv.server_epoch.load(Ordering::Acquire);
                if rv
                    .client_claim
                    .compare_exchange(0, nonce.max(1), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let region = Self::open_file(file.try_clone()?)?;
                    if rv.server_epoch.load(Ordering::Acquire) != epoch {
                        return Err(TransportError::PeerGone);
                    }
                    return Ok((region, epoch));
                }
            }
            if !server.alive(&rv.server_beat) {
                return Err(TransportError::Layout(format!(
                    "no Wormhole worker serves {} (its heartbeat is still)",
                    path.display()
                )));
            }
            if start.elapsed() > patience {
                return Err(TransportError::Layout(format!(
                    "{} stays busy: another process of this guest holds the session",
                    path.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The rendezvous words in the header page (used where no socket accompanies the region).
    pub fn rendezvous(&self) -> &Rendezvous {
        // SAFETY: every region is at least a header page long (checked when mapped), the block
        // is 8-byte aligned, and all its fields are atomics.
        unsafe { &*(self.map.as_ptr().add(RENDEZVOUS_OFFSET) as *const Rendezvous) }
    }

    /// Maps a region created by the peer and validates its header against the mapping.
    pub fn open_fd(fd: OwnedFd) -> Result<Region, TransportError> {
        Self::open_file(File::from(fd))
    }

    pub fn open_file(file: File) -> Result<Region, TransportError> {
        let map = MmapRaw::map_raw(&file)?;
        let size = map.len() as u64;
        if size < PAGE {
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

    /// The (request, reply) rings of lane `i`. Each ring holds the region, so the mapping
    /// lives as long as any ring of it:
    ///
    /// ```
    /// # use wormhole_transport::{Layout, Region};
    /// # use std::sync::Arc;
    /// let layout = Layout { lanes: 1, ring_capacity: 4096 };
    /// let (req, _rep) = Arc::new(Region::create_memfd(layout).unwrap()).lane(0).unwrap();
    /// assert_eq!(req.readable().unwrap(), 0);
    /// ```
    /// A region that nothing holds in an `Arc` hands out no rings, so none can outlive it:
    ///
    /// ```compile_fail,E0599
    /// # use wormhole_transport::{Layout, Region};
    /// let layout = Layout { lanes: 1, ring_capacity: 4096 };
    /// let (req, _rep) = Region::create_memfd(layout).unwrap().lane(0).unwrap();
    /// req.readable().unwrap();
    /// ```
    /// How much lane `i`'s client has sent so far (its request ring's head, bytes) and the
    /// CPU it last sent from ([`RingCtrl::producer_cpu`], None if not known): what the
    /// server reads to keep a local client's brief threads beside it. Values the client
    /// wrote: hints, nothing more.
    pub fn request_activity(&self, i: u32) -> Option<(u64, Option<u32>)> {
        if i >= self.layout.lanes {
            return None;
        }
        let base = PAGE + u64::from(i) * self.layout.lane_stride();
        // SAFETY: as in `lane`: the lane lies inside the mapping, which `self` holds.
        let ctrl = unsafe { &*(self.map.as_mut_ptr().add(base as usize) as *const RingCtrl) };
        let head = ctrl.head.0.load(std::sync::atomic::Ordering::Relaxed);
        let cpu = ctrl
            .producer_cpu
            .0
            .load(std::sync::atomic::Ordering::Relaxed);
        Some((head, cpu.checked_sub(1)))
    }

    pub fn lane(self: &Arc<Self>, i: u32) -> Option<(Ring, Ring)> {
        if i >= self.layout.lanes {
            return None;
        }
        let base = PAGE + u64::from(i) * self.layout.lane_stride();
        let cap = self.layout.ring_capacity;
        // SAFETY: `open_file`/`init` checked that every lane lies inside the mapping, which
        // each ring keeps alive by its clone of `self`; the control blocks are 64-byte aligned
        // (page-aligned lane + 320-byte blocks).
        unsafe {
            let p = self.map.as_mut_ptr().add(base as usize);
            let req_ctrl = p as *const RingCtrl;
            let rep_ctrl = p.add(CTRL_SIZE) as *const RingCtrl;
            let req_data = p.add(PAGE as usize);
            let rep_data = req_data.add(cap as usize);
            Some((
                Ring::in_region(self.clone(), req_ctrl, req_data, cap),
                Ring::in_region(self.clone(), rep_ctrl, rep_data, cap),
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
        assert_eq!(CTRL_SIZE, 320);
    }

    #[test]
    fn peer_view_validates_and_matches() {
        let layout = Layout {
            lanes: 2,
            ring_capacity: 4096,
        };
        let a = Region::create_memfd(layout).unwrap();
        let b = Arc::new(Region::open_file(a.file().try_clone().unwrap()).unwrap());
        assert_eq!(b.layout(), layout);
        assert!(b.lane(2).is_none());
    }

    /// Rings taken from a region that is dropped at once (a temporary) keep its mapping: they
    /// used to point into unmapped memory, and the first look at a counter crashed (SIGSEGV).
    #[test]
    fn rings_outlive_the_last_handle_on_their_region() {
        use crate::ring::WaitCtx;
        use crate::wait::{FutexWaiter, SpinPolicy};
        let layout = Layout {
            lanes: 1,
            ring_capacity: 4096,
        };
        let (req, _rep) = Arc::new(Region::create_memfd(layout).unwrap())
            .lane(0)
            .unwrap();
        assert_eq!(req.readable().unwrap(), 0);
        let alive = || true;
        let w = WaitCtx {
            waiter: &FutexWaiter,
            policy: SpinPolicy::default(),
            peer_alive: &alive,
        };
        req.write_all(b"still mapped", &w).unwrap();
        let mut back = [0u8; 12];
        req.read_exact(&mut back, &w).unwrap();
        assert_eq!(&back, b"still mapped");
    }

    #[test]
    fn fitting_layouts_fit() {
        let l = Layout::fitting(16 << 20, 8).unwrap();
        assert_eq!(l.ring_capacity, 512 * 1024);
        assert!(l.total_size() <= 16 << 20);
        assert!(Layout::fitting(4096, 2).is_none());
    }

    #[test]
    fn reset_moves_the_epoch_on() {
        let dir = std::env::temp_dir().join(format!("wh-region-{}", std::process::id()));
        std::fs::write(&dir, vec![0xAB; 1 << 20]).unwrap();
        let layout = Layout::fitting(1 << 20, 2).unwrap();
        let a = Region::reset_file(&dir, layout).unwrap();
        let first = a.rendezvous().server_epoch.load(Ordering::SeqCst);
        assert_ne!(first, 0xABAB_ABAB);
        assert_eq!(
            a.rendezvous().server_state.load(Ordering::SeqCst),
            STATE_READY
        );
        let b = Region::reset_file(&dir, layout).unwrap();
        assert_eq!(
            b.rendezvous().server_epoch.load(Ordering::SeqCst),
            first.wrapping_add(1).max(1)
        );
        let c = Region::open_path(&dir).unwrap();
        assert_eq!(c.layout(), layout);
        std::fs::remove_file(&dir).unwrap();
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
