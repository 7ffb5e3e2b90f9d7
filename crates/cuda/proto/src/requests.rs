//! The hand-written CUDA requests and replies, each defined once (see
//! `wormhole_wire::message`): the entry points the description marks `custom`.

use crate::jit::{JitOption, JitOut};
use crate::{DecodeError, Reader, Writer};
use std::sync::atomic::{AtomicU32, Ordering};
pub use wormhole_wire::message::{count, Message, Reply};

/// Most parameters one kernel may have (CUDA allows 32,764 bytes of them).
pub const MAX_KERNEL_PARAMS: usize = 1 << 14;

/// Images at most this large travel with their first request; larger ones are first asked for
/// by digest (the server may hold them from an earlier session of the tenant).
pub const IMAGE_INLINE: usize = 64 << 10;

/// Bytes of a memory pool attribute's value (`CUmemPool_attribute`: the reuse policies are
/// `int`s, the release threshold and the usage figures `cuuint64_t`s); None for an attribute
/// cuda.h 13.0 lacks, whose width neither side can know. Both sides hold values in 8 bytes.
pub fn mempool_attribute_size(attr: u32) -> Option<usize> {
    match attr {
        1..=3 => Some(4),
        4..=8 => Some(8),
        _ => None,
    }
}

/// `cuModuleLoadData(Ex)`, `cuModuleLoadFatBinary`, `cuLibraryLoad*`: a module image (cubin,
/// PTX or fatbin) by its SHA-256, with its bytes, or without them to ask whether the server has
/// it already; and the JIT options it is loaded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleLoad<'a> {
    pub new_id: u64,
    pub digest: [u8; 32],
    pub image: Option<&'a [u8]>,
    pub jit: Vec<JitOption>,
}

impl<'a> Message<'a> for ModuleLoad<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        w.bytes(&self.digest);
        w.opt_bytes(self.image);
        crate::jit::encode_options(w, &self.jit);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(ModuleLoad {
            new_id: r.u64()?,
            digest: r
                .bytes()?
                .try_into()
                .map_err(|_| DecodeError::BadValue("an image digest is 32 bytes"))?,
            image: r.opt_bytes_ref()?,
            jit: crate::jit::decode_options(r)?,
        })
    }
}

/// The answer to a [`ModuleLoad`]: the driver's status, or (status 0 and `need_image`) a request
/// for the image's bytes, which the server does not hold; and what the driver left in each JIT
/// option's slot (the logs too when the load failed), in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModuleLoaded {
    pub status: i32,
    pub need_image: bool,
    pub jit: Vec<JitOut>,
}

impl<'a> Message<'a> for ModuleLoaded {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        w.bool(self.need_image);
        crate::jit::encode_outs(w, &self.jit);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(ModuleLoaded {
            status: r.i32()?,
            need_image: r.bool()?,
            jit: crate::jit::decode_outs(r)?,
        })
    }
}

/// `cuLinkCreate*`: a link state under `new_id`, with JIT options that hold for its life (the
/// driver writes its logs during the inputs and the completion).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCreate {
    pub new_id: u64,
    pub jit: Vec<JitOption>,
}

impl<'a> Message<'a> for LinkCreate {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        crate::jit::encode_options(w, &self.jit);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(LinkCreate {
            new_id: r.u64()?,
            jit: crate::jit::decode_options(r)?,
        })
    }
}

/// `cuLinkAddData*`, `cuLinkAddFile*` (the file read by the client): one input of a link, its
/// `CUjitInputType`, name (for the logs) and bytes, with JIT options of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkAdd<'a> {
    pub state: u64,
    pub input_type: u32,
    pub name: &'a [u8],
    pub data: &'a [u8],
    pub jit: Vec<JitOption>,
}

impl<'a> Message<'a> for LinkAdd<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.state);
        w.u32(self.input_type);
        w.bytes(self.name);
        w.bytes(self.data);
        crate::jit::encode_options(w, &self.jit);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(LinkAdd {
            state: r.u64()?,
            input_type: r.u32()?,
            name: r.bytes()?,
            data: r.bytes()?,
            jit: crate::jit::decode_options(r)?,
        })
    }
}

/// The answer to every link request (`cuLinkComplete` and `cuLinkDestroy` send the state's id
/// alone): the driver's status, what it left in the link's own JIT options' slots (logs grow
/// with each step) and in the call's, and, from a completion, the linked image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkDone {
    pub status: i32,
    pub link_jit: Vec<JitOut>,
    pub call_jit: Vec<JitOut>,
    pub image: Option<Vec<u8>>,
}

impl<'a> Message<'a> for LinkDone {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        crate::jit::encode_outs(w, &self.link_jit);
        crate::jit::encode_outs(w, &self.call_jit);
        w.opt_bytes(self.image.as_deref());
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(LinkDone {
            status: r.i32()?,
            link_jit: crate::jit::decode_outs(r)?,
            call_jit: crate::jit::decode_outs(r)?,
            image: r.opt_bytes()?,
        })
    }
}

/// `cuModuleGetFunction` (and `cuLibraryGetKernel`, `module` the library): answered by the
/// function's (kernel's) parameter layout ([`ParamLayout`]), which
/// the client needs to copy a launch's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleGetFunction<'a> {
    pub new_id: u64,
    pub module: u64,
    pub name: &'a [u8],
}

impl<'a> Message<'a> for ModuleGetFunction<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        w.u64(self.module);
        w.bytes(self.name);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(ModuleGetFunction {
            new_id: r.u64()?,
            module: r.u64()?,
            name: r.bytes()?,
        })
    }
}

