//! Copying between private memory and memory a peer maps too (a ring's data area, the buffer
//! arena, an ivshmem region).
//!
//! The peer may write shared memory at any moment, so Rust code never holds a reference
//! (`&[u8]`, `&mut [u8]`) to it: the compiler may assume the bytes behind a reference stable,
//! read them twice and get two answers, or turn one check into two fetches. Every access to
//! shared memory goes through this module instead, and each is either a volatile access or an
//! instruction of an `asm!` block, which the compiler can neither see into, repeat, merge nor
//! drop: each byte is fetched (or stored) exactly once, by the instruction written here. (This
//! is rust-vmm's `VolatileSlice` discipline, with 16-byte instead of word-sized pieces.)
//!
//! Speed: when the destination lies a few bytes *after* the source within a 4 KiB page ("4K
//! aliasing": loads stall behind stores to the same page offset; the usual case between
//! page-aligned shared memory and an application's `malloc`ed buffer, 16 bytes past a page),
//! the C library's `memcpy` (and `rep movsb`) ran at 2–3 GB/s here on 4–32 KiB copies in the
//! caches, where the loop below, 16-byte loads and stores to an aligned destination, ran at
//! 38–43 GB/s; beyond the caches it keeps up with `memcpy` or beats it. Copies too large for the
//! caches stream the destination with non-temporal stores, which never wait on the loads.

use std::marker::PhantomData;

/// Copies at least this large bypass the caches.
pub const STREAM_MIN: usize = 32 << 20;

/// Copies `n` bytes from `src` to `dst`, either of which (or both) may be shared memory that
/// the peer writes concurrently: each byte is read once, by a volatile or `asm!` access, and
/// the copy never assumes `src` stable (a concurrent write leaves `dst` holding old bytes, new
/// bytes, or a mix, never anything else).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `n` bytes, the
/// two ranges disjoint.
pub unsafe fn copy_bulk(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        if n >= STREAM_MIN {
            x86::copy_large::<true>(dst, src, n)
        } else {
            x86::copy_large::<false>(dst, src, n)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        portable::copy(dst, src, n)
    }
}

/// `len` bytes of shared memory the peer may write at any time, lent for a while: they can
/// only be copied out (never read through a reference).
#[derive(Debug)]
pub struct SharedBytes<'a> {
    ptr: *const u8,
    len: usize,
    _lent: PhantomData<&'a ()>,
}

impl<'a> SharedBytes<'a> {
    /// # Safety
    /// `ptr` must be readable for `len` bytes for as long as the value lives.
    pub(crate) unsafe fn new(ptr: *const u8, len: usize) -> Self {
        SharedBytes {
            ptr,
            len,
            _lent: PhantomData,
        }
    }

