//! Wormhole's CUDA backend: what a worker runs for a CUDA session. It owns the tenant's CUDA
//! objects (made by the system's real `libcuda.so.1`, never Wormhole's own), maps client
//! handles to real objects in the session's table, checks every device range against what
//! the session allocated, and answers each request through the generated decoders and
//! dispatch (`crates/apigen`), with hand-written handlers in `custom` for device memory. The
//! server core (`wormhole-server`) does everything that is not CUDA's own.

mod capture;
mod contexts;
mod custom;
mod driver;
mod export_tables;
mod host_functions;
mod jit;
mod links;
mod pinned;
mod rt;
mod session;
mod tensor_maps;
mod threads;
mod vmm;
mod warm;

/// The generated decoders and dispatch (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_parens,
    unused_imports,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/server_gen.rs"));
}

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::{DecodeError, FrameHeader, Op, Reader, Writer, FLAG_ASYNC};
use wormhole_server::backend::{DeviceInventory, Reply, SessionSetup};
use wormhole_server::deferred::SESSION;

/// The worker's one CUDA session.
fn session() -> &'static session::Session {
    static SESSION: OnceLock<session::Session> = OnceLock::new();
    SESSION.get_or_init(session::Session::default)
}

/// The CUDA backend.
pub struct Cuda;

/// The CUDA backend, for the server's list of APIs.
pub static CUDA: Cuda = Cuda;

