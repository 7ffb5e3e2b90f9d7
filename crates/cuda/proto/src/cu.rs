//! CUDA's status codes (`CUresult`, cuda.h's `cudaError_enum`) and their names and messages
//! for `cuGetErrorName`/`cuGetErrorString`, answered in the client: they must work with no
//! server at all (a program reports why it has no device).

#![allow(missing_docs)]

use std::ffi::CStr;

pub const CUDA_SUCCESS: i32 = 0;
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: i32 = 3;
pub const CUDA_ERROR_DEINITIALIZED: i32 = 4;
pub const CUDA_ERROR_PROFILER_DISABLED: i32 = 5;
pub const CUDA_ERROR_PROFILER_NOT_INITIALIZED: i32 = 6;
pub const CUDA_ERROR_PROFILER_ALREADY_STARTED: i32 = 7;
pub const CUDA_ERROR_PROFILER_ALREADY_STOPPED: i32 = 8;
pub const CUDA_ERROR_STUB_LIBRARY: i32 = 34;
pub const CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: i32 = 36;
pub const CUDA_ERROR_DEVICE_UNAVAILABLE: i32 = 46;
pub const CUDA_ERROR_NO_DEVICE: i32 = 100;
pub const CUDA_ERROR_INVALID_DEVICE: i32 = 101;
pub const CUDA_ERROR_DEVICE_NOT_LICENSED: i32 = 102;
pub const CUDA_ERROR_INVALID_IMAGE: i32 = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;
pub const CUDA_ERROR_CONTEXT_ALREADY_CURRENT: i32 = 202;
pub const CUDA_ERROR_MAP_FAILED: i32 = 205;
pub const CUDA_ERROR_UNMAP_FAILED: i32 = 206;
pub const CUDA_ERROR_ARRAY_IS_MAPPED: i32 = 207;
pub const CUDA_ERROR_ALREADY_MAPPED: i32 = 208;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: i32 = 209;
pub const CUDA_ERROR_ALREADY_ACQUIRED: i32 = 210;
pub const CUDA_ERROR_NOT_MAPPED: i32 = 211;
pub const CUDA_ERROR_NOT_MAPPED_AS_ARRAY: i32 = 212;
pub const CUDA_ERROR_NOT_MAPPED_AS_POINTER: i32 = 213;
pub const CUDA_ERROR_ECC_UNCORRECTABLE: i32 = 214;
pub const CUDA_ERROR_UNSUPPORTED_LIMIT: i32 = 215;
pub const CUDA_ERROR_CONTEXT_ALREADY_IN_USE: i32 = 216;
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: i32 = 217;
pub const CUDA_ERROR_INVALID_PTX: i32 = 218;
pub const CUDA_ERROR_INVALID_GRAPHICS_CONTEXT: i32 = 219;
pub const CUDA_ERROR_NVLINK_UNCORRECTABLE: i32 = 220;
pub const CUDA_ERROR_JIT_COMPILER_NOT_FOUND: i32 = 221;
pub const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: i32 = 222;
pub const CUDA_ERROR_JIT_COMPILATION_DISABLED: i32 = 223;
pub const CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY: i32 = 224;
pub const CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC: i32 = 225;
pub const CUDA_ERROR_CONTAINED: i32 = 226;
pub const CUDA_ERROR_INVALID_SOURCE: i32 = 300;
pub const CUDA_ERROR_FILE_NOT_FOUND: i32 = 301;
pub const CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND: i32 = 302;
pub const CUDA_ERROR_SHARED_OBJECT_INIT_FAILED: i32 = 303;
pub const CUDA_ERROR_OPERATING_SYSTEM: i32 = 304;
pub const CUDA_ERROR_INVALID_HANDLE: i32 = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;
pub const CUDA_ERROR_LOSSY_QUERY: i32 = 402;
pub const CUDA_ERROR_NOT_FOUND: i32 = 500;
pub const CUDA_ERROR_NOT_READY: i32 = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: i32 = 701;
pub const CUDA_ERROR_LAUNCH_TIMEOUT: i32 = 702;
pub const CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING: i32 = 703;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: i32 = 705;
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: i32 = 708;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: i32 = 709;
pub const CUDA_ERROR_ASSERT: i32 = 710;
pub const CUDA_ERROR_TOO_MANY_PEERS: i32 = 711;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: i32 = 713;
pub const CUDA_ERROR_HARDWARE_STACK_ERROR: i32 = 714;
pub const CUDA_ERROR_ILLEGAL_INSTRUCTION: i32 = 715;
pub const CUDA_ERROR_MISALIGNED_ADDRESS: i32 = 716;
pub const CUDA_ERROR_INVALID_ADDRESS_SPACE: i32 = 717;
pub const CUDA_ERROR_INVALID_PC: i32 = 718;
pub const CUDA_ERROR_LAUNCH_FAILED: i32 = 719;
pub const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: i32 = 720;
pub const CUDA_ERROR_TENSOR_MEMORY_LEAK: i32 = 721;
pub const CUDA_ERROR_NOT_PERMITTED: i32 = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: i32 = 801;
pub const CUDA_ERROR_SYSTEM_NOT_READY: i32 = 802;
pub const CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: i32 = 803;
pub const CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: i32 = 804;
pub const CUDA_ERROR_MPS_CONNECTION_FAILED: i32 = 805;
pub const CUDA_ERROR_MPS_RPC_FAILURE: i32 = 806;
pub const CUDA_ERROR_MPS_SERVER_NOT_READY: i32 = 807;
pub const CUDA_ERROR_MPS_MAX_CLIENTS_REACHED: i32 = 808;
pub const CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED: i32 = 809;
pub const CUDA_ERROR_MPS_CLIENT_TERMINATED: i32 = 810;
pub const CUDA_ERROR_CDP_NOT_SUPPORTED: i32 = 811;
pub const CUDA_ERROR_CDP_VERSION_MISMATCH: i32 = 812;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: i32 = 901;
pub const CUDA_ERROR_STREAM_CAPTURE_MERGE: i32 = 902;
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: i32 = 903;
pub const CUDA_ERROR_STREAM_CAPTURE_UNJOINED: i32 = 904;
pub const CUDA_ERROR_STREAM_CAPTURE_ISOLATION: i32 = 905;
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: i32 = 906;
pub const CUDA_ERROR_CAPTURED_EVENT: i32 = 907;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: i32 = 908;
pub const CUDA_ERROR_TIMEOUT: i32 = 909;
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: i32 = 910;
pub const CUDA_ERROR_EXTERNAL_DEVICE: i32 = 911;
pub const CUDA_ERROR_INVALID_CLUSTER_SIZE: i32 = 912;
pub const CUDA_ERROR_FUNCTION_NOT_LOADED: i32 = 913;
pub const CUDA_ERROR_INVALID_RESOURCE_TYPE: i32 = 914;
pub const CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: i32 = 915;
pub const CUDA_ERROR_KEY_ROTATION: i32 = 916;
pub const CUDA_ERROR_UNKNOWN: i32 = 999;