/// `cuModuleGetGlobal_v2`, `cuLibraryGetGlobal`: a module's (or library's) variable by name,
/// answered by its [`DeviceRange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetGlobal<'a> {
    pub object: u64,
    pub name: &'a [u8],
}

impl<'a> Message<'a> for GetGlobal<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.object);
        w.bytes(self.name);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(GetGlobal {
            object: r.u64()?,
            name: r.bytes()?,
        })
    }
}

/// Device memory the driver placed: its address and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    pub dptr: u64,
    pub bytes: u64,
}

impl<'a> Message<'a> for DeviceRange {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.dptr);
        w.u64(self.bytes);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(DeviceRange {
            dptr: r.u64()?,
            bytes: r.u64()?,
        })
    }
}

/// The answer to `cuKernelGetFunction`: the function (in the current context) under the id
/// the server knows it by, and its parameters' layout (the kernel's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionOf {
    pub id: u64,
    pub layout: ParamLayout,
}

impl<'a> Message<'a> for FunctionOf {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.id);
        self.layout.encode(w);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(FunctionOf {
            id: r.u64()?,
            layout: ParamLayout::decode(r)?,
        })
    }
}

/// A kernel's parameters as the driver reports them (`cuFuncGetParamInfo`): (offset, size) of
/// each, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamLayout {
    pub params: Vec<(u32, u32)>,
}

impl ParamLayout {
    /// Bytes of the whole parameter buffer (`CU_LAUNCH_PARAM_BUFFER_SIZE` must be this).
    pub fn buffer_size(&self) -> usize {
        self.params
            .iter()
            .map(|&(o, s)| o as usize + s as usize)
            .max()
            .unwrap_or(0)
    }
}

impl<'a> Message<'a> for ParamLayout {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.params.len() as u32);
        for (o, s) in &self.params {
            w.u32(*o);
            w.u32(*s);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let n = count(r, 8, MAX_KERNEL_PARAMS)?;
        let params = (0..n)
            .map(|_| Ok((r.u32()?, r.u32()?)))
            .collect::<Result<_, DecodeError>>()?;
        Ok(ParamLayout { params })
    }
}

/// How a launch's arguments travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchArgs<'a> {
    /// `kernelParams`: each parameter's bytes, as many as its size.
    Each(Vec<&'a [u8]>),
    /// `extra` with `CU_LAUNCH_PARAM_BUFFER_POINTER`: the whole parameter buffer.
    Buffer(&'a [u8]),
}

/// Most attributes one launch may carry (`CUlaunchConfig::numAttrs`).
pub const MAX_LAUNCH_ATTRIBUTES: usize = 64;

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT` and `CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT`:
/// the two attributes whose value starts with a handle (a `CUevent`), which travels as its id.
pub const LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT: u32 = 7;
/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`: what `cuLaunchCooperativeKernel` is.
pub const LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
pub const LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT: u32 = 12;

/// Whether launch attribute `id` is forwarded: those whose values are plain data (access
/// policy window, cooperative, synchronisation policy, cluster dimension and scheduling,
/// programmatic serialisation, priority, memory synchronisation domain (map), preferred
/// cluster dimension, shared memory carveout, the NVLink-centric scheduling hint) and the two
/// that name an event. Not: a graph node's (13), whose value the driver writes back, and
/// later ones, whose values are not known.
pub fn launch_attribute_forwarded(id: u32) -> bool {
    matches!(id, 0..=12 | 14 | 16)
}

/// A launch attribute (`CUlaunchAttribute`): its id and its 64-byte value, an event's handle
/// in it replaced by the event's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchAttribute {
    pub id: u32,
    pub value: [u8; 64],
}

/// `CUlaunchAttribute` as C lays it out: id, padding, a 64-byte value (a union with 8-byte
/// members).
#[repr(C)]
pub struct CuLaunchAttribute {
    pub id: u32,
    pub pad: u32,
    pub value: [u64; 8],
}

/// `CUlaunchConfig` as C lays it out.
#[repr(C)]
pub struct CuLaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: *mut std::ffi::c_void,
    pub attrs: *mut CuLaunchAttribute,
    pub num_attrs: u32,
}

/// `CUDA_MEMCPY2D` as C lays it out.
#[repr(C)]
pub struct CuMemcpy2D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_type: u32,
    pub src_host: *const std::ffi::c_void,
    pub src_device: u64,
    pub src_array: *mut std::ffi::c_void,
    pub src_pitch: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_type: u32,
    pub dst_host: *mut std::ffi::c_void,
    pub dst_device: u64,
    pub dst_array: *mut std::ffi::c_void,
    pub dst_pitch: usize,
    pub width: usize,
    pub height: usize,
}

/// `CU_MEMORYTYPE_HOST`, `_DEVICE`, `_ARRAY`, `_UNIFIED`.
pub const MEMORYTYPE_HOST: u32 = 1;
pub const MEMORYTYPE_DEVICE: u32 = 2;
pub const MEMORYTYPE_ARRAY: u32 = 3;
pub const MEMORYTYPE_UNIFIED: u32 = 4;

/// One side of a 2D copy as it travels: device memory (its first byte and pitch), or the
/// program's host rows, packed (`width` bytes each), in the request (a source) or the reply
/// (a destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side2D {
    Device { addr: u64, pitch: u64 },
    Host,
}

/// The most bytes of host rows one [`Copy2D`] carries (the client sends more in pieces).
pub const MAX_ROWS_BYTES: usize = 64 << 20;

