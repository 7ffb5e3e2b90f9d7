//! Page-locked host memory (`cuMemHostAlloc`, `cuMemAllocHost`, `cuMemHostRegister`), as the
//! client knows it. Two kinds:
//! - **in the arena** (local sessions): `cuMemHostAlloc` takes a range of the memory the
//!   session shares with its worker, which the worker page-locks with its driver (see the
//!   server's `pinned` module). Copies from and to it are the driver's DMA (`copies.rs` sends
//!   where, not what), asynchronous ones complete when their stream does, and where both sides
//!   map the arena at one address the device reaches it at the program's address, as under
//!   unified addressing natively (`CU_MEMHOSTALLOC_DEVICEMAP`, `cuMemHostGetDevicePointer`);
//! - **the program's own memory** (`cuMemHostRegister`, and every allocation where the session
//!   has no arena: TCP, guests): plain memory the client remembers, to answer what CUDA
//!   answers of it (its flags, its pointer attributes). Copies travel as every copy of host
//!   memory does; what would need the device to reach it (`DEVICEMAP`, mapped device pointers,
//!   I/O memory) is refused with a log line. Not page-locked in the client: nothing DMAs from
//!   it here, and locking could fail where the native allocation succeeds.

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::rt::{self, entry_status, ApiErr};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{Message, PinnedAlloc, PinnedAllocated, PinnedFree};
use wormhole_cuda_proto::{pinned, Writer};
use wormhole_transport::Arena;

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
    /// Where it lies in the session's arena, if it does.
    pub arena: Option<InArena>,
}

/// A range allocated in the session's arena.
#[derive(Debug, Clone, Copy)]
pub struct InArena {
    /// Its offset there.
    pub offset: u64,
    /// The worker sees it at the program's address: the device reaches it there too.
    pub same_address: bool,
}

impl Pinned {
    /// Whether the device reaches the range at its host address.
    pub fn mapped(&self) -> bool {
        self.arena.is_some_and(|a| a.same_address)
    }

    /// Its flags as `cuMemHostGetFlags` reads them back. With unified addressing the driver
    /// maps every allocation of page-locked memory into the device's space and says so
    /// (driver 580: an allocation made PORTABLE reads back PORTABLE | DEVICEMAP); so does
    /// Wormhole where the device reaches the allocation at its address.
    pub fn flags_read_back(&self) -> u32 {
        match self.allocated && self.mapped() {
            true => self.flags | ALLOC_DEVICEMAP,
            false => self.flags,
        }
    }
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

/// Where `[host, host + n)` lies in the session's arena, if wholly inside one range of
/// page-locked memory allocated there.
pub fn arena_offset(host: u64, n: u64) -> Option<u64> {
    let (start, p) = range_of(host)?;
    let a = p.arena?;
    let end = host.checked_add(n)?;
    (end <= start + p.len).then_some(a.offset + (host - start))
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

/// A buffer id for page-locked memory: cuda.h says one "is guaranteed to be unique within the
/// process", and the driver numbers device allocations from low numbers, so these come from
/// the top half of the space.
fn next_buffer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1 << 63);
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
        let (context, device) = owner()?;
        let pinned = |arena| Pinned {
            len: bytesize as u64,
            flags,
            allocated: true,
            context,
            device,
            buffer_id: next_buffer_id(),
            arena,
        };
        if let Some(arena) = session_arena() {
            let (p, in_arena) = match alloc_in_arena(arena, bytesize, flags) {
                // The copies' staging range gives its room to the program's own memory.
                Err(ApiErr(CUDA_ERROR_OUT_OF_MEMORY)) if crate::staging::give_back() => {
                    alloc_in_arena(arena, bytesize, flags)?
                }
                other => other?,
            };
            table().insert(p as u64, pinned(Some(in_arena)));
            // SAFETY: per the contract.
            unsafe { *pp = p };
            return Ok(CUDA_SUCCESS);
        }
        if flags & ALLOC_DEVICEMAP != 0 {
            return Err(refused("cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP)"));
        }
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
        table().insert(p as u64, pinned(None));
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
        let pinned = {
            let mut t = table();
            match t.get(&(p as u64)) {
                Some(pinned) if pinned.allocated => t.remove(&(p as u64)),
                _ => None,
            }
        };
        match pinned {
            Some(pinned) if pinned.arena.is_some() => {
                let offset = pinned.arena.as_ref().map_or(0, |a| a.offset);
                let mut w = Writer::new(pinned::FREE);
                PinnedFree { offset }.encode(&mut w);
                let freed = rt::call(w).and_then(|reply| rt::status_of(&reply));
                if freed.is_err() {
                    // The worker keeps a range its driver would not unregister: so does the
                    // program, which may free it again.
                    table().insert(p as u64, pinned);
                }
                freed.map(|_| CUDA_SUCCESS)
            }
            Some(pinned) => {
                // SAFETY: a mapping this module made, of this length, unmapped once (it is
                // no longer in the table).
                unsafe { libc::munmap(p, pinned.len as usize) };
                Ok(CUDA_SUCCESS)
            }
            None => Err(ApiErr(CUDA_ERROR_INVALID_VALUE)),
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
                arena: None,
            },
        );
        Ok(CUDA_SUCCESS)
    })
}

/// `cuMemHostRegister`: the same call as `cuMemHostRegister_v2` (the v2 symbol only fixed the
/// ABI of the flags' type).
///
/// # Safety
/// None beyond the C function's.
pub unsafe fn cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: u32) -> i32 {
    // SAFETY: per the contract.
    unsafe { cuMemHostRegister_v2(p, bytesize, flags) }
}

