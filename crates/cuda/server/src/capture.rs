//! Stream capture and graphs (see the client's `capture`): the capture itself is the driver's,
//! on the lane threads that run the program's calls. Here: capture status queries, whose graph
//! and dependency nodes the driver lends (they are exported as the session's objects, the
//! nodes as children of their graph), a graph's nodes, and the thread's capture mode.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::generated::ffi;
use crate::session::{Call, Handle};
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    CaptureInfo, CaptureInfoQuery, CaptureMode, GraphNodes, GraphNodesQuery, Message,
    MAX_GRAPH_NODES,
};
use wormhole_cuda_proto::{DecodeError, HandleKind, Op, Reader, Writer};

/// Exports the nodes the driver returned (children of `graph`, by id) as ids; NULL as 0. They
/// are forgotten with their graph.
fn export_nodes(s: &Call<'_>, graph: u64, nodes: &[Handle]) -> Vec<u64> {
    nodes
        .iter()
        .map(|&n| {
            let id = s.export(HandleKind::GraphNode, n);
            if id != 0 && graph != 0 {
                s.graph_node(graph, id);
            }
            id
        })
        .collect()
}

/// Captures ended (or ending) so far: counted before the driver's end, so that a request
/// that looked twice for a capture and saw none both times can tell one came and went in
/// between (`host_functions`).
static ENDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Captures ended so far (see `ENDS`).
pub fn ends_so_far() -> u64 {
    ENDS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether `stream` (of the session's) is capturing now (`per_thread`: the NULL stream is the
/// calling thread's). A query the driver refuses counts as not capturing.
pub fn is_capturing(stream: Handle, per_thread: bool) -> bool {
    let mut status = 0u32;
    // SAFETY: a stream of the session's and a valid output.
    let st = unsafe {
        match per_thread {
            true => ffi::cuStreamIsCapturing_ptsz(stream, &mut status),
            false => ffi::cuStreamIsCapturing(stream, &mut status),
        }
    };
    st == CUDA_SUCCESS && status != 0
}

fn query(s: &Call<'_>, op: Op, q: &CaptureInfoQuery) -> Result<CaptureInfo, i32> {
    let stream = s.resolve(q.stream, HandleKind::Stream, true)?;
    let mut status = 0u32;
    let mut id = 0u64;
    let mut graph: Handle = std::ptr::null_mut();
    let mut deps: *const Handle = std::ptr::null();
    let mut edges: *const u8 = std::ptr::null();
    let mut count = 0usize;
    let st_ptr = &mut status as *mut u32 as *mut c_void;
    let id_ptr = match q.id {
        true => &mut id as *mut u64 as *mut c_void,
        false => std::ptr::null_mut(),
    };
    // The graph is always asked for (the nodes are its children); dependencies and edge data
    // only as the program asked (the driver refuses a query that would lose edge data it was
    // not given room for); their count always.
    let graph_ptr = &mut graph as *mut Handle as *mut c_void;
    let deps_ptr = match q.dependencies {
        true => &mut deps as *mut *const Handle as *mut c_void,
        false => std::ptr::null_mut(),
    };
    let edges_ptr = match q.edge_data {
        true => &mut edges as *mut *const u8 as *mut c_void,
        false => std::ptr::null_mut(),
    };
    let count_ptr = &mut count as *mut usize as *mut c_void;
    // SAFETY: every output points to a local of the type the driver writes there; the arrays
    // the driver lends are read below, before any other call.
    let st = unsafe {
        match op {
            Op::cuStreamGetCaptureInfo => ffi::cuStreamGetCaptureInfo(stream, st_ptr, id_ptr),
            Op::cuStreamGetCaptureInfo_ptsz => {
                ffi::cuStreamGetCaptureInfo_ptsz(stream, st_ptr, id_ptr)
            }
            Op::cuStreamGetCaptureInfo_v2 => ffi::cuStreamGetCaptureInfo_v2(
                stream, st_ptr, id_ptr, graph_ptr, deps_ptr, count_ptr,
            ),
            Op::cuStreamGetCaptureInfo_v2_ptsz => ffi::cuStreamGetCaptureInfo_v2_ptsz(
                stream, st_ptr, id_ptr, graph_ptr, deps_ptr, count_ptr,
            ),
            Op::cuStreamGetCaptureInfo_v3 => ffi::cuStreamGetCaptureInfo_v3(
                stream, st_ptr, id_ptr, graph_ptr, deps_ptr, edges_ptr, count_ptr,
            ),
            _ => ffi::cuStreamGetCaptureInfo_v3_ptsz(
                stream, st_ptr, id_ptr, graph_ptr, deps_ptr, edges_ptr, count_ptr,
            ),
        }
    };
    if st != CUDA_SUCCESS {
        return Err(st);
    }
    if count > MAX_GRAPH_NODES {
        tracing::warn!(
            count,
            "a capture with more dependencies than Wormhole carries"
        );
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let lent = |p: *const Handle| match p.is_null() || count == 0 {
        true => Vec::new(),
        // SAFETY: the driver lends `count` entries at `p` until the stream's next call.
        false => unsafe { std::slice::from_raw_parts(p, count) }.to_vec(),
    };
    let graph_id = s.export(HandleKind::Graph, graph);
    let nodes = lent(deps);
    let edge_data = match edges.is_null() || count == 0 {
        true => Vec::new(),
        // SAFETY: as above; `CUgraphEdgeData` is 8 bytes of alignment 1, read as bytes.
        false => unsafe { std::slice::from_raw_parts(edges, count * 8) }
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
    };
    Ok(CaptureInfo {
        status,
        id,
        graph: if q.graph { graph_id } else { 0 },
        count: count as u64,
        dependencies: export_nodes(s, graph_id, &nodes),
        edge_data,
    })
}

fn capture_info(
    s: &Call<'_>,
    op: Op,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let q = CaptureInfoQuery::decode_rest(r)?;
    query(s, op, &q).encode(w);
    Ok(())
}

/// `cuStreamGetCaptureInfo`.
pub fn cuStreamGetCaptureInfo(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo, r, w)
}

/// `cuStreamGetCaptureInfo_ptsz`.
pub fn cuStreamGetCaptureInfo_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo_ptsz, r, w)
}