/// `cuMemcpy2D*` (and `Unaligned`, `Async`, per-thread forms): rows of `width` bytes,
/// `height` of them, between two sides that are not both host memory (the client copies
/// those itself). A destination on the host is answered by the status, then the rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy2D<'a> {
    pub src: Side2D,
    pub dst: Side2D,
    pub width: u64,
    pub height: u64,
    /// The stream of the `Async` forms (0 for the others).
    pub stream: u64,
    /// The source rows, packed, when the source is host memory.
    pub rows: Option<&'a [u8]>,
}

fn encode_side(w: &mut Writer, side: Side2D) {
    match side {
        Side2D::Device { addr, pitch } => {
            w.u8(0);
            w.u64(addr);
            w.u64(pitch);
        }
        Side2D::Host => w.u8(1),
    }
}

fn decode_side(r: &mut Reader<'_>) -> Result<Side2D, DecodeError> {
    match r.u8()? {
        0 => Ok(Side2D::Device {
            addr: r.u64()?,
            pitch: r.u64()?,
        }),
        1 => Ok(Side2D::Host),
        _ => Err(DecodeError::BadValue("a 2D copy's side")),
    }
}

impl<'a> Message<'a> for Copy2D<'a> {
    fn encode(&self, w: &mut Writer) {
        encode_side(w, self.src);
        encode_side(w, self.dst);
        w.u64(self.width);
        w.u64(self.height);
        w.u64(self.stream);
        w.opt_bytes(self.rows);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let m = Copy2D {
            src: decode_side(r)?,
            dst: decode_side(r)?,
            width: r.u64()?,
            height: r.u64()?,
            stream: r.u64()?,
            rows: r.opt_bytes_ref()?,
        };
        let packed = m.width.checked_mul(m.height).filter(|&n| {
            n <= MAX_ROWS_BYTES as u64 || (m.src != Side2D::Host && m.dst != Side2D::Host)
        });
        let consistent = match (m.src, m.dst, m.rows) {
            (Side2D::Host, Side2D::Device { .. }, Some(rows)) => packed == Some(rows.len() as u64),
            (Side2D::Device { .. }, _, None) => packed.is_some(),
            _ => false,
        };
        if !consistent {
            return Err(DecodeError::BadValue("a 2D copy's sides and rows disagree"));
        }
        Ok(m)
    }
}

/// `cuLaunchKernel`, `cuLaunchKernelEx` (and `_ptsz`): answered by the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchKernel<'a> {
    pub function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: u64,
    pub args: LaunchArgs<'a>,
    /// `cuLaunchKernelEx`'s attributes (none for `cuLaunchKernel`).
    pub attributes: Vec<LaunchAttribute>,
}

impl<'a> Message<'a> for LaunchKernel<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.function);
        for v in self.grid.iter().chain(&self.block) {
            w.u32(*v);
        }
        w.u32(self.shared_mem);
        w.u64(self.stream);
        match &self.args {
            LaunchArgs::Each(params) => {
                w.u8(0);
                w.u32(params.len() as u32);
                for p in params {
                    w.bytes(p);
                }
            }
            LaunchArgs::Buffer(b) => {
                w.u8(1);
                w.bytes(b);
            }
        }
        w.u32(self.attributes.len() as u32);
        for a in &self.attributes {
            w.u32(a.id);
            w.bytes(&a.value);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let function = r.u64()?;
        let mut dims = [0u32; 6];
        for d in &mut dims {
            *d = r.u32()?;
        }
        let shared_mem = r.u32()?;
        let stream = r.u64()?;
        let args = match r.u8()? {
            0 => {
                let n = count(r, 8, MAX_KERNEL_PARAMS)?;
                LaunchArgs::Each((0..n).map(|_| r.bytes()).collect::<Result<_, _>>()?)
            }
            1 => LaunchArgs::Buffer(r.bytes()?),
            _ => return Err(DecodeError::BadValue("launch arguments kind")),
        };
        let n = count(r, 72, MAX_LAUNCH_ATTRIBUTES)?;
        let attributes = (0..n)
            .map(|_| {
                Ok(LaunchAttribute {
                    id: r.u32()?,
                    value: r.bytes()?.try_into().map_err(|_| {
                        DecodeError::BadValue("a launch attribute's value is 64 bytes")
                    })?,
                })
            })
            .collect::<Result<_, DecodeError>>()?;
        Ok(LaunchKernel {
            function,
            grid: [dims[0], dims[1], dims[2]],
            block: [dims[3], dims[4], dims[5]],
            shared_mem,
            stream,
            args,
            attributes,
        })
    }
}

/// `CU_POINTER_ATTRIBUTE_CONTEXT`: a context, which travels as the id the client knows it by.
pub const POINTER_ATTRIBUTE_CONTEXT: u32 = 1;
/// `CU_POINTER_ATTRIBUTE_DEVICE_POINTER`.
pub const POINTER_ATTRIBUTE_DEVICE_POINTER: u32 = 3;

/// `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`: a pool, which Wormhole does not forward.
pub const POINTER_ATTRIBUTE_MEMPOOL_HANDLE: u32 = 17;
/// Most attributes one `cuPointerGetAttributes` asks for (CUDA has 20-odd).
pub const MAX_POINTER_ATTRIBUTES: usize = 64;
/// The most bytes one attribute's value takes (the P2P tokens: 16).
pub const POINTER_VALUE_MAX: usize = 64;

/// `cuPointerGetAttribute` (`single`) and `cuPointerGetAttributes`: attributes of `ptr`, a
/// device address of the session's, or 0 for an address that is none (the client's own
/// memory, which the server's driver cannot know: it answers for memory unknown to CUDA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerAttributes {
    pub ptr: u64,
    pub single: bool,
    pub attributes: Vec<u32>,
}

