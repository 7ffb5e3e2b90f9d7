//! A standby worker's warm context: the primary context of the tenant's first device, made
//! before any session comes, so that a program's first CUDA call does not wait for its
//! creation (the config's `warm_device`). The program must not see it:
//! - until the program retains that primary context itself, its state reads as a fresh
//!   process's (inactive, no flags);
//! - a flag change, reset or release of it finds it as the program left it: the worker's
//!   reference goes first (with it, the context; the program's flags then apply at its own
//!   creation, as natively);
//! - once the program has retained it, the worker's reference goes, so the program's last
//!   release ends the context as natively, and its allocations with it (`contexts`).

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
/// across the driver calls that change it, so that a retain and a state query on two lanes
/// see one order.
static WARM: Mutex<Option<i32>> = Mutex::new(None);

fn warm() -> MutexGuard<'static, Option<i32>> {
    WARM.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes the warm context: the primary context of the first device the session's tenant may
/// use (nothing where it may use none).
pub fn make(s: &Session) {
    let Some(&dev) = crate::rt::visible_devices(s).first() else {
        return;
    };
    make_on(&Driver, &mut warm(), dev);
}

fn make_on(d: &dyn PrimaryContexts, held: &mut Option<i32>, dev: i32) {
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

/// The worker's reference to `dev`'s primary context goes (the context with it, unless the
/// program holds one too).
fn let_go(d: &dyn PrimaryContexts, held: &mut Option<i32>, dev: i32) {
    if *held == Some(dev) {
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
}

/// Before the program changes, resets or releases `dev`'s primary context: the warm
/// reference goes first, so that the driver answers as it would the program alone.
pub fn before_primary_change(dev: i32) {
    let_go(&Driver, &mut warm(), dev);
}

/// The program retains `dev`'s primary context (`retain`, the driver's call); once it holds
/// it, the warm reference goes.
fn retained_by_program(
    d: &dyn PrimaryContexts,
    held: &mut Option<i32>,
    dev: i32,
    retain: impl FnOnce() -> i32,
) -> i32 {
    let st = retain();
    if st == CUDA_SUCCESS {
        let_go(d, held, dev);
    }
    st
}

/// `cuDevicePrimaryCtxRetain`.
pub fn cuDevicePrimaryCtxRetain(
    s: &Call<'_>,
    a: args::cuDevicePrimaryCtxRetain,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let dev = match crate::rt::driver_device(s, a.dev) {
        Ok(dev) => dev,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let mut ctx: Handle = std::ptr::null_mut();
    let out = crate::rt::out_ptr(a.pctx_present, &mut ctx);
    let st = retained_by_program(&Driver, &mut warm(), dev, || {
        // SAFETY: an output for one context (or NULL, as asked) and a device of the driver's.
        unsafe { ffi::cuDevicePrimaryCtxRetain(out, dev) }
    });
    w.i32(st);
    if st == CUDA_SUCCESS && a.pctx_present {
        s.export_list(w, HandleKind::Context, &[ctx]);
    }
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
    let held = warm();
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
        let mut held = None;
        make_on(&d, &mut held, 0);
        assert_eq!((held, d.of(0)), (Some(0), 1), "made in advance");
        let st = retained_by_program(&d, &mut held, 0, || d.retain(0));
        assert_eq!(st, CUDA_SUCCESS);
        assert_eq!((held, d.of(0)), (None, 1), "the program's reference alone");
        // Its release ends the context, as natively; a second retain is the program's own.
        assert_eq!(d.release(0), CUDA_SUCCESS);
        assert_eq!(d.of(0), 0);
        retained_by_program(&d, &mut held, 0, || d.retain(0));
        assert_eq!(d.of(0), 1, "nothing of the worker's is left to let go");
    }

    #[test]
    fn a_failed_retain_or_another_device_keeps_the_warm_one() {
        let d = Counts::default();
        let mut held = None;
        make_on(&d, &mut held, 0);
        assert_eq!(
            retained_by_program(&d, &mut held, 0, || CUDA_ERROR_INVALID_DEVICE),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!((held, d.of(0)), (Some(0), 1));
        retained_by_program(&d, &mut held, 1, || d.retain(1));
        assert_eq!((held, d.of(0), d.of(1)), (Some(0), 1, 1));
    }

    #[test]
    fn a_change_before_the_programs_retain_finds_no_context() {
        let d = Counts::default();
        let mut held = None;
        make_on(&d, &mut held, 0);
        let_go(&d, &mut held, 0);
        assert_eq!(
            (held, d.of(0)),
            (None, 0),
            "gone before the program's reset or flags"
        );
        // A release the program never retained for is the driver's error, as natively.
        let_go(&d, &mut held, 0);
        assert_eq!(d.release(0), CUDA_ERROR_INVALID_CONTEXT);
    }
}
