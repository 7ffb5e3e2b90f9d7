//! Hand-written requests and replies: an API's entry points whose semantics the generator does
//! not know have their encoding written once, as a struct both sides go through (the client
//! encodes requests and decodes replies, the server the reverse).

use crate::{DecodeError, Reader, Writer};

/// The success status of every API Wormhole forwards.
const SUCCESS: i32 = 0;

/// A message with its one encoding. `decode` reads exactly what `encode` writes and treats its
/// input as hostile: bad input is a `DecodeError`, never a panic.
pub trait Message<'a>: Sized {
    fn encode(&self, w: &mut Writer);
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError>;

    /// Decodes a whole body: nothing may follow the message.
    fn decode_all(body: &'a [u8]) -> Result<Self, DecodeError> {
        Self::decode_rest(&mut Reader::new(body))
    }

    /// Decodes the rest of a body: nothing may follow the message.
    fn decode_rest(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let m = Self::decode(r)?;
        r.finish()?;
        Ok(m)
    }
}

/// A reply that is the call's status and, only when that is success (0 in every API Wormhole
/// forwards: `CL_SUCCESS`, `CUDA_SUCCESS`), what the call returns: `Ok(value)` travels as 0
/// then the value, `Err(status)` as the status alone.
pub type Reply<T> = Result<T, i32>;

impl<'a, T: Message<'a>> Message<'a> for Reply<T> {
    fn encode(&self, w: &mut Writer) {
        match self {
            Ok(v) => {
                w.i32(SUCCESS);
                v.encode(w);
            }
            Err(st) => {
                debug_assert_ne!(*st, SUCCESS, "a failed reply needs a failure status");
                w.i32(*st);
            }
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        match r.i32()? {
            SUCCESS => T::decode(r).map(Ok),
            st => Ok(Err(st)),
        }
    }
}

/// An array count whose elements take at least `min` bytes each: they must be in the message,
/// which bounds what is allocated for them.
pub fn count(r: &mut Reader<'_>, min: usize, limit: usize) -> Result<usize, DecodeError> {
    let n = r.u32()? as usize;
    if n > limit {
        return Err(DecodeError::TooLarge(n as u64));
    }
    if n.saturating_mul(min) > r.remaining() {
        return Err(DecodeError::Truncated {
            need: (n * min) as u64,
            have: r.remaining(),
        });
    }
    Ok(n)
}