impl<'a> Message<'a> for PointerAttributes {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.ptr);
        w.bool(self.single);
        w.u32(self.attributes.len() as u32);
        for a in &self.attributes {
            w.u32(*a);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let ptr = r.u64()?;
        let single = r.bool()?;
        let n = count(r, 4, MAX_POINTER_ATTRIBUTES)?;
        Ok(PointerAttributes {
            ptr,
            single,
            attributes: (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?,
        })
    }
}

/// The answer to [`PointerAttributes`]: the driver's status and, on success, each value as
/// the driver wrote it (exactly the bytes it wrote, so the client writes no more into the
/// program's variable than the driver would).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerValues {
    pub status: i32,
    pub values: Vec<Vec<u8>>,
}

impl<'a> Message<'a> for PointerValues {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        w.u32(self.values.len() as u32);
        for v in &self.values {
            w.bytes(v);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let status = r.i32()?;
        let n = count(r, 4, MAX_POINTER_ATTRIBUTES)?;
        let values = (0..n)
            .map(|_| {
                let v = r.bytes()?;
                if v.len() > POINTER_VALUE_MAX {
                    return Err(DecodeError::BadValue(
                        "an attribute value is at most 64 bytes",
                    ));
                }
                Ok(v.to_vec())
            })
            .collect::<Result<_, _>>()?;
        Ok(PointerValues { status, values })
    }
}

/// `cuMemHostAlloc` in the arena ([`crate::pinned::ALLOC`]): `bytes` page-locked with the
/// driver's `flags` (`CU_MEMHOSTALLOC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedAlloc {
    pub bytes: u64,
    pub flags: u32,
}

impl<'a> Message<'a> for PinnedAlloc {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.bytes);
        w.u32(self.flags);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(PinnedAlloc {
            bytes: r.u64()?,
            flags: r.u32()?,
        })
    }
}

/// The answer to a [`PinnedAlloc`]: where the range lies in the arena, and at which address
/// the worker (and so the device, under unified addressing) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedAllocated {
    pub status: i32,
    pub offset: u64,
    pub address: u64,
}

impl<'a> Message<'a> for PinnedAllocated {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        w.u64(self.offset);
        w.u64(self.address);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(PinnedAllocated {
            status: r.i32()?,
            offset: r.u64()?,
            address: r.u64()?,
        })
    }
}

/// `cuMemFreeHost` of a range [`PinnedAlloc`] made ([`crate::pinned::FREE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedFree {
    pub offset: u64,
}

impl<'a> Message<'a> for PinnedFree {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.offset);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(PinnedFree { offset: r.u64()? })
    }
}

/// A copy between device memory and page-locked arena memory ([`crate::pinned::COPY`]): the
/// worker's driver copies directly, no byte travels in the request or the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedCopy {
    /// Host to device (else device to host).
    pub to_device: bool,
    pub device: u64,
    /// Where the host side lies in the arena.
    pub offset: u64,
    pub len: u64,
    /// The stream of an asynchronous copy (by id: 0 the NULL stream), None for a synchronous
    /// one.
    pub stream: Option<u64>,
    /// The `_ptds`/`_ptsz` entry point (the NULL stream is the thread's own).
    pub per_thread: bool,
    /// An asynchronous copy answered once its stream has done it (a copy of the program's
    /// pageable memory staged through the arena, which the next piece reuses: the driver's
    /// own asynchronous copies of pageable memory return once the bytes are out of it).
    pub complete: bool,
    /// Where to say that the copy is done (a piece of a staged copy, sent without waiting).
    pub signal: Option<Signal>,
    /// The bytes from `device` on that the whole copy touches, checked before this piece
    /// moves any (a staged copy's first piece: a range the session does not own fails the
    /// copy before a byte is written, as natively); 0 for `len`.
    pub whole: u64,
}

/// A word pair in the session's page-locked memory that the worker writes when a copy is
/// done: at `offset` + 4 the copy's status, then at `offset` `value` (with
/// [`crate::pinned::SIGNAL_FAILED`] when the status is a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    pub offset: u64,
    pub value: u32,
}

/// The word pair a [`Signal`] names, as both sides use it (in shared memory, only
/// atomically): the worker says each piece of a staged copy done there, the client looks.
#[repr(C)]
pub struct SignalWords {
    done: AtomicU32,
    status: AtomicU32,
}

impl SignalWords {
    /// The words at `p`.
    ///
    /// # Safety
    /// `p` points to 8 bytes, 4-aligned, live for `'a`, that every side touches only
    /// through a `SignalWords`.
    pub unsafe fn at<'a>(p: *const u8) -> &'a SignalWords {
        // SAFETY: per the contract (two `AtomicU32`, `repr(C)`: 8 bytes, 4-aligned).
        unsafe { &*(p as *const SignalWords) }
    }

    /// Nothing said yet (a copy's start, before its first piece is sent).
    pub fn reset(&self) {
        self.done.store(0, Ordering::Relaxed);
    }

    /// Says piece `value` done with `status`, unless a failure is said already: a copy
    /// answers its first.
    pub fn say(&self, value: u32, status: i32) {
        if self.failure().is_some() {
            return;
        }
        self.status.store(status as u32, Ordering::Relaxed);
        let failed = match status {
            crate::cu::CUDA_SUCCESS => 0,
            _ => crate::pinned::SIGNAL_FAILED,
        };
        self.done.store(value | failed, Ordering::Release);
    }

    /// The failure said, if one was.
    pub fn failure(&self) -> Option<i32> {
        (self.done.load(Ordering::Acquire) & crate::pinned::SIGNAL_FAILED != 0)
            .then(|| self.status.load(Ordering::Relaxed) as i32)
    }

