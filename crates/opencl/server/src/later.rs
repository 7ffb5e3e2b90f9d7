//! `clFinish` answered from the driver's own thread (see [`Completion`]). The lane puts a
//! marker behind everything on the queue (a marker without a wait list completes once all
//! earlier commands did), flushes, and goes back to its ring; the marker's `CL_COMPLETE`
//! callback, on the driver's thread that finished the work, sends the reply. Natively the
//! driver's thread wakes the application; through Wormhole it now does the same, instead of
//! waking the lane that then wakes the application.
//!
//! Whatever this path cannot do as the driver would (a bad queue, a driver without markers or
//! callbacks) is left to the ordinary `clFinish`, which gives the native answer.

use crate::admission::release;
use crate::generated::ffi;
use crate::session::{Call, Handle, Session};
use crate::OpenCl;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use wormhole_opencl_proto::cl::{CL_COMPLETE, CL_SUCCESS};
use wormhole_opencl_proto::{DecodeError, HandleKind, Op, Reader};
use wormhole_server::backend::Completion;

/// A `clFinish` waiting for its marker.
struct Pending {
    id: u64,
    session: &'static Session,
    /// The queue as the client named it, the driver's object, and the marker.
    queue: u64,
    real: usize,
    marker: usize,
    /// The session's enqueue count before the marker: the queue is idle as of it once the
    /// marker completes.
    enqueues: u64,
    since: Instant,
    /// Taken by whichever answers first: the marker's callback, or the watch.
    completion: Mutex<Option<Completion>>,
}

