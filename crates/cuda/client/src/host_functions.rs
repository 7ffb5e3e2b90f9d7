//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`): the program's function runs in
//! the program's process, in stream order. The worker enqueues a trampoline of its own on the
//! stream; when the driver runs it, the worker sends a CALLBACK frame and holds the stream
//! until this client, having run the function on the session's callback thread, sends
//! `host_functions::DONE`. A function captured into a graph runs at every launch of it, so it
//! is kept until the worker says a run is the last.
//!
//! A host function must not call CUDA (natively: CUDA_ERROR_NOT_PERMITTED, or a deadlock):
//! calls from inside one are refused with that status (`rt` asks [`in_host_function`]), since
//! through Wormhole one that waited for the stream would wait forever.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::rt::{self, entry_status};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{HostFunction, HostFunctionCall, HostFunctionDone, Message};
use wormhole_cuda_proto::{host_functions, HandleKind, Op, Writer};

type HostFn = unsafe extern "C" fn(*mut c_void);
type StreamCallback = unsafe extern "C" fn(*mut c_void, i32, *mut c_void);

/// A function the worker may call back.
#[derive(Clone, Copy)]
enum Pending {
    Host(HostFn, usize),
    /// The callback, its data, and the stream as the program named it.
    Stream(StreamCallback, usize, usize),
}

fn pending() -> std::sync::MutexGuard<'static, BTreeMap<u64, Pending>> {
    static PENDING: Mutex<BTreeMap<u64, Pending>> = Mutex::new(BTreeMap::new());
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a host function.
pub fn in_host_function() -> bool {
    INSIDE.with(Cell::get)
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Registers `f` and asks the worker to run it in `stream`'s order (not waited for: what the
/// worker's driver refuses is answered at the next synchronisation point).
///
/// # Safety
/// `stream` a stream handle or NULL.
unsafe fn enqueue(op: Op, stream: *mut c_void, f: Pending, flags: u32) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        // SAFETY: `id_of` dereferences only registered objects.
        let stream = unsafe { rt::id_of(stream, HandleKind::Stream, true) }?;
        let callback = next_id();
        pending().insert(callback, f);
        let mut w = rt::request(op);
        HostFunction {
            stream,
            callback,
            flags,
        }
        .encode(&mut w);
        rt::call_async(w).inspect_err(|_| {
            pending().remove(&callback);
        })?;
        Ok(CUDA_SUCCESS)
    })
}

/// `cuLaunchHostFunc`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuLaunchHostFunc(stream: *mut c_void, f: *mut c_void, data: *mut c_void) -> i32 {
    if f.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a non-NULL `CUhostFn`, per the contract.
    let f: HostFn = unsafe { std::mem::transmute(f) };
    // SAFETY: per the contract.
    unsafe {
        enqueue(
            Op::cuLaunchHostFunc,
            stream,
            Pending::Host(f, data as usize),
            0,
        )
    }
}

/// `cuLaunchHostFunc_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuLaunchHostFunc_ptsz(stream: *mut c_void, f: *mut c_void, data: *mut c_void) -> i32 {
    if f.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: as in `cuLaunchHostFunc`.
    let f: HostFn = unsafe { std::mem::transmute(f) };
    // SAFETY: per the contract.
    unsafe {
        enqueue(
            Op::cuLaunchHostFunc_ptsz,
            stream,
            Pending::Host(f, data as usize),
            0,
        )
    }
}

/// `cuStreamAddCallback`: flags must be 0, as the driver says.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamAddCallback(
    stream: *mut c_void,
    f: *mut c_void,
    data: *mut c_void,
    flags: u32,
) -> i32 {
    if f.is_null() || flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a non-NULL `CUstreamCallback`, per the contract.
    let f: StreamCallback = unsafe { std::mem::transmute(f) };
    let pending = Pending::Stream(f, data as usize, stream as usize);
    // SAFETY: per the contract.
    unsafe { enqueue(Op::cuStreamAddCallback, stream, pending, flags) }
}

