//! Wormhole's NVML client: a `libnvidia-ml.so.1` that exports every symbol of NVIDIA's and
//! answers what a tenant may ask about the forwarded GPU (its name, identity, memory as the
//! tenant's quota shows it, device-wide readings) through a Wormhole server, whose worker asks
//! the real NVML. Devices handed to the program are small client-side structs carrying the
//! session-local id the server knows the real device by.
//!
//! Nothing here may panic or abort inside the application: every entry point catches panics
//! and every failure becomes an NVML status.

mod connection;
mod custom;
mod local;
mod objects;
pub mod rt;

/// The generated entry points: every symbol exported by name (see `crates/apigen`).
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_imports,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/client_gen.rs"));
}

/// Marks this library as Wormhole's, so that a server never loads it as the real NVML (a
/// server started inside `wh run` finds it first on the library path).
#[no_mangle]
pub static wormhole_nvml_client: u8 = 1;
