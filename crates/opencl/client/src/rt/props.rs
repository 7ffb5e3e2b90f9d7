//! Property lists: zero-terminated key/value words, sent whole; handles inside translated.

use super::*;
use wormhole_opencl_proto::Props;

const MAX_WORDS: usize = 1024;

/// # Safety
/// `p` must be NULL or a zero-terminated property list of its kind.
pub unsafe fn encode(w: &mut Writer, kind: Props, p: *const u64) -> Result<(), ClErr> {
    // SAFETY: per the contract.
    let words = unsafe { words(kind, p) }?;
    w.opt_u64s(words.as_deref());
    Ok(())
}

/// The words of a property list as they travel (None for NULL), handles inside as ids.
///
/// # Safety
/// As [`encode`].
pub unsafe fn words(kind: Props, p: *const u64) -> Result<Option<Vec<u64>>, ClErr> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract every index read below is inside the list (we stop at its end).
    let at = |i: usize| unsafe { *p.add(i) };
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        if words.len() > MAX_WORDS {
            return Err(ClErr(CL_INVALID_PROPERTY));
        }
        let key = at(i);
        words.push(key);
        if key == 0 {
            break;
        }
        match kind {
            Props::Partition if key == CL_DEVICE_PARTITION_BY_COUNTS => {
                // counts..., LIST_END, then the list's final 0
                loop {
                    i += 1;
                    let v = at(i);
                    words.push(v);
                    if v == CL_DEVICE_PARTITION_BY_COUNTS_LIST_END || words.len() > MAX_WORDS {
                        break;
                    }
                }
                i += 1;
                continue;
            }
            Props::Context if key == CL_CONTEXT_PLATFORM => {
                // SAFETY: the value is a platform handle the application got from OpenCL.
                let id = unsafe { id_of(at(i + 1) as *mut c_void, HandleKind::Platform, false) }
                    .map_err(|_| ClErr(CL_INVALID_PLATFORM))?;
                words.push(id);
            }
            _ => words.push(at(i + 1)),
        }
        i += 2;
    }
    Ok(Some(words))
}
