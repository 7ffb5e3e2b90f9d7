//! Handlers written by hand: the devices a tenant may use, and device memory as it sees it. A tenant with a quota sees
//! the quota as the device's memory, of which what it cannot get (its own allocations, and
//! what other users of the GPU hold beyond its share) is used; without a quota it sees the
//! device as it is.

// Handlers keep the C names of the entry points they serve.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::Call;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{
    DecodeError, HandleKind, Reader, Writer, MEMORY_SIZE, MEMORY_V2_SIZE, MEMORY_V2_VERSION,
};

/// Device memory: total, reserved (for the driver and firmware), free, used, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// The device's memory as a tenant with `quota` bytes, holding `held`, sees it: the quota is
/// the whole device (none of it reserved), free is what the tenant may still allocate (never
/// more than the device has free), and everything else is used.
pub fn quota_view(real: Memory, quota: Option<u64>, held: u64) -> Memory {
    let Some(q) = quota else {
        return real;
    };
    let total = real.total.min(q);
    let free = real.free.min(q.saturating_sub(held)).min(total);
    Memory {
        total,
        reserved: 0,
        free,
        used: total - free,
    }
}

fn tenant_view(s: &Call<'_>, real: Memory) -> Memory {
    let limits = s.limits();
    quota_view(real, limits.mem_quota, limits.tenant_bytes().max(0) as u64)
}

