//! The library's one session with the server, opened on first use through the session
//! machinery every API shares (`wormhole-session`).

use wormhole_cuda_proto::Op;
pub use wormhole_session::{log, CallError, Connection, OnceConnection};

/// What the session needs to know of CUDA.
const CUDA: wormhole_session::ApiHooks = wormhole_session::ApiHooks {
    api: wormhole_cuda_proto::API,
    // A GPU runs the work a synchronising call waits for: no driver thread of the client's
    // machine needs the caller's CPU, so it looks for the answer as for any other call's
    // (spinning, then yielding, then asleep) rather than sleeping at once, which cost each
    // wait a wake-up: on the H200 a tiny kernel and its stream's synchronisation took 20 µs
    // against 9.1 natively, a synchronous 1 MiB copy of page-locked memory 0.7× native's time
    // (native CUDA spins too: CU_CTX_SCHED_AUTO).
    waits_for_device: |_| false,
    // Host functions and stream callbacks run here.
    deliver_callback: crate::host_functions::deliver,
    when_gone: "further CUDA calls fail with CUDA_ERROR_DEVICE_UNAVAILABLE",
    op_name,
    lane_reused: Some(crate::current::lane_reused),
};

/// What an opcode stands for: an entry point, or one of the requests no symbol stands behind.
fn op_name(opcode: u16) -> Option<&'static str> {
    use wormhole_cuda_proto::{export_tables, host_functions, pinned, threads};
    Op::from_u16(opcode).map(Op::name).or(match opcode {
        export_tables::OP => Some("export table slot"),
        pinned::ALLOC => Some("page-locked alloc (arena)"),
        pinned::FREE => Some("page-locked free (arena)"),
        pinned::COPY => Some("page-locked copy (arena)"),
        pinned::PIECE => Some("staged copy's piece (arena)"),
        pinned::FENCE => Some("fence (staged copy)"),
        pinned::FENCE_SYNC => Some("synchronising fence (staged copy's end)"),
        host_functions::DONE => Some("host function done"),
        threads::FRESH => Some("fresh thread state"),
        _ => None,
    })
}

static CONNECTION: OnceConnection = OnceConnection::new();

/// The session, connecting on first use; Err says why there is none (logged once).
pub fn get() -> Result<&'static Connection, &'static str> {
    CONNECTION.get(CUDA, "no CUDA device")
}

/// The session if it was opened (never opens one).
pub fn opened() -> Option<&'static Connection> {
    CONNECTION.opened()
}
