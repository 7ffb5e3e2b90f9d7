//! Wormhole's OpenCL backend: what a worker runs for an OpenCL session. It owns the tenant's
//! OpenCL objects (reached through the system ICD loader, never through Wormhole's own ICD),
//! maps client handles to real objects in the session's table, and answers each request: the
//! generated decoders and dispatch (`crates/apigen`) for most entry points, the hand-written
//! handlers in `custom` for those with semantics of their own. The server core
//! (`wormhole-server`) does everything that is not OpenCL's own.

mod admission;
mod arena;
mod callbacks;
mod custom;
mod deferred;
mod driver;
pub mod includes;
mod info;
mod later;
mod output;
pub mod program_cache;
mod props;
mod rt;
mod session;
mod staging;
pub mod vendors;

/// The generated decoders and dispatch (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_parens,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/server_gen.rs"));
}

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use wormhole_opencl_proto::cl::CL_SUCCESS;
use wormhole_opencl_proto::{control, DecodeError, FrameHeader, Op, Reader, Writer, FLAG_ASYNC};
use wormhole_server::backend::{Completion, Reply, SessionSetup, StreamError, Streamed};

/// The worker's one OpenCL session.
pub(crate) fn session() -> &'static session::Session {
    static SESSION: OnceLock<session::Session> = OnceLock::new();
    SESSION.get_or_init(session::Session::default)
}

/// The OpenCL backend.
pub struct OpenCl;

/// The OpenCL backend, for the server's list of APIs.
pub static OPENCL: OpenCl = OpenCl;

impl OpenCl {
    /// Runs one request against session `s`; the trailer the handler left (bulk data of a
    /// mapped read) comes back explicitly with the reply.
    fn run(
        session: &session::Session,
        opcode: u16,
        asynchronous: bool,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<Reply, DecodeError> {
        // The request as it arrived, for what deferred errors need of it after the handler
        // has consumed it (a copy of the reader: no bytes are copied).
        let request = r.clone();
        let s = &session::Call::new(session);
        let op = Op::from_u16(opcode);
        // The tenant's limit of queued commands: one relaxed load when there is none.
        let limit = session.limits().max_queued();
        let enqueues = op.is_some_and(|op| op.name().starts_with("clEnqueue"));
        if enqueues {
            // Before the command is queued: no queue is known idle past this point.
            session.enqueues.fetch_add(1, Ordering::AcqRel);
        }
        let enqueue_on = match op {
            Some(_) if limit > 0 && enqueues => {
                // Every enqueue request begins with its queue's id.
                let queue = request.clone().u64().unwrap_or(0);
                session.admission.before(queue, limit);
                Some(queue)
            }
            _ => None,
        };
        // A queue the application finished is idle until the next enqueue (`arena::direct`).
        let finishing = (op == Some(Op::clFinish)).then(|| {
            let queue = request.clone().u64().unwrap_or(0);
            (queue, session.enqueues.load(Ordering::Acquire))
        });
        match opcode {
            control::COLLECT => custom::collect(s, r, w),
            control::STAGE => custom::stage(s, r, w),
            control::INCLUDES => custom::includes(s, r, w),
            control::SVM_PUSH => custom::svm_push(s, r, w),
            control::SVM_PULL => custom::svm_pull(s, r, w),
            control::DIRECT => arena::direct(s, r, w),
            other => match op {
                Some(op) => generated::dispatch(s, op, r, w),
                None => Err(DecodeError::UnknownOp(other)),
            },
        }?;
        if let Some((queue, enqueues)) = finishing {
            if w.body().get(..4) == Some(&CL_SUCCESS.to_le_bytes()[..]) {
                session.queue_idle(queue, enqueues);
            }
        }
        Ok(Self::answer(
            s,
            opcode,
            asynchronous,
            request,
            w,
            enqueue_on,
            limit,
        ))
    }

    /// What every request's reply gets once its handler wrote the body: what the device
    /// printed before a synchronisation point, the admission limit's bookkeeping, and the
    /// failures of pipelined calls, reported at the synchronisation point that covers them.
    /// `request` is the request's body as it arrived.
    fn answer(
        s: &session::Call<'_>,
        opcode: u16,
        asynchronous: bool,
        request: Reader<'_>,
        w: &mut Writer,
        enqueue_on: Option<u64>,
        limit: u64,
    ) -> Reply {
        let op = Op::from_u16(opcode);
        if !asynchronous && output::waited(opcode, request.clone(), w.body()) {
            // What the kernels waited for printed reaches the application before this reply.
            wormhole_server::output::drain();
        }
        // Every reply body begins with the call's cl_int status.
        let mut status = w.status();
        if status == CL_SUCCESS {
            Self::admitted(s, op, enqueue_on, limit, &request);
        }
        if asynchronous && status != CL_SUCCESS {
            let first = request.clone().u64().unwrap_or(0);
            s.deferred.record(deferred::key(opcode, first), status);
        } else if status == CL_SUCCESS && !s.deferred.is_empty() {
            // Only a synchronisation point with failures to report looks at what it names (a
            // clWaitForEvents asks the driver for each event's queue).
            let keys = match Op::from_u16(opcode) {
                Some(Op::clFinish) => Some(vec![request.clone().u64().unwrap_or(0)]),
                Some(Op::clWaitForEvents) => Some(deferred::event_queues(s, request)),
                _ => None,
            };
            if let Some(failed) = keys.and_then(|k| s.deferred.take(&k)) {
                tracing::warn!(
                    status = failed,
                    "reporting the failure of a pipelined call at this synchronisation point"
                );
                w.replace_status(failed);
                status = failed;
            }
        }
        Reply {
            status,
            trailer: s.take_trailer(),
        }
    }
}

impl OpenCl {
    /// The admission limit's bookkeeping after a call that succeeded.
    fn admitted(
        s: &session::Session,
        op: Option<Op>,
        enqueue_on: Option<u64>,
        limit: u64,
        request: &Reader<'_>,
    ) {
        use wormhole_opencl_proto::HandleKind;
        if let Some(queue) = enqueue_on {
            if let Ok(real) = s.resolve(queue, HandleKind::Queue, false) {
                s.admission.after(queue, real, limit);
            }
            return;
        }
        match op {
            Some(Op::clFinish) => s.admission.finished(request.clone().u64().unwrap_or(0)),
            Some(Op::clReleaseCommandQueue) => {
                let queue = request.clone().u64().unwrap_or(0);
                if s.resolve(queue, HandleKind::Queue, false).is_err() {
                    s.admission.forget(queue);
                }
            }
            Some(Op::clCreateUserEvent) => s.admission.user_event(),
            _ => {}
        }
    }
}

impl wormhole_server::Backend for OpenCl {
    fn api(&self) -> &'static str {
        wormhole_opencl_proto::API
    }

