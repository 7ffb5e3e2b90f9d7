//! OpenCL's vocabulary on Wormhole's wire, shared by the OpenCL client and backend: the opcode
//! table generated from the API description (`api/opencl.api`), handle and callback kinds, the
//! OpenCL constants Wormhole's own code needs, which info values carry handles, and the one
//! encoding of each hand-written request (`requests`). Frames and the body codec are the common
//! `wormhole-wire`, re-exported so OpenCL code names one crate.

pub mod cl;
/// The status codes under the name generated code uses for every API.
pub use cl as codes;
pub mod build_options;
pub mod geometry;
pub mod info;
mod kinds;
pub mod requests;

pub use kinds::*;
pub use wormhole_wire::*;

/// Generated from `api/opencl.api`: the opcodes, handle kinds and callback kinds.
mod generated {
    use crate::cl as codes;
    include!(concat!(env!("OUT_DIR"), "/proto.rs"));
}
pub use generated::{CallbackKind, HandleKind, Op, OP_COUNT};

/// Generated from `api/opencl.api` and the registry table `api/extensions.tsv`: the extensions
/// Wormhole does not advertise.
pub mod extensions {
    include!(concat!(env!("OUT_DIR"), "/extensions.rs"));
}

/// The API an OpenCL session speaks (sent in HELLO).
pub const API: &str = "opencl";

/// Most bytes of fine-grained SVM one `SVM_PUSH` request or `SVM_PULL` reply carries: the
/// client splits larger synchronisations into batches, and the server refuses larger ones
/// (a frame must stay far below `MAX_BODY`, whatever the application allocated).
pub const SVM_SYNC_BATCH: usize = 32 << 20;

/// Most bytes of a transfer's data one `STAGE` request or one `COLLECT` reply carries. A write
/// whose data does not fit one frame with its request is staged beforehand in pieces of at
/// most this size, and a read too large for its reply waits on the server and is collected in
/// pieces of at most this size (a reply's data in all): no frame comes near `MAX_BODY`, and
/// neither side holds more than this much of a transfer's bytes in a frame.
pub const TRANSFER_CHUNK: usize = 32 << 20;
