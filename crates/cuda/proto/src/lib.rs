//! The CUDA driver API's vocabulary on Wormhole's wire, shared by the CUDA client
//! (`libcuda.so.1`) and backend: the opcode table generated from the API description
//! (`api/cuda.api`), the handle kinds, and CUDA's status codes. Frames and the body codec are
//! the common `wormhole-wire`, re-exported so CUDA code names one crate.

pub mod cu;
pub mod jit;
pub mod requests;
pub mod vmm;
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

/// `CU_DEVICE_ATTRIBUTE_MAX` of the cuda.h Wormhole is built against (checked by
/// `abi_of_cuda_h`): the device attributes below it are the ones it knows to be fixed for a
/// device (but the compute mode), which the client may keep; a newer driver's are asked.
pub const DEVICE_ATTRIBUTE_MAX: i32 = 148;

/// The ids the special stream handles travel as. `CU_STREAM_LEGACY` ((CUstream)0x1) and
/// `CU_STREAM_PER_THREAD` ((CUstream)0x2) are not objects but values every driver knows; the
/// client never gives an object of its own an id this small.
pub const STREAM_LEGACY_ID: u64 = 1;
pub const STREAM_PER_THREAD_ID: u64 = 2;
/// Client ids of objects start above this.
pub const FIRST_OBJECT_ID: u64 = 16;

/// NVIDIA's private tables (`cuGetExportTable`): the client serves them, and asks the server
/// for the few slots only the real driver can answer, with requests of this opcode (outside
/// the description's: no exported symbol stands behind it), the body a `u32` naming the slot,
/// then its arguments.
pub mod export_tables {
    /// The opcode of a request of a slot.
    pub const OP: u16 = 0xE000;
    /// CUDART_INTERFACE slot 2: `(CUdevice)` → the device's primary context, not retained
    /// (reply: the status, then the context's id).
    pub const PRIMARY_CONTEXT: u32 = 1;

    /// The tables' ids, in the byte order `cuGetExportTable` receives them.
    pub const CUDART_INTERFACE: [u8; 16] = uuid(0x6bd5fb6c_5bf4_e74a_8987_d93912fd9df9);
    pub const TOOLS_RUNTIME_CALLBACK_HOOKS: [u8; 16] = uuid(0xa094798c_2e74_2e74_93f2_0800200c0a66);
    pub const TOOLS_TLS: [u8; 16] = uuid(0x42d85a81_23f6_cb47_8298_f6e78a3aecdc);
    pub const CONTEXT_LOCAL_STORAGE: [u8; 16] = uuid(0xc693336e_1121_df11_a8c3_68f355d89593);
    pub const CONTEXT_CHECKS: [u8; 16] = uuid(0x263e8860_7cd2_6143_92f6_bbd5006dfa7e);
    pub const INTEGRITY_CHECK: [u8; 16] = uuid(0xd4082055_bde6_704b_8d34_ba123c66e1f2);
    pub const TOOLS_CONTEXT: [u8; 16] = uuid(0x21318c60_9714_3248_8ca6_41ff7324c8f2);
    /// Asked for by every CUDA runtime (cudart, and the ones inside NVIDIA's libraries)
    /// before `cuInit`: a shortcut past the runtime's ordinary start. Optional: Wormhole
    /// answers CUDA_ERROR_NOT_FOUND, a table this driver lacks, and the runtime starts
    /// through CUDART_INTERFACE.
    pub const RUNTIME_SHORTCUT: [u8; 16] = uuid(0xf8cff951_2146_8b4e_b9e2_fb469e7c0dd9);

    const fn uuid(v: u128) -> [u8; 16] {
        v.to_be_bytes()
    }
}

/// Page-locked host memory in the session's arena (local sessions: memory both sides map at
/// one address, see `wormhole_transport::arena`): the worker allocates and registers it with
/// its driver, so copies from and to it are the driver's own DMA, with no copy through the
/// rings, and asynchronous ones complete when the stream does, as natively. Requests of these
/// opcodes stand behind no exported symbol (`host_memory_pinned` in the client makes them).
pub mod pinned {
    /// [`crate::requests::PinnedAlloc`] → the status, then the range's offset in the arena
    /// and its address in the worker.
    pub const ALLOC: u16 = 0xE001;
    /// [`crate::requests::PinnedFree`] → the status.
    pub const FREE: u16 = 0xE002;
    /// [`crate::requests::PinnedCopy`] → the status. With a stream, sent without waiting
    /// unless it is to be answered once complete.
    pub const COPY: u16 = 0xE003;
    /// Nothing → the status, once every request before it on the lane is done (a staged
    /// copy waiting for a piece, or ending; see `staging` in the client). Not a
    /// synchronisation point: the status is the fence's own.
    pub const FENCE: u16 = 0xE006;
    /// A staged copy's piece: a [`crate::requests::PinnedCopy`] with a signal, sent without
    /// waiting as part of a call its sender waits for (no other thread's request needs to wait
    /// for it), whose failure is said in its signal alone (not kept for a synchronisation
    /// point).
    pub const PIECE: u16 = 0xE007;
    /// As [`FENCE`], and a synchronisation point (a staged copy to the host ends with it, as
    /// the native copy is one).
    pub const FENCE_SYNC: u16 = 0xE008;
    /// In a [`crate::requests::Signal`]'s value: the copy failed.
    pub const SIGNAL_FAILED: u32 = 1 << 31;
}

/// Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`): the driver in the worker calls a
/// trampoline in stream order, which sends a CALLBACK frame
/// ([`crate::requests::HostFunctionCall`]) and holds the stream until the client, having run
/// the program's function, says so with a request of this opcode
/// ([`crate::requests::HostFunctionDone`]; no exported symbol stands behind it).
pub mod host_functions {
    pub const DONE: u16 = 0xE004;
}

/// The worker's threads, one per lane, carry the driver's per-thread state.
pub mod threads {
    /// No body → the status. The lane is a new program thread's, and a thread now ended used
    /// it: its worker thread drops that thread's driver state (its context stack, its stream
    /// capture mode), which natively a new thread starts without. Sent without waiting.
    pub const FRESH: u16 = 0xE005;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The requests no symbol stands behind have opcodes of their own: none another's, none
    /// an entry point's (a collision would route one as the other in the worker).
    #[test]
    fn requests_behind_no_symbol_have_opcodes_of_their_own() {
        let special = [
            export_tables::OP,
            pinned::ALLOC,
            pinned::FREE,
            pinned::COPY,
            pinned::FENCE,
            pinned::PIECE,
            pinned::FENCE_SYNC,
            host_functions::DONE,
            threads::FRESH,
        ];
        let mut seen = std::collections::BTreeSet::new();
        for op in special {
            assert!(seen.insert(op), "opcode {op:#x} twice");
            assert!(
                Op::from_u16(op).is_none(),
                "opcode {op:#x} is an entry point's"
            );
        }
    }

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
