//! Stream capture and graphs, as the client sees them. Capture happens in the worker: the
//! program's launches, copies and event records reach the server's driver on the captured
//! stream, which records them into its graph; `cuGraphLaunch` replays it there. What is here:
//! - capture status queries (`cuStreamIsCapturing`, `cuStreamGetCaptureInfo*`, which cuBLAS
//!   and PyTorch ask often) are answered without a round trip until the program first begins
//!   a capture: before that no stream can be capturing, so the answer is "none";
//! - the arrays the driver lends (a capture's dependencies and their edge data) are kept per
//!   stream until that stream's next query, as the driver keeps them;
//! - `cuGraphGetNodes` and `cuThreadExchangeStreamCaptureMode`, whose in-out counts and modes
//!   the generated encoding does not express.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::current;
use crate::generated;
use crate::rt::{self, entry_status, ApiErr};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    CaptureInfo, CaptureInfoQuery, CaptureMode, GraphNodes, GraphNodesQuery, Message, Reply,
    MAX_GRAPH_NODES,
};
use wormhole_cuda_proto::{HandleKind, Op};

/// Whether the program ever began a capture (set before the request goes, so that a query
/// racing with it asks the server).
static BEGUN: AtomicBool = AtomicBool::new(false);

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const STATUS_NONE: u32 = 0;

/// Whether a capture status query about `stream` can be answered "none" here: no capture was
/// ever begun, and the stream has a context (a stream object, or the current context for the
/// NULL and special streams; without one the driver's error is the server's to give).
fn never_capturing(stream: *mut c_void) -> bool {
    !BEGUN.load(Ordering::Acquire)
        && rt::answerable_here()
        && (stream as usize > 2 || current::known().is_some_and(|c| !c.is_null()))
}

/// Whether the program ever began a stream capture (so that a stream may be capturing now).
pub fn ever_begun() -> bool {
    BEGUN.load(Ordering::Acquire)
}

fn began() {
    BEGUN.store(true, Ordering::Release);
}

/// `cuStreamEndCapture`: cuda.h has a capture that failed give a NULL graph; the stub writes
/// the graph only when the capture succeeded.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        end_capture(graph, || {
            generated::wire_cuStreamEndCapture(stream, graph.cast())
        })
    }
}

/// `cuStreamEndCapture_ptsz`: as `cuStreamEndCapture`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamEndCapture_ptsz(stream: *mut c_void, graph: *mut *mut c_void) -> i32 {
    // SAFETY: per the contract.
    unsafe {
        end_capture(graph, || {
            generated::wire_cuStreamEndCapture_ptsz(stream, graph.cast())
        })
    }
}

/// A capture's end (`end`, the stub): the graph NULL unless the stub writes one.
///
/// # Safety
/// `graph` NULL or a writable graph handle.
unsafe fn end_capture(graph: *mut *mut c_void, end: impl FnOnce() -> i32) -> i32 {
    if !graph.is_null() {
        // SAFETY: per the contract.
        unsafe { *graph = std::ptr::null_mut() };
    }
    end()
}

/// `cuStreamBeginCapture`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamBeginCapture(stream: *mut c_void) -> i32 {
    began();
    // SAFETY: per the contract.
    unsafe { generated::wire_cuStreamBeginCapture(stream) }
}

/// `cuStreamBeginCapture_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamBeginCapture_ptsz(stream: *mut c_void) -> i32 {
    began();
    // SAFETY: per the contract.
    unsafe { generated::wire_cuStreamBeginCapture_ptsz(stream) }
}

/// `cuStreamBeginCapture_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: u32) -> i32 {
    began();
    // SAFETY: per the contract.
    unsafe { generated::wire_cuStreamBeginCapture_v2(stream, mode) }
}

/// `cuStreamBeginCapture_v2_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamBeginCapture_v2_ptsz(stream: *mut c_void, mode: u32) -> i32 {
    began();
    // SAFETY: per the contract.
    unsafe { generated::wire_cuStreamBeginCapture_v2_ptsz(stream, mode) }
}

/// "None" for `status` without a round trip, if that is the answer (see the module's comment).
///
/// # Safety
/// `status` NULL or a writable `CUstreamCaptureStatus`.
unsafe fn status_here(stream: *mut c_void, status: *mut u32) -> Option<i32> {
    if status.is_null() || !never_capturing(stream) {
        return None;
    }
    Some(entry_status(|| {
        rt::check_initialized()?;
        // SAFETY: `id_of` dereferences only registered objects.
        unsafe { rt::id_of(stream, HandleKind::Stream, true) }?;
        // SAFETY: per the contract.
        unsafe { *status = STATUS_NONE };
        Ok(CUDA_SUCCESS)
    }))
}

