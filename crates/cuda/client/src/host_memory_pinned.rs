//! Page-locked host memory (`cuMemHostAlloc`, `cuMemAllocHost`, `cuMemHostRegister`), as the
//! client knows it. The program's host memory is not the device's to reach through Wormhole:
//! copies from and to it travel as every copy of host memory does, so these ranges are plain
//! memory of the program's that the client remembers, to answer what CUDA answers of them
//! (their flags, their pointer attributes: host memory of the context they were made in).
//! What would need the device to reach them (`CU_MEMHOSTALLOC_DEVICEMAP`, mapped device
//! pointers, I/O memory) is refused with a log line. Not page-locked in the client: nothing
//! DMAs from it here, and locking could fail where the native allocation succeeds.

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::rt::{self, entry_status, ApiErr};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use wormhole_cuda_proto::cu::*;

/// `CU_MEMHOSTALLOC_PORTABLE`, `_DEVICEMAP`, `_WRITECOMBINED`.
const ALLOC_PORTABLE: u32 = 0x1;
const ALLOC_DEVICEMAP: u32 = 0x2;
const ALLOC_WRITECOMBINED: u32 = 0x4;
/// `CU_MEMHOSTREGISTER_PORTABLE`, `_DEVICEMAP`, `_IOMEMORY`, `_READ_ONLY`.
const REGISTER_PORTABLE: u32 = 0x1;
const REGISTER_DEVICEMAP: u32 = 0x2;
const REGISTER_IOMEMORY: u32 = 0x4;
const REGISTER_READ_ONLY: u32 = 0x8;

/// One page-locked range.
#[derive(Debug, Clone, Copy)]
pub struct Pinned {
    pub len: u64,
    pub flags: u32,
    /// Allocated here (freed with `cuMemFreeHost`), or the program's own (registered).
    allocated: bool,
    /// The context it was made in, and that context's device.
    pub context: usize,
    pub device: i32,
    /// A number no other range of the process has (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

fn table() -> MutexGuard<'static, BTreeMap<u64, Pinned>> {
    static TABLE: Mutex<BTreeMap<u64, Pinned>> = Mutex::new(BTreeMap::new());
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The page-locked range `addr` lies in: its start and what is known of it.
pub fn range_of(addr: u64) -> Option<(u64, Pinned)> {
    table()
        .range(..=addr)
        .next_back()
        .filter(|(start, p)| addr - **start < p.len)
        .map(|(s, p)| (*s, *p))
}

fn overlaps(t: &BTreeMap<u64, Pinned>, start: u64, len: u64) -> bool {
    let end = start.saturating_add(len);
    t.range(..end)
        .next_back()
        .is_some_and(|(s, p)| s.saturating_add(p.len) > start)
}

/// The current context and its device: page-locked memory belongs to one, as natively (none
/// current is CUDA_ERROR_INVALID_CONTEXT).
fn owner() -> Result<(usize, i32), ApiErr> {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        match crate::local::cuCtxGetCurrent(&mut ctx) {
            CUDA_SUCCESS if !ctx.is_null() => {}
            CUDA_SUCCESS => return Err(ApiErr(CUDA_ERROR_INVALID_CONTEXT)),
            st => return Err(ApiErr(st)),
        }
        let mut dev = 0u32;
        match crate::generated::cuCtxGetDevice(&mut dev) {
            CUDA_SUCCESS => Ok((ctx as usize, dev as i32)),
            st => Err(ApiErr(st)),
        }
    }
}

fn next_buffer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn refused(what: &str) -> ApiErr {
    crate::connection::log(&format!(
        "{what}: the device cannot reach the program's memory through Wormhole; answering CUDA_ERROR_NOT_SUPPORTED"
    ));
    ApiErr(CUDA_ERROR_NOT_SUPPORTED)
}

