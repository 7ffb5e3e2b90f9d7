//! Callbacks fired by the driver in the worker are sent to the client over the session's
//! control socket; the client runs the application's function in its own process.

use crate::generated::ffi;
use crate::session::Handle;
use std::ffi::{c_char, c_void, CStr};
use wormhole_opencl_proto::{control, CallbackKind, Writer};
use wormhole_server::callbacks::CallbackChannel;

/// Where callback frames go (the core's sink for the session's transport).
pub type Sink = wormhole_server::backend::CallbackSink;

static CHANNEL: CallbackChannel = CallbackChannel::new();

pub fn set_sink(s: Sink) {
    CHANNEL.connect(s);
}

struct Ctx {
    id: u64,
    owner: u64,
}

fn send(w: Writer) {
    CHANNEL.send(w);
}

fn header(kind: CallbackKind, ctx: &Ctx) -> Writer {
    let mut w = Writer::new(control::CALLBACK);
    w.u64(ctx.id);
    w.u8(kind as u8);
    w.u64(ctx.owner);
    w
}

unsafe extern "C" fn context_notify(
    errinfo: *const c_char,
    private_info: *const c_void,
    cb: usize,
    ud: *mut c_void,
) {
    // SAFETY: `ud` is the Ctx leaked by `make` for this context; context callbacks may fire many
    // times, so it is never freed. The driver passes a valid string and `cb` private bytes.
    let ctx = unsafe { &*(ud as *const Ctx) };
    let mut w = header(CallbackKind::ContextNotify, ctx);
    let info = if errinfo.is_null() {
        &[][..]
    } else {
        // SAFETY: the driver passes a NUL-terminated message.
        unsafe { CStr::from_ptr(errinfo) }.to_bytes()
    };
    w.bytes(info);
    let private = if private_info.is_null() || cb == 0 {
        &[][..]
    } else {
        // SAFETY: the driver passes `cb` bytes of private data.
        unsafe { std::slice::from_raw_parts(private_info as *const u8, cb) }
    };
    w.bytes(private);
    send(w);
}

unsafe extern "C" fn program_notify(_program: Handle, ud: *mut c_void) {
    // SAFETY: `ud` is the Box<Ctx> leaked by `make`; build/compile/link notify once per call.
    let ctx = unsafe { Box::from_raw(ud as *mut Ctx) };
    send(header(CallbackKind::ProgramNotify, &ctx));
}

/// Reports a build that completed without the driver's callback (a build the program cache
/// served) to the client, as the driver would have: `ud` is what `make` returned, or NULL.
pub fn program_built(ud: *mut c_void) {
    if !ud.is_null() {
        // SAFETY: `ud` is a Box<Ctx> from `make` that no driver was given, so this is its
        // only use.
        unsafe { program_notify(std::ptr::null_mut(), ud) };
    }
}

unsafe extern "C" fn event_notify(_event: Handle, status: i32, ud: *mut c_void) {
    // SAFETY: as above; an event callback fires once.
    let ctx = unsafe { Box::from_raw(ud as *mut Ctx) };
    let mut w = header(CallbackKind::EventNotify, &ctx);
    w.i32(status);
    send(w);
}

unsafe extern "C" fn object_notify(_obj: Handle, ud: *mut c_void) {
    // SAFETY: as above; destructor and release callbacks fire once.
    let ctx = unsafe { Box::from_raw(ud as *mut Ctx) };
    send(header(CallbackKind::ObjectNotify, &ctx));
}

unsafe extern "C" fn svm_free_notify(queue: Handle, _n: u32, _ptrs: *mut c_void, ud: *mut c_void) {
    // The client knows the queue and the pointers it enqueued: it is told only that it is time.
    // SAFETY: as for `object_notify`: the Box<Ctx> from `make_svm_free`, fired once.
    unsafe { object_notify(queue, ud) }
}

/// The free function and user data to hand `clEnqueueSVMFree` for client callback `id`
/// (reported to the client as an object notification of `owner`, the queue).
pub fn make_svm_free(id: u64, owner: u64) -> (*const c_void, *mut c_void) {
    let (_, ud) = make(CallbackKind::ObjectNotify, id, owner);
    if ud.is_null() {
        return (std::ptr::null(), ud);
    }
    (svm_free_notify as *const c_void, ud)
}

/// The trampoline and user data to hand the driver for client callback `id` (0: none).
/// `owner` is the id of the object the callback reports.
pub fn make(kind: CallbackKind, id: u64, owner: u64) -> (*const c_void, *mut c_void) {
    if id == 0 {
        return (std::ptr::null(), std::ptr::null_mut());
    }
    let ud = Box::into_raw(Box::new(Ctx { id, owner })) as *mut c_void;
    let f = match kind {
        CallbackKind::ContextNotify => context_notify as *const c_void,
        CallbackKind::ProgramNotify => program_notify as *const c_void,
        CallbackKind::EventNotify => event_notify as *const c_void,
        CallbackKind::ObjectNotify => object_notify as *const c_void,
    };
    (f, ud)
}

type Hook = Box<dyn FnOnce() + Send>;

unsafe extern "C" fn run_hook(_obj: Handle, ud: *mut c_void) {
    // SAFETY: `ud` is the Box<Hook> leaked by `on_mem_destroyed`; destructors fire once.
    let hook = unsafe { Box::from_raw(ud as *mut Hook) };
    hook();
}

/// Runs `f` when the driver destroys `mem` (server-side bookkeeping, not a client callback).
pub fn on_mem_destroyed(mem: Handle, f: impl FnOnce() + Send + 'static) {
    let hook: Box<Hook> = Box::new(Box::new(f));
    let ud = Box::into_raw(hook) as *mut c_void;
    // SAFETY: `mem` is live; the trampoline matches the destructor callback signature.
    let st = unsafe { ffi::clSetMemObjectDestructorCallback(mem, run_hook as *const c_void, ud) };
    if st != 0 {
        // SAFETY: the driver refused it, so we still own the box.
        drop(unsafe { Box::from_raw(ud as *mut Hook) });
    }
}

/// Runs `f` once `event` completes (or fails).
pub fn on_event_complete(event: Handle, f: impl FnOnce() + Send + 'static) {
    unsafe extern "C" fn run(_e: Handle, _status: i32, ud: *mut c_void) {
        // SAFETY: the Box<Hook> leaked below; event callbacks fire once.
        let hook = unsafe { Box::from_raw(ud as *mut Hook) };
        hook();
    }
    let hook: Box<Hook> = Box::new(Box::new(f));
    let ud = Box::into_raw(hook) as *mut c_void;
    // SAFETY: `event` is live; CL_COMPLETE callbacks also fire on error termination.
    let st = unsafe {
        ffi::clSetEventCallback(
            event,
            wormhole_opencl_proto::cl::CL_COMPLETE,
            run as *const c_void,
            ud,
        )
    };
    if st != 0 {
        // The driver refused (a bad event): the hook's data may still be in use by a command,
        // so it is leaked rather than freed under the driver's feet.
        tracing::warn!(
            status = st,
            "could not watch an event; keeping its staging data"
        );
    }
}