    fn out_of_memory(&self) -> i32 {
        wormhole_opencl_proto::cl::CL_OUT_OF_HOST_MEMORY
    }

    fn worker_env(
        &self,
        runtime_dir: &std::path::Path,
    ) -> std::io::Result<Vec<(std::ffi::OsString, std::ffi::OsString)>> {
        let vendors = vendors::filtered_vendor_dir(runtime_dir)?;
        Ok(vec![("OCL_ICD_VENDORS".into(), vendors.into())])
    }

    fn load(&self) -> Result<(), String> {
        driver::DRIVER.load().map_err(str::to_string)
    }

    fn warm_up(&self, _: &std::sync::Arc<wormhole_server::worker::Limits>, _: bool) {
        // A driver that cannot be loaded is logged; the session that comes is refused.
        if driver::DRIVER.load().is_ok() {
            custom::warm_up();
        }
    }

    fn inventory(&self) -> Result<Vec<wormhole_server::backend::DeviceInventory>, String> {
        driver::DRIVER.load().map_err(str::to_string)?;
        custom::inventory()
    }

    fn begin(&self, setup: SessionSetup) {
        session().set_limits(setup.limits);
        if let Some(arena) = setup.arena {
            arena::enable(arena);
        }
        if let Some(cache) = setup.build_cache {
            program_cache::set(cache);
        }
        callbacks::set_sink(setup.callbacks);
    }

