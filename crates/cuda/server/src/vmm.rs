//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemRetainAllocationHandle` and their undoing), which PyTorch's
//! expandable segments and NCCL's buffers are made of (NCCL's shared between ranks' processes
//! need exporting too, which is not forwarded). The session keeps:
//! - the address ranges it reserved: mappings must lie in them;
//! - the physical allocations it created, by the driver's handle (the worker is the session's
//!   alone, so the driver's values are the session's, each checked against this table). Each
//!   counts against the tenant's quota from its creation until the driver frees it: when every
//!   reference to its handle (its creation's, each `cuMemRetainAllocationHandle`'s) is
//!   released and its last mapping is gone;
//! - its mappings: device memory later calls may name, as allocations are (a tensor may span
//!   several mappings side by side).
//!
//! Device numbers in the structs are the tenant's on the wire and the driver's here. Memory on
//! the host (a host location) and handles for other export mechanisms than a file descriptor
//! are refused, saying why; so is exporting (not forwarded): a handle means nothing outside
//! the worker.

// Entry points keep the C names the description gives them.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::{Call, Session};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{Message, Reply};
use wormhole_cuda_proto::vmm::{
    CuMemAccessDesc, CuMemAllocationProp, CuMemLocation, GenericHandle, RetainAllocationHandle,
    ALLOCATION_TYPE_PINNED, HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, LOCATION_TYPE_DEVICE,
};
use wormhole_cuda_proto::{DecodeError, Reader, Writer};

/// The most access descriptors one `cuMemSetAccess` may carry (one per device and more).
const MAX_ACCESS_DESCS: usize = 64;

/// A physical allocation: its size, the references to its handle not yet released (one from
/// `cuMemCreate`, one more per `cuMemRetainAllocationHandle`), and its mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Physical {
    len: u64,
    refs: u32,
    mappings: u32,
}

/// What the session reserved, created and mapped (see the module's comment).
#[derive(Debug, Default)]
pub struct Vmm {
    /// Reserved address ranges: start → length.
    reserved: BTreeMap<u64, u64>,
    /// Physical allocations by the driver's handle.
    physical: HashMap<u64, Physical>,
    /// Mappings: start → length and the handle mapped there.
    mapped: BTreeMap<u64, (u64, u64)>,
}

/// Whether `[start, end)` is covered, gap-free, by ranges (none overlapping) of which
/// `holding(at)` gives the last one that begins at or before `at` (its start and length).
fn covered(start: u64, end: u64, holding: impl Fn(u64) -> Option<(u64, u64)>) -> bool {
    let mut at = start;
    while at < end {
        match holding(at) {
            Some((s, l)) if s.saturating_add(l) > at => at = s.saturating_add(l),
            _ => return false,
        }
    }
    true
}

impl Vmm {
    pub fn reserved(&mut self, start: u64, len: u64) {
        self.reserved.insert(start, len);
    }

    /// Whether `[start, start + len)` is exactly a reservation (what freeing one names).
    pub fn is_reservation(&self, start: u64, len: u64) -> bool {
        self.reserved.get(&start) == Some(&len)
    }

    /// The reservation at `start` was freed (its mappings were undone first: see
    /// `cuMemAddressFree`).
    pub fn reservation_freed(&mut self, start: u64) {
        self.reserved.remove(&start);
    }

    /// The mappings that lie in `[start, start + len)`: start and length.
    pub fn mappings_within(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        self.mapped
            .range(start..start.saturating_add(len))
            .map(|(s, (l, _))| (*s, *l))
            .collect()
    }

    pub fn created(&mut self, handle: u64, len: u64) {
        self.physical.insert(
            handle,
            Physical {
                len,
                refs: 1,
                mappings: 0,
            },
        );
    }

    /// Whether `handle` names one of the session's allocations whose handle is not released.
    pub fn is_live(&self, handle: u64) -> bool {
        self.physical.get(&handle).is_some_and(|p| p.refs > 0)
    }

    /// The driver handed out another reference to `handle` (`cuMemRetainAllocationHandle`);
    /// false if it is not one of the session's allocations.
    pub fn retained(&mut self, handle: u64) -> bool {
        match self.physical.get_mut(&handle) {
            Some(p) => {
                p.refs += 1;
                true
            }
            None => false,
        }
    }

