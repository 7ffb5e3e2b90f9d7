//! What an API plugs into the server: a [`Backend`] per API (OpenCL, CUDA). The core owns
//! everything else — accepting sessions, tenants and quotas, standby workers, the worker
//! process and its lanes, status — and calls the backend only for what is the API's own:
//! preparing its driver stack, and running requests.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use wormhole_transport::{Arena, BulkIn, ShmSender, SpinPolicy, TransportError};
use wormhole_wire::{DecodeError, FrameHeader, Reader, Writer};

/// Where a session's callback frames go: the session's control socket, its one TCP stream
/// (shared with replies, hence the lock around whole frames), or a guest's event lane.
pub type CallbackSink = Arc<Mutex<dyn Write + Send>>;

/// What a worker hands its backend when a session starts.
pub struct SessionSetup {
    /// What the session's tenant may use (quota, objects, devices).
    pub limits: Arc<crate::worker::Limits>,
    /// Where callbacks to the client go.
    pub callbacks: CallbackSink,
    /// Local sessions: memory the client maps too, for buffers it copies itself.
    pub arena: Option<Arena>,
    /// The server's store of build products shared by all sessions, if it has one.
    pub build_cache: Option<wormhole_blobcache::BlobCache>,
}

thread_local! {
    static SHARED_STREAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the replies this thread sends share one stream with every other lane's replies
/// and callbacks (TCP, TLS): a reply's trailer holds that stream until its last byte, so a
/// trailer that waits for the device would hold them all (and the call that the device waits
/// for, a user event another thread sets, could never be answered). On a ring transport each
/// lane sends on its own.
pub fn replies_share_a_stream() -> bool {
    SHARED_STREAM.with(|s| s.get())
}

/// Says that this thread's replies go out on a stream every lane shares.
pub(crate) fn set_replies_share_a_stream() {
    SHARED_STREAM.with(|s| s.set(true));
}

/// Bulk data a reply carries after its body, sent from where it lies (a mapping of the
/// driver's buffer, pinned staging the device fills piece by piece) instead of being copied
/// into the reply first. Dropping it releases it.
pub trait Trailer {
    /// Hands the bytes to `out` in order, each piece as soon as it is ready. Always all the
    /// bytes the reply's body announced, so that the frame stays whole: a piece the device
    /// failed to deliver goes as zeros, and the failure is reported the API's own way.
    fn send(
        &mut self,
        out: &mut dyn FnMut(&[u8]) -> Result<(), TransportError>,
    ) -> Result<(), TransportError>;
}

/// The outcome of one request.
pub struct Reply {
    /// The API's status of the call (0: success): every reply body begins with it.
    pub status: i32,
    pub trailer: Option<Box<dyn Trailer>>,
}

/// A synchronous request whose reply the backend sends later, from the thread that learns its
/// outcome: the driver's own thread, when the device signals that the awaited work is done.
/// The worker's lane thread goes back to its ring instead of sleeping in the driver only to be
/// woken to pass the answer on, so the way from the device to the waiting application takes
/// one wake-up fewer, and the lane is awake for the application's next request. The client
/// waits for the reply as for any other. Dropped unanswered, it answers the API's
/// out-of-memory status, with a log line, so that no client waits forever.
pub struct Completion {
    pub(crate) h: FrameHeader,
    pub(crate) lane: usize,
    pub(crate) sink: Arc<ShmSender>,
    pub(crate) policy: SpinPolicy,
    pub(crate) out_of_memory: i32,
    pub(crate) answered: bool,
}

impl Completion {
    /// Writes the reply's body with `f` (as [`Backend::handle`] does, a synchronisation point
    /// draining the device's output first) and sends the reply, on the calling thread.
    pub fn complete(mut self, f: impl FnOnce(&mut Writer) -> Result<Reply, DecodeError>) {
        self.answered = true;
        crate::worker::complete(&self, f);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.answered {
            tracing::error!(
                opcode = self.h.opcode,
                "a request to be answered later was dropped unanswered: answering out-of-memory"
            );
            let status = self.out_of_memory;
            crate::worker::complete(self, |w| {
                w.i32(status);
                Ok(Reply {
                    status,
                    trailer: None,
                })
            });
        }
    }
}

/// What became of a request offered to [`Backend::stream`].
pub enum Streamed {
    /// Not a request the backend streams: nothing was read.
    Declined,
    /// The backend read the request from the link itself and wrote the reply body.
    Done,
    /// Not streamable after all: the whole body is in the buffer (its first `h.len` bytes),
    /// for [`Backend::handle`].
    Body,
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("malformed request: {0}")]
    Malformed(#[from] DecodeError),
}

/// One device a backend offers, as `wh devices` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceInventory {
    /// The device's name as the API reports it (what tenants' `devices` filters match).
    pub name: String,
    pub vendor: String,
    /// gpu, cpu, accelerator or other.
    pub kind: String,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// The API's version string for the device (e.g. "OpenCL 3.0 ...").
    pub version: String,
    /// The platform (OpenCL) or driver the device belongs to.
    pub platform: String,
}

/// One API the server serves.
pub trait Backend: Sync {
    /// The API's name in HELLO (`"opencl"`, `"cuda"`).
    fn api(&self) -> &'static str;

