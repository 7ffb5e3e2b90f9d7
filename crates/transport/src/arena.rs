//! Buffer storage shared with the tenant: a sparse memfd that both sides of a local session
//! map. The server places the storage of some device buffers in it (buffers of devices that
//! compute on host memory directly, such as a CPU device), so that the client can copy between
//! the application and such a buffer itself: one copy, as a native call makes, instead of one
//! into the ring and another out of it.
//!
//! Only pages in use cost memory: the file is sparse, and freed ranges are punched out.

use crate::TransportError;
use std::ffi::c_void;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

/// Virtual size of a session's arena: address space only, never committed as a whole.
pub const ARENA_SIZE: u64 = 64 << 30;

/// Where a client asks for its view of the arena: 32 TiB, far below where the kernel places
/// mappings of its own accord (just under the top of the address space, in the server as
/// here). Shared virtual memory is mirrored in the client at the addresses the server's
/// driver hands out, which come from the server's mapping area; an arena of 64 GiB placed by
/// the kernel in the client's mapping area would cover such addresses in about one session
/// in ten. The kernel takes the hint when the range is free, else it picks a place.
const CLIENT_HINT: usize = 0x2000_0000_0000;

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
        Self::map(crate::region::memfd(c"wormhole-buffers", size)?, None)
    }

    /// The peer's arena, received over the session socket (client side).
    pub fn open_fd(fd: OwnedFd) -> Result<Arena, TransportError> {
        Self::map(File::from(fd), Some(CLIENT_HINT))
    }

    fn map(file: File, hint: Option<usize>) -> Result<Arena, TransportError> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| TransportError::Corrupt("arena larger than the address space"))?;
        // SAFETY: a shared mapping of our own file descriptor; without MAP_FIXED the hint
        // never replaces an existing mapping.
        let ptr = unsafe {
            libc::mmap(
                hint.unwrap_or(0) as *mut c_void,
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
        // The client's view sits where the hint asks (the range is free in a test process).
        assert_eq!(b.range(0, 1).unwrap() as usize, CLIENT_HINT);
        assert!(b.range(u64::MAX, 2).is_none());
    }
}