/// `cuStreamIsCapturing`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamIsCapturing(stream: *mut c_void, status: *mut u32) -> i32 {
    // SAFETY: per the contract.
    unsafe { status_here(stream, status) }
        // SAFETY: per the contract.
        .unwrap_or_else(|| unsafe { generated::wire_cuStreamIsCapturing(stream, status) })
}

/// `cuStreamIsCapturing_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamIsCapturing_ptsz(stream: *mut c_void, status: *mut u32) -> i32 {
    // SAFETY: per the contract.
    unsafe { status_here(stream, status) }
        // SAFETY: per the contract.
        .unwrap_or_else(|| unsafe { generated::wire_cuStreamIsCapturing_ptsz(stream, status) })
}

/// The outputs of a `cuStreamGetCaptureInfo*` call (NULL: not asked for).
struct InfoOut {
    status: *mut u32,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const *mut c_void,
    edge_data: *mut *const u64,
    count: *mut usize,
}

/// What the driver lends a query's caller: the dependency and edge arrays of each stream's
/// last answer (valid until that stream's next query, as the driver's own; the NULL and
/// per-thread streams are each thread's own).
struct Lent {
    dependencies: Box<[usize]>,
    edge_data: Box<[u64]>,
}

fn lent() -> std::sync::MutexGuard<'static, BTreeMap<(u64, u64), Lent>> {
    static LENT: Mutex<BTreeMap<(u64, u64), Lent>> = Mutex::new(BTreeMap::new());
    LENT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key of `stream`'s lent arrays: a stream object's own, the special streams' per thread.
fn lent_key(stream: *mut c_void) -> (u64, u64) {
    thread_local! {
        static THREAD: u64 = {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            NEXT.fetch_add(1, Ordering::Relaxed)
        };
    }
    match stream as usize {
        0..=2 => (stream as u64, THREAD.with(|t| *t)),
        _ => (stream as u64, 0),
    }
}

/// # Safety
/// Each pointer in `out` NULL or writable, as the C functions' contract says.
unsafe fn capture_info(op: Op, stream: *mut c_void, out: InfoOut) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if out.status.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let info = if never_capturing(stream) {
            // SAFETY: `id_of` dereferences only registered objects.
            unsafe { rt::id_of(stream, HandleKind::Stream, true) }?;
            CaptureInfo::default()
        } else {
            let query = CaptureInfoQuery {
                // SAFETY: as above.
                stream: unsafe { rt::id_of(stream, HandleKind::Stream, true) }?,
                id: !out.id.is_null(),
                graph: !out.graph.is_null(),
                dependencies: !out.dependencies.is_null(),
                edge_data: !out.edge_data.is_null(),
            };
            let mut w = rt::request(op);
            query.encode(&mut w);
            Reply::<CaptureInfo>::decode_all(&rt::call(w)?)?.map_err(ApiErr)?
        };
        let key = lent_key(stream);
        let mut lent = lent();
        let arrays = Lent {
            dependencies: info
                .dependencies
                .iter()
                .map(|&id| crate::objects::object_for_id(HandleKind::GraphNode, id) as usize)
                .collect(),
            edge_data: info.edge_data.clone().into_boxed_slice(),
        };
        // SAFETY: per the contract, each non-NULL output is writable; the arrays handed out
        // live in `LENT` until this stream's next query.
        unsafe {
            *out.status = info.status;
            if !out.id.is_null() {
                *out.id = info.id;
            }
            if !out.graph.is_null() {
                *out.graph = crate::objects::object_for_id(HandleKind::Graph, info.graph);
            }
            if !out.count.is_null() {
                *out.count = info.count as usize;
            }
            lent.insert(key, arrays);
            let arrays = &lent[&key];
            if !out.dependencies.is_null() {
                *out.dependencies = match arrays.dependencies.is_empty() {
                    true => std::ptr::null(),
                    false => arrays.dependencies.as_ptr() as *const *mut c_void,
                };
            }
            if !out.edge_data.is_null() {
                *out.edge_data = match arrays.edge_data.is_empty() {
                    true => std::ptr::null(),
                    false => arrays.edge_data.as_ptr(),
                };
            }
        }
        Ok(CUDA_SUCCESS)
    })
}

/// `cuStreamGetCaptureInfo` (v1: status and id).
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: std::ptr::null_mut(),
        dependencies: std::ptr::null_mut(),
        edge_data: std::ptr::null_mut(),
        count: std::ptr::null_mut(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo, stream, out) }
}

/// `cuStreamGetCaptureInfo_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo_ptsz(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: std::ptr::null_mut(),
        dependencies: std::ptr::null_mut(),
        edge_data: std::ptr::null_mut(),
        count: std::ptr::null_mut(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo_ptsz, stream, out) }
}

