//! Property lists on the server: decoded as u64 words, handles inside translated to objects.

use crate::session::Session;
use wormhole_opencl_proto::{cl::*, DecodeError, HandleKind, Props, Reader};

/// A property list as every request carries it (the one decoder the hand-written requests
/// use too).
pub fn decode(r: &mut Reader<'_>, _kind: Props) -> Result<Option<Vec<u64>>, DecodeError> {
    wormhole_opencl_proto::requests::decode_props(r)
}

/// Replaces handle ids inside a property list by the real objects.
pub fn resolve(s: &Session, kind: Props, props: Option<Vec<u64>>) -> Result<Option<Vec<u64>>, i32> {
    let Some(mut v) = props else { return Ok(None) };
    if kind == Props::Context {
        let mut i = 0;
        while i + 1 < v.len() && v[i] != 0 {
            if v[i] == CL_CONTEXT_PLATFORM {
                v[i + 1] = s.resolve(v[i + 1], HandleKind::Platform, false)? as u64;
            }
            i += 2;
        }
    }
    Ok(Some(v))
}

/// The reverse, for CL_CONTEXT_PROPERTIES values going back to the client.
pub fn export_context_props(s: &Session, bytes: &mut [u8]) {
    let mut words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let mut i = 0;
    while i + 1 < words.len() && words[i] != 0 {
        if words[i] == CL_CONTEXT_PLATFORM {
            words[i + 1] = s.export(HandleKind::Platform, words[i + 1] as *mut _);
        }
        i += 2;
    }
    for (c, w) in bytes.chunks_exact_mut(8).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
}
