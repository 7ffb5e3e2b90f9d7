//! The device memory the program allocated, as the client knows it: what answers where an
//! address lies (`cuMemGetAddressRange`), which way a copy between two plain addresses goes
//! (`cuMemcpy`), and whether the server's driver can say anything of an address
//! (`cuPointerGetAttribute`): device addresses are the same number on both sides, but an
//! address the program's own memory has means nothing in the worker.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One allocation: its length, and how many contexts had ended when it was made (memory of
/// an ended context is gone, but stays here until an allocation takes its place).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Entry {
    len: u64,
    epoch: u64,
}

/// Allocations by start address.
fn table() -> MutexGuard<'static, BTreeMap<u64, Entry>> {
    static TABLE: Mutex<BTreeMap<u64, Entry>> = Mutex::new(BTreeMap::new());
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Contexts ended so far (destroyed, reset, released for the last time).
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// A context ended: the allocations made before may be gone with it.
pub fn context_ended() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
}

fn entry(len: u64) -> Entry {
    Entry {
        len,
        epoch: EPOCH.load(Ordering::Acquire),
    }
}

/// The driver allocated `[start, start + len)`. Entries it overlaps are stale (memory a
/// context's end freed, which the client does not see range by range): they go, or an older
/// one starting inside the new range would hide it from lookups.
pub fn allocated(start: u64, len: u64) {
    if len == 0 {
        return;
    }
    let end = start.saturating_add(len);
    let mut t = table();
    let stale: Vec<u64> = t
        .range(..end)
        .rev()
        .take_while(|(s, e)| s.saturating_add(e.len) > start)
        .map(|(s, _)| *s)
        .collect();
    for s in stale {
        t.remove(&s);
    }
    t.insert(start, entry(len));
}

/// The allocation at `start` was freed (the frees themselves go through `free_with`).
#[cfg(test)]
pub fn freed(start: u64) {
    table().remove(&start);
}

/// Frees the allocation at `start` with `free` (the driver's status): it is forgotten before
/// the free is sent, since the driver may give its address to another thread's allocation as
/// soon as it is freed, and a late forget would then drop that one; a refused free (not an
/// allocation, a bad stream) puts it back unless the address was given out again meanwhile.
pub fn free_with(start: u64, free: impl FnOnce() -> i32) -> i32 {
    let gone = table().remove(&start);
    let status = free();
    if let (Some(e), true) = (gone, status != wormhole_cuda_proto::cu::CUDA_SUCCESS) {
        table().entry(start).or_insert(e);
    }
    status
}

/// Forgets every entry that begins in `[start, start + len)` (mappings undone together:
/// `cuMemUnmap` of several, `cuMemAddressFree` of a reservation) while `undo` (the driver's
/// status) runs, as `free_with` does: the driver may hand the addresses to another thread as
/// soon as they are undone. A refused undo puts back the entries whose place was not taken
/// meanwhile.
pub fn forget_within_with(start: u64, len: u64, undo: impl FnOnce() -> i32) -> i32 {
    let gone: Vec<(u64, Entry)> = {
        let mut t = table();
        let inside: Vec<(u64, Entry)> = t
            .range(start..start.saturating_add(len))
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, _) in &inside {
            t.remove(s);
        }
        inside
    };
    let status = undo();
    if status != wormhole_cuda_proto::cu::CUDA_SUCCESS {
        let mut t = table();
        for (s, e) in gone {
            let end = s.saturating_add(e.len);
            let taken = t
                .range(..end)
                .next_back()
                .is_some_and(|(o, oe)| o.saturating_add(oe.len) > s);
            if !taken {
                t.insert(s, e);
            }
        }
    }
    status
}

/// Module variables by the module or library they belong to (its id): their ranges go from
/// the table when it is unloaded.
fn variables() -> MutexGuard<'static, BTreeMap<u64, Vec<(u64, u64)>>> {
    static VARIABLES: Mutex<BTreeMap<u64, Vec<(u64, u64)>>> = Mutex::new(BTreeMap::new());
    VARIABLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A variable of module or library `owner` lies at `[start, start + len)`: device memory the
/// program may name in copies until its owner is unloaded.
pub fn variable(owner: u64, start: u64, len: u64) {
    allocated(start, len);
    if len > 0 {
        let mut v = variables();
        let ranges = v.entry(owner).or_default();
        if !ranges.contains(&(start, len)) {
            ranges.push((start, len));
        }
    }
}

/// Module or library `owner` was unloaded: its variables' ranges go, unless an allocation
/// made since took their place.
pub fn unloaded(owner: u64) {
    let Some(ranges) = variables().remove(&owner) else {
        return;
    };
    let mut t = table();
    for (start, len) in ranges {
        if t.get(&start).is_some_and(|e| e.len == len) {
            t.remove(&start);
        }
    }
}

/// The allocation `addr` lies in: its start and length.
pub fn range_of(addr: u64) -> Option<(u64, u64)> {
    entry_of(addr).map(|(s, e)| (s, e.len))
}

