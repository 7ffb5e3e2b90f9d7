//! API-level vocabulary shared by both sides.

use crate::cl;

/// The object types of the API. A handle on the wire is a u64 id of one of these kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum HandleKind {
    Platform = 1,
    Device,
    Context,
    Queue,
    Mem,
    Sampler,
    Program,
    Kernel,
    Event,
}

impl HandleKind {
    /// The status native OpenCL returns for an invalid object of this kind.
    pub fn invalid_code(self) -> i32 {
        match self {
            HandleKind::Platform => cl::CL_INVALID_PLATFORM,
            HandleKind::Device => cl::CL_INVALID_DEVICE,
            HandleKind::Context => cl::CL_INVALID_CONTEXT,
            HandleKind::Queue => cl::CL_INVALID_COMMAND_QUEUE,
            HandleKind::Mem => cl::CL_INVALID_MEM_OBJECT,
            HandleKind::Sampler => cl::CL_INVALID_SAMPLER,
            HandleKind::Program => cl::CL_INVALID_PROGRAM,
            HandleKind::Kernel => cl::CL_INVALID_KERNEL,
            HandleKind::Event => cl::CL_INVALID_EVENT,
        }
    }

    pub fn from_u8(v: u8) -> Option<HandleKind> {
        use HandleKind::*;
        [
            Platform, Device, Context, Queue, Mem, Sampler, Program, Kernel, Event,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }

    /// Objects whose lifetime the application does not manage (root devices, platforms).
    pub fn is_permanent(self) -> bool {
        matches!(self, HandleKind::Platform | HandleKind::Device)
    }
}

/// The callback signatures of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CallbackKind {
    /// `void (const char *errinfo, const void *private_info, size_t cb, void *user_data)`
    ContextNotify = 1,
    /// `void (cl_program, void *user_data)` (build, compile, link)
    ProgramNotify,
    /// `void (cl_event, cl_int status, void *user_data)`
    EventNotify,
    /// `void (cl_xxx object, void *user_data)` (destructor and release callbacks)
    ObjectNotify,
}

impl CallbackKind {
    pub fn from_u8(v: u8) -> Option<CallbackKind> {
        use CallbackKind::*;
        [ContextNotify, ProgramNotify, EventNotify, ObjectNotify]
            .into_iter()
            .find(|k| *k as u8 == v)
    }
}

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