/// `cuMemHostAlloc`.
///
/// # Safety
/// `pp` NULL or a writable `void *`.
pub unsafe fn cuMemHostAlloc(pp: *mut c_void, bytesize: usize, flags: u32) -> i32 {
    let pp = pp as *mut *mut c_void;
    entry_status(|| {
        rt::check_initialized()?;
        if pp.is_null() || bytesize == 0 {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        if flags & !(ALLOC_PORTABLE | ALLOC_DEVICEMAP | ALLOC_WRITECOMBINED) != 0 {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        if flags & ALLOC_DEVICEMAP != 0 {
            return Err(refused("cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP)"));
        }
        let (context, device) = owner()?;
        // SAFETY: an anonymous private mapping: no file, no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytesize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ApiErr(CUDA_ERROR_OUT_OF_MEMORY));
        }
        table().insert(
            p as u64,
            Pinned {
                len: bytesize as u64,
                flags,
                allocated: true,
                context,
                device,
                buffer_id: next_buffer_id(),
            },
        );
        // SAFETY: per the contract.
        unsafe { *pp = p };
        Ok(CUDA_SUCCESS)
    })
}

/// `cuMemAllocHost_v2`: `cuMemHostAlloc` without flags.
///
/// # Safety
/// As [`cuMemHostAlloc`].
pub unsafe fn cuMemAllocHost_v2(pp: *mut c_void, bytesize: usize) -> i32 {
    // SAFETY: per the contract.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

/// `cuMemFreeHost`: NULL is nothing to free (cudart frees NULL too).
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuMemFreeHost(p: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if p.is_null() {
            return Ok(CUDA_SUCCESS);
        }
        let mut t = table();
        match t.get(&(p as u64)) {
            Some(pinned) if pinned.allocated => {
                let len = pinned.len as usize;
                t.remove(&(p as u64));
                // SAFETY: a mapping this module made, of this length, unmapped once (it is
                // no longer in the table).
                unsafe { libc::munmap(p, len) };
                Ok(CUDA_SUCCESS)
            }
            _ => Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
        }
    })
}

/// `cuMemHostRegister_v2`: the program's own range, which must be its memory.
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: u32) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        if p.is_null() || bytesize == 0 {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let known = REGISTER_PORTABLE | REGISTER_DEVICEMAP | REGISTER_IOMEMORY | REGISTER_READ_ONLY;
        if flags & !known != 0 {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        if flags & (REGISTER_DEVICEMAP | REGISTER_IOMEMORY) != 0 {
            return Err(refused("cuMemHostRegister(DEVICEMAP or IOMEMORY)"));
        }
        if !wormhole_session::host_memory::readable(p as *const u8, bytesize) {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (context, device) = owner()?;
        let mut t = table();
        if overlaps(&t, p as u64, bytesize as u64) {
            return Err(ApiErr(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED));
        }
        t.insert(
            p as u64,
            Pinned {
                len: bytesize as u64,
                flags,
                allocated: false,
                context,
                device,
                buffer_id: next_buffer_id(),
            },
        );
        Ok(CUDA_SUCCESS)
    })
}

/// `cuMemHostUnregister`: the start of a range the program registered.
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuMemHostUnregister(p: *mut c_void) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        let mut t = table();
        match t.get(&(p as u64)) {
            Some(pinned) if !pinned.allocated => {
                t.remove(&(p as u64));
                Ok(CUDA_SUCCESS)
            }
            _ => Err(ApiErr(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)),
        }
    })
}

/// `cuMemHostGetFlags`.
///
/// # Safety
/// `flags` NULL or a writable `unsigned int`.
pub unsafe fn cuMemHostGetFlags(flags: *mut c_void, p: *mut c_void) -> i32 {
    let flags = flags as *mut u32;
    entry_status(|| {
        rt::check_initialized()?;
        if flags.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (_, pinned) = range_of(p as u64).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
        // SAFETY: per the contract.
        unsafe { *flags = pinned.flags };
        Ok(CUDA_SUCCESS)
    })
}

