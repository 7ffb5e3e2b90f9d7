//! The Wormhole server core, the same for every API: a *supervisor* accepts sessions, checks
//! their HELLO, identifies the tenant and gives each session its own *worker* process (a
//! standby one, driver already loaded, when there is one for that tenant and API); workers
//! serve the session's lanes over shared memory, TCP/TLS or a guest region and run each
//! request through the API's [`Backend`]. Tenants, quotas, limits and status live here; what
//! is an API's own lives in its backend crate (`wormhole-opencl-server`).

pub mod admin;
pub mod backend;
pub mod build_sandbox;
pub mod callbacks;
pub mod cgroup;
pub mod config;
pub mod deferred;
pub mod driver_table;
pub mod handles;
pub mod order;
pub mod output;
pub mod quota;
pub mod slices;
pub mod supervisor;
pub mod tenants;
pub mod vendor_library;
pub mod worker;

pub use backend::Backend;
pub use config::Config;
