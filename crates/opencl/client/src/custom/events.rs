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
        drop_callback_hold(event);
    }
    st
}

/// Drops the reference one callback of `event` held: once it has run (`rt::callbacks`), or
/// when the driver refused it.
pub fn drop_callback_hold(event: Handle) {
    // SAFETY: the application's handle (kept alive by the hold), only looked up.
    if let Some(ev) = unsafe { objects::get(event, HandleKind::Event) } {
        ev.callback_holds.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: a live event: the hold kept it.
        unsafe { generated::wire_clReleaseEvent(event) };
    }
}

/// How many references of `event` its pending callbacks hold: not the application's, so its
/// reference count is reported without them.
pub fn callback_holds(event: Handle) -> u32 {
    // SAFETY: the application's handle, only looked up.
    unsafe { objects::get(event, HandleKind::Event) }
        .map_or(0, |e| e.callback_holds.load(Ordering::Acquire))
}