impl Pending {
    fn take(&self) -> Option<Completion> {
        self.completion
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// The lane's half: takes the `clFinish` request (`body`) to answer from the marker's
/// callback, or hands it back to run as usual.
pub fn finish(
    s: &'static Session,
    body: &[u8],
    c: Completion,
) -> Result<Option<Completion>, DecodeError> {
    let mut r = Reader::new(body);
    let queue = r.u64()?;
    r.finish()?;
    let real = match s.resolve(queue, HandleKind::Queue, false) {
        Ok(real) if !real.is_null() => real,
        _ => return Ok(Some(c)),
    };
    for op in [Op::clFinish, Op::clEnqueueMarkerWithWaitList, Op::clFlush] {
        if crate::rt::check_slot(real, op).is_err() {
            return Ok(Some(c));
        }
    }
    let enqueues = s.enqueues.load(Ordering::Acquire);
    let mut ev: Handle = std::ptr::null_mut();
    // SAFETY: `real` is a live queue of this session's table; no wait list; `ev` receives the
    // new event.
    let st = unsafe { ffi::clEnqueueMarkerWithWaitList(real, 0, std::ptr::null(), &mut ev) };
    if st != CL_SUCCESS || ev.is_null() {
        return Ok(Some(c));
    }
    // SAFETY: as above. clFinish implies a flush; the marker's callback needs one to fire.
    if unsafe { ffi::clFlush(real) } != CL_SUCCESS {
        release(ev as usize);
        return Ok(Some(c));
    }
    static IDS: AtomicU64 = AtomicU64::new(0);
    let p = Arc::new(Pending {
        id: IDS.fetch_add(1, Ordering::Relaxed),
        session: s,
        queue,
        real: real as usize,
        marker: ev as usize,
        enqueues,
        since: Instant::now(),
        completion: Mutex::new(Some(c)),
    });
    watch(p.clone());
    let ud = Arc::into_raw(p.clone());
    // SAFETY: `ev` is the live marker; `on_marker` matches the event callback's signature and
    // takes back the reference `ud` holds.
    let st = unsafe {
        ffi::clSetEventCallback(
            ev,
            CL_COMPLETE,
            on_marker as *const c_void,
            ud as *mut c_void,
        )
    };
    if st != CL_SUCCESS {
        // SAFETY: the driver refused the callback, so `ud`'s reference is still ours.
        drop(unsafe { Arc::from_raw(ud) });
        unwatch(p.id);
        release(p.marker);
        return Ok(p.take());
    }
    Ok(None)
}

/// The marker's `CL_COMPLETE` callback, on the driver's thread.
unsafe extern "C" fn on_marker(_ev: Handle, status: i32, ud: *mut c_void) {
    // SAFETY: `ud` is the reference `finish` leaked for this callback, which fires once.
    let p = unsafe { Arc::from_raw(ud as *const Pending) };
    unwatch(p.id);
    if let Some(c) = p.take() {
        release(p.marker);
        if status >= 0 {
            answer(&p, c, CL_SUCCESS);
        } else {
            ask_the_driver(p, c);
        }
    }
}

/// A command before the marker failed. What clFinish answers then is the driver's to say:
/// ask it, off the driver's thread (the queue has run dry by now, so it returns at once).
fn ask_the_driver(p: Arc<Pending>, c: Completion) {
    tracing::debug!("a command before clFinish failed: the driver's clFinish answers");
    std::thread::spawn(move || {
        // SAFETY: the queue outlives its commands, and its client waits in this clFinish.
        let st = unsafe { ffi::clFinish(p.real as Handle) };
        answer(&p, c, st);
    });
}

/// Sends the reply as the ordinary path would (output, admission, deferred failures).
fn answer(p: &Pending, c: Completion, status: i32) {
    if status == CL_SUCCESS {
        p.session.queue_idle(p.queue, p.enqueues);
    }
    let request = p.queue.to_le_bytes();
    let s = Call::new(p.session);
    c.complete(|w| {
        w.i32(status);
        Ok(OpenCl::answer(
            &s,
            Op::clFinish as u16,
            false,
            Reader::new(&request),
            w,
            None,
            0,
        ))
    });
}

/// How often the watch looks at markers, and how old a marker must be before it does.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The finishes whose markers have not called back, for the watch.
fn watched() -> &'static Mutex<HashMap<u64, Arc<Pending>>> {
    static W: OnceLock<Mutex<HashMap<u64, Arc<Pending>>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

fn unwatch(id: u64) {
    watched()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
}

/// Some drivers never call a marker back once a command before it failed (PoCL 3.1, after a
/// user event set to an error): the watch, a thread that runs while finishes are pending,
/// answers those from the marker's status, so that no clFinish waits forever.
fn watch(p: Arc<Pending>) {
    static WATCH: OnceLock<std::thread::Thread> = OnceLock::new();
    watched()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(p.id, p);
    let t = WATCH.get_or_init(|| {
        std::thread::Builder::new()
            .name("finish-watch".into())
            .spawn(run_watch)
            .expect("a thread for the finish watch")
            .thread()
            .clone()
    });
    t.unpark();
}

fn run_watch() {
    loop {
        if watched()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            std::thread::park();
            continue;
        }
        std::thread::sleep(WATCH_EVERY);
        let old: Vec<Arc<Pending>> = watched()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|p| p.since.elapsed() >= WATCH_EVERY)
            .cloned()
            .collect();
        for p in old {
            // The marker is queried under the completion's lock: whoever takes the completion
            // releases the marker, so it is live while the slot is still full.
            let taken = {
                let mut slot = p.completion.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    None
                } else {
                    let mut st: i32 = 1;
                    // SAFETY: the marker is live (above); `st` receives one cl_int.
                    let got = unsafe {
                        ffi::clGetEventInfo(
                            p.marker as Handle,
                            wormhole_opencl_proto::cl::CL_EVENT_COMMAND_EXECUTION_STATUS,
                            std::mem::size_of::<i32>(),
                            &mut st as *mut i32 as *mut c_void,
                            std::ptr::null_mut(),
                        )
                    };
                    // Still queued or running: its callback may come yet.
                    if got == CL_SUCCESS && st <= CL_COMPLETE {
                        slot.take().map(|c| (c, st))
                    } else {
                        None
                    }
                }
            };
            let Some((c, st)) = taken else { continue };
            unwatch(p.id);
            if st < 0 {
                tracing::warn!(
                    status = st,
                    "a clFinish marker failed without calling back: answering from its status"
                );
            }
            release(p.marker);
            if st >= 0 {
                answer(&p, c, CL_SUCCESS);
            } else {
                ask_the_driver(p, c);
            }
        }
    }
}