/// `cuStreamAddCallback_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamAddCallback_ptsz(
    stream: *mut c_void,
    f: *mut c_void,
    data: *mut c_void,
    flags: u32,
) -> i32 {
    if f.is_null() || flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: as in `cuStreamAddCallback`.
    let f: StreamCallback = unsafe { std::mem::transmute(f) };
    let pending = Pending::Stream(f, data as usize, stream as usize);
    // SAFETY: per the contract.
    unsafe { enqueue(Op::cuStreamAddCallback_ptsz, stream, pending, flags) }
}

/// A CALLBACK frame (on the session's callback thread): runs the function, then lets the
/// worker's stream go on.
pub fn deliver(body: &[u8]) {
    let call = match HostFunctionCall::decode_all(body) {
        Ok(c) => c,
        Err(e) => {
            crate::connection::log(&format!(
                "malformed host function call from the server: {e}"
            ));
            return;
        }
    };
    let f = {
        let mut p = pending();
        match call.last {
            true => p.remove(&call.callback),
            false => p.get(&call.callback).copied(),
        }
    };
    match f {
        Some(f) => {
            INSIDE.with(|i| i.set(true));
            // SAFETY: the program's function with the data it gave, as the driver calls it.
            unsafe {
                match f {
                    Pending::Host(f, data) => f(data as *mut c_void),
                    Pending::Stream(f, data, stream) => {
                        f(stream as *mut c_void, call.status, data as *mut c_void)
                    }
                }
            }
            INSIDE.with(|i| i.set(false));
        }
        None => crate::connection::log(&format!(
            "the server ran host function {} that this client does not know",
            call.callback
        )),
    }
    let mut w = Writer::new(host_functions::DONE);
    HostFunctionDone {
        callback: call.callback,
    }
    .encode(&mut w);
    // On the callback thread's own lane, run at once by the worker (`Backend::unordered`):
    // program threads may be waiting inside calls for the stream this releases.
    if rt::call_async(w).is_err() {
        crate::connection::log(&format!(
            "could not tell the server that host function {} returned",
            call.callback
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;

    static RAN: AtomicI32 = AtomicI32::new(0);
    static STATUS: AtomicI32 = AtomicI32::new(0);

    unsafe extern "C" fn host(data: *mut c_void) {
        // A CUDA call from here would be refused: the thread is marked.
        assert!(in_host_function());
        RAN.fetch_add(data as i32, Ordering::SeqCst);
    }

    unsafe extern "C" fn stream_cb(stream: *mut c_void, status: i32, data: *mut c_void) {
        assert_eq!(stream as usize, 0x77);
        STATUS.store(status + data as i32, Ordering::SeqCst);
    }

    fn frame(callback: u64, status: i32, last: bool) -> Vec<u8> {
        let mut w = Writer::new(0);
        HostFunctionCall {
            callback,
            status,
            last,
        }
        .encode(&mut w);
        w.body().to_vec()
    }

    /// The function runs with its data, on the calling thread marked as inside a host
    /// function; one that repeats (a graph's) stays until its last run.
    #[test]
    fn calls_run_the_programs_function_until_the_last() {
        pending().insert(9001, Pending::Host(host, 5));
        deliver(&frame(9001, 0, false));
        deliver(&frame(9001, 0, true));
        assert_eq!(RAN.load(Ordering::SeqCst), 10);
        assert!(!in_host_function());
        assert!(!pending().contains_key(&9001));
        deliver(&frame(9001, 0, true));
        assert_eq!(RAN.load(Ordering::SeqCst), 10, "unknown now");
        pending().insert(9002, Pending::Stream(stream_cb, 1, 0x77));
        deliver(&frame(9002, 700, true));
        assert_eq!(STATUS.load(Ordering::SeqCst), 701);
        deliver(b"\x01");
    }
}
