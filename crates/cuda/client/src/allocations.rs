//! The device memory the program allocated, as the client knows it: what answers where an
//! address lies (`cuMemGetAddressRange`), which way a copy between two plain addresses goes
//! (`cuMemcpy`), and whether the server's driver can say anything of an address
//! (`cuPointerGetAttribute`): device addresses are the same number on both sides, but an
//! address the program's own memory has means nothing in the worker.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Allocations by start address: their length.
fn table() -> MutexGuard<'static, BTreeMap<u64, u64>> {
    static TABLE: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The driver allocated `[start, start + len)`.
pub fn allocated(start: u64, len: u64) {
    if len > 0 {
        table().insert(start, len);
    }
}

/// The allocation at `start` was freed.
pub fn freed(start: u64) {
    table().remove(&start);
}

/// The allocation `addr` lies in: its start and length.
pub fn range_of(addr: u64) -> Option<(u64, u64)> {
    table()
        .range(..=addr)
        .next_back()
        .filter(|(start, len)| addr - **start < **len)
        .map(|(s, l)| (*s, *l))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