/// The device behind `id`, or None with the reply written (the status of a bad handle).
fn device_or_reply(s: &Call<'_>, id: u64, w: &mut Writer) -> Option<crate::session::Handle> {
    s.resolve(id, wormhole_nvml_proto::HandleKind::Device, false)
        .inspect_err(|st| w.i32(*st))
        .ok()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `nvmlDeviceGetMemoryInfo` (`nvmlMemory_t`: total, free, used).
pub fn nvmlDeviceGetMemoryInfo(
    s: &Call<'_>,
    a: args::nvmlDeviceGetMemoryInfo,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let Some(device) = device_or_reply(s, a.device_id, w) else {
        return Ok(());
    };
    if !a.memory_present {
        // nvml.h: "NVML_ERROR_INVALID_ARGUMENT if device is invalid or memory is NULL".
        w.i32(NVML_ERROR_INVALID_ARGUMENT);
        return Ok(());
    }
    let mut b = [0u8; MEMORY_SIZE];
    // SAFETY: `device` is a device NVML gave this session; `b` is an nvmlMemory_t's size.
    let st = unsafe { ffi::nvmlDeviceGetMemoryInfo(device, b.as_mut_ptr().cast()) };
    w.i32(st);
    if st == NVML_SUCCESS && a.memory_present {
        let real = Memory {
            total: u64_at(&b, 0),
            reserved: 0,
            free: u64_at(&b, 8),
            used: u64_at(&b, 16),
        };
        let m = tenant_view(s, real);
        let mut out = Vec::with_capacity(MEMORY_SIZE);
        for v in [m.total, m.free, m.used] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        w.bytes(&out);
    }
    Ok(())
}

/// `nvmlDeviceGetMemoryInfo_v2` (`nvmlMemory_v2_t`: version, total, reserved, free, used);
/// the client checked the caller's version.
pub fn nvmlDeviceGetMemoryInfo_v2(
    s: &Call<'_>,
    a: args::nvmlDeviceGetMemoryInfo_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let Some(device) = device_or_reply(s, a.device_id, w) else {
        return Ok(());
    };
    let mut b = [0u8; MEMORY_V2_SIZE];
    b[..4].copy_from_slice(&MEMORY_V2_VERSION.to_le_bytes());
    // SAFETY: `device` is a device NVML gave this session; `b` is an nvmlMemory_v2_t's size,
    // its version set.
    let st = unsafe { ffi::nvmlDeviceGetMemoryInfo_v2(device, b.as_mut_ptr().cast()) };
    w.i32(st);
    if st == NVML_SUCCESS && a.memory_present {
        let real = Memory {
            total: u64_at(&b, 8),
            reserved: u64_at(&b, 16),
            free: u64_at(&b, 24),
            used: u64_at(&b, 32),
        };
        let m = tenant_view(s, real);
        let mut out = vec![0u8; 8];
        out[..4].copy_from_slice(&MEMORY_V2_VERSION.to_le_bytes());
        for v in [m.total, m.reserved, m.free, m.used] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        w.bytes(&out);
    }
    Ok(())
}

/// Every device NVML has (those whose handle it gives), in its order; its status if it
/// cannot count them.
fn all_devices() -> Result<Vec<crate::session::Handle>, i32> {
    let mut count = 0u32;
    // SAFETY: a valid output pointer.
    let st = unsafe { ffi::nvmlDeviceGetCount_v2(&mut count) };
    if st != NVML_SUCCESS {
        return Err(st);
    }
    Ok((0..count)
        .filter_map(|i| {
            let mut dev: crate::session::Handle = std::ptr::null_mut();
            // SAFETY: a valid output pointer.
            let st = unsafe { ffi::nvmlDeviceGetHandleByIndex_v2(i, &mut dev) };
            (st == NVML_SUCCESS).then_some(dev)
        })
        .collect())
}

/// NVML's devices the tenant may use (those whose name its `devices` filter lets through), in
/// NVML's order: the tenant's device `n` is the `n`-th of them. Found once per session; if
/// NVML cannot count its devices, its status (asked again next time).
fn visible_devices<'a>(s: &'a Call<'_>) -> Result<&'a [usize], i32> {
    if let Some(v) = s.visible.get() {
        return Ok(v);
    }
    let all = all_devices()?;
    Ok(s.visible.get_or_init(|| {
        all.into_iter()
            .filter(|&dev| {
                let mut name = [0u8; 96];
                // SAFETY: `name` holds the length passed; `dev` is NVML's.
                unsafe { ffi::nvmlDeviceGetName(dev, name.as_mut_ptr().cast(), name.len() as u32) };
                let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                s.limits()
                    .may_use_device(&String::from_utf8_lossy(&name[..end]))
            })
            .map(|dev| dev as usize)
            .collect()
    }))
}

/// A lookup (`find`: NVML's status and device): the device if the tenant may use it (else
/// NVML_ERROR_NOT_FOUND, as for a device there is not). Without somewhere to put it the
/// answer is NVML's for that (nvml.h: "NVML_ERROR_INVALID_ARGUMENT if ... device is NULL"),
/// before NVML is asked: a tenant learns nothing of devices it may not use.
fn reply_found(
    s: &Call<'_>,
    present: bool,
    find: impl FnOnce(&mut crate::session::Handle) -> i32,
    w: &mut Writer,
) {
    if !present {
        return w.i32(NVML_ERROR_INVALID_ARGUMENT);
    }
    let mut dev: crate::session::Handle = std::ptr::null_mut();
    let st = find(&mut dev);
    if st != NVML_SUCCESS {
        return w.i32(st);
    }
    match visible_devices(s) {
        Ok(v) if v.contains(&(dev as usize)) => {
            w.i32(NVML_SUCCESS);
            s.export_list(w, HandleKind::Device, &[dev]);
        }
        Ok(_) => w.i32(NVML_ERROR_NOT_FOUND),
        Err(st) => w.i32(st),
    }
}

/// The devices the tenant may use, counted.
fn count(s: &Call<'_>, present: bool, w: &mut Writer) {
    if !present {
        return w.i32(NVML_ERROR_INVALID_ARGUMENT);
    }
    match visible_devices(s) {
        Ok(v) => {
            w.i32(NVML_SUCCESS);
            w.u32(v.len() as u32);
        }
        Err(st) => w.i32(st),
    }
}

/// The tenant's device `index`.
fn by_index(s: &Call<'_>, index: u32, present: bool, w: &mut Writer) {
    match visible_devices(s).map(|v| v.get(index as usize).copied()) {
        Ok(Some(dev)) if present => {
            w.i32(NVML_SUCCESS);
            s.export_list(w, HandleKind::Device, &[dev as crate::session::Handle]);
        }
        Err(st) => w.i32(st),
        _ => w.i32(NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// The device at PCI address `bus_id`, if the tenant may use it.
fn by_bus_id(s: &Call<'_>, bus_id: &Option<std::ffi::CString>, present: bool, w: &mut Writer) {
    let bus_id = bus_id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: `bus_id` NULL or a C string; a valid output pointer.
    reply_found(
        s,
        present,
        |dev| unsafe { ffi::nvmlDeviceGetHandleByPciBusId_v2(bus_id, dev) },
        w,
    );
}

/// `nvmlDeviceGetCount_v2`: the devices the tenant may use.
pub fn nvmlDeviceGetCount_v2(
    s: &Call<'_>,
    a: args::nvmlDeviceGetCount_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    count(s, a.deviceCount_present, w);
    Ok(())
}

/// `nvmlDeviceGetCount`, as `_v2`.
pub fn nvmlDeviceGetCount(
    s: &Call<'_>,
    a: args::nvmlDeviceGetCount,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    count(s, a.deviceCount_present, w);
    Ok(())
}

/// `nvmlDeviceGetHandleByIndex_v2`: by the tenant's numbering.
pub fn nvmlDeviceGetHandleByIndex_v2(
    s: &Call<'_>,
    a: args::nvmlDeviceGetHandleByIndex_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    by_index(s, a.index, a.device_present, w);
    Ok(())
}

/// `nvmlDeviceGetHandleByIndex`, as `_v2`.
pub fn nvmlDeviceGetHandleByIndex(
    s: &Call<'_>,
    a: args::nvmlDeviceGetHandleByIndex,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    by_index(s, a.index, a.device_present, w);
    Ok(())
}

/// `nvmlDeviceGetHandleByUUID`: only a device the tenant may use is found.
pub fn nvmlDeviceGetHandleByUUID(
    s: &Call<'_>,
    a: args::nvmlDeviceGetHandleByUUID,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let uuid = a.uuid_str.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: `uuid` NULL or a C string; a valid output pointer.
    reply_found(
        s,
        a.device_present,
        |dev| unsafe { ffi::nvmlDeviceGetHandleByUUID(uuid, dev) },
        w,
    );
    Ok(())
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: only a device the tenant may use is found.
pub fn nvmlDeviceGetHandleByPciBusId_v2(
    s: &Call<'_>,
    a: args::nvmlDeviceGetHandleByPciBusId_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    by_bus_id(s, &a.pciBusId_str, a.device_present, w);
    Ok(())
}

/// `nvmlDeviceGetHandleByPciBusId`, as `_v2`.
pub fn nvmlDeviceGetHandleByPciBusId(
    s: &Call<'_>,
    a: args::nvmlDeviceGetHandleByPciBusId,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    by_bus_id(s, &a.pciBusId_str, a.device_present, w);
    Ok(())
}

/// `nvmlPciInfo_t`'s size, and where its domain, bus and device numbers lie.
const PCI_SIZE: usize = 68;
const PCI_ADDRESS: std::ops::Range<usize> = 16..28;

/// Whether the PCI address in `pci` (an `nvmlPciInfo_t`) is a GPU's that the tenant may not
/// use. Other peers (NVSwitches) are no GPU of NVML's.
fn hidden_gpu(s: &Call<'_>, pci: &[u8; PCI_SIZE]) -> bool {
    let visible = visible_devices(s).unwrap_or(&[]);
    all_devices().unwrap_or_default().into_iter().any(|dev| {
        let mut other = [0u8; PCI_SIZE];
        // SAFETY: a device of NVML's; `other` an nvmlPciInfo_t's size.
        let found =
            unsafe { ffi::nvmlDeviceGetPciInfo_v3(dev, other.as_mut_ptr().cast()) } == NVML_SUCCESS;
        found && other[PCI_ADDRESS] == pci[PCI_ADDRESS] && !visible.contains(&(dev as usize))
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the link's peer, unless it is a GPU the tenant may
/// not use (NVML_ERROR_NOT_FOUND, as for a lookup of one: its address is not the tenant's to
/// learn).
pub fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    s: &Call<'_>,
    a: args::nvmlDeviceGetNvLinkRemotePciInfo_v2,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let Some(device) = device_or_reply(s, a.device_id, w) else {
        return Ok(());
    };
    let mut pci = [0u8; PCI_SIZE];
    let out = match a.pci_present {
        true => pci.as_mut_ptr().cast(),
        false => std::ptr::null_mut(),
    };
    // SAFETY: a device NVML gave this session; `pci` an nvmlPciInfo_t's size (or NULL).
    let st = unsafe { ffi::nvmlDeviceGetNvLinkRemotePciInfo_v2(device, a.link, out) };
    if st != NVML_SUCCESS || !a.pci_present {
        w.i32(st);
    } else if hidden_gpu(s, &pci) {
        w.i32(NVML_ERROR_NOT_FOUND);
    } else {
        w.i32(NVML_SUCCESS);
        w.bytes(&pci);
    }
    Ok(())
}

/// `nvmlDeviceGetIndex`: the tenant's number of the device.
pub fn nvmlDeviceGetIndex(
    s: &Call<'_>,
    a: args::nvmlDeviceGetIndex,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let Some(dev) = device_or_reply(s, a.device_id, w) else {
        return Ok(());
    };
    match visible_devices(s).map(|v| v.iter().position(|&d| d == dev as usize)) {
        Ok(Some(i)) if a.index_present => {
            w.i32(NVML_SUCCESS);
            w.u32(i as u32);
        }
        Ok(Some(_)) => w.i32(NVML_ERROR_INVALID_ARGUMENT),
        Ok(None) => w.i32(NVML_ERROR_NOT_FOUND),
        Err(st) => w.i32(st),
    }
    Ok(())
}

/// The compute processes on a device, as the tenant sees them (the client makes them one
/// entry, see its `custom.rs`): the device memory the tenant holds, if it may use the device.
fn running_processes(s: &Call<'_>, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let id = r.u64()?;
    r.finish()?;
    let Some(dev) = device_or_reply(s, id, w) else {
        return Ok(());
    };
    match visible_devices(s).map(|v| v.contains(&(dev as usize))) {
        Ok(true) => {
            w.i32(NVML_SUCCESS);
            w.u64(s.limits().tenant_bytes().max(0) as u64);
        }
        Ok(false) => w.i32(NVML_ERROR_NOT_FOUND),
        Err(st) => w.i32(st),
    }
    Ok(())
}

/// `nvmlDeviceGetComputeRunningProcesses`.
pub fn nvmlDeviceGetComputeRunningProcesses(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    running_processes(s, r, w)
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`.
pub fn nvmlDeviceGetComputeRunningProcesses_v2(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    running_processes(s, r, w)
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
pub fn nvmlDeviceGetComputeRunningProcesses_v3(
    s: &Call<'_>,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    running_processes(s, r, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: Memory = Memory {
        total: 80 << 30,
        reserved: 1 << 30,
        free: 70 << 30,
        used: 9 << 30,
    };

    #[test]
    fn without_a_quota_the_device_is_seen_as_it_is() {
        assert_eq!(quota_view(H100, None, 5 << 30), H100);
    }

    #[test]
    fn with_a_quota_the_quota_is_the_device_and_the_tenants_use_is_used() {
        let m = quota_view(H100, Some(8 << 30), 3 << 30);
        assert_eq!(
            m,
            Memory {
                total: 8 << 30,
                reserved: 0,
                free: 5 << 30,
                used: 3 << 30
            }
        );
    }

    /// Others on the GPU leave less free than the quota allows: free is what the device has,
    /// and the rest of the quota is used (the tenant cannot get it either).
    #[test]
    fn free_is_never_more_than_the_device_has() {
        let crowded = Memory {
            free: 2 << 30,
            used: 77 << 30,
            ..H100
        };
        let m = quota_view(crowded, Some(8 << 30), 1 << 30);
        assert_eq!((m.total, m.free, m.used), (8 << 30, 2 << 30, 6 << 30));
        // A tenant over its quota (the quota lowered under it) has nothing free.
        let m = quota_view(H100, Some(8 << 30), 9 << 30);
        assert_eq!((m.total, m.free, m.used), (8 << 30, 0, 8 << 30));
    }
}