/// Every status: (code, name, message).
static TABLE: &[(i32, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_DEINITIALIZED,
        c"CUDA_ERROR_DEINITIALIZED",
        c"driver shutting down",
    ),
    (
        CUDA_ERROR_PROFILER_DISABLED,
        c"CUDA_ERROR_PROFILER_DISABLED",
        c"profiler disabled",
    ),
    (
        CUDA_ERROR_PROFILER_NOT_INITIALIZED,
        c"CUDA_ERROR_PROFILER_NOT_INITIALIZED",
        c"profiler not initialized",
    ),
    (
        CUDA_ERROR_PROFILER_ALREADY_STARTED,
        c"CUDA_ERROR_PROFILER_ALREADY_STARTED",
        c"profiler already started",
    ),
    (
        CUDA_ERROR_PROFILER_ALREADY_STOPPED,
        c"CUDA_ERROR_PROFILER_ALREADY_STOPPED",
        c"profiler already stopped",
    ),
    (
        CUDA_ERROR_STUB_LIBRARY,
        c"CUDA_ERROR_STUB_LIBRARY",
        c"CUDA driver is a stub library",
    ),
    (
        CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
        c"CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
        c"CUDA driver is too old for this call",
    ),
    (
        CUDA_ERROR_DEVICE_UNAVAILABLE,
        c"CUDA_ERROR_DEVICE_UNAVAILABLE",
        c"CUDA-capable device(s) is/are busy or unavailable",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_DEVICE_NOT_LICENSED,
        c"CUDA_ERROR_DEVICE_NOT_LICENSED",
        c"device not licensed",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
        c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
        c"context already current",
    ),
    (
        CUDA_ERROR_MAP_FAILED,
        c"CUDA_ERROR_MAP_FAILED",
        c"map failed",
    ),
    (
        CUDA_ERROR_UNMAP_FAILED,
        c"CUDA_ERROR_UNMAP_FAILED",
        c"unmap failed",
    ),
    (
        CUDA_ERROR_ARRAY_IS_MAPPED,
        c"CUDA_ERROR_ARRAY_IS_MAPPED",
        c"array is mapped",
    ),
    (
        CUDA_ERROR_ALREADY_MAPPED,
        c"CUDA_ERROR_ALREADY_MAPPED",
        c"already mapped",
    ),
    (
        CUDA_ERROR_NO_BINARY_FOR_GPU,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        c"no kernel image is available for execution on the device",
    ),
    (
        CUDA_ERROR_ALREADY_ACQUIRED,
        c"CUDA_ERROR_ALREADY_ACQUIRED",
        c"already acquired",
    ),
    (
        CUDA_ERROR_NOT_MAPPED,
        c"CUDA_ERROR_NOT_MAPPED",
        c"not mapped",
    ),
    (
        CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
        c"CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
        c"not mapped as array",
    ),
    (
        CUDA_ERROR_NOT_MAPPED_AS_POINTER,
        c"CUDA_ERROR_NOT_MAPPED_AS_POINTER",
        c"not mapped as pointer",
    ),
    (
        CUDA_ERROR_ECC_UNCORRECTABLE,
        c"CUDA_ERROR_ECC_UNCORRECTABLE",
        c"ecc uncorrectable",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_LIMIT,
        c"CUDA_ERROR_UNSUPPORTED_LIMIT",
        c"unsupported limit",
    ),
    (
        CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
        c"CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
        c"context already in use",
    ),
    (
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        c"peer access unsupported",
    ),
    (
        CUDA_ERROR_INVALID_PTX,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        c"CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
        c"invalid graphics context",
    ),
    (
        CUDA_ERROR_NVLINK_UNCORRECTABLE,
        c"CUDA_ERROR_NVLINK_UNCORRECTABLE",
        c"nvlink uncorrectable",
    ),
    (
        CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
        c"CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        c"jit compiler not found",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        c"unsupported ptx version",
    ),
    (
        CUDA_ERROR_JIT_COMPILATION_DISABLED,
        c"CUDA_ERROR_JIT_COMPILATION_DISABLED",
        c"jit compilation disabled",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
        c"CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
        c"unsupported exec affinity",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
        c"CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
        c"unsupported devside sync",
    ),
    (CUDA_ERROR_CONTAINED, c"CUDA_ERROR_CONTAINED", c"contained"),
    (
        CUDA_ERROR_INVALID_SOURCE,
        c"CUDA_ERROR_INVALID_SOURCE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_FILE_NOT_FOUND,
        c"CUDA_ERROR_FILE_NOT_FOUND",
        c"file not found",
    ),
    (
        CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        c"CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
        c"shared object symbol not found",
    ),
    (
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        c"CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
        c"shared object init failed",
    ),
    (
        CUDA_ERROR_OPERATING_SYSTEM,
        c"CUDA_ERROR_OPERATING_SYSTEM",
        c"operating system",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_ILLEGAL_STATE,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"illegal state",
    ),
    (
        CUDA_ERROR_LOSSY_QUERY,
        c"CUDA_ERROR_LOSSY_QUERY",
        c"lossy query",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_READY,
        c"CUDA_ERROR_NOT_READY",
        c"device not ready",
    ),
    (
        CUDA_ERROR_ILLEGAL_ADDRESS,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        CUDA_ERROR_LAUNCH_TIMEOUT,
        c"CUDA_ERROR_LAUNCH_TIMEOUT",
        c"the launch timed out and was terminated",
    ),
    (
        CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
        c"CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
        c"launch incompatible texturing",
    ),
    (
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        c"peer access already enabled",
    ),
    (
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        c"peer access not enabled",
    ),
    (
        CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        c"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        c"primary context active",
    ),
    (
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        c"CUDA_ERROR_CONTEXT_IS_DESTROYED",
        c"context is destroyed",
    ),
    (CUDA_ERROR_ASSERT, c"CUDA_ERROR_ASSERT", c"assert"),
    (
        CUDA_ERROR_TOO_MANY_PEERS,
        c"CUDA_ERROR_TOO_MANY_PEERS",
        c"too many peers",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"host memory already registered",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"host memory not registered",
    ),
    (
        CUDA_ERROR_HARDWARE_STACK_ERROR,
        c"CUDA_ERROR_HARDWARE_STACK_ERROR",
        c"hardware stack error",
    ),
    (
        CUDA_ERROR_ILLEGAL_INSTRUCTION,
        c"CUDA_ERROR_ILLEGAL_INSTRUCTION",
        c"illegal instruction",
    ),
    (
        CUDA_ERROR_MISALIGNED_ADDRESS,
        c"CUDA_ERROR_MISALIGNED_ADDRESS",
        c"misaligned address",
    ),
    (
        CUDA_ERROR_INVALID_ADDRESS_SPACE,
        c"CUDA_ERROR_INVALID_ADDRESS_SPACE",
        c"invalid address space",
    ),
    (
        CUDA_ERROR_INVALID_PC,
        c"CUDA_ERROR_INVALID_PC",
        c"invalid pc",
    ),
    (
        CUDA_ERROR_LAUNCH_FAILED,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        c"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
        c"cooperative launch too large",
    ),
    (
        CUDA_ERROR_TENSOR_MEMORY_LEAK,
        c"CUDA_ERROR_TENSOR_MEMORY_LEAK",
        c"tensor memory leak",
    ),
    (
        CUDA_ERROR_NOT_PERMITTED,
        c"CUDA_ERROR_NOT_PERMITTED",
        c"operation not permitted",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (
        CUDA_ERROR_SYSTEM_NOT_READY,
        c"CUDA_ERROR_SYSTEM_NOT_READY",
        c"system not ready",
    ),
    (
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        c"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        c"system driver mismatch",
    ),
    (
        CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        c"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        c"compat not supported on device",
    ),
    (
        CUDA_ERROR_MPS_CONNECTION_FAILED,
        c"CUDA_ERROR_MPS_CONNECTION_FAILED",
        c"mps connection failed",
    ),
    (
        CUDA_ERROR_MPS_RPC_FAILURE,
        c"CUDA_ERROR_MPS_RPC_FAILURE",
        c"mps rpc failure",
    ),
    (
        CUDA_ERROR_MPS_SERVER_NOT_READY,
        c"CUDA_ERROR_MPS_SERVER_NOT_READY",
        c"mps server not ready",
    ),
    (
        CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
        c"CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
        c"mps max clients reached",
    ),
    (
        CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
        c"CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
        c"mps max connections reached",
    ),
    (
        CUDA_ERROR_MPS_CLIENT_TERMINATED,
        c"CUDA_ERROR_MPS_CLIENT_TERMINATED",
        c"mps client terminated",
    ),
    (
        CUDA_ERROR_CDP_NOT_SUPPORTED,
        c"CUDA_ERROR_CDP_NOT_SUPPORTED",
        c"cdp not supported",
    ),
    (
        CUDA_ERROR_CDP_VERSION_MISMATCH,
        c"CUDA_ERROR_CDP_VERSION_MISMATCH",
        c"cdp version mismatch",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"stream capture unsupported",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"stream capture invalidated",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_MERGE,
        c"CUDA_ERROR_STREAM_CAPTURE_MERGE",
        c"stream capture merge",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        c"stream capture unmatched",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        c"stream capture unjoined",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        c"stream capture isolation",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        c"stream capture implicit",
    ),
    (
        CUDA_ERROR_CAPTURED_EVENT,
        c"CUDA_ERROR_CAPTURED_EVENT",
        c"captured event",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"stream capture wrong thread",
    ),
    (CUDA_ERROR_TIMEOUT, c"CUDA_ERROR_TIMEOUT", c"timeout"),
    (
        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        c"CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
        c"graph exec update failure",
    ),
    (
        CUDA_ERROR_EXTERNAL_DEVICE,
        c"CUDA_ERROR_EXTERNAL_DEVICE",
        c"external device",
    ),
    (
        CUDA_ERROR_INVALID_CLUSTER_SIZE,
        c"CUDA_ERROR_INVALID_CLUSTER_SIZE",
        c"invalid cluster size",
    ),
    (
        CUDA_ERROR_FUNCTION_NOT_LOADED,
        c"CUDA_ERROR_FUNCTION_NOT_LOADED",
        c"function not loaded",
    ),
    (
        CUDA_ERROR_INVALID_RESOURCE_TYPE,
        c"CUDA_ERROR_INVALID_RESOURCE_TYPE",
        c"invalid resource type",
    ),
    (
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        c"CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
        c"invalid resource configuration",
    ),
    (
        CUDA_ERROR_KEY_ROTATION,
        c"CUDA_ERROR_KEY_ROTATION",
        c"key rotation",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The status's name (`"CUDA_ERROR_NO_DEVICE"`), None for a value that is no status.
pub fn error_name(code: i32) -> Option<&'static CStr> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// The status's message (`"no CUDA-capable device is detected"`), None for a value that is no
/// status.
pub fn error_string(code: i32) -> Option<&'static CStr> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.2)
}
