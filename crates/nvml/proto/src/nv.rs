//! NVML's status codes (`nvmlReturn_t`) and their messages for `nvmlErrorString`, answered in
//! the client: they must work with no server at all (a program reports why it has no GPU).

#![allow(missing_docs)]

use std::ffi::CStr;

pub const NVML_SUCCESS: i32 = 0;
pub const NVML_ERROR_UNINITIALIZED: i32 = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: i32 = 2;
pub const NVML_ERROR_NOT_SUPPORTED: i32 = 3;
pub const NVML_ERROR_NO_PERMISSION: i32 = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: i32 = 5;
pub const NVML_ERROR_NOT_FOUND: i32 = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: i32 = 7;
pub const NVML_ERROR_INSUFFICIENT_POWER: i32 = 8;
pub const NVML_ERROR_DRIVER_NOT_LOADED: i32 = 9;
pub const NVML_ERROR_TIMEOUT: i32 = 10;
pub const NVML_ERROR_IRQ_ISSUE: i32 = 11;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: i32 = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: i32 = 13;
pub const NVML_ERROR_CORRUPTED_INFOROM: i32 = 14;
pub const NVML_ERROR_GPU_IS_LOST: i32 = 15;
pub const NVML_ERROR_RESET_REQUIRED: i32 = 16;
pub const NVML_ERROR_OPERATING_SYSTEM: i32 = 17;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: i32 = 18;
pub const NVML_ERROR_IN_USE: i32 = 19;
pub const NVML_ERROR_MEMORY: i32 = 20;
pub const NVML_ERROR_NO_DATA: i32 = 21;
pub const NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: i32 = 22;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: i32 = 23;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: i32 = 24;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: i32 = 25;
pub const NVML_ERROR_DEPRECATED: i32 = 26;
pub const NVML_ERROR_NOT_READY: i32 = 27;
pub const NVML_ERROR_GPU_NOT_FOUND: i32 = 28;
pub const NVML_ERROR_INVALID_STATE: i32 = 29;
pub const NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: i32 = 30;
pub const NVML_ERROR_UNKNOWN: i32 = 999;

/// `nvmlErrorString`'s text for a status (the real library's texts, as its Python binding
/// shows them); any other value is an unknown error, as there.
pub fn error_string(code: i32) -> &'static CStr {
    match code {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_TIMEOUT => c"Timeout",
        NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM => c"The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_IN_USE => c"In use by another client",
        NVML_ERROR_MEMORY => c"Insufficient Memory",
        NVML_ERROR_NO_DATA => c"No data",
        NVML_ERROR_VGPU_ECC_NOT_SUPPORTED => {
            c"The requested vgpu operation is not available on target device, becasue ECC is enabled"
        }
        NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        NVML_ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        NVML_ERROR_DEPRECATED => c"Deprecated",
        NVML_ERROR_NOT_READY => c"Not Ready",
        NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
        NVML_ERROR_INVALID_STATE => c"Invalid state",
        NVML_ERROR_RESET_TYPE_NOT_SUPPORTED => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}