    /// Whether piece `value` (or a later one) was said done, or a failure.
    pub fn said(&self, value: u32) -> bool {
        let v = self.done.load(Ordering::Acquire);
        v & crate::pinned::SIGNAL_FAILED != 0 || v >= value
    }
}

impl<'a> Message<'a> for PinnedCopy {
    fn encode(&self, w: &mut Writer) {
        w.bool(self.to_device);
        w.u64(self.device);
        w.u64(self.offset);
        w.u64(self.len);
        w.bool(self.stream.is_some());
        w.u64(self.stream.unwrap_or(0));
        w.bool(self.per_thread);
        w.bool(self.complete);
        w.bool(self.signal.is_some());
        let signal = self.signal.unwrap_or(Signal {
            offset: 0,
            value: 0,
        });
        w.u64(signal.offset);
        w.u32(signal.value);
        w.u64(self.whole);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let to_device = r.bool()?;
        let device = r.u64()?;
        let offset = r.u64()?;
        let len = r.u64()?;
        let has_stream = r.bool()?;
        let stream = r.u64()?;
        Ok(PinnedCopy {
            to_device,
            device,
            offset,
            len,
            stream: has_stream.then_some(stream),
            per_thread: r.bool()?,
            complete: r.bool()?,
            signal: {
                let has = r.bool()?;
                let offset = r.u64()?;
                let value = r.u32()?;
                has.then_some(Signal { offset, value })
            },
            whole: r.u64()?,
        })
    }
}

/// `CUtensorMap`: an opaque descriptor of 128 bytes that kernels using the tensor memory
/// accelerator (Hopper on: cuBLASLt's and cuDNN's GEMMs) receive as a parameter.
pub const TENSOR_MAP_BYTES: usize = 128;
/// The most dimensions a tensor map has (`tensorRank`).
pub const TENSOR_MAP_MAX_RANK: u32 = 5;

/// A tensor map the driver made (or changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMap(pub [u8; TENSOR_MAP_BYTES]);

impl<'a> Message<'a> for TensorMap {
    fn encode(&self, w: &mut Writer) {
        w.bytes(&self.0);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(TensorMap(r.bytes()?.try_into().map_err(|_| {
            DecodeError::BadValue("a tensor map is 128 bytes")
        })?))
    }
}

/// How a tensor map cuts its boxes: the part of `cuTensorMapEncodeTiled`,
/// `cuTensorMapEncodeIm2col` and `cuTensorMapEncodeIm2colWide` that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorMapLayout {
    Tiled {
        box_dim: Vec<u32>,
    },
    Im2col {
        lower_corner: Vec<i32>,
        upper_corner: Vec<i32>,
        channels_per_pixel: u32,
        pixels_per_column: u32,
    },
    Im2colWide {
        lower_corner_width: i32,
        upper_corner_width: i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        mode: u32,
    },
}

/// `cuTensorMapEncode*`: every argument but the output, its arrays read at their lengths
/// (`rank` entries, `rank - 1` strides, `rank - 2` im2col corners). Answered by
/// `Reply<TensorMap>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMapEncode {
    pub layout: TensorMapLayout,
    pub data_type: u32,
    pub rank: u32,
    /// A device address (the same number on both sides).
    pub address: u64,
    pub global_dim: Vec<u64>,
    pub global_strides: Vec<u64>,
    pub element_strides: Vec<u32>,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
}

fn put_u32s(w: &mut Writer, v: &[u32]) {
    w.u32(v.len() as u32);
    v.iter().for_each(|&x| w.u32(x));
}

fn put_i32s(w: &mut Writer, v: &[i32]) {
    w.u32(v.len() as u32);
    v.iter().for_each(|&x| w.i32(x));
}

fn put_u64s(w: &mut Writer, v: &[u64]) {
    w.u32(v.len() as u32);
    v.iter().for_each(|&x| w.u64(x));
}

/// At most this many entries in a tensor map's arrays.
const RANK_LIMIT: usize = TENSOR_MAP_MAX_RANK as usize;

fn get_u32s(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    (0..count(r, 4, RANK_LIMIT)?).map(|_| r.u32()).collect()
}

fn get_i32s(r: &mut Reader<'_>) -> Result<Vec<i32>, DecodeError> {
    (0..count(r, 4, RANK_LIMIT)?).map(|_| r.i32()).collect()
}

fn get_u64s(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    (0..count(r, 8, RANK_LIMIT)?).map(|_| r.u64()).collect()
}

