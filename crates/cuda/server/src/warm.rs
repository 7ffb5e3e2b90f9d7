//! A standby worker's warm context: the primary context of the tenant's GPU, made before any
//! session comes, so that a program's first CUDA call does not wait for its creation (the
//! config's `warm_device`). Only where the tenant sees one GPU, in the default compute mode (an
//! exclusive-process GPU takes one process's context: an idle standby would lock every other
//! process out). The program must not see it:
//! - until the program retains that primary context itself, its state reads as a fresh
//!   process's (inactive, no flags);
//! - a flag change, reset or release of it finds it as the program left it: the worker's
//!   reference goes first (with it, the context; the program's flags then apply at its own
//!   creation, as natively);
//! - once the program has made or retained any context, the worker's reference goes, so the
//!   program's last release ends the context as natively, and its allocations with it
//!   (`contexts`), and no context the program does not use stays behind.

// Handlers keep the C names of the entry points they answer.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::{Call, Handle, Session};
use std::sync::{Mutex, MutexGuard};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{DecodeError, HandleKind, Writer};

/// What the warm context needs of the driver (a trait so that its bookkeeping is tested
/// without one).
trait PrimaryContexts {
    fn retain(&self, dev: i32) -> i32;
    fn release(&self, dev: i32) -> i32;
}

struct Driver;

impl PrimaryContexts for Driver {
    fn retain(&self, dev: i32) -> i32 {
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: a valid output pointer and a device of the driver's.
        unsafe { ffi::cuDevicePrimaryCtxRetain(&mut ctx, dev) }
    }

    fn release(&self, dev: i32) -> i32 {
        // SAFETY: a device of the driver's whose primary context the worker retained.
        unsafe { ffi::cuDevicePrimaryCtxRelease_v2(dev) }
    }
}

/// The driver's device whose primary context the worker holds a reference to, if any. Held
/// across the driver calls on that device's primary context, so that a retain and a state
/// query on two lanes see one order.
type Warm = Mutex<Option<i32>>;

static WARM: Warm = Mutex::new(None);

fn lock(w: &Warm) -> MutexGuard<'_, Option<i32>> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE` and its `CU_COMPUTEMODE_DEFAULT`.
const ATTRIBUTE_COMPUTE_MODE: i32 = 20;
const COMPUTE_MODE_DEFAULT: u32 = 0;

/// Makes the warm context, where the tenant may use exactly one GPU and that GPU lets several
/// processes make contexts.
pub fn make(s: &Session) {
    let &[dev] = crate::rt::visible_devices(s) else {
        tracing::debug!("no warm context: the tenant may use other than one GPU");
        return;
    };
    let mut mode = u32::MAX;
    // SAFETY: a valid output pointer and a device of the driver's.
    let st = unsafe { ffi::cuDeviceGetAttribute(&mut mode, ATTRIBUTE_COMPUTE_MODE, dev) };
    if st != CUDA_SUCCESS || mode != COMPUTE_MODE_DEFAULT {
        tracing::info!(
            device = dev,
            mode,
            "no warm context: the GPU is not in the default compute mode"
        );
        return;
    }
    make_on(&Driver, &WARM, dev);
}

fn make_on(d: &dyn PrimaryContexts, warm: &Warm, dev: i32) {
    let mut held = lock(warm);
    let started = std::time::Instant::now();
    match d.retain(dev) {
        CUDA_SUCCESS => {
            *held = Some(dev);
            tracing::info!(
                device = dev,
                ms = started.elapsed().as_millis() as u64,
                "a warm context waits for the session (its primary context, made in advance)"
            );
        }
        st => tracing::warn!(
            device = dev,
            status = st,
            "no warm context: the driver would not make the primary context"
        ),
    }
}

/// The worker's reference goes (with it the context, unless the program holds one too);
/// `only` limits that to one device's.
fn let_go(d: &dyn PrimaryContexts, held: &mut Option<i32>, only: Option<i32>) {
    let Some(dev) = *held else { return };
    if only.is_some_and(|o| o != dev) {
        return;
    }
    *held = None;
    let st = d.release(dev);
    if st != CUDA_SUCCESS {
        tracing::warn!(
            device = dev,
            status = st,
            "releasing the warm context failed"
        );
    }
}