/// `cuStreamGetCaptureInfo_v2`.
pub fn cuStreamGetCaptureInfo_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo_v2, r, w)
}

/// `cuStreamGetCaptureInfo_v2_ptsz`.
pub fn cuStreamGetCaptureInfo_v2_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo_v2_ptsz, r, w)
}

/// `cuStreamGetCaptureInfo_v3`.
pub fn cuStreamGetCaptureInfo_v3(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo_v3, r, w)
}

/// `cuStreamGetCaptureInfo_v3_ptsz`.
pub fn cuStreamGetCaptureInfo_v3_ptsz(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    capture_info(s, Op::cuStreamGetCaptureInfo_v3_ptsz, r, w)
}

/// `cuStreamEndCapture`: the graph the capture lent is the program's now; if the capture
/// failed, the driver destroyed it, and the session forgets it.
pub fn cuStreamEndCapture(
    s: &Call<'_>,
    a: crate::generated::args::cuStreamEndCapture,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    end_capture(s, a.hStream_id, a.phGraph_present, false, w);
    Ok(())
}

/// `cuStreamEndCapture_ptsz`.
pub fn cuStreamEndCapture_ptsz(
    s: &Call<'_>,
    a: crate::generated::args::cuStreamEndCapture_ptsz,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    end_capture(s, a.hStream_id, a.phGraph_present, true, w);
    Ok(())
}

/// A graph the driver destroys (or is about to), which a capture query may have lent the
/// program: the session forgets it.
fn forget_graph(s: &Call<'_>, graph: Handle) {
    let lent = s.export(HandleKind::Graph, graph);
    s.forget(lent);
}