impl<'a> Message<'a> for TensorMapEncode {
    fn encode(&self, w: &mut Writer) {
        match &self.layout {
            TensorMapLayout::Tiled { box_dim } => {
                w.u8(0);
                put_u32s(w, box_dim);
            }
            TensorMapLayout::Im2col {
                lower_corner,
                upper_corner,
                channels_per_pixel,
                pixels_per_column,
            } => {
                w.u8(1);
                put_i32s(w, lower_corner);
                put_i32s(w, upper_corner);
                w.u32(*channels_per_pixel);
                w.u32(*pixels_per_column);
            }
            TensorMapLayout::Im2colWide {
                lower_corner_width,
                upper_corner_width,
                channels_per_pixel,
                pixels_per_column,
                mode,
            } => {
                w.u8(2);
                w.i32(*lower_corner_width);
                w.i32(*upper_corner_width);
                w.u32(*channels_per_pixel);
                w.u32(*pixels_per_column);
                w.u32(*mode);
            }
        }
        w.u32(self.data_type);
        w.u32(self.rank);
        w.u64(self.address);
        put_u64s(w, &self.global_dim);
        put_u64s(w, &self.global_strides);
        put_u32s(w, &self.element_strides);
        w.u32(self.interleave);
        w.u32(self.swizzle);
        w.u32(self.l2_promotion);
        w.u32(self.oob_fill);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let layout = match r.u8()? {
            0 => TensorMapLayout::Tiled {
                box_dim: get_u32s(r)?,
            },
            1 => TensorMapLayout::Im2col {
                lower_corner: get_i32s(r)?,
                upper_corner: get_i32s(r)?,
                channels_per_pixel: r.u32()?,
                pixels_per_column: r.u32()?,
            },
            2 => TensorMapLayout::Im2colWide {
                lower_corner_width: r.i32()?,
                upper_corner_width: r.i32()?,
                channels_per_pixel: r.u32()?,
                pixels_per_column: r.u32()?,
                mode: r.u32()?,
            },
            _ => return Err(DecodeError::BadValue("unknown tensor map layout")),
        };
        Ok(TensorMapEncode {
            layout,
            data_type: r.u32()?,
            rank: r.u32()?,
            address: r.u64()?,
            global_dim: get_u64s(r)?,
            global_strides: get_u64s(r)?,
            element_strides: get_u32s(r)?,
            interleave: r.u32()?,
            swizzle: r.u32()?,
            l2_promotion: r.u32()?,
            oob_fill: r.u32()?,
        })
    }
}

/// `cuTensorMapReplaceAddress`: the map as the program holds it, and its new address.
/// Answered by `Reply<TensorMap>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapReplaceAddress {
    pub map: TensorMap,
    pub address: u64,
}

impl<'a> Message<'a> for TensorMapReplaceAddress {
    fn encode(&self, w: &mut Writer) {
        self.map.encode(w);
        w.u64(self.address);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(TensorMapReplaceAddress {
            map: TensorMap::decode(r)?,
            address: r.u64()?,
        })
    }
}

/// Most graph nodes one answer names (`cuGraphGetNodes`, a capture's dependencies).
pub const MAX_GRAPH_NODES: usize = 1 << 20;

fn put_ids(w: &mut Writer, v: &[u64]) {
    w.u32(v.len() as u32);
    v.iter().for_each(|&x| w.u64(x));
}

fn get_ids(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    (0..count(r, 8, MAX_GRAPH_NODES)?)
        .map(|_| r.u64())
        .collect()
}

/// `cuStreamGetCaptureInfo` (v1, v2, v3; the opcode says which): the stream, and which
/// optional outputs the program asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureInfoQuery {
    pub stream: u64,
    pub id: bool,
    pub graph: bool,
    pub dependencies: bool,
    pub edge_data: bool,
}

impl<'a> Message<'a> for CaptureInfoQuery {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.stream);
        w.bool(self.id);
        w.bool(self.graph);
        w.bool(self.dependencies);
        w.bool(self.edge_data);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(CaptureInfoQuery {
            stream: r.u64()?,
            id: r.bool()?,
            graph: r.bool()?,
            dependencies: r.bool()?,
            edge_data: r.bool()?,
        })
    }
}

/// The answer to a [`CaptureInfoQuery`] (in a `Reply`): the capture status, the number of
/// dependencies, and what was asked for (0 or empty where not): the capture's id, its graph
/// and dependency nodes by id (borrowed: the capture owns them), each dependency's edge data
/// (`CUgraphEdgeData`, 8 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CaptureInfo {
    pub status: u32,
    pub id: u64,
    pub graph: u64,
    pub count: u64,
    pub dependencies: Vec<u64>,
    pub edge_data: Vec<u64>,
}

impl<'a> Message<'a> for CaptureInfo {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.status);
        w.u64(self.id);
        w.u64(self.graph);
        w.u64(self.count);
        put_ids(w, &self.dependencies);
        put_ids(w, &self.edge_data);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(CaptureInfo {
            status: r.u32()?,
            id: r.u64()?,
            graph: r.u64()?,
            count: r.u64()?,
            dependencies: get_ids(r)?,
            edge_data: get_ids(r)?,
        })
    }
}

/// `cuGraphGetNodes`: the graph, and how many nodes the program's array holds (None: it
/// passed no array, and asks for the count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphNodesQuery {
    pub graph: u64,
    pub capacity: Option<u64>,
}

impl<'a> Message<'a> for GraphNodesQuery {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.graph);
        w.bool(self.capacity.is_some());
        w.u64(self.capacity.unwrap_or(0));
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let graph = r.u64()?;
        let present = r.bool()?;
        let capacity = r.u64()?;
        Ok(GraphNodesQuery {
            graph,
            capacity: present.then_some(capacity),
        })
    }
}

/// The answer to a [`GraphNodesQuery`] (in a `Reply`): the count the driver returned, and
/// the array's entries by id (0 for NULL; none when no array was passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNodes {
    pub count: u64,
    pub nodes: Vec<u64>,
}

impl<'a> Message<'a> for GraphNodes {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.count);
        put_ids(w, &self.nodes);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(GraphNodes {
            count: r.u64()?,
            nodes: get_ids(r)?,
        })
    }
}

/// `cuThreadExchangeStreamCaptureMode`: the mode the calling thread takes; answered (in a
/// `Reply`) by the one it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureMode(pub u32);

impl<'a> Message<'a> for CaptureMode {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.0);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(CaptureMode(r.u32()?))
    }
}

/// `cuLaunchHostFunc`, `cuStreamAddCallback` (and their `_ptsz`): the stream, and the id the
/// client knows the program's function (and its data) by. Sent without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFunction {
    pub stream: u64,
    pub callback: u64,
    /// `cuStreamAddCallback`'s flags (0).
    pub flags: u32,
}

