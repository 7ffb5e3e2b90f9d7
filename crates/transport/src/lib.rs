//! Wormhole's transports. The fast path is a shared-memory region of *lanes*, each a pair of
//! single-producer/single-consumer byte rings (requests and replies) that carry the same frames
//! as every other transport. The rings work over any shared mapping (a memfd between processes,
//! an ivshmem BAR between a VM guest and its host); how a waiting side sleeps is pluggable
//! ([`wait::Waiter`]) because a futex does not cross a VM boundary.

pub mod arena;
pub mod contention;
pub mod copy;
mod error;
pub mod link;
pub mod region;
pub mod rendezvous;
pub mod ring;
pub mod tls;
pub mod unix;
pub mod wait;

pub use arena::{Arena, ArenaSpace};
pub use error::TransportError;
pub use link::{BulkIn, FrameLink, Pieces, ShmLink, ShmSender, StreamLink};
pub use region::{Layout, Region};
pub use rendezvous::Rendezvous;
pub use wait::{FutexWaiter, PollWaiter, SpinPolicy, SpinRead, Waiter};
