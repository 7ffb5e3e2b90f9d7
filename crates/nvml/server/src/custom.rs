//! Handlers written by hand: device memory as the tenant sees it. A tenant with a quota sees
//! the quota as the device's memory, of which what it cannot get (its own allocations, and
//! what other users of the GPU hold beyond its share) is used; without a quota it sees the
//! device as it is.

// Handlers keep the C names of the entry points they serve.
#![allow(non_snake_case)]

use crate::generated::{args, ffi};
use crate::session::Call;
use wormhole_nvml_proto::nv::*;
use wormhole_nvml_proto::{DecodeError, Writer, MEMORY_SIZE, MEMORY_V2_SIZE, MEMORY_V2_VERSION};

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
