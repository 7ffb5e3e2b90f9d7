//! Which OpenCL requests are synchronisation points for the device's output (a kernel's
//! `printf`, which PoCL writes when the kernel's command ends): when one of them returns to
//! the application, the output of the commands it waited for must be on the application's
//! stdout, as natively. The core sends it (`wormhole_server::output`); the backend says when.

use std::sync::atomic::{AtomicU64, Ordering};
use wormhole_opencl_proto::cl::{CL_COMPLETE, CL_EVENT_COMMAND_EXECUTION_STATUS};
use wormhole_opencl_proto::{control, Op, Reader};

/// The last event a status query found complete and drained the output for: querying it again
/// can reveal no output that was not sent then (what it waited for had ended), so a loop that
/// polls a finished event pays no system call per query.
static DRAINED_EVENT: AtomicU64 = AtomicU64::new(0);

/// Whether a request `opcode` (its body `request`), answered with `reply`, returns to the
/// application after waiting for the device.
pub fn waited(opcode: u16, request: Reader<'_>, reply: &[u8]) -> bool {
    if opcode == control::DIRECT {
        // The client copies a windowed buffer itself once the worker has waited as a blocking
        // transfer would.
        return true;
    }
    let Some(op) = Op::from_u16(opcode) else {
        return false;
    };
    let mut r = request;
    match op {
        Op::clFinish | Op::clWaitForEvents => true,
        Op::clGetEventInfo => complete_status(&mut r, reply),
        // Reads, writes and maps name (queue, object, blocking ...).
        Op::clEnqueueReadBuffer
        | Op::clEnqueueWriteBuffer
        | Op::clEnqueueReadBufferRect
        | Op::clEnqueueWriteBufferRect
        | Op::clEnqueueReadImage
        | Op::clEnqueueWriteImage
        | Op::clEnqueueMapBuffer
        | Op::clEnqueueMapImage => blocking(r.u64().and_then(|_| r.u64()).and_then(|_| r.u32())),
        // SVM copies and maps name (queue, blocking ...).
        Op::clEnqueueSVMMemcpy | Op::clEnqueueSVMMap => blocking(r.u64().and_then(|_| r.u32())),
        _ => false,
    }
}

/// A request's blocking flag, as read (a truncated request was refused: it waited for nothing).
fn blocking(flag: Result<u32, wormhole_opencl_proto::DecodeError>) -> bool {
    matches!(flag, Ok(b) if b != 0)
}

/// A status query (event id, param) that found its event ended (complete, or failed), unless
/// it is the event the last such query drained for.
fn complete_status(r: &mut Reader<'_>, reply: &[u8]) -> bool {
    let (Ok(event), Ok(CL_EVENT_COMMAND_EXECUTION_STATUS)) = (r.u64(), r.u32()) else {
        return false;
    };
    // Reply: status, the value as a byte string (u64 length, an i32), the reported size.
    let mut reply = Reader::new(reply);
    let ended = matches!(
        (reply.i32(), reply.bytes()),
        (Ok(0), Ok(v)) if v.len() == 4 && i32::from_le_bytes([v[0], v[1], v[2], v[3]]) <= CL_COMPLETE
    );
    ended && DRAINED_EVENT.swap(event, Ordering::Relaxed) != event
}

#[cfg(test)]
mod tests {
    use super::*;
    use wormhole_opencl_proto::Writer;

    const CL_RUNNING: i32 = 1;

    fn body(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new(0);
        f(&mut w);
        w.body().to_vec()
    }

    fn status_query(event: u64, param: u32) -> Vec<u8> {
        body(|w| {
            w.u64(event);
            w.u32(param);
        })
    }

    fn status_reply(status: i32) -> Vec<u8> {
        body(|w| {
            w.i32(0);
            w.bytes(&status.to_le_bytes());
            w.u64(4);
        })
    }

    /// Waits are synchronisation points, and blocking transfers; their non-blocking forms,
    /// and calls that do not wait, are not. A finished event's status drains once.
    #[test]
    fn synchronisation_points() {
        let none = [];
        assert!(waited(Op::clFinish as u16, Reader::new(&[1; 8]), &none));
        assert!(waited(Op::clWaitForEvents as u16, Reader::new(&[]), &none));
        assert!(waited(control::DIRECT, Reader::new(&[]), &none));
        assert!(!waited(Op::clFlush as u16, Reader::new(&[1; 8]), &none));
        assert!(!waited(
            Op::clEnqueueNDRangeKernel as u16,
            Reader::new(&[]),
            &none
        ));
        assert!(!waited(0xFFFF, Reader::new(&[]), &none));
        for (op, blocking) in [(Op::clEnqueueReadBuffer, 1u32), (Op::clEnqueueMapImage, 1)] {
            let req = body(|w| {
                w.u64(1);
                w.u64(2);
                w.u32(blocking);
                w.u64(0);
            });
            assert!(waited(op as u16, Reader::new(&req), &none));
            let req = body(|w| {
                w.u64(1);
                w.u64(2);
                w.u32(0);
                w.u64(0);
            });
            assert!(!waited(op as u16, Reader::new(&req), &none));
        }
        let svm = |blocking: u32| {
            body(|w| {
                w.u64(1);
                w.u32(blocking);
                w.u8(0);
            })
        };
        assert!(waited(
            Op::clEnqueueSVMMemcpy as u16,
            Reader::new(&svm(1)),
            &none
        ));
        assert!(!waited(
            Op::clEnqueueSVMMap as u16,
            Reader::new(&svm(0)),
            &none
        ));
        // A truncated request is no synchronisation point (the handler has refused it).
        assert!(!waited(
            Op::clEnqueueWriteBuffer as u16,
            Reader::new(&[1; 10]),
            &none
        ));

        let info = Op::clGetEventInfo as u16;
        let q = status_query(77, CL_EVENT_COMMAND_EXECUTION_STATUS);
        assert!(!waited(info, Reader::new(&q), &status_reply(CL_RUNNING)));
        assert!(waited(info, Reader::new(&q), &status_reply(CL_COMPLETE)));
        // The same finished event again: nothing new to wait for.
        assert!(!waited(info, Reader::new(&q), &status_reply(CL_COMPLETE)));
        // A failed command has ended too.
        let q2 = status_query(78, CL_EVENT_COMMAND_EXECUTION_STATUS);
        assert!(waited(info, Reader::new(&q2), &status_reply(-5)));
        assert!(waited(info, Reader::new(&q), &status_reply(CL_COMPLETE)));
        // Other event queries, and failed queries, wait for nothing.
        let other = status_query(79, 0x11D0);
        assert!(!waited(
            info,
            Reader::new(&other),
            &status_reply(CL_COMPLETE)
        ));
        let failed = body(|w| w.i32(-58));
        let q3 = status_query(80, CL_EVENT_COMMAND_EXECUTION_STATUS);
        assert!(!waited(info, Reader::new(&q3), &failed));
    }
}