impl<'a> Message<'a> for HostFunction {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.stream);
        w.u64(self.callback);
        w.u32(self.flags);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(HostFunction {
            stream: r.u64()?,
            callback: r.u64()?,
            flags: r.u32()?,
        })
    }
}

/// The CALLBACK frame of a host function the driver runs now: which, the stream's status
/// (what `cuStreamAddCallback`'s callback receives), and whether it is the last run (one
/// captured into a graph runs at every launch of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFunctionCall {
    pub callback: u64,
    pub status: i32,
    pub last: bool,
}

impl<'a> Message<'a> for HostFunctionCall {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.callback);
        w.i32(self.status);
        w.bool(self.last);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(HostFunctionCall {
            callback: r.u64()?,
            status: r.i32()?,
            last: r.bool()?,
        })
    }
}

/// The program's function for a [`HostFunctionCall`] returned: the stream may go on
/// ([`crate::host_functions::DONE`], sent without waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFunctionDone {
    pub callback: u64,
}

impl<'a> Message<'a> for HostFunctionDone {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.callback);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(HostFunctionDone { callback: r.u64()? })
    }
}

/// One `int` a query answers (in a `Reply`): cluster occupancy (`cuOccupancyMaxActiveClusters`,
/// `cuOccupancyMaxPotentialClusterSize`, asked with a `LaunchKernel` without arguments as the
/// launch configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value(pub i32);

impl<'a> Message<'a> for Value {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.0);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Value(r.i32()?))
    }
}

/// The name of a function or kernel (`cuFuncGetName`, `cuKernelGetName`; in a `Reply`): the
/// bytes of the driver's string, without its NUL. Asked with the object's id (a `u64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name<'a>(pub &'a [u8]);