/// `CU_POINTER_ATTRIBUTE_*` values answered for page-locked memory.
const ATTR_CONTEXT: u32 = 1;
const ATTR_MEMORY_TYPE: u32 = 2;
const ATTR_DEVICE_POINTER: u32 = 3;
const ATTR_HOST_POINTER: u32 = 4;
const ATTR_BUFFER_ID: u32 = 7;
const ATTR_IS_MANAGED: u32 = 8;
const ATTR_DEVICE_ORDINAL: u32 = 9;
const ATTR_IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
const ATTR_RANGE_START_ADDR: u32 = 11;
const ATTR_RANGE_SIZE: u32 = 12;
const ATTR_MAPPED: u32 = 13;
/// `CU_MEMORYTYPE_HOST`.
const MEMORYTYPE_HOST: u32 = 1;

/// Attribute `attribute` of `ptr` in page-locked range (`start`, `p`), as the driver writes it
/// (its width: pointers and sizes 8 bytes, enums and ordinals 4, booleans 1). The context
/// travels as its id, as the server's answers do. None: not answered here.
pub fn attribute(ptr: u64, start: u64, p: &Pinned, attribute: u32) -> Option<Vec<u8>> {
    let context_id = || {
        // SAFETY: dereferenced only if registered.
        unsafe {
            crate::objects::get(
                p.context as *mut c_void,
                wormhole_cuda_proto::HandleKind::Context,
            )
        }
        .map_or(0, |o| o.id)
    };
    Some(match attribute {
        ATTR_CONTEXT => context_id().to_le_bytes().to_vec(),
        ATTR_MEMORY_TYPE => MEMORYTYPE_HOST.to_le_bytes().to_vec(),
        // Not reachable from the device through Wormhole: no device address.
        ATTR_DEVICE_POINTER => 0u64.to_le_bytes().to_vec(),
        ATTR_HOST_POINTER => ptr.to_le_bytes().to_vec(),
        ATTR_BUFFER_ID => p.buffer_id.to_le_bytes().to_vec(),
        ATTR_IS_MANAGED | ATTR_IS_LEGACY_CUDA_IPC_CAPABLE | ATTR_MAPPED => vec![0],
        ATTR_DEVICE_ORDINAL => p.device.to_le_bytes().to_vec(),
        ATTR_RANGE_START_ADDR => start.to_le_bytes().to_vec(),
        ATTR_RANGE_SIZE => p.len.to_le_bytes().to_vec(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_found_and_overlaps_refused() {
        let pinned = |len| Pinned {
            len,
            flags: 0,
            allocated: false,
            context: 0x100,
            device: 0,
            buffer_id: next_buffer_id(),
        };
        table().insert(0x5000_0000, pinned(0x1000));
        assert_eq!(range_of(0x5000_0fff).map(|r| r.0), Some(0x5000_0000));
        assert!(range_of(0x5000_1000).is_none());
        let t = table();
        assert!(overlaps(&t, 0x4fff_f000, 0x1001));
        assert!(!overlaps(&t, 0x4fff_f000, 0x1000));
        assert!(overlaps(&t, 0x5000_0800, 0x10));
        assert!(!overlaps(&t, 0x5000_1000, 0x10));
        drop(t);
        let (start, p) = range_of(0x5000_0010).unwrap();
        assert_eq!(
            attribute(0x5000_0010, start, &p, ATTR_MEMORY_TYPE),
            Some(vec![1, 0, 0, 0])
        );
        assert_eq!(
            attribute(0x5000_0010, start, &p, ATTR_HOST_POINTER),
            Some(0x5000_0010u64.to_le_bytes().to_vec())
        );
        assert_eq!(
            attribute(0x5000_0010, start, &p, ATTR_IS_MANAGED),
            Some(vec![0])
        );
        assert_eq!(attribute(0x5000_0010, start, &p, 5), None, "P2P tokens");
        table().remove(&0x5000_0000);
    }
}
