//! Application callbacks: registered here under an id the server echoes back when the driver
//! fires the callback in the worker; run on the client's event thread.

use super::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Mutex;
use wormhole_opencl_proto::CallbackKind;

struct Entry {
    kind: CallbackKind,
    f: usize,
    user_data: usize,
}

static TABLE: Mutex<Option<HashMap<u64, Entry>>> = Mutex::new(None);

/// Registers `f` (NULL: no callback, id 0). User data without a function is
/// `CL_INVALID_VALUE`, as every OpenCL call taking a callback says (the driver never sees the
/// user data, so it cannot say so itself).
pub fn register(
    kind: CallbackKind,
    f: *const c_void,
    user_data: *mut c_void,
) -> Result<u64, ClErr> {
    if f.is_null() {
        return if user_data.is_null() {
            Ok(0)
        } else {
            Err(ClErr(CL_INVALID_VALUE))
        };
    }
    let id = alloc_id();
    TABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(
            id,
            Entry {
                kind,
                f: f as usize,
                user_data: user_data as usize,
            },
        );
    Ok(id)
}

type ContextFn = unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void);
type ProgramFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
type EventFn = unsafe extern "C" fn(*mut c_void, i32, *mut c_void);

/// Runs one callback frame from the server.
pub fn deliver(body: &[u8]) {
    let mut r = Reader::new(body);
    let (Ok(id), Ok(kind), Ok(owner)) = (r.u64(), r.u8(), r.u64()) else {
        crate::connection::log("malformed callback frame");
        return;
    };
    let entry = {
        let mut t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = t.as_mut() else { return };
        // Context notifications may come many times; every other callback fires once.
        if kind == CallbackKind::ContextNotify as u8 {
            t.get(&id).map(|e| Entry {
                kind: e.kind,
                f: e.f,
                user_data: e.user_data,
            })
        } else {
            t.remove(&id)
        }
    };
    let Some(e) = entry else { return };
    if e.kind as u8 != kind {
        crate::connection::log("callback kind mismatch; ignored");
        return;
    }
    let ud = e.user_data as *mut c_void;
    let run = || match e.kind {
        CallbackKind::ContextNotify => {
            let info = r.bytes().unwrap_or_default();
            let private = r.bytes().unwrap_or_default().to_vec();
            let info = CString::new(info.to_vec()).unwrap_or_default();
            // SAFETY: `f` is the application's function of this signature.
            let f: ContextFn = unsafe { std::mem::transmute::<usize, ContextFn>(e.f) };
            // SAFETY: arguments as the API specifies; the buffers outlive the call.
            unsafe {
                f(
                    info.as_ptr(),
                    private.as_ptr() as *const c_void,
                    private.len(),
                    ud,
                )
            };
        }
        CallbackKind::ProgramNotify => {
            // clLinkProgram's callback may overtake the reply that creates the program's
            // handle; give the calling thread a moment to publish it.
            let mut program = crate::objects::known_object(owner);
            for _ in 0..100 {
                if !program.is_null() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                program = crate::objects::known_object(owner);
            }
            // SAFETY: as above.
            let f: ProgramFn = unsafe { std::mem::transmute::<usize, ProgramFn>(e.f) };
            // SAFETY: as above.
            unsafe { f(program, ud) };
        }
        CallbackKind::EventNotify => {
            let status = r.i32().unwrap_or(CL_OUT_OF_RESOURCES);
            // The event is done: a read it covers must land before the application sees it.
            after_sync();
            let event = crate::objects::known_object(owner);
            // SAFETY: as above.
            let f: EventFn = unsafe { std::mem::transmute::<usize, EventFn>(e.f) };
            // SAFETY: as above.
            unsafe { f(event, status, ud) };
            // The reference the callback held since it was asked for (custom/events.rs).
            crate::custom::drop_callback_hold(event);
        }
        CallbackKind::ObjectNotify => {
            let obj = crate::objects::known_object(owner);
            // SAFETY: as above.
            let f: ProgramFn = unsafe { std::mem::transmute::<usize, ProgramFn>(e.f) };
            // SAFETY: as above.
            unsafe { f(obj, ud) };
        }
    };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        crate::connection::log("a callback panicked");
    }
}
