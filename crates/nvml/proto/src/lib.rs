//! NVML's vocabulary on Wormhole's wire, shared by the NVML client (`libnvidia-ml.so.1`) and
//! backend: the opcode table generated from the API description (`api/nvml.api`), the device
//! handle kind, NVML's status codes and the layouts of the structs that travel as bytes.
//! Frames and the body codec are the common `wormhole-wire`, re-exported.

pub mod nv;
/// The status codes under the name generated code uses for every API.
pub use nv as codes;
pub use wormhole_wire::*;

/// Generated from `api/nvml.api`: the opcodes and handle kinds.
#[allow(clippy::match_single_binding)]
mod generated {
    use crate::nv as codes;
    include!(concat!(env!("OUT_DIR"), "/proto.rs"));
}
pub use generated::{CallbackKind, HandleKind, Op, OP_COUNT};

/// The API an NVML session speaks (sent in HELLO).
pub const API: &str = "nvml";

/// `nvmlMemory_t`: total, free, used (bytes).
pub const MEMORY_SIZE: usize = 24;
/// `nvmlMemory_v2_t`: version, padding, total, reserved, free, used.
pub const MEMORY_V2_SIZE: usize = 40;
/// `nvmlMemory_v2`: the version a caller of `nvmlDeviceGetMemoryInfo_v2` puts in the struct
/// (`NVML_STRUCT_VERSION(Memory, 2)`: its size, and the version in the top byte).
pub const MEMORY_V2_VERSION: u32 = MEMORY_V2_SIZE as u32 | 2 << 24;

/// `nvmlGpuFabricInfo_t` (`nvmlDeviceGetGpuFabricInfo`), and `nvmlGpuFabricInfo_v2_t` and
/// `_v3_t` (`nvmlDeviceGetGpuFabricInfoV`, their version in their first field): sizes. All
/// zeros after the version is a GPU on no fabric (state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED).
pub const FABRIC_INFO_V1_SIZE: usize = 28;
pub const FABRIC_INFO_V2_SIZE: usize = 36;
pub const FABRIC_INFO_V3_SIZE: usize = 40;
pub const FABRIC_INFO_V2_VERSION: u32 = FABRIC_INFO_V2_SIZE as u32 | 2 << 24;
pub const FABRIC_INFO_V3_VERSION: u32 = FABRIC_INFO_V3_SIZE as u32 | 3 << 24;

/// `nvmlProcessInfo_v1_t` (`nvmlDeviceGetComputeRunningProcesses`): pid, padding, used memory.
pub const PROCESS_INFO_V1_SIZE: usize = 16;
/// `nvmlProcessInfo_t` (`_v2` and `_v3`): pid, padding, used memory, GPU and compute instance.
pub const PROCESS_INFO_SIZE: usize = 24;

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn description() -> wormhole_apigen::Api {
        wormhole_apigen::Api::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("api/nvml.api"))
            .unwrap()
    }

    /// Every symbol the real library exports has an entry in the description (forwarded,
    /// answered locally, or refused with a log line), so a program linked against NVML (or a
    /// binding that looks each symbol up) finds each one in Wormhole's library; the list is
    /// the real library's (`nm -D`, driver 580), in ../shared/cuda.
    #[test]
    fn the_description_covers_every_symbol_of_the_real_library() {
        let list = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../../shared/cuda/libnvidia-ml-580-symbols.txt");
        let Ok(text) = std::fs::read_to_string(&list) else {
            panic!("{} is missing (the shared material)", list.display());
        };
        let api = description();
        let missing = api.not_described(&text);
        assert!(missing.is_empty(), "not in api/nvml.api: {missing:?}");
        assert_eq!(text.lines().filter(|l| !l.trim().is_empty()).count(), 404);
        assert_eq!(api.funcs.len(), 404);
    }

    /// What a framework asks of NVML is forwarded: a change of the description that drops
    /// one fails here, not on a GPU machine.
    #[test]
    fn what_frameworks_ask_is_forwarded() {
        let api = description();
        let mode = |n: &str| api.funcs.iter().find(|f| f.name == n).map(|f| f.mode);
        use wormhole_apigen::Mode::{Custom, Gen, Local, Unsupported};
        for n in [
            "nvmlDeviceGetCount_v2",
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetHandleByPciBusId_v2",
            "nvmlDeviceGetName",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetUtilizationRates",
            "nvmlSystemGetCudaDriverVersion_v2",
            "nvmlDeviceGetNvLinkRemoteDeviceType",
        ] {
            assert_eq!(mode(n), Some(Gen), "{n}");
        }
        for n in ["nvmlInit_v2", "nvmlShutdown", "nvmlErrorString"] {
            assert_eq!(mode(n), Some(Local), "{n}");
        }
        // The tenant's own processes are answered (PyTorch's out-of-memory report asks);
        // other tenants' are not the tenant's to see.
        for n in [
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3",
        ] {
            assert_eq!(mode(n), Some(Custom), "{n}");
        }
        assert_eq!(mode("nvmlDeviceGetAccountingPids"), Some(Unsupported));
    }

    #[test]
    fn every_status_has_a_message() {
        use crate::nv::*;
        assert_eq!(
            error_string(NVML_ERROR_DRIVER_NOT_LOADED).to_str().unwrap(),
            "Driver Not Loaded"
        );
        assert_eq!(error_string(12345).to_str().unwrap(), "Unknown Error");
        assert_eq!(super::MEMORY_V2_VERSION, 0x0200_0028);
    }
}
