//! The Wormhole server. A *supervisor* accepts sessions and gives each its own *worker*
//! process; the worker owns the tenant's OpenCL objects (through the system ICD loader, never
//! through Wormhole's own ICD), maps client handles to real objects in a per-session table,
//! and serves the session's lanes, one thread per lane.

mod callbacks;
pub mod config;
mod custom;
mod info;
mod props;
pub mod quota;
mod rt;
mod session;
pub mod supervisor;
pub mod vendors;
pub mod worker;

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

pub use config::Config;