/// Before the program changes, resets or releases `dev`'s primary context: the warm
/// reference goes first, so that the driver answers as it would the program alone.
pub fn before_primary_change(dev: i32) {
    let_go(&Driver, &mut lock(&WARM), Some(dev));
}

/// The program makes or retains a context (`make`, the driver's call); once it has one, the
/// warm reference goes. `primary_of`: the device whose primary context the call retains, if
/// it does. The lock is held across the driver's call only where that is the warm context (a
/// state query must not see it in between); a context made elsewhere takes its time without
/// holding up the other lanes.
fn made_by_program(
    d: &dyn PrimaryContexts,
    warm: &Warm,
    primary_of: Option<i32>,
    make: impl FnOnce() -> i32,
) -> i32 {
    let mut held = lock(warm);
    if primary_of.is_some() && *held == primary_of {
        let st = make();
        if st == CUDA_SUCCESS {
            let_go(d, &mut held, None);
        }
        return st;
    }
    drop(held);
    let st = make();
    if st == CUDA_SUCCESS {
        let_go(d, &mut lock(warm), None);
    }
    st
}

/// A context the program makes (`make` given the driver's device and where the context goes)
/// on its device `devno`, answered as the generated handlers answer: the status, then the
/// context's id if one was asked for. `primary`: the device's primary context, which may be
/// the warm one (the lock is then held across the driver's call).
fn program_context(
    s: &Call<'_>,
    w: &mut Writer,
    devno: i32,
    present: bool,
    primary: bool,
    make: impl FnOnce(i32, *mut Handle) -> i32,
) {
    let dev = match crate::rt::driver_device(s, devno) {
        Ok(dev) => dev,
        Err(st) => return w.i32(st),
    };
    let mut ctx: Handle = std::ptr::null_mut();
    let out = crate::rt::out_ptr(present, &mut ctx);
    let st = made_by_program(&Driver, &WARM, primary.then_some(dev), || make(dev, out));
    w.i32(st);
    if st == CUDA_SUCCESS && present {
        s.export_list(w, HandleKind::Context, &[ctx]);
    }
}

/// `cuDevicePrimaryCtxRetain`.
pub fn cuDevicePrimaryCtxRetain(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxRetain,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    program_context(s, w, a.dev, a.pctx_present, true, |dev, out| {
        // SAFETY: an output for one context (or NULL, as asked) and a device of the driver's.
        unsafe { ffi::cuDevicePrimaryCtxRetain(out, dev) }
    });
    Ok(())
}

/// `cuCtxCreate_v2`: a context of the program's own; the warm one is not needed then.
pub fn cuCtxCreate_v2(
    s: &Call<'_>,
    a: args::cuCtxCreate_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    program_context(s, w, a.dev, a.pctx_present, false, |dev, out| {
        // SAFETY: an output for one context (or NULL, as asked) and a device of the driver's.
        unsafe { ffi::cuCtxCreate_v2(out, a.flags, dev) }
    });
    Ok(())
}

