//! Event callbacks: pipelined when the client can vouch for them, and holding their event
//! until they have run.

use super::*;
use crate::generated;
use std::sync::atomic::Ordering;

/// Every error `clSetEventCallback` can return is the client's to see (a bad event, no
/// function, a type other than the three): one it cannot is pipelined.
///
/// The callback names its event, which must still be the application's when it runs, though
/// the application may release it right after asking (OpenCV does): a native driver keeps the
/// event until its callbacks ran. So the callback holds a reference, on both sides, that
/// `rt::callbacks` drops once it has run.
pub unsafe extern "C" fn clSetEventCallback(
    event: Handle,
    kind: i32,
    pfn_notify: *const c_void,
    user_data: *mut c_void,
) -> i32 {
    // SAFETY: the application's handle, only looked up.
    let Some(ev) =
        (unsafe { objects::get(event, HandleKind::Event) }).filter(|_| !pfn_notify.is_null())
    else {
        // SAFETY: forwarded for the driver's own error.
        return unsafe { generated::wire_clSetEventCallback(event, kind, pfn_notify, user_data) };
    };
    // SAFETY: a live event of the application's.
    let held = unsafe { generated::wire_clRetainEvent(event) };
    if held != CL_SUCCESS {
        return held;
    }
    ev.callback_holds.fetch_add(1, Ordering::AcqRel);
    if matches!(kind, CL_COMPLETE | CL_RUNNING | CL_SUBMITTED) {
        rt::send_next_async();
    }
    // SAFETY: forwarded with the caller's guarantees.
    let st = unsafe { generated::wire_clSetEventCallback(event, kind, pfn_notify, user_data) };
    if st != CL_SUCCESS {
        ev.callback_holds.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the reference taken above.
        unsafe { generated::wire_clReleaseEvent(event) };
    }
    st
}
