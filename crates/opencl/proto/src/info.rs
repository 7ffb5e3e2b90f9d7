//! Info queries whose values are not plain data: handles (translated to ids on the server and
//! back to client objects on the client), property lists holding a platform, and values the
//! server rewrites.

use crate::{cl::*, HandleKind, Op, Writer};

/// What an info value holds, beyond plain bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoValue {
    Plain,
    /// An array of handles of this kind.
    Handles(HandleKind),
    /// A context property list (pairs; the value after CL_CONTEXT_PLATFORM is a platform).
    ContextProps,
    /// A host pointer that only makes sense in the client (CL_MEM_HOST_PTR).
    ClientHostPtr,
    /// Program binaries: an array of pointers into the caller's memory.
    Binaries,
}

pub fn info_value(op: Op, param: u32) -> InfoValue {
    use HandleKind::*;
    use InfoValue::*;
    match (op, param) {
        (Op::clGetDeviceInfo, CL_DEVICE_PLATFORM) => Handles(Platform),
        (Op::clGetDeviceInfo, CL_DEVICE_PARENT_DEVICE) => Handles(Device),
        (Op::clGetContextInfo, CL_CONTEXT_DEVICES) => Handles(Device),
        (Op::clGetContextInfo, CL_CONTEXT_PROPERTIES) => ContextProps,
        (Op::clGetCommandQueueInfo, CL_QUEUE_CONTEXT) => Handles(Context),
        (Op::clGetCommandQueueInfo, CL_QUEUE_DEVICE) => Handles(Device),
        (Op::clGetCommandQueueInfo, CL_QUEUE_DEVICE_DEFAULT) => Handles(Queue),
        (Op::clGetMemObjectInfo, CL_MEM_CONTEXT) => Handles(Context),
        (Op::clGetMemObjectInfo, CL_MEM_ASSOCIATED_MEMOBJECT) => Handles(Mem),
        (Op::clGetMemObjectInfo, CL_MEM_HOST_PTR) => ClientHostPtr,
        (Op::clGetImageInfo, CL_IMAGE_BUFFER) => Handles(Mem),
        (Op::clGetSamplerInfo, CL_SAMPLER_CONTEXT) => Handles(Context),
        (Op::clGetProgramInfo, CL_PROGRAM_CONTEXT) => Handles(Context),
        (Op::clGetProgramInfo, CL_PROGRAM_DEVICES) => Handles(Device),
        (Op::clGetProgramInfo, CL_PROGRAM_BINARIES) => Binaries,
        (Op::clGetKernelInfo, CL_KERNEL_CONTEXT) => Handles(Context),
        (Op::clGetKernelInfo, CL_KERNEL_PROGRAM) => Handles(Program),
        (Op::clGetEventInfo, CL_EVENT_COMMAND_QUEUE) => Handles(Queue),
        (Op::clGetEventInfo, CL_EVENT_CONTEXT) => Handles(Context),
        _ => Plain,
    }
}

/// Whether an info answer can never change for the object, so the client may keep it and
/// answer repeats without a round trip. Reference and map counts change; programs change when
/// built; events change as they run. Libraries ask again and again (clFFT asks its program for
/// the context at every transform: a round trip behind the pipelined launch each time).
pub fn cacheable(op: Op, param: u32) -> bool {
    match op {
        Op::clGetPlatformInfo | Op::clGetImageInfo | Op::clGetKernelArgInfo => true,
        // A kernel's local memory counts its local arguments' sizes, set at any time.
        Op::clGetKernelWorkGroupInfo => param != CL_KERNEL_LOCAL_MEM_SIZE,
        Op::clGetDeviceInfo => param != 0x1047,
        Op::clGetContextInfo => param != 0x1080,
        Op::clGetCommandQueueInfo => param != 0x1092,
        Op::clGetMemObjectInfo => !matches!(param, 0x1104 | 0x1105),
        Op::clGetSamplerInfo => param != 0x1150,
        Op::clGetKernelInfo => param != 0x1192,
        // What a program was made from; its build, kernels and binaries change when built.
        Op::clGetProgramInfo => matches!(
            param,
            CL_PROGRAM_CONTEXT
                | CL_PROGRAM_NUM_DEVICES
                | CL_PROGRAM_DEVICES
                | CL_PROGRAM_SOURCE
                | CL_PROGRAM_IL
        ),
        // Where and what a command is; not its status.
        Op::clGetEventInfo => matches!(
            param,
            CL_EVENT_CONTEXT | CL_EVENT_COMMAND_QUEUE | CL_EVENT_COMMAND_TYPE
        ),
        _ => false,
    }
}

/// An info query's answer as it travels: success, the whole value, the size the driver reported
/// (the server's answers and those the client gives itself alike).
pub fn write_answer(w: &mut Writer, value: &[u8], reported: usize) {
    w.i32(CL_SUCCESS);
    w.bytes(value);
    w.u64(reported as u64);
}
