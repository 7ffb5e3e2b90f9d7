//! Host functions (see the client's `host_functions`): the driver runs a trampoline of the
//! worker's in stream order; it sends the client a CALLBACK frame and holds the stream (as the
//! program's function would, natively) until the client's DONE. One enqueued while its stream
//! is capturing becomes a node of the graph and runs at every launch of it: its context stays
//! for the session, and no run is the last.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::generated::ffi;
use crate::session::{Call, Handle};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{HostFunction, HostFunctionCall, HostFunctionDone, Message};
use wormhole_cuda_proto::{control, DecodeError, HandleKind, Op, Reader, Writer};
use wormhole_server::callbacks::CallbackChannel;

/// Where the CALLBACK frames go.
pub static CHANNEL: CallbackChannel = CallbackChannel::new();

/// The client is gone: trampolines return without their DONE (the process is exiting).
static ENDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The session ended: every trampoline waiting for the client returns.
pub fn end() {
    ENDED.store(true, std::sync::atomic::Ordering::SeqCst);
    let _guard = DONE.lock().unwrap_or_else(|p| p.into_inner());
    DONE_CHANGED.notify_all();
}

/// DONEs that came and that no trampoline has taken yet, per host function (a graph's may
/// run in two launches at once).
static DONE: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());
static DONE_CHANGED: Condvar = Condvar::new();

/// What a trampoline needs: the client's id of the function, and whether it may run again
/// (captured into a graph: set again after the enqueue, should a capture have begun on the
/// stream meanwhile, so a captured context is never freed after its first run).
struct Ctx {
    callback: u64,
    repeats: AtomicBool,
    /// Holders: the request that enqueued it (until it has looked again) and a run that does
    /// not repeat. The last one frees it.
    holders: AtomicU32,
}

impl Ctx {
    fn new(callback: u64, repeats: bool) -> Ctx {
        Ctx {
            callback,
            repeats: AtomicBool::new(repeats),
            holders: AtomicU32::new(2),
        }
    }
}

/// Lets go of `data`'s context; the last holder frees it.
///
/// # Safety
/// `data` is a `Ctx` that `enqueue` leaked, and the caller one of its holders.
unsafe fn let_go(data: *mut c_void) {
    // SAFETY: per the contract, it is alive while the caller holds it.
    if unsafe { &*(data as *const Ctx) }
        .holders
        .fetch_sub(1, Ordering::AcqRel)
        == 1
    {
        // SAFETY: no holder is left: nothing refers to it any more.
        drop(unsafe { Box::from_raw(data as *mut Ctx) });
    }
}

