//! Buffer storage shared with the tenant: a sparse memfd that both sides of a local session
//! map. The server places the storage of some device buffers in it (buffers of devices that
//! compute on host memory directly, such as a CPU device), so that the client can copy between
//! the application and such a buffer itself: one copy, as a native call makes, instead of one
//! into the ring and another out of it.
//!
//! Only pages in use cost memory: the file is sparse, and freed ranges are punched out.

use crate::TransportError;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Virtual size of a session's arena: address space only, never committed as a whole.
pub const ARENA_SIZE: u64 = 64 << 30;

/// Where both sides ask for their view of the arena: 32 TiB, far below where the kernel places
/// mappings of its own accord (just under the top of the address space, in the server as
/// here). Shared virtual memory is mirrored in the client at the addresses the server's
/// driver hands out, which come from the server's mapping area; an arena of 64 GiB placed by
/// the kernel in the client's mapping area would cover such addresses in about one session
/// in ten. The server asks for the same place so that arena memory has one address on both
/// sides (CUDA's page-locked memory lives here: under unified addressing its host address is
/// also the one the device reaches it by). The kernel takes the hint when the range is free,
/// else it picks a place.
const SHARED_HINT: usize = 0x2000_0000_0000;

pub struct Arena {
    file: File,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, owned by this value until drop; what is written
// where is governed by the users of `range`.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// A fresh, empty arena (server side).
    pub fn create(size: u64) -> Result<Arena, TransportError> {
        Self::map(crate::region::memfd(c"wormhole-buffers", size)?)
    }

    /// The peer's arena, received over the session socket (client side).
    pub fn open_fd(fd: OwnedFd) -> Result<Arena, TransportError> {
        Self::map(File::from(fd))
    }

    fn map(file: File) -> Result<Arena, TransportError> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| TransportError::Corrupt("arena larger than the address space"))?;
        // SAFETY: a shared mapping of our own file descriptor; without MAP_FIXED the hint
        // never replaces an existing mapping.
        let ptr = unsafe {
            libc::mmap(
                SHARED_HINT as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(Arena {
            file,
            ptr: ptr as *mut u8,
            len,
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `[off, off + len)` lies in this process, if inside the arena (the offset may come
    /// from the peer, so it is checked, never trusted). The peer may write those bytes at any
    /// time: copy them with [`crate::copy::copy_bulk`], never read them through a reference.
    pub fn range(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: off + len lies inside the mapping.
        Some(unsafe { self.ptr.add(off as usize) })
    }

    /// Where the arena begins in this process.
    pub fn base(&self) -> usize {
        self.ptr as usize
    }

    /// Gives the pages of a freed range back to the system (they read as zeros afterwards).
    pub fn discard(&self, off: u64, len: u64) {
        if self.range(off, len).is_none() {
            return;
        }
        // SAFETY: plain system call on our own file descriptor; a failure only means the pages
        // stay allocated until the session ends.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            );
        }
    }
}

/// Which pages of an arena are free: the server hands them out (to the storage of OpenCL
/// buffers, to CUDA's page-locked host memory) in whole pages, first fit; a freed range merges
/// with its free neighbours.
pub struct ArenaSpace {
    /// Offset -> length, page-aligned, never adjacent.
    free: Mutex<BTreeMap<u64, u64>>,
}

impl ArenaSpace {
    pub const PAGE: u64 = 4096;

    /// All of an arena of `len` bytes free.
    pub fn new(len: u64) -> ArenaSpace {
        let mut free = BTreeMap::new();
        let len = len / Self::PAGE * Self::PAGE;
        if len > 0 {
            free.insert(0, len);
        }
        ArenaSpace {
            free: Mutex::new(free),
        }
    }

    /// What `size` bytes take: whole pages, at least one (a size no arena holds stays one no
    /// arena holds: the largest whole number of pages).
    pub fn pages_for(size: u64) -> u64 {
        size.max(1)
            .div_ceil(Self::PAGE)
            .checked_mul(Self::PAGE)
            .unwrap_or(u64::MAX / Self::PAGE * Self::PAGE)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u64>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The offset of `size` bytes (rounded up to pages) no one else holds, if there is room.
    pub fn alloc(&self, size: u64) -> Option<u64> {
        let len = Self::pages_for(size);
        let mut free = self.lock();
        let (&off, &have) = free.iter().find(|(_, &l)| l >= len)?;
        free.remove(&off);
        if have > len {
            free.insert(off + len, have - len);
        }
        Some(off)
    }

    /// Gives back what `alloc(size)` returned as `off`.
    pub fn release(&self, off: u64, size: u64) {
        let own = Self::pages_for(size);
        let mut free = self.lock();
        let (mut start, mut len) = (off, own);
        if let Some((&prev, &plen)) = free.range(..off).next_back() {
            if prev + plen == off {
                free.remove(&prev);
                (start, len) = (prev, plen + len);
            }
        }
        if let Some(next) = free.remove(&(off + own)) {
            len += next;
        }
        free.insert(start, len);
    }

    /// The free ranges, for tests and reports.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.lock().iter().map(|(o, l)| (*o, *l)).collect()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing refers to it after the arena is gone.
        unsafe { libc::munmap(self.ptr as *mut c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::copy_bulk;

    #[test]
    fn both_sides_see_the_same_bytes_and_ranges_are_checked() {
        let a = Arena::create(1 << 30).unwrap();
        let b = Arena::open_fd(a.file().try_clone().unwrap().into()).unwrap();
        assert_eq!(b.len(), 1 << 30);
        let p = a.range(4096, 8).unwrap();
        // SAFETY: 8 bytes inside the arena.
        unsafe { copy_bulk(p, b"wormhole".as_ptr(), 8) };
        let q = b.range(4096, 8).unwrap();
        let mut seen = [0u8; 8];
        // SAFETY: as above, in the peer's mapping.
        unsafe { copy_bulk(seen.as_mut_ptr(), q, 8) };
        assert_eq!(&seen, b"wormhole");
        a.discard(0, 8192);
        // SAFETY: as above.
        unsafe { copy_bulk(seen.as_mut_ptr(), q, 8) };
        assert_eq!(seen, [0u8; 8]);
        assert!(b.range((1 << 30) - 4, 8).is_none());
        // The first view sits where the hint asks (the range is free in a test process); the
        // second, in the same process, cannot.
        assert_eq!(a.base(), SHARED_HINT);
        assert_ne!(b.base(), SHARED_HINT);
        assert!(b.range(u64::MAX, 2).is_none());
    }

    #[test]
    fn space_is_handed_out_in_pages_reused_and_merged_back() {
        const PAGE: u64 = ArenaSpace::PAGE;
        let s = ArenaSpace::new(16 * PAGE + 5);
        let a = s.alloc(1).unwrap();
        let b = s.alloc(PAGE + 1).unwrap();
        let c = s.alloc(4 * PAGE).unwrap();
        assert_eq!((a, b, c), (0, PAGE, 3 * PAGE));
        assert!(s.alloc(10 * PAGE).is_none());
        s.release(b, PAGE + 1);
        s.release(a, 1);
        assert_eq!(s.free_ranges()[0], (0, 3 * PAGE));
        s.release(c, 4 * PAGE);
        assert_eq!(s.free_ranges(), vec![(0, 16 * PAGE)]);
        assert_eq!(s.alloc(16 * PAGE), Some(0));
        assert!(ArenaSpace::new(PAGE - 1).alloc(1).is_none());
        assert!(
            s.alloc(u64::MAX).is_none(),
            "a size that rounds past the end"
        );
    }
}
