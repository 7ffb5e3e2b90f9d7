//! Memory accounting of a tenant, shared by the supervisor and every worker of that tenant: a
//! small memfd holding, per account (device memory; page-locked host memory the workers hold
//! for the tenant), the tenant's total and one slot per session. Workers reserve
//! before they keep memory and give it back when the driver frees it; when a worker dies, the
//! supervisor writes its slot off, so a crashed session never leaks quota.
//!
//! The same memory carries the tenant's limits that may change while sessions run (`wh tenant
//! set`): the supervisor writes them, and every worker of the tenant, standby ones included,
//! reads them at each use.

use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub const SLOTS: usize = 256;

#[repr(C)]
struct Shared {
    device: Account,
    /// The tenant's `max_queued` (0: no limit).
    max_queued: AtomicU64,
    host: Account,
}

#[repr(C)]
struct Account {
    total: AtomicI64,
    slots: [AtomicI64; SLOTS],
}

/// What a reservation is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device memory.
    Device,
    /// Page-locked host memory a worker holds for the tenant (CUDA's `cuMemHostAlloc`): bounded
    /// by the same quota, apart from device memory.
    Host,
}

pub struct Ledger {
    map: MmapRaw,
    file: File,
}

impl Ledger {
    pub fn create() -> std::io::Result<Ledger> {
        let fd = nix::sys::memfd::memfd_create(
            c"wormhole-ledger",
            nix::sys::memfd::MemFdCreateFlag::empty(),
        )?;
        let file = File::from(fd);
        file.set_len(std::mem::size_of::<Shared>() as u64)?;
        Self::map(file)
    }

    pub fn from_fd(fd: OwnedFd) -> std::io::Result<Ledger> {
        let file = File::from(fd);
        if file.metadata()?.len() < std::mem::size_of::<Shared>() as u64 {
            return Err(std::io::Error::other("ledger too small"));
        }
        Self::map(file)
    }

    fn map(file: File) -> std::io::Result<Ledger> {
        let map = MmapRaw::map_raw(&file)?;
        Ok(Ledger { map, file })
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    fn shared(&self) -> &Shared {
        // SAFETY: the mapping is at least size_of::<Shared>() bytes (checked or created so),
        // page-aligned, and only ever accessed through these atomics.
        unsafe { &*(self.map.as_ptr() as *const Shared) }
    }

    fn account(&self, kind: Kind) -> &Account {
        match kind {
            Kind::Device => &self.shared().device,
            Kind::Host => &self.shared().host,
        }
    }

    /// Takes `bytes` of device memory for session `slot` if the tenant stays within `quota`.
    pub fn reserve(&self, slot: usize, bytes: u64, quota: Option<u64>) -> bool {
        self.reserve_of(Kind::Device, slot, bytes, quota)
    }

    /// Takes `bytes` of `kind` for session `slot` if the tenant stays within `quota`.
    pub fn reserve_of(&self, kind: Kind, slot: usize, bytes: u64, quota: Option<u64>) -> bool {
        let a = self.account(kind);
        let b = bytes.min(i64::MAX as u64) as i64;
        let before = a.total.fetch_add(b, Ordering::AcqRel);
        if let Some(q) = quota {
            if before.saturating_add(b) > q.min(i64::MAX as u64) as i64 {
                a.total.fetch_sub(b, Ordering::AcqRel);
                return false;
            }
        }
        a.slots[slot % SLOTS].fetch_add(b, Ordering::AcqRel);
        true
    }

    pub fn release(&self, slot: usize, bytes: u64) {
        self.release_of(Kind::Device, slot, bytes)
    }

    pub fn release_of(&self, kind: Kind, slot: usize, bytes: u64) {
        let a = self.account(kind);
        let b = bytes.min(i64::MAX as u64) as i64;
        a.slots[slot % SLOTS].fetch_sub(b, Ordering::AcqRel);
        a.total.fetch_sub(b, Ordering::AcqRel);
    }

    /// The session in `slot` is gone: everything it held is free again.
    pub fn write_off(&self, slot: usize) {
        for kind in [Kind::Device, Kind::Host] {
            let a = self.account(kind);
            let held = a.slots[slot % SLOTS].swap(0, Ordering::AcqRel);
            a.total.fetch_sub(held, Ordering::AcqRel);
        }
    }

    /// The tenant's device memory now.
    pub fn total(&self) -> i64 {
        self.total_of(Kind::Device)
    }

    pub fn total_of(&self, kind: Kind) -> i64 {
        self.account(kind).total.load(Ordering::Acquire)
    }

    /// Sets the tenant's limit of commands a session may have queued per queue (0: none).
    pub fn set_max_queued(&self, n: u64) {
        self.shared().max_queued.store(n, Ordering::Relaxed);
    }

    /// The tenant's limit of queued commands now (0: none).
    pub fn max_queued(&self) -> u64 {
        self.shared().max_queued.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_is_shared_and_written_off() {
        let a = Ledger::create().unwrap();
        let b = Ledger::from_fd(a.file.try_clone().unwrap().into()).unwrap();
        assert!(a.reserve(0, 600, Some(1000)));
        assert!(!b.reserve(1, 500, Some(1000)));
        assert!(b.reserve(1, 400, Some(1000)));
        assert_eq!(a.total(), 1000);
        b.release(1, 400);
        a.write_off(0);
        assert_eq!(b.total(), 0);
        // Page-locked host memory is a quota of its own, written off with the session too.
        assert!(a.reserve_of(Kind::Host, 2, 900, Some(1000)));
        assert!(a.reserve(2, 900, Some(1000)));
        assert!(!b.reserve_of(Kind::Host, 3, 200, Some(1000)));
        a.write_off(2);
        assert_eq!((b.total(), b.total_of(Kind::Host)), (0, 0));
        // The limits the supervisor changes reach every worker's mapping at once.
        assert_eq!(b.max_queued(), 0);
        a.set_max_queued(64);
        assert_eq!(b.max_queued(), 64);
    }
}