/// The statuses of stream capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED to
/// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, and CUDA_ERROR_CAPTURED_EVENT).
fn is_capture_error(status: i32) -> bool {
    (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED..=CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
        .contains(&status)
}

fn end_capture(s: &Call<'_>, stream_id: u64, present: bool, per_thread: bool, w: &mut Writer) {
    let stream = match s.resolve(stream_id, HandleKind::Stream, true) {
        Ok(h) => h,
        Err(st) => return w.i32(st),
    };
    // The graph this capture builds, as the driver says now (a query may have lent it).
    let mut capturing: Handle = std::ptr::null_mut();
    let mut status = 0u32;
    let (st_ptr, graph_ptr) = (
        &mut status as *mut u32 as *mut c_void,
        &mut capturing as *mut Handle as *mut c_void,
    );
    let null = std::ptr::null_mut();
    // SAFETY: a stream of the session's; outputs for the status and the graph, the rest NULL.
    let asked = unsafe {
        match per_thread {
            true => ffi::cuStreamGetCaptureInfo_v3_ptsz(
                stream, st_ptr, null, graph_ptr, null, null, null,
            ),
            false => {
                ffi::cuStreamGetCaptureInfo_v3(stream, st_ptr, null, graph_ptr, null, null, null)
            }
        }
    };
    if asked != CUDA_SUCCESS {
        capturing = std::ptr::null_mut();
    }
    let mut graph: Handle = std::ptr::null_mut();
    let out = crate::rt::out_ptr(present, &mut graph);
    ENDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: a stream of the session's and an output for one graph (or NULL, as asked).
    let st = unsafe {
        match per_thread {
            true => ffi::cuStreamEndCapture_ptsz(stream, out),
            false => ffi::cuStreamEndCapture(stream, out),
        }
    };
    // A refusal that leaves the capture going (the wrong thread, no output for the graph)
    // ends nothing: the graph a query lent the program stays, and so do the capture's errors.
    let ended = st == CUDA_SUCCESS || !is_capturing(stream, per_thread);
    // A capture that failed leaves no graph: the driver destroyed the one it was building,
    // which a query may have lent the program; the session forgets it.
    if ended && !capturing.is_null() && (st != CUDA_SUCCESS || graph != capturing) {
        forget_graph(s, capturing);
    }
    let st = match st {
        // A request the client did not wait for failed (refused here, or by the driver), so
        // the graph lacks what the program captured: natively that call would have failed
        // and invalidated the capture, which then ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
        // The graph goes.
        CUDA_SUCCESS => match s.deferred.take(&[]) {
            Some(failed) => {
                tracing::warn!(
                    status = failed,
                    "a request of the capture failed after the client went on: the capture ends invalidated"
                );
                if present && !graph.is_null() {
                    forget_graph(s, graph);
                    // SAFETY: the graph the driver just made, forgotten by the session.
                    unsafe { ffi::cuGraphDestroy(graph) };
                }
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            }
            None => CUDA_SUCCESS,
        },
        // The driver ended the capture as failed: the errors of capture it had given pipelined
        // requests are what this answer reports, not to be answered again later.
        failed if ended => {
            s.deferred.forget(is_capture_error);
            failed
        }
        failed => failed,
    };
    w.i32(st);
    if st == CUDA_SUCCESS && present {
        s.export_list(w, HandleKind::Graph, &[graph]);
    }
}

fn graph_nodes(s: &Call<'_>, q: &GraphNodesQuery) -> Result<GraphNodes, i32> {
    let graph = s.resolve(q.graph, HandleKind::Graph, false)?;
    let capacity = match q.capacity {
        Some(c) if c > MAX_GRAPH_NODES as u64 => return Err(CUDA_ERROR_OUT_OF_MEMORY),
        Some(c) => Some(c as usize),
        None => None,
    };
    let mut nodes: Vec<Handle> = vec![std::ptr::null_mut(); capacity.unwrap_or(0)];
    let mut count = capacity.unwrap_or(0);
    let array = match capacity {
        Some(_) => nodes.as_mut_ptr() as *mut c_void,
        None => std::ptr::null_mut(),
    };
    // SAFETY: `array` is NULL or holds `count` entries, as the driver's contract asks.
    let st = unsafe { ffi::cuGraphGetNodes(graph, array, &mut count as *mut usize as *mut c_void) };
    if st != CUDA_SUCCESS {
        return Err(st);
    }
    Ok(GraphNodes {
        count: count as u64,
        nodes: export_nodes(s, q.graph, &nodes),
    })
}

/// `cuGraphGetNodes`.
pub fn cuGraphGetNodes(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let q = GraphNodesQuery::decode_rest(r)?;
    graph_nodes(s, &q).encode(w);
    Ok(())
}

/// `cuThreadExchangeStreamCaptureMode`: the mode of the lane thread that runs the call.
pub fn cuThreadExchangeStreamCaptureMode(
    _s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let CaptureMode(mut mode) = CaptureMode::decode_rest(r)?;
    // SAFETY: a valid in-out pointer.
    let st =
        unsafe { ffi::cuThreadExchangeStreamCaptureMode(&mut mode as *mut u32 as *mut c_void) };
    crate::rt::status(st).map(|()| CaptureMode(mode)).encode(w);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;

    #[test]
    fn queries_name_the_sessions_streams_and_graphs() {
        let session = Session::default();
        let s = Call(&session);
        let q = CaptureInfoQuery {
            stream: 999,
            id: true,
            graph: true,
            dependencies: true,
            edge_data: true,
        };
        assert_eq!(
            query(&s, Op::cuStreamGetCaptureInfo_v3, &q),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        let nodes = GraphNodesQuery {
            graph: 999,
            capacity: Some(4),
        };
        assert_eq!(graph_nodes(&s, &nodes), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