    /// Why mapping `len` bytes of `handle`, from `offset`, at `start` is refused, if it is.
    pub fn check_map(
        &self,
        start: u64,
        len: u64,
        offset: u64,
        handle: u64,
    ) -> Result<(), &'static str> {
        let p = self
            .physical
            .get(&handle)
            .filter(|p| p.refs > 0)
            .ok_or("a handle the session did not create, or released")?;
        let end = start.checked_add(len).ok_or("a range past the end")?;
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > p.len) {
            return Err("a range outside the allocation");
        }
        // In one reservation: freeing it must take every mapping that lies in it.
        let in_one = self
            .reserved
            .range(..=start)
            .next_back()
            .is_some_and(|(s, l)| s.saturating_add(*l) >= end);
        if !in_one {
            return Err("an address range outside the session's reservations (or across two)");
        }
        let overlaps = self
            .mapped
            .range(..end)
            .next_back()
            .is_some_and(|(s, (l, _))| s.saturating_add(*l) > start);
        if overlaps {
            return Err("an address range already mapped");
        }
        Ok(())
    }

    pub fn mapped(&mut self, start: u64, len: u64, handle: u64) {
        self.mapped.insert(start, (len, handle));
        if let Some(p) = self.physical.get_mut(&handle) {
            p.mappings += 1;
        }
    }

    /// The mappings `cuMemUnmap(start, len)` undoes: whole ones, at least one, from `start` to
    /// the end of the range (a mapping only partly inside cannot be unmapped).
    pub fn check_unmap(&self, start: u64, len: u64) -> Result<Vec<u64>, &'static str> {
        let end = start.checked_add(len).ok_or("a range past the end")?;
        if self
            .mapped
            .range(..start)
            .next_back()
            .is_some_and(|(s, (l, _))| s.saturating_add(*l) > start)
        {
            return Err("a range that begins inside a mapping");
        }
        let inside: Vec<(u64, u64)> = self
            .mapped
            .range(start..end)
            .map(|(s, (l, _))| (*s, *l))
            .collect();
        match inside.first() {
            Some((s, _)) if *s == start => {}
            _ => return Err("a range that does not begin at a mapping"),
        }
        // cuda.h: the entire contiguous range mapped, no gap and no tail (a driver that
        // undid part of a range and then failed would leave the record wrong).
        let mut at = start;
        for (s, l) in &inside {
            if *s != at {
                return Err("a range with a gap between mappings");
            }
            at = s.saturating_add(*l);
        }
        if at != end {
            return Err("a range that does not end where a mapping does");
        }
        Ok(inside.into_iter().map(|(s, _)| s).collect())
    }

    /// The mappings at `starts` are gone: the bytes of the physical allocations freed with
    /// them (released, and mapped nowhere else).
    pub fn unmapped(&mut self, starts: &[u64]) -> u64 {
        let mut freed = 0;
        for start in starts {
            let Some((_, handle)) = self.mapped.remove(start) else {
                continue;
            };
            if let Some(p) = self.physical.get_mut(&handle) {
                p.mappings = p.mappings.saturating_sub(1);
                if p.refs == 0 && p.mappings == 0 {
                    freed += p.len;
                    self.physical.remove(&handle);
                }
            }
        }
        freed
    }

    /// A reference to `handle` was released: the bytes freed with it (none while another
    /// reference or a mapping holds it).
    pub fn released(&mut self, handle: u64) -> u64 {
        let Some(p) = self.physical.get_mut(&handle) else {
            return 0;
        };
        p.refs = p.refs.saturating_sub(1);
        if p.refs > 0 || p.mappings > 0 {
            return 0;
        }
        let len = p.len;
        self.physical.remove(&handle);
        len
    }

    /// Whether `[addr, addr + len)` lies in the session's mappings (side by side ones too).
    pub fn owns(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|end| {
            covered(addr, end, |at| {
                let (s, (l, _)) = self.mapped.range(..=at).next_back()?;
                Some((*s, *l))
            })
        })
    }

    /// Whether `[addr, addr + len)` lies in the session's reservations.
    pub fn in_reservations(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|end| {
            covered(addr, end, |at| {
                let (s, l) = self.reserved.range(..=at).next_back()?;
                Some((*s, *l))
            })
        })
    }
}