impl<'a> Message<'a> for Name<'a> {
    fn encode(&self, w: &mut Writer) {
        w.bytes(self.0);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Name(r.bytes()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_launch_attributes_are_forwarded_and_unknown_ones_are_not() {
        for id in [0, 1, 2, 7, 12, 14, 16] {
            assert!(launch_attribute_forwarded(id), "{id}");
        }
        // 13: the driver writes a graph node's handle back; 15 is not in cuda.h 13.0.
        for id in [13, 15, 17, 1000] {
            assert!(!launch_attribute_forwarded(id), "{id}");
        }
    }

    fn roundtrip<'a, M: Message<'a> + PartialEq + std::fmt::Debug>(m: &M, buf: &'a mut Vec<u8>) {
        let mut w = Writer::new(0);
        m.encode(&mut w);
        *buf = w.body().to_vec();
        assert_eq!(&M::decode_all(buf).unwrap(), m);
        // Every truncation is an error, never a panic.
        for n in 0..buf.len() {
            assert!(M::decode_all(&buf[..n]).is_err());
        }
    }

    #[test]
    fn tensor_map_arrays_longer_than_the_largest_rank_are_malformed() {
        let m = TensorMapEncode {
            layout: TensorMapLayout::Tiled {
                box_dim: vec![1; 6],
            },
            data_type: 0,
            rank: 6,
            address: 0,
            global_dim: vec![],
            global_strides: vec![],
            element_strides: vec![],
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
        };
        let mut w = Writer::new(0);
        m.encode(&mut w);
        assert!(TensorMapEncode::decode_all(w.body()).is_err());
        let mut w = Writer::new(0);
        w.bytes(&[0; 127]);
        assert!(TensorMap::decode_all(w.body()).is_err());
    }

    #[test]
    fn requests_decode_as_encoded() {
        let image = [7u8; 100];
        roundtrip(
            &HostFunction {
                stream: 2,
                callback: 77,
                flags: 0,
            },
            &mut Vec::new(),
        );
        roundtrip(
            &HostFunctionCall {
                callback: 77,
                status: 700,
                last: true,
            },
            &mut Vec::new(),
        );
        roundtrip(&HostFunctionDone { callback: 77 }, &mut Vec::new());
        roundtrip(
            &CaptureInfoQuery {
                stream: 17,
                id: true,
                graph: false,
                dependencies: true,
                edge_data: false,
            },
            &mut Vec::new(),
        );
        let info: Reply<CaptureInfo> = Ok(CaptureInfo {
            status: 1,
            id: 9,
            graph: 40,
            count: 2,
            dependencies: vec![41, 42],
            edge_data: vec![0, 0x0101],
        });
        roundtrip(&info, &mut Vec::new());
        for capacity in [None, Some(0), Some(12)] {
            roundtrip(
                &GraphNodesQuery {
                    graph: 40,
                    capacity,
                },
                &mut Vec::new(),
            );
        }
        let nodes: Reply<GraphNodes> = Ok(GraphNodes {
            count: 3,
            nodes: vec![41, 42, 0],
        });
        roundtrip(&nodes, &mut Vec::new());
        roundtrip(&CaptureMode(2), &mut Vec::new());
        let name: Reply<Name> = Ok(Name(b"vadd"));
        roundtrip(&name, &mut Vec::new());
        let value: Reply<Value> = Ok(Value(-7));
        roundtrip(&value, &mut Vec::new());
        let encode = |layout| TensorMapEncode {
            layout,
            data_type: 7,
            rank: 3,
            address: 0x7f00_0000_0000,
            global_dim: vec![1024, 512, 8],
            global_strides: vec![2048, 1 << 20],
            element_strides: vec![1, 1, 1],
            interleave: 0,
            swizzle: 3,
            l2_promotion: 2,
            oob_fill: 0,
        };
        for layout in [
            TensorMapLayout::Tiled {
                box_dim: vec![64, 64, 1],
            },
            TensorMapLayout::Im2col {
                lower_corner: vec![-1],
                upper_corner: vec![1],
                channels_per_pixel: 64,
                pixels_per_column: 128,
            },
            TensorMapLayout::Im2colWide {
                lower_corner_width: -2,
                upper_corner_width: 2,
                channels_per_pixel: 32,
                pixels_per_column: 64,
                mode: 1,
            },
        ] {
            roundtrip(&encode(layout), &mut Vec::new());
        }
        let mut bytes = [0u8; TENSOR_MAP_BYTES];
        bytes[127] = 9;
        roundtrip(
            &TensorMapReplaceAddress {
                map: TensorMap(bytes),
                address: 0x7f00_0000_1000,
            },
            &mut Vec::new(),
        );
        let reply: Reply<TensorMap> = Ok(TensorMap(bytes));
        roundtrip(&reply, &mut Vec::new());
        roundtrip(
            &PinnedAlloc {
                bytes: 1 << 33,
                flags: 3,
            },
            &mut Vec::new(),
        );
        roundtrip(
            &PinnedAllocated {
                status: 0,
                offset: 4096,
                address: 0x2000_0000_1000,
            },
            &mut Vec::new(),
        );
        roundtrip(&PinnedFree { offset: 8192 }, &mut Vec::new());
        let signal = Some(Signal {
            offset: 8 << 20,
            value: 3,
        });
        for (stream, per_thread, complete, signal) in [
            (None, false, false, None),
            (Some(0), true, false, signal),
            (Some(77), false, true, signal),
        ] {
            roundtrip(
                &PinnedCopy {
                    to_device: stream.is_some(),
                    device: 0x7f00_0000_0000,
                    offset: 12288,
                    len: 1 << 28,
                    stream,
                    per_thread,
                    complete,
                    signal,
                    whole: 1 << 29,
                },
                &mut Vec::new(),
            );
        }
        roundtrip(
            &ModuleLoad {
                new_id: 99,
                digest: [3; 32],
                image: Some(&image),
                jit: vec![JitOption {
                    option: 7,
                    value: 2,
                }],
            },
            &mut Vec::new(),
        );
        roundtrip(
            &ModuleLoaded {
                status: 0,
                need_image: true,
                jit: vec![JitOut {
                    value: 5,
                    log: b"error".to_vec(),
                }],
            },
            &mut Vec::new(),
        );
        roundtrip(
            &LinkAdd {
                state: 7,
                input_type: 1,
                name: b"kernel.ptx",
                data: b".version 8.0",
                jit: Vec::new(),
            },
            &mut Vec::new(),
        );
        roundtrip(
            &LinkDone {
                status: 0,
                link_jit: vec![JitOut::default()],
                call_jit: Vec::new(),
                image: Some(vec![0x7f, b'E', b'L', b'F']),
            },
            &mut Vec::new(),
        );
        roundtrip(
            &ModuleGetFunction {
                new_id: 5,
                module: 6,
                name: b"vadd",
            },
            &mut Vec::new(),
        );
        roundtrip(
            &ParamLayout {
                params: vec![(0, 8), (8, 8), (16, 4)],
            },
            &mut Vec::new(),
        );
        roundtrip(
            &Copy2D {
                src: Side2D::Host,
                dst: Side2D::Device {
                    addr: 0x7f00_0000_0000,
                    pitch: 512,
                },
                width: 3,
                height: 2,
                stream: 0,
                rows: Some(&[1, 2, 3, 4, 5, 6]),
            },
            &mut Vec::new(),
        );
        roundtrip(
            &Copy2D {
                src: Side2D::Device {
                    addr: 0x7f00_0000_0000,
                    pitch: 512,
                },
                dst: Side2D::Host,
                width: 3,
                height: 2,
                stream: 9,
                rows: None,
            },
            &mut Vec::new(),
        );
        roundtrip(
            &GetGlobal {
                object: 7,
                name: b"counter",
            },
            &mut Vec::new(),
        );
        roundtrip(
            &DeviceRange {
                dptr: 0x7f00_0000_2000,
                bytes: 64,
            },
            &mut Vec::new(),
        );
        roundtrip(
            &FunctionOf {
                id: 1 << 63 | 4,
                layout: ParamLayout {
                    params: vec![(0, 8)],
                },
            },
            &mut Vec::new(),
        );
        roundtrip(
            &PointerAttributes {
                ptr: 0x7f00_0000_1000,
                single: false,
                attributes: vec![1, 2, 11, 12],
            },
            &mut Vec::new(),
        );
        roundtrip(
            &PointerValues {
                status: 0,
                values: vec![vec![1, 0, 0, 0], vec![7; 8]],
            },
            &mut Vec::new(),
        );
        let a = [1u8; 8];
        roundtrip(
            &LaunchKernel {
                function: 1,
                grid: [2, 3, 4],
                block: [5, 6, 7],
                shared_mem: 8,
                stream: 0,
                args: LaunchArgs::Each(vec![&a, &a[..4]]),
                attributes: Vec::new(),
            },
            &mut Vec::new(),
        );
        roundtrip(
            &LaunchKernel {
                function: 1,
                grid: [1; 3],
                block: [1; 3],
                shared_mem: 0,
                stream: 1,
                args: LaunchArgs::Buffer(&a),
                attributes: vec![LaunchAttribute {
                    id: 4,
                    value: [2; 64],
                }],
            },
            &mut Vec::new(),
        );
        assert_eq!(
            ParamLayout {
                params: vec![(0, 8), (8, 4)]
            }
            .buffer_size(),
            12
        );
    }
}