/// `cuStreamGetCaptureInfo_v2`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo_v2(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    dependencies: *mut c_void,
    count: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: graph.cast(),
        dependencies: dependencies.cast(),
        edge_data: std::ptr::null_mut(),
        count: count.cast(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo_v2, stream, out) }
}

/// `cuStreamGetCaptureInfo_v2_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo_v2_ptsz(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    dependencies: *mut c_void,
    count: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: graph.cast(),
        dependencies: dependencies.cast(),
        edge_data: std::ptr::null_mut(),
        count: count.cast(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo_v2_ptsz, stream, out) }
}

/// `cuStreamGetCaptureInfo_v3` (what cudart 13's `cudaStreamGetCaptureInfo` calls).
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo_v3(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    dependencies: *mut c_void,
    edge_data: *mut c_void,
    count: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: graph.cast(),
        dependencies: dependencies.cast(),
        edge_data: edge_data.cast(),
        count: count.cast(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo_v3, stream, out) }
}

/// `cuStreamGetCaptureInfo_v3_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuStreamGetCaptureInfo_v3_ptsz(
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    dependencies: *mut c_void,
    edge_data: *mut c_void,
    count: *mut c_void,
) -> i32 {
    let out = InfoOut {
        status: status.cast(),
        id: id.cast(),
        graph: graph.cast(),
        dependencies: dependencies.cast(),
        edge_data: edge_data.cast(),
        count: count.cast(),
    };
    // SAFETY: per the contract.
    unsafe { capture_info(Op::cuStreamGetCaptureInfo_v3_ptsz, stream, out) }
}

/// `cuGraphGetNodes`: with no array, the count; with one, up to `*numNodes` nodes (NULL past
/// the graph's), and the count obtained.
///
/// # Safety
/// As the C function.
pub unsafe fn cuGraphGetNodes(graph: *mut c_void, nodes: *mut c_void, count: *mut c_void) -> i32 {
    let (nodes, count) = (nodes as *mut *mut c_void, count as *mut usize);
    entry_status(|| {
        rt::check_initialized()?;
        if count.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract (`*count` is the array's length when there is one).
        let capacity = (!nodes.is_null()).then(|| unsafe { *count } as u64);
        if capacity.is_some_and(|c| c > MAX_GRAPH_NODES as u64) {
            return Err(ApiErr(CUDA_ERROR_OUT_OF_MEMORY));
        }
        let query = GraphNodesQuery {
            // SAFETY: `id_of` dereferences only registered objects.
            graph: unsafe { rt::id_of(graph, HandleKind::Graph, false) }?,
            capacity,
        };
        let mut w = rt::request(Op::cuGraphGetNodes);
        query.encode(&mut w);
        let answer = Reply::<GraphNodes>::decode_all(&rt::call(w)?)?.map_err(ApiErr)?;
        if answer.nodes.len() as u64 > capacity.unwrap_or(0) {
            return Err(ApiErr::from(wormhole_cuda_proto::DecodeError::BadValue(
                "more graph nodes than asked for",
            )));
        }
        // SAFETY: per the contract; at most `capacity` entries are written.
        unsafe {
            for (i, &id) in answer.nodes.iter().enumerate() {
                *nodes.add(i) = crate::objects::object_for_id(HandleKind::GraphNode, id);
            }
            *count = answer.count as usize;
        }
        Ok(CUDA_SUCCESS)
    })
}

/// `cuThreadExchangeStreamCaptureMode`: the calling thread's mode is its lane's in the worker.
///
/// # Safety
/// As the C function.
pub unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut c_void) -> i32 {
    let mode = mode as *mut u32;
    entry_status(|| {
        rt::check_initialized()?;
        if mode.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let mut w = rt::request(Op::cuThreadExchangeStreamCaptureMode);
        // SAFETY: per the contract.
        CaptureMode(unsafe { *mode }).encode(&mut w);
        let CaptureMode(old) = Reply::<CaptureMode>::decode_all(&rt::call(w)?)?.map_err(ApiErr)?;
        // SAFETY: per the contract.
        unsafe { *mode = old };
        Ok(CUDA_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Until a capture begins, a stream object's status is "none" without a round trip; the
    /// NULL stream's needs a current context; after, every query goes to the server.
    #[test]
    fn status_is_answered_here_only_before_any_capture() {
        let _serial = current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        let stream = 0x1000 as *mut c_void;
        assert!(never_capturing(stream));
        if current::known().is_none() {
            assert!(!never_capturing(std::ptr::null_mut()));
        }
        began();
        assert!(!never_capturing(stream));
    }
}