/// The driver's location for the tenant's, if it is a device the tenant may use; other kinds
/// of location are refused (memory on the host through these calls is not the program's to
/// reach: its process is not the worker's).
fn driver_location(s: &Session, loc: CuMemLocation, what: &str) -> Result<CuMemLocation, i32> {
    if loc.kind != LOCATION_TYPE_DEVICE {
        tracing::warn!(
            kind = loc.kind,
            "{what}: a location other than a device (host memory the program could not reach): answering CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(CuMemLocation {
        kind: loc.kind,
        id: crate::rt::driver_device(s, loc.id)?,
    })
}

/// An allocation's properties as the driver is to get them, checked: plain device memory on a
/// device of the tenant's; one to be created (not a query, which has no effect) exportable at
/// most as a file descriptor.
fn driver_prop(
    s: &Session,
    bytes: Option<&[u8]>,
    what: &str,
    creating: bool,
) -> Result<CuMemAllocationProp, i32> {
    let mut prop = bytes
        .and_then(CuMemAllocationProp::from_bytes)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if prop.kind != ALLOCATION_TYPE_PINNED {
        tracing::warn!(
            kind = prop.kind,
            "{what}: an allocation type other than pinned device memory: answering CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if creating && prop.requested_handle_types & !HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 {
        tracing::warn!(
            types = prop.requested_handle_types,
            "{what}: export handles other than a file descriptor (fabric, Windows): answering CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if prop.win32_handle_meta_data != 0 {
        // cuda.h: required to be zero but for Windows handles; the value is the program's
        // pointer, which the worker's driver must not be handed.
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    prop.location = driver_location(s, prop.location, what)?;
    Ok(prop)
}

fn status_of(r: Result<(), i32>) -> i32 {
    r.err().unwrap_or(CUDA_SUCCESS)
}

/// The reply of a call that answers one 8-byte value: the status, then the value on success.
fn reply_u64(w: &mut Writer, answer: Result<u64, i32>) {
    match answer {
        Ok(v) => {
            w.i32(CUDA_SUCCESS);
            w.u64(v);
        }
        Err(st) => w.i32(st),
    }
}

/// The driver's status as a result.
fn driver(st: i32) -> Result<(), i32> {
    match st {
        CUDA_SUCCESS => Ok(()),
        st => Err(st),
    }
}

/// `cuMemAddressReserve`.
pub fn cuMemAddressReserve(
    s: &Call<'_>,
    a: args::cuMemAddressReserve,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    if !a.ptr_present {
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    let mut ptr = 0u64;
    // SAFETY: a valid output pointer; the rest are values.
    let st = unsafe { ffi::cuMemAddressReserve(&mut ptr, a.size, a.alignment, a.addr, a.flags) };
    w.i32(st);
    if st == CUDA_SUCCESS {
        s.vmm().reserved(ptr, a.size as u64);
        w.u64(ptr);
    }
    Ok(())
}

/// `cuMemAddressFree`: only a reservation of the session's, whole. What is still mapped in it
/// is unmapped first, by the worker (cuda.h does not say what freeing a reservation does to
/// its mappings; unmapped, their memory is surely the driver's to free, and the quota's).
pub fn cuMemAddressFree(
    s: &Call<'_>,
    a: args::cuMemAddressFree,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    let size = a.size as u64;
    if !s.vmm().is_reservation(a.ptr, size) {
        tracing::warn!(
            ptr = format_args!("{:#x}", a.ptr),
            size,
            "cuMemAddressFree of a range the session did not reserve"
        );
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    let left = s.vmm().mappings_within(a.ptr, size);
    for (start, len) in left {
        // SAFETY: value arguments: a whole mapping of the session's.
        let st = unsafe { ffi::cuMemUnmap(start, len as usize) };
        if st != CUDA_SUCCESS {
            tracing::warn!(status = st, "could not unmap what a freed reservation held");
            w.i32(st);
            return Ok(());
        }
        let freed = s.vmm().unmapped(&[start]);
        s.vmm_freed(freed);
    }
    // SAFETY: value arguments: a reservation of the session's, nothing mapped in it.
    let st = unsafe { ffi::cuMemAddressFree(a.ptr, a.size) };
    if st == CUDA_SUCCESS {
        s.vmm().reservation_freed(a.ptr);
    }
    w.i32(st);
    Ok(())
}

/// `cuMemCreate`: reserved against the tenant's quota first (its out-of-memory status is the
/// driver's for a full device, which PyTorch's allocator answers by freeing its cache).
pub fn cuMemCreate(s: &Call<'_>, a: args::cuMemCreate, w: &mut Writer) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    if !a.handle_present {
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    let prop = match driver_prop(s, a.prop_bytes.as_deref(), "cuMemCreate", true) {
        Ok(p) => p,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let bytes = a.size as u64;
    if !s.limits().reserve(bytes) {
        w.i32(CUDA_ERROR_OUT_OF_MEMORY);
        return Ok(());
    }
    let mut handle = 0u64;
    // SAFETY: a valid output pointer and a struct of cuda.h's layout that lives across the
    // call (its Windows pointer zero).
    let st = unsafe {
        ffi::cuMemCreate(
            &mut handle,
            a.size,
            (&prop as *const CuMemAllocationProp)
                .cast_mut()
                .cast::<c_void>(),
            a.flags,
        )
    };
    if st != CUDA_SUCCESS {
        s.limits().release(bytes);
        w.i32(st);
        return Ok(());
    }
    s.vmm().created(handle, bytes);
    s.vmm_created(bytes);
    w.i32(CUDA_SUCCESS);
    w.u64(handle);
    Ok(())
}

/// `cuMemRelease`: only a handle the session created and has not released.
pub fn cuMemRelease(
    s: &Call<'_>,
    a: args::cuMemRelease,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    if !s.vmm().is_live(a.handle) {
        tracing::warn!("cuMemRelease of a handle the session did not create, or released");
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    // SAFETY: a value argument: a live handle of the session's.
    let st = unsafe { ffi::cuMemRelease(a.handle) };
    if st == CUDA_SUCCESS {
        let freed = s.vmm().released(a.handle);
        s.vmm_freed(freed);
    }
    w.i32(st);
    Ok(())
}

/// `cuMemRetainAllocationHandle`: the handle mapped at an address of the session's mappings,
/// one more reference to it (NCCL frees its buffers so).
pub fn cuMemRetainAllocationHandle(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let m = RetainAllocationHandle::decode(r)?;
    r.finish()?;
    let _op = s.vmm_op();
    let answer: Reply<GenericHandle> = (|| {
        if !s.vmm().owns(m.addr, 1) {
            tracing::warn!(
                addr = format_args!("{:#x}", m.addr),
                "cuMemRetainAllocationHandle of an address the session did not map"
            );
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut handle = 0u64;
        // SAFETY: a valid output pointer; the address lies in a mapping of the session's.
        driver(unsafe {
            ffi::cuMemRetainAllocationHandle(
                (&mut handle as *mut u64).cast::<c_void>(),
                m.addr as *mut c_void,
            )
        })?;
        if !s.vmm().retained(handle) {
            // The session's mapping is of one of its handles: not reached.
            tracing::error!("the driver retained a handle the session did not create");
            // SAFETY: the reference the driver just handed out.
            unsafe { ffi::cuMemRelease(handle) };
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(GenericHandle(handle))
    })();
    answer.encode(w);
    Ok(())
}

/// `cuMemMap`: a handle of the session's, into an unmapped part of its reservations.
pub fn cuMemMap(s: &Call<'_>, a: args::cuMemMap, w: &mut Writer) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    let (len, offset) = (a.size as u64, a.offset as u64);
    if let Err(why) = s.vmm().check_map(a.ptr, len, offset, a.handle) {
        tracing::warn!(
            ptr = format_args!("{:#x}", a.ptr),
            len,
            "cuMemMap refused: {why}"
        );
        w.i32(CUDA_ERROR_INVALID_VALUE);
        return Ok(());
    }
    // SAFETY: value arguments, checked above against the session's reservations and handles.
    let st = unsafe { ffi::cuMemMap(a.ptr, a.size, a.offset, a.handle, a.flags) };
    if st == CUDA_SUCCESS {
        s.vmm().mapped(a.ptr, len, a.handle);
    }
    w.i32(st);
    Ok(())
}

/// `cuMemUnmap`: whole mappings of the session's.
pub fn cuMemUnmap(s: &Call<'_>, a: args::cuMemUnmap, w: &mut Writer) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    let len = a.size as u64;
    let undone = match s.vmm().check_unmap(a.ptr, len) {
        Ok(starts) => starts,
        Err(why) => {
            tracing::warn!(
                ptr = format_args!("{:#x}", a.ptr),
                len,
                "cuMemUnmap refused: {why}"
            );
            w.i32(CUDA_ERROR_INVALID_VALUE);
            return Ok(());
        }
    };
    // SAFETY: value arguments: whole mappings of the session's.
    let st = unsafe { ffi::cuMemUnmap(a.ptr, a.size) };
    if st == CUDA_SUCCESS {
        let freed = s.vmm().unmapped(&undone);
        s.vmm_freed(freed);
    }
    w.i32(st);
    Ok(())
}

/// `cuMemSetAccess`: within the session's reservations, for devices of the tenant's.
pub fn cuMemSetAccess(
    s: &Call<'_>,
    a: args::cuMemSetAccess,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    w.i32(status_of((|| {
        if !s.vmm().in_reservations(a.ptr, a.size as u64) {
            tracing::warn!(
                ptr = format_args!("{:#x}", a.ptr),
                size = a.size,
                "cuMemSetAccess of a range the session did not reserve"
            );
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let descs = a
            .desc_bytes
            .as_deref()
            .and_then(CuMemAccessDesc::array_from_bytes)
            .filter(|d| d.len() == a.count && d.len() <= MAX_ACCESS_DESCS)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let descs = descs
            .into_iter()
            .map(|d| {
                Ok(CuMemAccessDesc {
                    location: driver_location(s, d.location, "cuMemSetAccess")?,
                    flags: d.flags,
                })
            })
            .collect::<Result<Vec<_>, i32>>()?;
        // SAFETY: `count` descriptors of cuda.h's layout, living across the call.
        let st = unsafe {
            ffi::cuMemSetAccess(
                a.ptr,
                a.size,
                descs.as_ptr().cast_mut().cast::<c_void>(),
                descs.len(),
            )
        };
        driver(st)
    })()));
    Ok(())
}

/// `cuMemGetAccess`: of an address in the session's reservations, for a device of the
/// tenant's.
pub fn cuMemGetAccess(
    s: &Call<'_>,
    a: args::cuMemGetAccess,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    let answer = (|| {
        if !a.flags_present {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let loc = a
            .location_bytes
            .as_deref()
            .and_then(CuMemLocation::from_bytes)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let loc = driver_location(s, loc, "cuMemGetAccess")?;
        if !s.vmm().in_reservations(a.ptr, 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut flags = 0u64;
        // SAFETY: a valid output pointer and a location of cuda.h's layout.
        let st = unsafe {
            ffi::cuMemGetAccess(
                &mut flags,
                (&loc as *const CuMemLocation).cast_mut().cast::<c_void>(),
                a.ptr,
            )
        };
        driver(st).map(|()| flags)
    })();
    reply_u64(w, answer);
    Ok(())
}

/// `cuMemGetAllocationGranularity`: for properties `cuMemCreate` would take.
pub fn cuMemGetAllocationGranularity(
    s: &Call<'_>,
    a: args::cuMemGetAllocationGranularity,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let answer = (|| {
        if !a.granularity_present {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let prop = driver_prop(
            s,
            a.prop_bytes.as_deref(),
            "cuMemGetAllocationGranularity",
            false,
        )?;
        let mut granularity = 0usize;
        // SAFETY: a valid output pointer and a struct of cuda.h's layout.
        let st = unsafe {
            ffi::cuMemGetAllocationGranularity(
                &mut granularity,
                (&prop as *const CuMemAllocationProp)
                    .cast_mut()
                    .cast::<c_void>(),
                a.option,
            )
        };
        driver(st).map(|()| granularity as u64)
    })();
    reply_u64(w, answer);
    Ok(())
}

/// `cuMemGetAllocationPropertiesFromHandle`: of a handle of the session's, its device numbered
/// as the tenant numbers it.
pub fn cuMemGetAllocationPropertiesFromHandle(
    s: &Call<'_>,
    a: args::cuMemGetAllocationPropertiesFromHandle,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let _op = s.vmm_op();
    let answer = (|| {
        if !a.prop_present {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !s.vmm().is_live(a.handle) {
            tracing::warn!("cuMemGetAllocationPropertiesFromHandle of a handle the session did not create, or released");
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut prop = CuMemAllocationProp::default();
        // SAFETY: a struct of cuda.h's layout to write, and a live handle of the session's.
        let st = unsafe {
            ffi::cuMemGetAllocationPropertiesFromHandle(
                (&mut prop as *mut CuMemAllocationProp).cast::<c_void>(),
                a.handle,
            )
        };
        driver(st)?;
        if prop.location.kind == LOCATION_TYPE_DEVICE {
            prop.location.id = crate::rt::tenant_device(s, prop.location.id).unwrap_or(-1);
        }
        Ok(prop)
    })();
    match answer {
        Ok(prop) => {
            w.i32(CUDA_SUCCESS);
            w.bytes(&prop.to_bytes());
        }
        Err(st) => w.i32(st),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn coverage_is_gap_free_across_neighbours() {
        let r: BTreeMap<u64, u64> = [(0x1000, 0x1000), (0x2000, 0x1000), (0x4000, 0x1000)]
            .into_iter()
            .collect();
        let holding = |at| r.range(..=at).next_back().map(|(s, l)| (*s, *l));
        assert!(covered(0x1000, 0x3000, holding));
        assert!(covered(0x1800, 0x2800, holding));
        assert!(!covered(0x2800, 0x4800, holding), "the gap at 0x3000");
        assert!(!covered(0xfff, 0x1001, holding));
        assert!(!covered(0x4800, 0x5001, holding));
        assert!(covered(0x4800, 0x4800, holding), "an empty range");
        assert!(!covered(0, 1, |_| None));
    }

    /// PyTorch's expandable segments: one large reservation, handles of one segment each
    /// mapped side by side, a tensor across two of them, then unmapped and released one by one.
    #[test]
    fn mappings_side_by_side_are_device_memory_until_unmapped_and_released() {
        let mut v = Vmm::default();
        let base = 0x7000_0000_0000;
        v.reserved(base, 8 * 20 * MIB);
        v.created(1, 20 * MIB);
        v.created(2, 20 * MIB);
        assert_eq!(v.check_map(base, 20 * MIB, 0, 1), Ok(()));
        v.mapped(base, 20 * MIB, 1);
        assert_eq!(v.check_map(base + 20 * MIB, 20 * MIB, 0, 2), Ok(()));
        v.mapped(base + 20 * MIB, 20 * MIB, 2);
        assert!(v.owns(base + 10 * MIB, 20 * MIB), "a tensor across both");
        assert!(!v.owns(base + 30 * MIB, 20 * MIB), "past the second");
        assert!(v.in_reservations(base + 100 * MIB, MIB));
        // Released while mapped: the memory stays until its mapping goes.
        assert_eq!(v.released(1), 0);
        assert!(!v.is_live(1));
        assert!(v.owns(base, MIB));
        assert_eq!(v.check_unmap(base, 20 * MIB), Ok(vec![base]));
        assert_eq!(v.unmapped(&[base]), 20 * MIB);
        assert!(!v.owns(base, MIB));
        // Unmapped first, released after.
        assert_eq!(v.unmapped(&[base + 20 * MIB]), 0);
        assert_eq!(v.released(2), 20 * MIB);
        assert!(v.physical.is_empty() && v.mapped.is_empty());
    }

    #[test]
    fn maps_must_name_the_sessions_handles_and_reservations() {
        let mut v = Vmm::default();
        v.reserved(0x10_0000, 4 * MIB);
        v.reserved(0x10_0000 + 4 * MIB, 4 * MIB);
        v.created(7, 2 * MIB);
        assert!(
            v.check_map(0x10_0000, 2 * MIB, 0, 8).is_err(),
            "not created"
        );
        assert!(v.check_map(0x10_0000, 4 * MIB, 0, 7).is_err(), "beyond it");
        assert!(v.check_map(0x10_0000, MIB, 2 * MIB, 7).is_err(), "offset");
        assert!(v.check_map(0x10_0000, 0, 0, 7).is_err(), "empty");
        assert!(
            v.check_map(0x0f_0000, 2 * MIB, 0, 7).is_err(),
            "not reserved"
        );
        assert!(v.check_map(u64::MAX - MIB, 2 * MIB, 0, 7).is_err(), "wraps");
        assert!(
            v.check_map(0x10_0000 + 3 * MIB, 2 * MIB, 0, 7).is_err(),
            "across two reservations side by side"
        );
        assert_eq!(v.check_map(0x10_0000 + 4 * MIB, 2 * MIB, 0, 7), Ok(()));
        v.mapped(0x10_0000, 2 * MIB, 7);
        assert!(
            v.check_map(0x10_0000 + MIB, MIB, 0, 7).is_err(),
            "already mapped"
        );
        assert_eq!(v.released(7), 0);
        assert!(
            v.check_map(0x10_0000 + 2 * MIB, MIB, 0, 7).is_err(),
            "released"
        );
    }

    /// NCCL's way: a handle retained from a mapped address needs one release more before the
    /// memory can go.
    #[test]
    fn retained_handles_need_a_release_each() {
        let mut v = Vmm::default();
        v.reserved(0x200_0000, 4 * MIB);
        v.created(5, 2 * MIB);
        v.mapped(0x200_0000, 2 * MIB, 5);
        assert!(v.retained(5));
        assert!(!v.retained(6), "not the session's");
        assert_eq!(v.released(5), 0);
        assert!(v.is_live(5), "the retained reference is still out");
        assert_eq!(v.unmapped(&[0x200_0000]), 0);
        assert_eq!(v.released(5), 2 * MIB);
        assert!(!v.is_live(5));
    }

    #[test]
    fn unmaps_take_whole_mappings_only() {
        let mut v = Vmm::default();
        v.reserved(0x100_0000, 16 * MIB);
        for (i, h) in [10u64, 11, 12].iter().enumerate() {
            v.created(*h, 2 * MIB);
            v.mapped(0x100_0000 + i as u64 * 2 * MIB, 2 * MIB, *h);
        }
        assert!(v.check_unmap(0x100_0000 + MIB, MIB).is_err(), "inside one");
        assert!(v.check_unmap(0x100_0000, 3 * MIB).is_err(), "ends inside");
        assert!(
            v.check_unmap(0x100_0000 + 6 * MIB, MIB).is_err(),
            "none there"
        );
        assert!(
            v.check_unmap(0x100_0000 + 4 * MIB, 4 * MIB).is_err(),
            "a tail past the last"
        );
        assert_eq!(
            v.check_unmap(0x100_0000, 4 * MIB),
            Ok(vec![0x100_0000, 0x100_0000 + 2 * MIB]),
            "two whole ones"
        );
        assert_eq!(v.unmapped(&[0x100_0000 + 2 * MIB]), 0);
        assert!(
            v.check_unmap(0x100_0000, 6 * MIB).is_err(),
            "a gap where one was"
        );
        v.mapped(0x100_0000 + 2 * MIB, 2 * MIB, 11);
        // Freeing the reservation takes what is still mapped in it (the worker unmaps it
        // first, one mapping at a time).
        for h in [10, 11, 12] {
            assert_eq!(v.released(h), 0);
        }
        let left = v.mappings_within(0x100_0000, 16 * MIB);
        assert_eq!(left.len(), 3);
        assert_eq!(v.unmapped(&[left[0].0]), 2 * MIB);
        let rest: Vec<u64> = left[1..].iter().map(|(s, _)| *s).collect();
        assert_eq!(v.unmapped(&rest), 4 * MIB);
        v.reservation_freed(0x100_0000);
        assert!(v.physical.is_empty() && v.mapped.is_empty() && v.reserved.is_empty());
    }
}
