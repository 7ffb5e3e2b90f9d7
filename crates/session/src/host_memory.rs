//! Reading the application's memory for a request without trusting the length it passed.
//! A length far beyond the memory behind a pointer (a fill pattern of a GiB, a kernel
//! argument larger than any type) is one the driver refuses natively before it reads a byte;
//! a client that copied it first would crash the application instead. So a range larger
//! than a page is copied with a copy that reports a fault instead of taking it
//! (`process_vm_readv` of this very process), and the caller answers an unreadable range
//! with the API's error. A smaller range is read directly: it reaches at most a page past
//! the memory behind the pointer.

use std::borrow::Cow;

/// Ranges up to this many bytes are read directly.
pub const DIRECT_MAX: usize = 4096;

/// The `len` bytes at `p`, or `None` when part of the range cannot be read (or no memory
/// can hold a copy of it).
///
/// # Safety
/// Every byte of a range of at most [`DIRECT_MAX`] bytes at `p` must be readable.
pub unsafe fn copy_in<'a>(p: *const u8, len: usize) -> Option<Cow<'a, [u8]>> {
    if len == 0 {
        // No byte to read (and a NULL pointer makes no slice).
        return Some(Cow::Borrowed(&[]));
    }
    if len <= DIRECT_MAX {
        // SAFETY: per the contract.
        return Some(Cow::Borrowed(unsafe { std::slice::from_raw_parts(p, len) }));
    }
    let mut copy: Vec<u8> = Vec::new();
    copy.try_reserve_exact(len).ok()?;
    let local = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: p as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is `len` bytes of spare capacity we own; the kernel reads `remote` on
    // our behalf and stops short (or fails with EFAULT) where it cannot, instead of
    // faulting. Our own process is always ours to read.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == len as isize {
        // SAFETY: the kernel wrote all `len` bytes.
        unsafe { copy.set_len(len) };
        return Some(Cow::Owned(copy));
    }
    // A partial copy stopped at memory it could not read.
    if n >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT) {
        return None;
    }
    // The call is unavailable here (a seccomp filter, an old kernel): read directly, as
    // before this check existed.
    // SAFETY: the caller's promise for ranges it believes readable; only a wrong length
    // breaks it, which this path cannot tell.
    Some(Cow::Borrowed(unsafe { std::slice::from_raw_parts(p, len) }))
}

/// Whether the program has every page of the `len` bytes at `p`, found by reading one byte
/// of each (a check of a range of any size that copies nothing of it). True where the kernel
/// cannot tell (no `process_vm_readv` here).
pub fn readable(p: *const u8, len: usize) -> bool {
    const PAGE: usize = 4096;
    const BATCH: usize = 1024;
    let start = p as usize;
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    let mut probes = (start & !(PAGE - 1)..end)
        .step_by(PAGE)
        .map(|a| a.max(start));
    let mut sink = [0u8; BATCH];
    loop {
        let remote: Vec<libc::iovec> = probes
            .by_ref()
            .take(BATCH)
            .map(|a| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: 1,
            })
            .collect();
        if remote.is_empty() {
            return true;
        }
        let local = libc::iovec {
            iov_base: sink.as_mut_ptr().cast(),
            iov_len: remote.len(),
        };
        // SAFETY: `local` is `remote.len()` bytes we own; the kernel reads one byte at each
        // remote address on our behalf, stopping where it cannot instead of faulting.
        let n = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as _,
                0,
            )
        };
        if n != remote.len() as isize {
            return n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EFAULT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_probed_page_by_page() {
        let v = vec![1u8; 5 * 4096 + 7];
        assert!(readable(v.as_ptr(), v.len()));
        assert!(readable(v[10..].as_ptr(), 3 * 4096));
        assert!(!readable(8 as *const u8, 4096), "the zero page");
        assert!(
            !readable(v.as_ptr(), usize::MAX),
            "beyond the address space"
        );
    }

    #[test]
    fn copies_what_is_there_and_refuses_what_is_not() {
        let data: Vec<u8> = (0..3 * DIRECT_MAX).map(|i| i as u8).collect();
        // SAFETY: in bounds.
        let small = unsafe { copy_in(data.as_ptr(), 10) };
        assert_eq!(small.unwrap()[..], data[..10]);
        // SAFETY: in bounds.
        let large = unsafe { copy_in(data.as_ptr(), data.len()) };
        assert_eq!(large.unwrap()[..], data[..]);
        // A mapping followed by an inaccessible page: a range into it is refused.
        // SAFETY: a fresh anonymous mapping of two pages, the second made inaccessible.
        unsafe {
            let page = 4096;
            let m = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect(m.cast::<u8>().add(page).cast(), page, libc::PROT_NONE),
                0
            );
            let p = m as *const u8;
            assert!(copy_in(p, page).is_some());
            assert!(copy_in(p, page + 1).is_none());
            assert!(copy_in(p, 1 << 40).is_none());
            libc::munmap(m, 2 * page);
        }
    }
}
