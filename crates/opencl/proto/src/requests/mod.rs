//! The hand-written requests and replies of OpenCL on the wire, each defined once: the entry
//! points the API description marks `custom` (and the OpenCL control requests COLLECT, STAGE,
//! SVM_PUSH, SVM_PULL, DIRECT) have semantics the generator does not know, so their encoding is
//! written here, and the client (which encodes requests, decodes replies) and the server
//! (the reverse) both go through these structs. A field added on one side only cannot happen.
//!
//! Bulk data at the end of a message (a write's bytes, a read's bytes) travels outside the
//! body where it can: the struct is then the message's *header*, carries the data's length,
//! and the bytes follow the header unprefixed. The sender supplies them from its own memory
//! (`Writer::trailer`) or fills them in place (`Writer::filled_by`); the receiver takes them
//! with the struct's `data` method (`Reader::raw`) or streams them from the transport. Data
//! that does not fit one frame with its message travels in pieces of at most
//! [`crate::TRANSFER_CHUNK`] bytes: a write's is staged beforehand ([`Stage`],
//! [`WriteData::Staged`]), a read's waits on the server and is collected ([`Collected::Part`]).

mod control;
mod kernel;
mod memory;
mod program;
mod svm;
mod transfer;

pub use control::*;
pub use kernel::*;
pub use memory::*;
pub use program::*;
pub use svm::*;
pub use transfer::*;

use wormhole_wire::message::count;
/// The one encoding of every hand-written message, the same for every API.
pub use wormhole_wire::message::{Message, Reply};
use wormhole_wire::{DecodeError, Reader, Writer};

/// The offset a reply carries for "not in the shared arena" (a buffer without a window, a
/// mapping that is not the buffer's own storage).
pub const NO_WINDOW: u64 = u64::MAX;

/// Most strings or binaries one program creation carries.
pub const MAX_PARTS: usize = 1 << 16;

/// Most words of a property list.
pub const MAX_PROPERTY_WORDS: usize = 1024;

fn put_triple(w: &mut Writer, t: &[usize; 3]) {
    for v in t {
        w.usize(*v);
    }
}

fn triple(r: &mut Reader<'_>) -> Result<[usize; 3], DecodeError> {
    Ok([r.usize()?, r.usize()?, r.usize()?])
}

fn put_window(w: &mut Writer, at: Option<u64>) {
    w.u64(at.unwrap_or(NO_WINDOW));
}

fn window(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    Ok(Some(r.u64()?).filter(|&o| o != NO_WINDOW))
}

/// A list of u64 that travels as an optional array; the sender always sends one (absent
/// decodes as empty).
fn u64s(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    Ok(r.opt_u64s()?.unwrap_or_default())
}

/// A zero-terminated property list (absent: NULL), as every creation with properties sends it.
pub fn decode_props(r: &mut Reader<'_>) -> Result<Option<Vec<u64>>, DecodeError> {
    let v = r.opt_u64s()?;
    if let Some(v) = &v {
        if v.len() > MAX_PROPERTY_WORDS {
            return Err(DecodeError::TooLarge(v.len() as u64));
        }
        if v.last() != Some(&0) {
            return Err(DecodeError::BadValue("property list must end with 0"));
        }
    }
    Ok(v)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::fmt::Debug;

    /// The body `m` encodes to, leaked: messages that borrow from their body then decode with
    /// the lifetime the test's own values have.
    pub fn body<M: Message<'static>>(m: &M) -> &'static [u8] {
        let mut w = Writer::new(0);
        m.encode(&mut w);
        Box::leak(w.body().to_vec().into_boxed_slice())
    }

    /// Encoding then decoding gives `m` back, and every truncation of its body fails to
    /// decode (without a panic). Returns the body.
    pub fn roundtrip<M>(m: &M) -> &'static [u8]
    where
        M: Message<'static> + PartialEq + Debug,
    {
        let b = body(m);
        assert_eq!(&M::decode_all(b).unwrap(), m);
        for k in 0..b.len() {
            let cut = M::decode_all(&b[..k]);
            assert!(cut.is_err(), "{k} of {} bytes decoded: {cut:?}", b.len());
        }
        b
    }

    /// As `roundtrip`, for messages that end with "the rest of the body" (their length is
    /// implied by the request): a truncation may decode, but never as the original.
    pub fn roundtrip_open_ended<M>(m: &M) -> &'static [u8]
    where
        M: Message<'static> + PartialEq + Debug,
    {
        let b = body(m);
        assert_eq!(&M::decode_all(b).unwrap(), m);
        for k in 0..b.len() {
            if let Ok(cut) = M::decode_all(&b[..k]) {
                assert_ne!(&cut, m, "{k} of {} bytes decoded as the whole", b.len());
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Two(u64);
    impl Message<'_> for Two {
        fn encode(&self, w: &mut Writer) {
            w.u64(self.0);
        }
        fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
            Ok(Two(r.u64()?))
        }
    }

    #[test]
    fn replies_carry_a_value_only_on_success() {
        let ok: Reply<Two> = Ok(Two(7));
        assert_eq!(roundtrip(&ok).len(), 12);
        let failed: Reply<Two> = Err(-5);
        assert_eq!(roundtrip(&failed), (-5i32).to_le_bytes());
    }

    #[test]
    fn property_lists_are_bounded_and_terminated() {
        let mut w = Writer::new(0);
        w.opt_u64s(Some(&[1, 2, 0]));
        w.opt_u64s(Some(&[1, 2]));
        w.opt_u64s(None);
        w.opt_u64s(Some(&vec![0; MAX_PROPERTY_WORDS + 1]));
        let body = w.body().to_vec();
        let mut r = Reader::new(&body);
        assert_eq!(decode_props(&mut r).unwrap(), Some(vec![1, 2, 0]));
        assert!(matches!(
            decode_props(&mut r),
            Err(DecodeError::BadValue(_))
        ));
        assert_eq!(decode_props(&mut r).unwrap(), None);
        assert!(matches!(
            decode_props(&mut r),
            Err(DecodeError::TooLarge(_))
        ));
    }

    #[test]
    fn counts_must_fit_the_message() {
        let mut w = Writer::new(0);
        w.u32(u32::MAX);
        let b = w.body().to_vec();
        assert!(count(&mut Reader::new(&b), 8, usize::MAX).is_err());
        assert!(matches!(
            count(&mut Reader::new(&b), 0, 10),
            Err(DecodeError::TooLarge(_))
        ));
    }
}