    /// Private bytes lent the same way (a request's data a stream delivered in chunks), so
    /// that one consumer serves both.
    pub fn private(bytes: &'a [u8]) -> SharedBytes<'a> {
        SharedBytes {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
            _lent: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the bytes to `dst` (see [`copy_bulk`]).
    ///
    /// # Safety
    /// `dst` must be writable for [`SharedBytes::len`] bytes, outside the shared bytes.
    pub unsafe fn copy_to(&self, dst: *mut u8) {
        // SAFETY: `ptr` holds `len` readable bytes (`new`); the caller vouches for `dst`.
        unsafe { copy_bulk(dst, self.ptr, self.len) }
    }

    /// Copies the bytes into `dst`, which must be exactly as long.
    pub fn copy_to_slice(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len, "destination and source lengths differ");
        // SAFETY: `dst` is private memory of the right length.
        unsafe { self.copy_to(dst.as_mut_ptr()) }
    }
}

/// Sets `n` bytes of shared memory at `dst` to zero, with volatile stores.
///
/// # Safety
/// `dst` must be writable for `n` bytes.
pub unsafe fn zero_shared(dst: *mut u8, n: usize) {
    let head = ((8 - (dst as usize & 7)) & 7).min(n);
    let words = (n - head) / 8;
    // SAFETY: every store lies in [dst, dst + n), which the caller lends us; the word stores
    // are 8-byte aligned.
    unsafe {
        for i in 0..head {
            dst.add(i).write_volatile(0);
        }
        let w = dst.add(head) as *mut u64;
        for i in 0..words {
            w.add(i).write_volatile(0);
        }
        for i in head + words * 8..n {
            dst.add(i).write_volatile(0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! SSE2 (part of every x86_64). Each `asm!` block moves one piece; the compiler treats its
    //! memory accesses as opaque side effects (no `pure`), so it neither repeats nor elides them.
    use std::arch::asm;

    /// Moves 16 bytes, both sides unaligned.
    #[inline(always)]
    unsafe fn mov16(d: *mut u8, s: *const u8) {
        // SAFETY: the caller vouches for 16 bytes at each pointer.
        unsafe {
            asm!(
                "movdqu {x}, xmmword ptr [{s}]",
                "movdqu xmmword ptr [{d}], {x}",
                s = in(reg) s,
                d = in(reg) d,
                x = out(xmm_reg) _,
                options(nostack, preserves_flags),
            )
        }
    }

    /// Moves 8 bytes, both sides unaligned.
    #[inline(always)]
    unsafe fn mov8(d: *mut u8, s: *const u8) {
        // SAFETY: the caller vouches for 8 bytes at each pointer.
        unsafe {
            asm!(
                "mov {x}, qword ptr [{s}]",
                "mov qword ptr [{d}], {x}",
                s = in(reg) s,
                d = in(reg) d,
                x = out(reg) _,
                options(nostack, preserves_flags),
            )
        }
    }

    /// Moves 4 bytes, both sides unaligned.
    #[inline(always)]
    unsafe fn mov4(d: *mut u8, s: *const u8) {
        // SAFETY: the caller vouches for 4 bytes at each pointer.
        unsafe {
            asm!(
                "mov {x:e}, dword ptr [{s}]",
                "mov dword ptr [{d}], {x:e}",
                s = in(reg) s,
                d = in(reg) d,
                x = out(reg) _,
                options(nostack, preserves_flags),
            )
        }
    }

    /// Moves 64 bytes: unaligned loads, then stores to `d`, which must be 16-byte aligned;
    /// non-temporal stores when `STREAM`.
    #[inline(always)]
    unsafe fn mov64<const STREAM: bool>(d: *mut u8, s: *const u8) {
        // SAFETY: the caller vouches for 64 bytes at each pointer and for the alignment of `d`.
        unsafe {
            if STREAM {
                asm!(
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + 16]",
                    "movdqu {c}, xmmword ptr [{s} + 32]",
                    "movdqu {e}, xmmword ptr [{s} + 48]",
                    "movntdq xmmword ptr [{d}], {a}",
                    "movntdq xmmword ptr [{d} + 16], {b}",
                    "movntdq xmmword ptr [{d} + 32], {c}",
                    "movntdq xmmword ptr [{d} + 48], {e}",
                    s = in(reg) s,
                    d = in(reg) d,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    e = out(xmm_reg) _,
                    options(nostack, preserves_flags),
                )
            } else {
                asm!(
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + 16]",
                    "movdqu {c}, xmmword ptr [{s} + 32]",
                    "movdqu {e}, xmmword ptr [{s} + 48]",
                    "movdqa xmmword ptr [{d}], {a}",
                    "movdqa xmmword ptr [{d} + 16], {b}",
                    "movdqa xmmword ptr [{d} + 32], {c}",
                    "movdqa xmmword ptr [{d} + 48], {e}",
                    s = in(reg) s,
                    d = in(reg) d,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    e = out(xmm_reg) _,
                    options(nostack, preserves_flags),
                )
            }
        }
    }

    /// Copies `n < 64` bytes (or any `n`, slowly) in the widest pieces that fit; the last
    /// piece may overlap the one before it, rewriting a few bytes with the same source bytes.
    #[inline(always)]
    pub(super) unsafe fn copy_small(d: *mut u8, s: *const u8, n: usize) {
        // SAFETY: every piece lies inside [0, n) of both ranges, which the caller vouches for.
        unsafe {
            if n >= 16 {
                let mut i = 0;
                while i + 16 <= n {
                    mov16(d.add(i), s.add(i));
                    i += 16;
                }
                if i < n {
                    mov16(d.add(n - 16), s.add(n - 16));
                }
            } else if n >= 8 {
                mov8(d, s);
                mov8(d.add(n - 8), s.add(n - 8));
            } else if n >= 4 {
                mov4(d, s);
                mov4(d.add(n - 4), s.add(n - 4));
            } else {
                for i in 0..n {
                    d.add(i).write_volatile(s.add(i).read_volatile());
                }
            }
        }
    }

    /// Copies `n` bytes: the first 16 unaligned, then 64-byte rounds to a 16-byte aligned
    /// destination, then the rest. Streamed rounds end with a fence, so the stores are
    /// visible before the caller reports the copy done (or publishes it to the peer).
    #[inline(never)]
    pub(super) unsafe fn copy_large<const STREAM: bool>(d: *mut u8, s: *const u8, n: usize) {
        if n < 64 {
            // SAFETY: forwarded from the caller.
            unsafe { copy_small(d, s, n) };
            return;
        }
        // Up to 15 bytes to align the destination; the first 16 cover them.
        let head = (16 - (d as usize & 15)) & 15;
        let body = (n - head) / 64 * 64;
        // SAFETY: n >= 64, so the first 16 bytes, the rounds in [head, head + body) and the
        // rest in [head + body, n) all lie inside both ranges; `d + head` is 16-byte aligned.
        unsafe {
            if head != 0 {
                mov16(d, s);
            }
            let (dd, ss) = (d.add(head), s.add(head));
            let mut i = 0;
            while i < body {
                mov64::<STREAM>(dd.add(i), ss.add(i));
                i += 64;
            }
            if STREAM {
                asm!("sfence", options(nostack, preserves_flags));
            }
            copy_small(dd.add(body), ss.add(body), n - head - body);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod portable {
    /// Volatile words where both sides share an alignment, volatile bytes elsewhere.
    pub(super) unsafe fn copy(d: *mut u8, s: *const u8, n: usize) {
        let head = if (d as usize ^ s as usize) % 8 == 0 {
            ((8 - (d as usize & 7)) & 7).min(n)
        } else {
            n
        };
        let words = (n - head) / 8;
        // SAFETY: every access lies inside [0, n) of both ranges; word accesses are aligned.
        unsafe {
            for i in 0..head {
                d.add(i).write_volatile(s.add(i).read_volatile());
            }
            let (dw, sw) = (d.add(head) as *mut u64, s.add(head) as *const u64);
            for i in 0..words {
                dw.add(i).write_volatile(sw.add(i).read_volatile());
            }
            for i in head + words * 8..n {
                d.add(i).write_volatile(s.add(i).read_volatile());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies of every small size and a few large ones, at every relative alignment that
    /// matters, land exactly in place: nothing before or after the destination is touched.
    fn check(n: usize, offsets: &[(usize, usize)]) {
        let src: Vec<u8> = (0..n + 64).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut dst = vec![0u8; n + 64];
        for &(so, d_off) in offsets {
            dst.fill(0);
            // SAFETY: both ranges lie inside their vectors and are disjoint.
            unsafe { copy_bulk(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), n) };
            assert_eq!(
                &dst[d_off..d_off + n],
                &src[so..so + n],
                "n {n} at {so}/{d_off}"
            );
            assert!(dst[..d_off].iter().all(|&b| b == 0));
            assert!(dst[d_off + n..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn copies_every_byte_at_any_alignment() {
        let offsets: Vec<(usize, usize)> = (0..17)
            .flat_map(|a| [(a, 0), (0, a), (a, 16 - a.min(16))])
            .collect();
        for n in 0..300 {
            check(n, &offsets);
        }
        check(32768 + 5, &offsets);
        // The streaming path.
        check(STREAM_MIN + 4099, &[(0, 0), (3, 16), (16, 5), (63, 1)]);
    }

    #[test]
    fn zeroes_exactly_the_range() {
        for (off, n) in [(0, 0), (1, 3), (3, 8), (5, 61), (8, 4096), (7, 4097)] {
            let mut b = vec![0xABu8; off + n + 9];
            // SAFETY: the range lies inside `b`.
            unsafe { zero_shared(b.as_mut_ptr().add(off), n) };
            assert!(b[..off].iter().all(|&x| x == 0xAB));
            assert!(b[off..off + n].iter().all(|&x| x == 0));
            assert!(b[off + n..].iter().all(|&x| x == 0xAB));
        }
    }
}