/// `cuMemHostGetDevicePointer_v2`: the device's address of page-locked memory, which under
/// unified addressing is its host address; known only of arena memory the worker maps at the
/// program's address.
///
/// # Safety
/// `pdptr` NULL or a writable `CUdeviceptr`.
pub unsafe fn cuMemHostGetDevicePointer_v2(pdptr: *mut c_void, p: *mut c_void, flags: u32) -> i32 {
    let pdptr = pdptr as *mut u64;
    entry_status(|| {
        rt::check_initialized()?;
        if pdptr.is_null() || flags != 0 {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        let (_, pinned) = range_of(p as u64).ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
        if !pinned.mapped() {
            return Err(refused("cuMemHostGetDevicePointer"));
        }
        // SAFETY: per the contract.
        unsafe { *pdptr = p as u64 };
        Ok(CUDA_SUCCESS)
    })
}

/// The session's arena, if it has one (local sessions).
pub(crate) fn session_arena() -> Option<&'static Arena> {
    crate::connection::get().ok()?.arena()
}

/// Page-locked memory from the worker (see the module's comment): the program's pointer to it.
pub(crate) fn alloc_in_arena(
    arena: &Arena,
    bytesize: usize,
    flags: u32,
) -> Result<(*mut c_void, InArena), ApiErr> {
    let mut w = Writer::new(pinned::ALLOC);
    PinnedAlloc {
        bytes: bytesize as u64,
        flags,
    }
    .encode(&mut w);
    let reply = PinnedAllocated::decode_all(&rt::call(w)?)?;
    if reply.status != CUDA_SUCCESS {
        return Err(ApiErr(reply.status));
    }
    let give_back = || {
        let mut w = Writer::new(pinned::FREE);
        PinnedFree {
            offset: reply.offset,
        }
        .encode(&mut w);
        let _ = rt::call(w);
    };
    let Some(p) = arena.range(reply.offset, bytesize as u64) else {
        crate::connection::log("the server placed page-locked memory outside the arena");
        give_back();
        return Err(ApiErr(CUDA_ERROR_UNKNOWN));
    };
    let same_address = reply.address == p as u64;
    if flags & ALLOC_DEVICEMAP != 0 && !same_address {
        give_back();
        return Err(refused(
            "cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP) (the worker maps the arena elsewhere)",
        ));
    }
    Ok((
        p as *mut c_void,
        InArena {
            offset: reply.offset,
            same_address,
        },
    ))
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
        unsafe { *flags = pinned.flags_read_back() };
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
        // The device reaches arena memory at the program's address where the worker maps it
        // there; other page-locked memory it does not reach through Wormhole.
        ATTR_DEVICE_POINTER => match p.mapped() {
            true => ptr,
            false => 0,
        }
        .to_le_bytes()
        .to_vec(),
        // Backed by an allocation (CUDA's sense: a mapped address range), as all of it is.
        ATTR_MAPPED => vec![1],
        ATTR_HOST_POINTER => ptr.to_le_bytes().to_vec(),
        ATTR_BUFFER_ID => p.buffer_id.to_le_bytes().to_vec(),
        ATTR_IS_MANAGED | ATTR_IS_LEGACY_CUDA_IPC_CAPABLE => vec![0],
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
            arena: None,
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
        assert_eq!(arena_offset(0x5000_0010, 16), None, "not in the arena");
        assert_eq!(
            attribute(0x5000_0010, start, &p, ATTR_DEVICE_POINTER),
            Some(vec![0; 8])
        );
        table().remove(&0x5000_0000);
    }

    /// Arena memory: copies that lie wholly inside one range go through the arena, the device
    /// reaches it at the program's address only where the worker maps it there.
    #[test]
    fn arena_ranges_give_offsets_and_device_addresses() {
        let in_arena = |offset, same_address| Pinned {
            len: 0x3000,
            flags: 0,
            allocated: true,
            context: 0x100,
            device: 0,
            buffer_id: next_buffer_id(),
            arena: Some(InArena {
                offset,
                same_address,
            }),
        };
        table().insert(0x6000_0000, in_arena(0x10000, true));
        table().insert(0x6000_3000, in_arena(0x20000, false));
        assert_eq!(arena_offset(0x6000_0000, 0x3000), Some(0x10000));
        assert_eq!(arena_offset(0x6000_1000, 0x10), Some(0x11000));
        assert_eq!(
            arena_offset(0x6000_2000, 0x1001),
            None,
            "runs past the range"
        );
        assert_eq!(arena_offset(0x6000_3100, 0x100), Some(0x20100));
        assert_eq!(arena_offset(u64::MAX - 4, 8), None);
        let (start, p) = range_of(0x6000_0040).unwrap();
        assert_eq!(
            attribute(0x6000_0040, start, &p, ATTR_DEVICE_POINTER),
            Some(0x6000_0040u64.to_le_bytes().to_vec())
        );
        assert_eq!(
            attribute(0x6000_0040, start, &p, ATTR_MAPPED),
            Some(vec![1])
        );
        let (start, p) = range_of(0x6000_3040).unwrap();
        assert_eq!(
            attribute(0x6000_3040, start, &p, ATTR_DEVICE_POINTER),
            Some(vec![0; 8])
        );
        assert_eq!(
            attribute(0x6000_3040, start, &p, ATTR_MAPPED),
            Some(vec![1])
        );
        // Allocated where the device reaches it: mapped, as the driver says of its own.
        let portable = |same_address| Pinned {
            flags: ALLOC_PORTABLE,
            ..in_arena(0x10000, same_address)
        };
        assert_eq!(
            portable(true).flags_read_back(),
            ALLOC_PORTABLE | ALLOC_DEVICEMAP
        );
        assert_eq!(portable(false).flags_read_back(), ALLOC_PORTABLE);
        table().remove(&0x6000_0000);
        table().remove(&0x6000_3000);
    }
}