/// Has the client run function `ctx.callback` (with the stream's `status`), and waits until it
/// has returned.
fn run_in_client(ctx: &Ctx, status: i32) {
    let mut w = Writer::new(control::CALLBACK);
    HostFunctionCall {
        callback: ctx.callback,
        status,
        last: !ctx.repeats.load(Ordering::Acquire),
    }
    .encode(&mut w);
    CHANNEL.send(w);
    // Without a client no DONE comes: the session's end releases the wait.
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if ENDED.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        match done.get_mut(&ctx.callback) {
            Some(1) => {
                done.remove(&ctx.callback);
                return;
            }
            Some(n) => {
                *n -= 1;
                return;
            }
            None => done = DONE_CHANGED.wait(done).unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// Runs with the trampoline's context: kept if it repeats, else let go of after the run (the
/// last of its holders frees it).
///
/// # Safety
/// `data` is a `Ctx` that `enqueue` leaked.
unsafe fn with_ctx(data: *mut c_void, f: impl FnOnce(&Ctx)) {
    // SAFETY: per the contract.
    let ctx = unsafe { &*(data as *const Ctx) };
    f(ctx);
    if !ctx.repeats.load(Ordering::Acquire) {
        // SAFETY: a context that does not repeat runs once: this run was a holder.
        unsafe { let_go(data) };
    }
}

unsafe extern "C" fn host_fn(data: *mut c_void) {
    // SAFETY: the driver passes the data `enqueue` gave it.
    unsafe { with_ctx(data, |ctx| run_in_client(ctx, CUDA_SUCCESS)) }
}

unsafe extern "C" fn stream_callback(_stream: Handle, status: i32, data: *mut c_void) {
    // SAFETY: as in `host_fn`.
    unsafe { with_ctx(data, |ctx| run_in_client(ctx, status)) }
}

/// Whether `stream` is capturing (a host function enqueued now joins the graph).
fn capturing(op: Op, stream: Handle) -> bool {
    let per_thread = matches!(op, Op::cuLaunchHostFunc_ptsz | Op::cuStreamAddCallback_ptsz);
    crate::capture::is_capturing(stream, per_thread)
}

fn enqueue(s: &Call<'_>, op: Op, m: &HostFunction) -> Result<(), i32> {
    let stream = s.resolve(m.stream, HandleKind::Stream, true)?;
    let ends = crate::capture::ends_so_far();
    let ctx = Box::into_raw(Box::new(Ctx::new(m.callback, capturing(op, stream)))) as *mut c_void;
    // SAFETY: a stream of the session's, a trampoline of the driver's callback type, and its
    // context (leaked until it runs, or for the session if it repeats).
    let st = unsafe {
        match op {
            Op::cuLaunchHostFunc => ffi::cuLaunchHostFunc(stream, host_fn as *mut c_void, ctx),
            Op::cuLaunchHostFunc_ptsz => {
                ffi::cuLaunchHostFunc_ptsz(stream, host_fn as *mut c_void, ctx)
            }
            Op::cuStreamAddCallback => {
                ffi::cuStreamAddCallback(stream, stream_callback as *mut c_void, ctx, m.flags)
            }
            _ => {
                ffi::cuStreamAddCallback_ptsz(stream, stream_callback as *mut c_void, ctx, m.flags)
            }
        }
    };
    if st != CUDA_SUCCESS {
        // SAFETY: the driver refused it: the context was never handed out.
        drop(unsafe { Box::from_raw(ctx as *mut Ctx) });
        return Err(st);
    }
    if capturing(op, stream) || crate::capture::ends_so_far() != ends {
        // A capture began on the stream (another thread's) since the first look, or one came
        // and went meanwhile: the function may have joined the graph. Kept for the session
        // then, still held by this request (at worst one context leaked where it was not
        // captured after all), never freed under a graph that runs it again.
        // SAFETY: this request still holds the context.
        unsafe { &*(ctx as *const Ctx) }
            .repeats
            .store(true, Ordering::Release);
    } else {
        // SAFETY: this request holds it, and lets go once.
        unsafe { let_go(ctx) };
    }
    Ok(())
}

fn handle(s: &Call<'_>, op: Op, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let m = HostFunction::decode_rest(r)?;
    w.i32(enqueue(s, op, &m).err().unwrap_or(CUDA_SUCCESS));
    Ok(())
}

/// DONE: the client ran the function; its trampoline may return.
pub fn done(r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let m = HostFunctionDone::decode_rest(r)?;
    *DONE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(m.callback)
        .or_default() += 1;
    DONE_CHANGED.notify_all();
    w.i32(CUDA_SUCCESS);
    Ok(())
}

/// `cuLaunchHostFunc`.
pub fn cuLaunchHostFunc(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    handle(s, Op::cuLaunchHostFunc, r, w)
}

/// `cuLaunchHostFunc_ptsz`.
pub fn cuLaunchHostFunc_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    handle(s, Op::cuLaunchHostFunc_ptsz, r, w)
}

/// `cuStreamAddCallback`.
pub fn cuStreamAddCallback(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    handle(s, Op::cuStreamAddCallback, r, w)
}

/// `cuStreamAddCallback_ptsz`.
pub fn cuStreamAddCallback_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    handle(s, Op::cuStreamAddCallback_ptsz, r, w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;

    /// A trampoline waits for its DONE, and only its own: a DONE that came first is kept.
    #[test]
    fn a_trampoline_returns_once_the_client_says_its_function_did() {
        let ctx = Ctx::new(4242, true);
        let mut w = Writer::new(0);
        let mut body = Writer::new(0);
        HostFunctionDone { callback: 4242 }.encode(&mut body);
        done(&mut Reader::new(body.body()), &mut w).unwrap();
        done(&mut Reader::new(body.body()), &mut Writer::new(0)).unwrap();
        // Two DONEs of one function (a graph's, in two launches): two runs return.
        run_in_client(&ctx, CUDA_SUCCESS);
        run_in_client(&ctx, CUDA_SUCCESS);
        let waiter = std::thread::spawn(move || run_in_client(&ctx, CUDA_SUCCESS));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "returned before its DONE");
        let mut other = Writer::new(0);
        HostFunctionDone { callback: 4343 }.encode(&mut other);
        done(&mut Reader::new(other.body()), &mut Writer::new(0)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "returned on another function's DONE");
        done(&mut Reader::new(body.body()), &mut Writer::new(0)).unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn host_functions_name_the_sessions_streams() {
        let session = Session::default();
        let m = HostFunction {
            stream: 999,
            callback: 1,
            flags: 0,
        };
        assert_eq!(
            enqueue(&Call(&session), Op::cuLaunchHostFunc, &m),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
    }
}
