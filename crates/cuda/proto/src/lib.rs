//! The CUDA driver API's vocabulary on Wormhole's wire, shared by the CUDA client
//! (`libcuda.so.1`) and backend: the opcode table generated from the API description
//! (`api/cuda.api`), the handle kinds, and CUDA's status codes. Frames and the body codec are
//! the common `wormhole-wire`, re-exported so CUDA code names one crate.

pub mod cu;
pub mod requests;
/// The status codes under the name generated code uses for every API.
pub use cu as codes;
pub use wormhole_wire::*;

/// Generated from `api/cuda.api`: the opcodes and handle kinds (and no callback kinds yet).
#[allow(clippy::match_single_binding)]
mod generated {
    use crate::cu as codes;
    include!(concat!(env!("OUT_DIR"), "/proto.rs"));
}
pub use generated::{CallbackKind, HandleKind, Op, OP_COUNT};

/// The API a CUDA session speaks (sent in HELLO).
pub const API: &str = "cuda";

/// The CUDA version whose driver API this library implements (`CUDA_VERSION` of the cuda.h the
/// description follows: driver 580).
pub const CUDA_VERSION: i32 = 13000;

/// The ids the special stream handles travel as. `CU_STREAM_LEGACY` ((CUstream)0x1) and
/// `CU_STREAM_PER_THREAD` ((CUstream)0x2) are not objects but values every driver knows; the
/// client never gives an object of its own an id this small.
pub const STREAM_LEGACY_ID: u64 = 1;
pub const STREAM_PER_THREAD_ID: u64 = 2;
/// Client ids of objects start above this.
pub const FIRST_OBJECT_ID: u64 = 16;

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn description() -> wormhole_apigen::Api {
        wormhole_apigen::Api::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("api/cuda.api"))
            .unwrap()
    }

    /// Every symbol the real driver exports has an entry in the description (forwarded,
    /// answered locally, or refused with a log line), so a program linked against the driver
    /// finds each one in Wormhole's library; the list is the real driver's (`nm -D`, driver
    /// 580), in ../shared/cuda.
    #[test]
    fn the_description_covers_every_symbol_of_the_real_driver() {
        let list = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../../shared/cuda/libcuda-580-symbols.txt");
        let Ok(text) = std::fs::read_to_string(&list) else {
            panic!("{} is missing (the shared material)", list.display());
        };
        let api = description();
        let missing = api.not_described(&text);
        assert!(missing.is_empty(), "not in api/cuda.api: {missing:?}");
        assert_eq!(text.lines().filter(|l| !l.trim().is_empty()).count(), 707);
    }

    /// Opcodes follow the symbol list (new symbols are appended), and the forwarded core is
    /// there: a change of the description that drops one fails here, not on a GPU machine.
    #[test]
    fn the_forwarded_core_is_described() {
        let api = description();
        let gen = |n: &str| {
            api.funcs
                .iter()
                .find(|f| f.name == n)
                .is_some_and(|f| f.mode == wormhole_apigen::Mode::Gen)
        };
        for n in [
            "cuDeviceGet",
            "cuCtxCreate_v2",
            "cuMemAlloc_v2",
            "cuMemcpyHtoD_v2",
            "cuMemcpyDtoH_v2",
            "cuStreamSynchronize",
            "cuEventElapsedTime_v2",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpyDtoHAsync_v2",
            "cuMemsetD32Async",
        ] {
            assert!(gen(n), "{n} is not forwarded");
        }
        // What the driver queues is sent without waiting; a copy to the host is waited for.
        let flags = |n: &str| {
            api.funcs
                .iter()
                .find(|f| f.name == n)
                .map(|f| (f.asynchronous, f.sync))
        };
        assert_eq!(
            flags("cuLaunchKernel"),
            Some((false, false)),
            "custom: async in the client"
        );
        assert_eq!(flags("cuMemcpyHtoDAsync_v2"), Some((true, false)));
        assert_eq!(flags("cuMemsetD8_v2"), Some((true, false)));
        assert_eq!(flags("cuMemcpyDtoHAsync_v2"), Some((false, true)));
        let since = |n: &str| api.funcs.iter().find(|f| f.name == n).and_then(|f| f.since);
        assert_eq!(since("cuMemAlloc_v2"), Some(3020));
        assert_eq!(since("cuMemcpyHtoD_v2_ptds"), Some(7000));
        assert_eq!(since("cuCtxCreate_v4"), Some(12050));
    }

    #[test]
    fn every_status_has_a_name_and_a_message() {
        use crate::cu::*;
        assert_eq!(
            error_name(CUDA_ERROR_NO_DEVICE).unwrap().to_str().unwrap(),
            "CUDA_ERROR_NO_DEVICE"
        );
        assert_eq!(
            error_string(CUDA_ERROR_NO_DEVICE)
                .unwrap()
                .to_str()
                .unwrap(),
            "no CUDA-capable device is detected"
        );
        assert!(error_name(12345).is_none());
    }
}