    /// The API's status for a call that failed for want of host memory: what a call whose
    /// reply would outgrow a frame answers instead.
    fn out_of_memory(&self) -> i32;

    /// Supervisor, once per server: the environment this API's workers need, prepared in
    /// the server's runtime directory (e.g. an ICD vendor directory without Wormhole's own).
    fn worker_env(&self, _runtime_dir: &Path) -> std::io::Result<Vec<(OsString, OsString)>> {
        Ok(Vec::new())
    }

    /// Supervisor: whether the API's driver is installed at all, judged without loading it
    /// (the supervisor never loads a driver): a file's presence. Err says why not. Without it
    /// the server keeps no standby workers for the API; a session still gets a worker, whose
    /// `load` gives the reason it is refused.
    fn installed(&self) -> Result<(), String> {
        Ok(())
    }

    /// Worker: open the API's driver stack (once; later calls return the first outcome). An
    /// error is the reason the worker's session is refused (the client sees no device).
    fn load(&self) -> Result<(), String> {
        Ok(())
    }

    /// Worker: load the driver and find the devices. A standby worker does this before any
    /// tenant waits, so a session's start pays none of it; with `device`, it also readies the
    /// first device the tenant (`limits`) may use where the API has a costly step for that
    /// (the config's `warm_device`).
    fn warm_up(&self, limits: &std::sync::Arc<crate::worker::Limits>, device: bool) {
        let _ = (limits, device);
    }

    /// Inventory worker: the devices the driver offers, for `wh devices` and the cluster
    /// integrations that publish them (Kubernetes DRA). Runs in a worker process of its own,
    /// never in the supervisor, like every other call into the driver.
    fn inventory(&self) -> Result<Vec<DeviceInventory>, String> {
        Err(format!(
            "the {} backend cannot list its devices",
            self.api()
        ))
    }

    /// Worker: the session starts (once per process).
    fn begin(&self, setup: SessionSetup);

    /// Worker: runs one request (`h.opcode`, its whole body in `r`), writing the reply body
    /// into `w`. An error means a malformed request: the session ends. A request that waited
    /// for the device (a synchronisation point) calls [`crate::output::drain`] before it
    /// returns, so that what the device printed reaches the application before the reply.
    fn handle(
        &self,
        h: &FrameHeader,
        r: &mut Reader<'_>,
        w: &mut Writer,
    ) -> Result<Reply, DecodeError>;

    /// Worker: the session's client is gone and the process is about to exit: release whatever
    /// waits for the client (driver threads inside a callback of the backend's), so that the
    /// driver's exit handlers find none stuck. Default: nothing.
    fn end(&self) {}

    /// Worker: whether requests with this opcode, sent without waiting, are part of a call
    /// their sender waits for (CUDA's staged copy pieces, which its closing fence waits for):
    /// other lanes need not wait for them (see `order`), as for a waited request. Default:
    /// none.
    fn within_waited_call(&self, _opcode: u16) -> bool {
        false
    }

    /// Worker: whether requests with this opcode run at once, without first waiting for what
    /// other lanes had sent before them (see `order`): requests that depend on nothing the
    /// program sent and that something the program sent may be waiting for (CUDA's "host
    /// function done"). Default: none.
    fn unordered(&self, _opcode: u16) -> bool {
        false
    }

    /// Worker, shared-memory lanes: whether the backend may answer synchronous requests with
    /// this opcode later (see [`Backend::handle_later`]). Asked first, so that requests it
    /// never takes cost nothing. Default: none.
    fn answers_later(&self, _opcode: u16) -> bool {
        false
    }

    /// Worker, shared-memory lanes: a synchronous request (its whole body in `body`) that the
    /// backend may answer later through `c`, from the thread that learns its outcome (see
    /// [`Completion`]). Returns `None` once the backend has taken it, `Some(c)` to have it run
    /// by [`Backend::handle`] as usual (e.g. to give the error of a bad request). An error
    /// means a malformed request: the session ends.
    fn handle_later(
        &self,
        _h: &FrameHeader,
        _body: &[u8],
        c: Completion,
    ) -> Result<Option<Completion>, DecodeError> {
        Ok(Some(c))
    }

    /// Worker: a synchronous request whose bulk data the backend may take as it arrives
    /// (straight into the driver's memory) instead of after the whole body: from a lane's ring,
    /// or from the chunks a TCP session's reader passes on (only for opcodes [`Self::streams`]
    /// names). Only the header has been read. Default: never.
    fn stream(
        &self,
        _h: &FrameHeader,
        _link: &mut dyn BulkIn,
        _body: &mut Vec<u8>,
        _w: &mut Writer,
    ) -> Result<Streamed, StreamError> {
        Ok(Streamed::Declined)
    }

    /// Worker, streams (TCP, TLS): whether a large synchronous request of `opcode` goes to
    /// [`Self::stream`] as its bytes arrive. One stream carries every lane, so its reader
    /// passes such a request's body on in chunks instead of holding it whole first.
    fn streams(&self, _opcode: u16) -> bool {
        false
    }

    /// Worker: the session's live objects, by kind (for `wh status`).
    fn objects(&self) -> std::collections::BTreeMap<String, usize>;

    /// Worker: device memory the session's objects hold now, in bytes.
    fn mem_bytes(&self) -> i64;

    /// Worker: the API's own counters for `wh status` (merged into the session's detail).
    fn detail(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
}
