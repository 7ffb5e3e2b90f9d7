//! API-level vocabulary shared by both sides that the description does not declare (handle
//! and callback kinds are generated from it: see `lib.rs`).

/// Zero-terminated property lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Props {
    /// Plain key/value pairs (queues, samplers, pipes, buffers).
    Plain,
    /// Context properties: the value of CL_CONTEXT_PLATFORM is a platform handle.
    Context,
    /// Device partition properties: CL_DEVICE_PARTITION_BY_COUNTS has a list of its own.
    Partition,
}