    fn handle(
        &self,
        h: &FrameHeader,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<Reply, DecodeError> {
        Self::run(session(), h.opcode, h.flags & FLAG_ASYNC != 0, r, w)
    }

    fn end(&self) {
        program_cache::finish();
    }

    fn answers_later(&self, opcode: u16) -> bool {
        opcode == Op::clFinish as u16
    }

    fn handle_later(
        &self,
        h: &FrameHeader,
        body: &[u8],
        c: Completion,
    ) -> Result<Option<Completion>, DecodeError> {
        debug_assert_eq!(h.opcode, Op::clFinish as u16);
        later::finish(session(), body, c)
    }

    fn stream(
        &self,
        h: &FrameHeader,
        link: &mut dyn wormhole_transport::BulkIn,
        body: &mut Vec<u8>,
        w: &mut Writer,
    ) -> Result<Streamed, StreamError> {
        if !self.streams(h.opcode) {
            return Ok(Streamed::Declined);
        }
        let streamed = custom::stream_write(session(), link, h, body, w)?;
        if let Streamed::Done = streamed {
            // A streamed write is a blocking one.
            wormhole_server::output::drain();
        }
        Ok(streamed)
    }

    fn streams(&self, opcode: u16) -> bool {
        opcode == Op::clEnqueueWriteBuffer as u16
    }

    fn objects(&self) -> std::collections::BTreeMap<String, usize> {
        session()
            .object_counts()
            .into_iter()
            .map(|(k, n)| (format!("{k:?}"), n))
            .collect()
    }

    fn mem_bytes(&self) -> i64 {
        session().mem_bytes()
    }

    fn detail(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: u64| {
            m.insert(k.into(), v.into());
        };
        for (k, counter) in [
            ("shared_mem_bytes", &arena::SHARED_BYTES),
            ("direct_transfers", &arena::DIRECT_TRANSFERS),
            ("streamed_writes", &custom::STREAMED_WRITES),
            ("at_once_transfers", &custom::AT_ONCE_TRANSFERS),
            ("staged_reads", &staging::STAGED_READS),
            ("staged_writes", &staging::STAGED_WRITES),
            ("program_cache_hits", &program_cache::HITS),
            ("program_cache_misses", &program_cache::MISSES),
            ("program_cache_uncacheable", &program_cache::UNCACHEABLE),
            (
                "program_cache_stores_skipped",
                &program_cache::STORES_SKIPPED,
            ),
        ] {
            put(k, counter.load(Ordering::Relaxed));
        }
        let admission = &session().admission;
        put("max_queued", session().limits().max_queued());
        put("queued_peak", admission.peak.load(Ordering::Relaxed));
        put("queued_waits", admission.waits.load(Ordering::Relaxed));
        m
    }
}

/// Runs one request made of untrusted bytes (`opcode u16 LE` + body) against a fresh session,
/// through the same path a worker's lanes take; the fuzzing entry point (`fuzz/`). Must return
/// normally for any input. A `clEnqueueWriteBuffer` request also goes through a real lane of
/// shared memory to the streamed-write path, as large writes do.
#[doc(hidden)]
pub fn fuzz_request(data: &[u8]) {
    let Some((op, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let op = u16::from_le_bytes(*op);
    let s = session::Session::default();
    if op == Op::clEnqueueWriteBuffer as u16 {
        fuzz_stream(&s, op, body);
    }
    let mut w = Writer::new(op);
    let _ = OpenCl::run(&s, op, false, &mut Reader::new(body), &mut w);
}

/// Offers `body` to the streamed-write path from the request ring of a real lane.
fn fuzz_stream(s: &session::Session, op: u16, body: &[u8]) {
    use std::sync::Arc;
    use wormhole_transport::{FutexWaiter, Layout, Region, ShmLink, SpinPolicy};
    const RING: u64 = 1 << 20;
    if body.len() as u64 + 64 > RING {
        return;
    }
    let Ok(region) = Region::create_memfd(Layout {
        lanes: 1,
        ring_capacity: RING,
    }) else {
        return;
    };
    let region = Arc::new(region);
    let link = |(tx, rx)| {
        ShmLink::new(
            tx,
            rx,
            Arc::new(FutexWaiter),
            SpinPolicy::default(),
            Arc::new(|| true),
        )
    };
    let (Some((req, rep)), Some((req2, rep2))) = (region.lane(0), region.lane(0)) else {
        return;
    };
    let mut client = link((req, rep));
    let mut server = link((rep2, req2));
    let header = FrameHeader {
        flags: 0,
        opcode: op,
        lane: 0,
        len: body.len() as u32,
        seq: 1,
    };
    // The whole frame fits the ring, so the server side never waits for bytes that do not come.
    if client.send_parts(&[&header.encode(), body]).is_err() {
        return;
    }
    let Ok(h) = server.recv_header() else { return };
    let mut buf = Vec::new();
    let mut w = Writer::new(op);
    let _ = custom::stream_write(s, &mut server, &h, &mut buf, &mut w);
}

#[cfg(test)]
mod tests {
    /// The fuzz entry point survives what the fuzzer starts from: empty and short inputs,
    /// every control op, and write requests through the streamed path.
    #[test]
    fn hostile_requests_end_in_errors_not_crashes() {
        let write = (wormhole_opencl_proto::Op::clEnqueueWriteBuffer as u16).to_le_bytes();
        let mut inputs: Vec<Vec<u8>> = vec![vec![], vec![1], write.to_vec()];
        for op in 0xF000u16..0xF010 {
            inputs.push(op.to_le_bytes().to_vec());
        }
        let mut long = write.to_vec();
        long.extend((0..200u8).map(|i| i.wrapping_mul(37)));
        inputs.push(long);
        let mut claims = write.to_vec();
        claims.extend([0u8; 36]);
        claims.push(1); // a wait list follows...
        claims.extend(u32::MAX.to_le_bytes()); // ...of 4 billion events
        inputs.push(claims);
        for i in inputs {
            super::fuzz_request(&i);
        }
    }
}