/// `cuDevicePrimaryCtxGetState`: while only the worker holds the context, a fresh process's
/// answer (no flags, inactive).
pub fn cuDevicePrimaryCtxGetState(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxGetState,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let dev = match crate::rt::driver_device(s, a.dev) {
        Ok(dev) => dev,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let held = lock(&WARM);
    let (mut flags, mut active) = (0u32, 0u32);
    let st = if *held == Some(dev) && a.flags_present && a.active_present {
        CUDA_SUCCESS
    } else {
        // SAFETY: outputs where asked for (NULL otherwise: the driver's own answer to that)
        // and a device of the driver's.
        unsafe {
            ffi::cuDevicePrimaryCtxGetState(
                dev,
                crate::rt::out_ptr(a.flags_present, &mut flags),
                crate::rt::out_ptr(a.active_present, &mut active),
            )
        }
    };
    drop(held);
    w.i32(st);
    if st == CUDA_SUCCESS {
        if a.flags_present {
            w.u32(flags);
        }
        if a.active_present {
            w.u32(active);
        }
    }
    Ok(())
}

/// The flag changes: the warm reference goes first, so the program's flags apply when its own
/// retain makes the context, as natively (the first version refuses an active context).
macro_rules! set_flags {
    ($($name:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`.")]
        pub fn $name(s: &Call<'_>, a: args::$name, w: &mut Writer) -> Result<(), DecodeError> {
            let st = crate::rt::driver_device(s, a.dev).and_then(|dev| {
                before_primary_change(dev);
                // SAFETY: a device of the driver's.
                crate::rt::status(unsafe { ffi::$name(dev, a.flags) })
            });
            w.i32(st.err().unwrap_or(CUDA_SUCCESS));
            Ok(())
        }
    )*};
}

set_flags! {
    cuDevicePrimaryCtxSetFlags;
    cuDevicePrimaryCtxSetFlags_v2;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Reference counts per device, as the driver keeps them.
    #[derive(Default)]
    struct Counts(RefCell<std::collections::BTreeMap<i32, u32>>);

    impl PrimaryContexts for Counts {
        fn retain(&self, dev: i32) -> i32 {
            *self.0.borrow_mut().entry(dev).or_default() += 1;
            CUDA_SUCCESS
        }
        fn release(&self, dev: i32) -> i32 {
            match self.0.borrow_mut().get_mut(&dev) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    CUDA_SUCCESS
                }
                _ => CUDA_ERROR_INVALID_CONTEXT,
            }
        }
    }

    impl Counts {
        fn of(&self, dev: i32) -> u32 {
            self.0.borrow().get(&dev).copied().unwrap_or(0)
        }
    }

    #[test]
    fn the_programs_retain_leaves_it_the_only_reference() {
        let d = Counts::default();
        let warm = Mutex::new(None);
        make_on(&d, &warm, 0);
        assert_eq!((*lock(&warm), d.of(0)), (Some(0), 1), "made in advance");
        let st = made_by_program(&d, &warm, Some(0), || d.retain(0));
        assert_eq!(st, CUDA_SUCCESS);
        assert_eq!(
            (*lock(&warm), d.of(0)),
            (None, 1),
            "the program's reference alone"
        );
        // Its release ends the context, as natively; a second retain is the program's own.
        assert_eq!(d.release(0), CUDA_SUCCESS);
        assert_eq!(d.of(0), 0);
        made_by_program(&d, &warm, Some(0), || d.retain(0));
        assert_eq!(d.of(0), 1, "nothing of the worker's is left to let go");
    }

    #[test]
    fn a_failed_retain_keeps_the_warm_one_and_another_devices_lets_it_go() {
        let d = Counts::default();
        let warm = Mutex::new(None);
        make_on(&d, &warm, 0);
        assert_eq!(
            made_by_program(&d, &warm, Some(0), || CUDA_ERROR_INVALID_DEVICE),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!((*lock(&warm), d.of(0)), (Some(0), 1));
        // A program that works on another device (or makes a context of its own) has no use
        // for the warm one.
        made_by_program(&d, &warm, Some(1), || d.retain(1));
        assert_eq!((*lock(&warm), d.of(0), d.of(1)), (None, 0, 1));
    }

    #[test]
    fn a_change_before_the_programs_retain_finds_no_context() {
        let d = Counts::default();
        let warm = Mutex::new(None);
        make_on(&d, &warm, 0);
        let_go(&d, &mut lock(&warm), Some(1));
        assert_eq!(
            (*lock(&warm), d.of(0)),
            (Some(0), 1),
            "another device's change"
        );
        let_go(&d, &mut lock(&warm), Some(0));
        assert_eq!(
            (*lock(&warm), d.of(0)),
            (None, 0),
            "gone before the program's reset or flags"
        );
        // A release the program never retained for is the driver's error, as natively.
        let_go(&d, &mut lock(&warm), Some(0));
        assert_eq!(d.release(0), CUDA_ERROR_INVALID_CONTEXT);
    }
}
