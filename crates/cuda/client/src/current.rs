//! The calling thread's current context, known in the client. cudart asks for it on nearly
//! every runtime call (and the export tables on the program's behalf): answered from here, the
//! question costs no round trip, and a launch behind it stays unwaited. The client learns it
//! from the calls that set it (`cuCtxSetCurrent`, `cuCtxPushCurrent`, `cuCtxCreate`); after
//! those that leave it to the driver (`cuCtxPopCurrent`, a context destroyed or reset, a
//! primary context released) it asks the server once.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bumped whenever a context may have gone: every thread's cached answer is then stale (a
/// context current to one thread can be destroyed by another).
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (generation, context) of this thread's last known answer.
    static CURRENT: Cell<Option<(u64, usize)>> = const { Cell::new(None) };
}

/// This thread's current context (NULL: none), if the client knows it.
pub fn known() -> Option<*mut c_void> {
    let generation = GENERATION.load(Ordering::Acquire);
    CURRENT.with(|c| match c.get() {
        Some((g, ctx)) if g == generation => Some(ctx as *mut c_void),
        _ => None,
    })
}

/// This thread's current context is now `ctx` (NULL: none).
pub fn set(ctx: *mut c_void) {
    let generation = GENERATION.load(Ordering::Acquire);
    CURRENT.with(|c| c.set(Some((generation, ctx as usize))));
}

/// This thread's current context is the driver's to say (asked on next use).
pub fn forget() {
    CURRENT.with(|c| c.set(None));
}

/// This thread took a lane that a thread now ended used: the worker's thread behind that lane
/// still has the ended thread's contexts current, which natively a new thread does not have.
/// It drops them (`threads::FRESH`, ahead of this thread's first call on the lane, sent
/// without waiting, so on this lane and no other), and the client knows none is current.
pub fn lane_reused() {
    let w = wormhole_cuda_proto::Writer::new(wormhole_cuda_proto::threads::FRESH);
    if crate::rt::call_async(w).is_ok() {
        set(std::ptr::null_mut());
    }
}

/// A context may have gone or changed: every thread asks again.
pub fn contexts_changed() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// How many times contexts may have gone or changed: what the client learnt of a context
/// under an older generation may be stale (see `context_facts`).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Held by the tests that bump or read the generation: they run in parallel, in one process.
#[cfg(test)]
pub static GENERATION_TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_holds_until_a_context_may_have_changed() {
        let _serial = GENERATION_TEST_LOCK.lock();
        assert_eq!(known(), None, "unknown until learnt");
        let ctx = 0x1000 as *mut c_void;
        set(ctx);
        assert_eq!(known(), Some(ctx));
        std::thread::spawn(|| assert_eq!(known(), None, "per thread"))
            .join()
            .unwrap();
        contexts_changed();
        assert_eq!(known(), None, "stale after a context went");
        set(std::ptr::null_mut());
        assert_eq!(
            known(),
            Some(std::ptr::null_mut()),
            "none current is an answer too"
        );
        forget();
        assert_eq!(known(), None);
    }
}