/// Runs one request against `s` (the whole body in `r`), writing the reply body.
pub fn run(
    s: &session::Session,
    opcode: u16,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<i32, DecodeError> {
    if opcode == wormhole_cuda_proto::export_tables::OP {
        export_tables::handle(&session::Call(s), r, w)?;
        return Ok(w.status());
    }
    if opcode == wormhole_cuda_proto::host_functions::DONE {
        host_functions::done(r, w)?;
        return Ok(w.status());
    }
    if opcode == wormhole_cuda_proto::threads::FRESH {
        r.finish()?;
        w.i32(threads::fresh_thread());
        return Ok(w.status());
    }
    if let Some(done) = pinned::handle(&session::Call(s), opcode, r, w) {
        done?;
        return Ok(w.status());
    }
    let op = Op::from_u16(opcode).ok_or(DecodeError::UnknownOp(opcode))?;
    generated::dispatch(&session::Call(s), op, r, w)?;
    if op.is_sync() {
        // What the kernels waited for printed reaches the program before this reply.
        wormhole_server::output::drain();
    }
    // Every reply body begins with the call's CUresult.
    Ok(w.status())
}

/// The status request `h` answers once its handler wrote `status` into `w`: a failure of a
/// request the client did not wait for is kept, and answered by the next synchronisation
/// point that succeeds (in its place: the program learns of it there, once).
fn settle(s: &session::Session, h: &FrameHeader, status: i32, w: &mut Writer) -> i32 {
    if h.flags & FLAG_ASYNC != 0 {
        // A staged copy's piece says its failure in its signal, to its own copy alone.
        if status != CUDA_SUCCESS && h.opcode != wormhole_cuda_proto::pinned::PIECE {
            s.deferred.record(SESSION, status);
        }
        return status;
    }
    // The deferred failures' lock is taken only at synchronisation points (a synchronous copy
    // of page-locked memory is one, as the native copy is, and a staged copy to the host's
    // closing fence).
    let sync = match Op::from_u16(h.opcode) {
        Some(op) => op.is_sync(),
        None => matches!(
            h.opcode,
            wormhole_cuda_proto::pinned::COPY | wormhole_cuda_proto::pinned::FENCE_SYNC
        ),
    };
    if status != CUDA_SUCCESS || !sync || s.deferred.is_empty() {
        return status;
    }
    match s.deferred.take(&[]) {
        Some(failed) => {
            tracing::warn!(
                status = failed,
                "answering the failure of a request the client did not wait for at this synchronisation point"
            );
            w.replace_status(failed);
            failed
        }
        None => status,
    }
}

impl wormhole_server::Backend for Cuda {
    fn api(&self) -> &'static str {
        wormhole_cuda_proto::API
    }

    fn out_of_memory(&self) -> i32 {
        CUDA_ERROR_OUT_OF_MEMORY
    }

    fn installed(&self) -> Result<(), String> {
        // From files alone: the supervisor loads no driver.
        driver::LIBRARY.installed()
    }

    fn load(&self) -> Result<(), String> {
        driver::DRIVER.load().map_err(str::to_string)
    }

    fn warm_up(&self, limits: &std::sync::Arc<wormhole_server::worker::Limits>, device: bool) {
        // A driver that cannot be loaded is logged; the session that comes is refused.
        if driver::DRIVER.load().is_ok() && device {
            session().set_limits(limits.clone());
            warm::make(session());
        }
    }

    fn inventory(&self) -> Result<Vec<DeviceInventory>, String> {
        driver::DRIVER.load().map_err(str::to_string)?;
        let mut count = 0u32;
        // SAFETY: a valid output pointer.
        let st = unsafe { generated::ffi::cuDeviceGetCount(&mut count) };
        if st != CUDA_SUCCESS {
            return Err(format!("cuDeviceGetCount returned {st}"));
        }
        let mut version = 0u32;
        // SAFETY: a valid output pointer.
        unsafe { generated::ffi::cuDriverGetVersion(&mut version) };
        Ok((0..count as i32)
            .map(|dev| {
                let mut bytes = 0usize;
                // SAFETY: a valid output pointer.
                unsafe { generated::ffi::cuDeviceTotalMem_v2(&mut bytes, dev) };
                DeviceInventory {
                    name: rt::device_name(dev),
                    vendor: "NVIDIA Corporation".into(),
                    kind: "gpu".into(),
                    memory_bytes: bytes as u64,
                    version: format!("CUDA {}.{}", version / 1000, version % 1000 / 10),
                    platform: "CUDA".into(),
                }
            })
            .collect())
    }

    fn begin(&self, setup: SessionSetup) {
        session().set_limits(setup.limits);
        if let Some(arena) = setup.arena {
            pinned::enable(arena);
        }
        host_functions::CHANNEL.connect(setup.callbacks);
        if let Some(cache) = setup.build_cache {
            session().set_cache(cache);
        }
    }

    fn handle(
        &self,
        h: &FrameHeader,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<Reply, DecodeError> {
        let s = session();
        let status = run(s, h.opcode, r, w)?;
        Ok(Reply {
            status: settle(s, h, status, w),
            trailer: None,
        })
    }

    fn end(&self) {
        host_functions::end();
    }

    fn within_waited_call(&self, opcode: u16) -> bool {
        // A staged copy's pieces: its closing fence is waited for.
        opcode == wormhole_cuda_proto::pinned::PIECE
    }

    fn unordered(&self, opcode: u16) -> bool {
        // A host function's DONE releases a stream that later requests may be waiting on.
        opcode == wormhole_cuda_proto::host_functions::DONE
    }

    fn objects(&self) -> std::collections::BTreeMap<String, usize> {
        session()
            .object_counts()
            .into_iter()
            .map(|(k, n)| (format!("{k:?}").to_lowercase(), n))
            .collect()
    }

    fn mem_bytes(&self) -> i64 {
        session().mem_bytes.load(Ordering::Relaxed)
    }

    fn detail(&self) -> serde_json::Map<String, serde_json::Value> {
        let images = &custom::IMAGES;
        let mut m = serde_json::Map::new();
        for (what, tally) in [
            ("received", &images.received),
            ("from_cache", &images.from_cache),
        ] {
            let count = tally.count.load(Ordering::Relaxed);
            m.insert(format!("module_images_{what}"), count.into());
            let bytes = tally.bytes.load(Ordering::Relaxed);
            m.insert(format!("module_image_bytes_{what}"), bytes.into());
        }
        let asked = images.asked_for.load(Ordering::Relaxed);
        m.insert("module_images_asked_for".into(), asked.into());
        m
    }
}

/// Fuzzing entry (fuzz/fuzz_targets/cuda_request.rs): a request as a worker receives it, its
/// first two bytes the opcode, the rest the body, against a fresh session: decoding,
/// validation and handle and range checks must turn any input into a status or a clean
/// "malformed" verdict, never a crash.
pub fn fuzz_request(data: &[u8]) {
    let Some((op, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let op = u16::from_le_bytes(*op);
    let s = session::Session::default();
    let mut w = Writer::new(op);
    let _ = run(&s, op, &mut Reader::new(body), &mut w);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(op: Op, flags: u8) -> FrameHeader {
        header_of(op as u16, flags)
    }

    fn header_of(opcode: u16, flags: u8) -> FrameHeader {
        let mut w = Writer::new(opcode);
        w.i32(0);
        let frame = w.finish(flags, 7).unwrap();
        FrameHeader::decode(frame[..wormhole_cuda_proto::HEADER_LEN].try_into().unwrap()).unwrap()
    }

    fn reply(status: i32) -> Writer {
        let mut w = Writer::new(0);
        w.i32(status);
        w
    }

    /// A launch the client did not wait for fails in the driver: the next synchronisation
    /// point answers that failure (once); calls that are not synchronisation points do not.
    #[test]
    fn a_failure_nobody_waited_for_is_answered_at_the_next_synchronisation_point() {
        let s = session::Session::default();
        let launch = header(Op::cuLaunchKernel, FLAG_ASYNC);
        assert_eq!(
            settle(
                &s,
                &launch,
                CUDA_ERROR_INVALID_VALUE,
                &mut reply(CUDA_ERROR_INVALID_VALUE)
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        let query = header(Op::cuStreamQuery, 0);
        assert_eq!(
            settle(&s, &query, CUDA_SUCCESS, &mut reply(0)),
            CUDA_SUCCESS
        );
        let sync = header(Op::cuStreamSynchronize, 0);
        let mut w = reply(CUDA_SUCCESS);
        assert_eq!(
            settle(&s, &sync, CUDA_SUCCESS, &mut w),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(w.status(), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(settle(&s, &sync, CUDA_SUCCESS, &mut reply(0)), CUDA_SUCCESS);
    }

    /// A staged copy's pieces go without waiting: their failures are their copy's, and a
    /// fence is a synchronisation point only where the copy is.
    #[test]
    fn a_staged_copys_pieces_fail_their_copy_alone() {
        use wormhole_cuda_proto::pinned;
        let s = session::Session::default();
        let failed = CUDA_ERROR_INVALID_VALUE;
        let ok = CUDA_SUCCESS;
        // A piece's failure is its copy's (said in its signal), no synchronisation point's.
        let piece = header_of(pinned::PIECE, FLAG_ASYNC);
        assert_eq!(settle(&s, &piece, failed, &mut reply(failed)), failed);
        let fence_sync = header_of(pinned::FENCE_SYNC, 0);
        assert_eq!(settle(&s, &fence_sync, ok, &mut reply(0)), ok);
        // A failure nobody waited for: the synchronising fence answers it, the plain one not.
        let copy = header_of(pinned::COPY, FLAG_ASYNC);
        assert_eq!(settle(&s, &copy, failed, &mut reply(failed)), failed);
        let fence = header_of(pinned::FENCE, 0);
        assert_eq!(settle(&s, &fence, ok, &mut reply(0)), ok);
        assert_eq!(settle(&s, &fence_sync, ok, &mut reply(0)), failed);
        assert_eq!(settle(&s, &fence_sync, ok, &mut reply(0)), ok);
        // Both fences are requests of their own on the lane (no other request's opcode).
        for op in [pinned::FENCE, pinned::FENCE_SYNC] {
            let mut w = Writer::new(0);
            assert_eq!(run(&s, op, &mut Reader::new(&[]), &mut w), Ok(ok));
        }
    }

    #[test]
    fn launches_copies_to_the_device_and_memsets_are_not_waited_for() {
        for op in [
            Op::cuMemcpyHtoD_v2,
            Op::cuMemsetD8_v2,
            Op::cuMemsetD32_v2,
            Op::cuEventRecord,
            Op::cuStreamWaitEvent,
        ] {
            assert!(!op.is_sync(), "{op:?}");
        }
        assert!(Op::cuStreamSynchronize.is_sync() && Op::cuMemcpyDtoH_v2.is_sync());
    }
}
