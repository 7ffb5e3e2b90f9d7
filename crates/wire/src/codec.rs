//! Encoding of message bodies. Every value is little-endian; `size_t` travels as u64; a handle
//! is a u64 id (0 = NULL); byte strings and arrays carry a length; optional values carry a
//! presence byte. The decoder treats its input as hostile: every read is bounds-checked and
//! every length is checked against what is left before anything is allocated.

use crate::frame::{FrameHeader, HEADER_LEN, MAX_BODY};
use std::ffi::CString;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message truncated: needed {need} more bytes, {have} left")]
    Truncated { need: u64, have: usize },
    #[error("length {0} exceeds the limit")]
    TooLarge(u64),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("bad frame magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    #[error("invalid value: {0}")]
    BadValue(&'static str),
    #[error("unknown opcode {0:#06x}")]
    UnknownOp(u16),
    #[error("opcode {0} is answered by the client and never forwarded")]
    NotForwarded(u16),
}

/// A frame whose body (with its trailing bytes) would exceed [`MAX_BODY`]: every peer refuses
/// such a frame, and its length may not even fit the header, so it is never sent. The sender
/// reports the failure instead (the client as an API error, the server as an error reply).
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
#[error("a frame body of {0} bytes exceeds the limit of {MAX_BODY} bytes")]
pub struct FrameTooLarge(pub u64);

impl From<FrameTooLarge> for std::io::Error {
    fn from(e: FrameTooLarge) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// Builds one frame: header space first, body after, header filled in by [`Writer::finish`].
#[derive(Debug)]
pub struct Writer {
    buf: Vec<u8>,
    opcode: u16,
    /// Bytes that follow the body but are sent from the caller's own memory (bulk data).
    trailer: usize,
}

impl Writer {
    pub fn new(opcode: u16) -> Writer {
        Writer::with_buffer(opcode, Vec::with_capacity(256))
    }

    /// A writer that reuses `buf`'s allocation (a lane keeps one across requests, so bulk
    /// replies do not allocate and fault in fresh memory every time).
    pub fn with_buffer(opcode: u16, mut buf: Vec<u8>) -> Writer {
        buf.clear();
        buf.resize(HEADER_LEN, 0);
        Writer {
            buf,
            opcode,
            trailer: 0,
        }
    }

    pub fn opcode(&self) -> u16 {
        self.opcode
    }

    /// The body written so far.
    pub fn body(&self) -> &[u8] {
        &self.buf[HEADER_LEN..]
    }

    /// Body bytes written so far.
    pub fn body_len(&self) -> usize {
        self.buf.len() - HEADER_LEN
    }

    /// Fills in the header and returns the whole frame, unless its body exceeds [`MAX_BODY`].
    pub fn finish(self, flags: u8, seq: u32) -> Result<Vec<u8>, FrameTooLarge> {
        self.finish_on(0, flags, seq)
    }

    /// As [`Writer::finish`], for lane `lane` of a multiplexed stream.
    pub fn finish_on(mut self, lane: u16, flags: u8, seq: u32) -> Result<Vec<u8>, FrameTooLarge> {
        let len = self.body_len() as u64 + self.trailer as u64;
        if len > u64::from(MAX_BODY) {
            return Err(FrameTooLarge(len));
        }
        let h = FrameHeader {
            flags,
            opcode: self.opcode,
            lane,
            len: len as u32,
            seq,
        };
        self.buf[..HEADER_LEN].copy_from_slice(&h.encode());
        Ok(self.buf)
    }

    /// Ends the body with a length-prefixed byte string of `len` bytes that the caller sends
    /// right after the frame from its own memory (no copy into the frame). Must come last.
    pub fn trailing_bytes(&mut self, len: usize) {
        self.u64(len as u64);
        self.trailer(len);
    }

    /// `len` bytes that the caller sends right after the frame from its own memory, whose
    /// length the body already announced (a message header that says how much bulk data
    /// follows). Must come last.
    pub fn trailer(&mut self, len: usize) {
        self.trailer = len;
    }

    /// A position to [`Writer::rewind`] to, discarding what was written after it.
    pub fn mark(&self) -> usize {
        self.buf.len()
    }
    pub fn rewind(&mut self, mark: usize) {
        self.buf.truncate(mark.max(HEADER_LEN));
    }

    /// The status a reply body begins with (every API's replies do), 0 (success) for a body
    /// shorter than that.
    pub fn status(&self) -> i32 {
        self.buf
            .get(HEADER_LEN..HEADER_LEN + 4)
            .map_or(0, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Replaces the first four body bytes (a reply's status) with `v`; false if the body is
    /// shorter than that.
    pub fn replace_status(&mut self, v: i32) -> bool {
        match self.buf.get_mut(HEADER_LEN..HEADER_LEN + 4) {
            Some(b) => {
                b.copy_from_slice(&v.to_le_bytes());
                true
            }
            None => false,
        }
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn usize(&mut self, v: usize) {
        self.u64(v as u64);
    }
    /// A length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.buf.extend_from_slice(v);
    }
    /// Appends a length-prefixed string of `len` bytes that `fill` writes in place through a
    /// pointer to `len` bytes of uninitialised memory (no zeroing first). `fill` must write all
    /// `len` bytes when it returns Ok; on Err nothing is appended.
    pub fn bytes_filled_by<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(*mut u8) -> Result<(), E>,
    ) -> Result<(), E> {
        let mark = self.buf.len();
        self.u64(len as u64);
        let filled = self.filled_by(len, fill);
        if filled.is_err() {
            self.buf.truncate(mark);
        }
        filled
    }

    /// Appends `len` bytes (no length prefix: a header before them announced it) that `fill`
    /// writes in place, as [`Writer::bytes_filled_by`] does. On Err nothing is appended.
    pub fn filled_by<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(*mut u8) -> Result<(), E>,
    ) -> Result<(), E> {
        self.buf.reserve(len);
        let start = self.buf.len();
        // SAFETY: `reserve` made room for `len` bytes after `start`.
        let dst = unsafe { self.buf.as_mut_ptr().add(start) };
        fill(dst)?;
        // SAFETY: `fill` initialised all `len` bytes (its contract) within capacity.
        unsafe { self.buf.set_len(start + len) };
        Ok(())
    }

    /// Room for `len` bytes of a length-prefixed string, for callers that fill it in place.
    pub fn bytes_in_place(&mut self, len: usize) -> &mut [u8] {
        self.u64(len as u64);
        let start = self.buf.len();
        self.buf.resize(start + len, 0);
        &mut self.buf[start..]
    }
    pub fn opt_bytes(&mut self, v: Option<&[u8]>) {
        self.bool(v.is_some());
        if let Some(v) = v {
            self.bytes(v);
        }
    }
    pub fn opt_u64s(&mut self, v: Option<&[u64]>) {
        self.bool(v.is_some());
        if let Some(v) = v {
            self.u32(v.len() as u32);
            for x in v {
                self.u64(*x);
            }
        }
    }
}

/// Reads a message body; every accessor fails cleanly on short or inconsistent input. A clone
/// reads on from the same place (to peek ahead without consuming).
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], DecodeError> {
        let have = self.remaining();
        if n > have as u64 {
            return Err(DecodeError::Truncated { need: n, have });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::BadValue("boolean must be 0 or 1")),
        }
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn usize(&mut self) -> Result<usize, DecodeError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| DecodeError::TooLarge(v))
    }
    /// A length-prefixed byte string, borrowed from the message.
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u64()?;
        self.take(n)
    }
    /// `n` bytes without a length prefix (bulk data whose length a header announced),
    /// borrowed from the message.
    pub fn raw(&mut self, n: u64) -> Result<&'a [u8], DecodeError> {
        self.take(n)
    }
    pub fn opt_bytes(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        Ok(if self.bool()? {
            Some(self.bytes()?.to_vec())
        } else {
            None
        })
    }
    pub fn opt_bytes_ref(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        Ok(if self.bool()? {
            Some(self.bytes()?)
        } else {
            None
        })
    }
    fn count(&mut self, elem: u64) -> Result<usize, DecodeError> {
        let n = u64::from(self.u32()?);
        // The elements must be in the message: this bounds the allocation below.
        if n.saturating_mul(elem) > self.remaining() as u64 {
            return Err(DecodeError::Truncated {
                need: n * elem,
                have: self.remaining(),
            });
        }
        Ok(n as usize)
    }
    pub fn opt_u64s(&mut self) -> Result<Option<Vec<u64>>, DecodeError> {
        if !self.bool()? {
            return Ok(None);
        }
        let n = self.count(8)?;
        (0..n)
            .map(|_| self.u64())
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    pub fn opt_usizes(&mut self) -> Result<Option<Vec<usize>>, DecodeError> {
        if !self.bool()? {
            return Ok(None);
        }
        let n = self.count(8)?;
        (0..n)
            .map(|_| self.usize())
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    /// A C string sent without its terminating NUL.
    pub fn cstring(&mut self) -> Result<CString, DecodeError> {
        CString::new(self.bytes()?).map_err(|_| DecodeError::BadValue("string contains NUL"))
    }
    pub fn opt_cstring(&mut self) -> Result<Option<CString>, DecodeError> {
        Ok(if self.bool()? {
            Some(self.cstring()?)
        } else {
            None
        })
    }
    pub fn opt_cstrings(&mut self) -> Result<Option<Vec<CString>>, DecodeError> {
        if !self.bool()? {
            return Ok(None);
        }
        let n = self.count(8)?;
        (0..n)
            .map(|_| self.cstring())
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    /// The message must end here: trailing bytes mean the peer and we disagree on its shape.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_status_is_read_and_replaced_in_place() {
        let mut w = Writer::new(7);
        assert_eq!(w.status(), 0, "no body: success");
        w.i32(-5);
        w.u64(9);
        assert_eq!(w.status(), -5);
        assert!(w.replace_status(-30));
        assert_eq!(w.status(), -30);
    }

    #[test]
    fn roundtrip_all_kinds() {
        let mut w = Writer::new(5);
        w.u8(1);
        w.bool(true);
        w.u32(0xdead_beef);
        w.i32(-30);
        w.u64(u64::MAX);
        w.bytes(b"hello");
        w.opt_bytes(None);
        w.opt_u64s(Some(&[1, 2, 3]));
        w.opt_bytes(Some(b"k\0".as_slice().split_last().unwrap().1));
        let frame = w.finish(0, 9).unwrap();
        let h = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len as usize, frame.len() - HEADER_LEN);
        let mut r = Reader::new(&frame[HEADER_LEN..]);
        assert_eq!(r.u8().unwrap(), 1);
        assert!(r.bool().unwrap());
        assert_eq!(r.u32().unwrap(), 0xdead_beef);
        assert_eq!(r.i32().unwrap(), -30);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.bytes().unwrap(), b"hello");
        assert_eq!(r.opt_bytes().unwrap(), None);
        assert_eq!(r.opt_u64s().unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(r.opt_cstring().unwrap().unwrap().as_bytes(), b"k");
        r.finish().unwrap();
    }

    /// An oversize frame is an error the sender gets back, in every build (it used to be a
    /// debug assertion only: release builds sent a header the peer refuses, or whose length
    /// had wrapped around). Bulk trailing bytes count, and need not be allocated to test it.
    #[test]
    fn oversize_frames_are_refused_to_the_sender() {
        let max = MAX_BODY as usize;
        let mut w = Writer::new(7);
        w.trailing_bytes(max - 8);
        let frame = w.finish(0, 1).unwrap();
        let h = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len, MAX_BODY);
        let mut w = Writer::new(7);
        w.u8(0);
        w.trailing_bytes(max - 8);
        assert_eq!(w.finish(0, 1), Err(FrameTooLarge(u64::from(MAX_BODY) + 1)));
        // Lengths beyond 4 GiB do not wrap around into a small, plausible header.
        let mut w = Writer::new(7);
        w.trailing_bytes((4usize << 30) + 8);
        assert_eq!(w.finish_on(3, 0, 1), Err(FrameTooLarge((4 << 30) + 16)));
    }

    #[test]
    fn hostile_lengths_fail_without_allocating() {
        // A claimed length far beyond the message.
        let mut w = Writer::new(0);
        w.u64(u64::MAX);
        let f = w.finish(0, 0).unwrap();
        assert!(matches!(
            Reader::new(&f[HEADER_LEN..]).bytes(),
            Err(DecodeError::Truncated { .. })
        ));
        // An array count whose elements are not there.
        let mut w = Writer::new(0);
        w.bool(true);
        w.u32(u32::MAX);
        let f = w.finish(0, 0).unwrap();
        assert!(matches!(
            Reader::new(&f[HEADER_LEN..]).opt_u64s(),
            Err(DecodeError::Truncated { .. })
        ));
        // A boolean that is neither 0 nor 1, trailing bytes, an interior NUL.
        assert!(Reader::new(&[7]).bool().is_err());
        assert_eq!(
            Reader::new(&[1]).finish(),
            Err(DecodeError::TrailingBytes(1))
        );
        let mut w = Writer::new(0);
        w.bytes(b"a\0b");
        let f = w.finish(0, 0).unwrap();
        assert!(Reader::new(&f[HEADER_LEN..]).cstring().is_err());
    }
}
