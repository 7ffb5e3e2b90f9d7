//! Wormhole's CUDA client: a `libcuda.so.1` that exports every symbol of the real driver and
//! forwards the driver API of an unmodified program (with cudart linked statically or shared,
//! and the libraries above it) to a Wormhole server, whose worker runs the real driver.
//! Objects handed to the program are small client-side structs carrying the session-local id
//! the server knows the real object by; device addresses are the server's own (one address
//! space on both sides, as CUDA's unified addressing promises).
//!
//! Nothing here may panic or abort inside the application: every entry point catches panics
//! and every failure becomes a CUDA status.

mod allocations;
mod capture;
mod connection;
mod context_facts;
mod copies;
mod copies_2d;
mod current;
mod custom;
mod export_tables;
mod host_functions;
mod host_memory_pinned;
mod image;
mod jit;
mod links;
mod local;
mod memory;
mod objects;
pub mod rt;
mod staging;
mod tensor_maps;

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

/// Marks this library as Wormhole's, so that a server never loads it as the real driver (a
/// server started inside `wh run` finds it first on the library path).
#[no_mangle]
pub static wormhole_cuda_client: u8 = 1;