fn entry_of(addr: u64) -> Option<(u64, Entry)> {
    table()
        .range(..=addr)
        .next_back()
        .filter(|(start, e)| addr - **start < e.len)
        .map(|(s, e)| (*s, *e))
}

/// Whether `addr` lies in an allocation made since the last context ended (one that surely
/// still exists, unless freed: the driver need not be asked about it).
pub fn surely_live(addr: u64) -> bool {
    entry_of(addr).is_some_and(|(_, e)| e.epoch == EPOCH.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_allocation_replaces_the_stale_ones_it_overlaps() {
        allocated(0x7100_0000, 0x100);
        allocated(0x7100_0200, 0x100);
        allocated(0x7100_0400, 0x100);
        // The driver hands out [0x7100_0080, 0x7100_0280) again after a reset.
        allocated(0x7100_0080, 0x200);
        assert_eq!(range_of(0x7100_0000), None);
        assert_eq!(range_of(0x7100_0250), Some((0x7100_0080, 0x200)));
        assert_eq!(range_of(0x7100_0400), Some((0x7100_0400, 0x100)));
        freed(0x7100_0080);
        freed(0x7100_0400);
    }

    #[test]
    fn a_free_forgets_before_it_is_sent_and_a_refused_one_remembers() {
        use wormhole_cuda_proto::cu::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
        allocated(0x7000_0000, 64);
        let st = free_with(0x7000_0000, || {
            assert_eq!(
                range_of(0x7000_0000),
                None,
                "forgotten while the free is out"
            );
            // Another thread gets the address as soon as the driver freed it.
            allocated(0x7000_0000, 32);
            CUDA_SUCCESS
        });
        assert_eq!(st, CUDA_SUCCESS);
        assert_eq!(
            range_of(0x7000_0010),
            Some((0x7000_0000, 32)),
            "the new one stays"
        );
        let st = free_with(0x7000_0000, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(st, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            range_of(0x7000_0010),
            Some((0x7000_0000, 32)),
            "a refused free"
        );
        freed(0x7000_0000);
    }

    #[test]
    fn addresses_are_found_in_their_allocation_only() {
        allocated(0x10_0000, 0x1000);
        allocated(0x10_1000, 0x10);
        assert_eq!(range_of(0x10_0000), Some((0x10_0000, 0x1000)));
        assert_eq!(range_of(0x10_0fff), Some((0x10_0000, 0x1000)));
        assert_eq!(range_of(0x10_1000), Some((0x10_1000, 0x10)));
        assert_eq!(range_of(0x10_1010), None);
        assert_eq!(range_of(0xf_ffff), None);
        freed(0x10_0000);
        assert_eq!(range_of(0x10_0800), None);
        allocated(0x20_0000, 0);
        assert_eq!(range_of(0x20_0000), None);
    }

    #[test]
    fn an_unloaded_modules_variables_go_with_it() {
        variable(7, 0x40_0000, 0x100);
        variable(7, 0x40_1000, 0x10);
        variable(8, 0x40_2000, 0x10);
        // An allocation took the place of one of module 7's since.
        allocated(0x40_1000, 0x20);
        unloaded(7);
        assert_eq!(range_of(0x40_0010), None);
        assert_eq!(
            range_of(0x40_1018),
            Some((0x40_1000, 0x20)),
            "the allocation stays"
        );
        assert_eq!(
            range_of(0x40_2000),
            Some((0x40_2000, 0x10)),
            "another module's"
        );
        unloaded(7);
        unloaded(8);
        assert_eq!(range_of(0x40_2000), None);
        freed(0x40_1000);
    }

    #[test]
    fn mappings_undone_together_are_forgotten_together() {
        use wormhole_cuda_proto::cu::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
        allocated(0x30_0000, 0x1000);
        allocated(0x30_1000, 0x1000);
        allocated(0x30_2000, 0x1000);
        let st = forget_within_with(0x30_0000, 0x2000, || {
            assert_eq!(range_of(0x30_0800), None, "forgotten while the undo is out");
            assert_eq!(range_of(0x30_1800), None);
            CUDA_SUCCESS
        });
        assert_eq!(st, CUDA_SUCCESS);
        assert_eq!(range_of(0x30_0800), None);
        assert_eq!(range_of(0x30_2800), Some((0x30_2000, 0x1000)));
        // A refused undo puts back what another thread did not take meanwhile.
        allocated(0x30_0000, 0x1000);
        let st = forget_within_with(0x30_0000, 0x3000, || {
            allocated(0x30_0800, 0x100);
            CUDA_ERROR_INVALID_VALUE
        });
        assert_eq!(st, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(range_of(0x30_0900), None, "its place was taken");
        assert_eq!(range_of(0x30_0850), Some((0x30_0800, 0x100)));
        assert_eq!(range_of(0x30_2800), Some((0x30_2000, 0x1000)), "put back");
        freed(0x30_0800);
        freed(0x30_2000);
    }
}
