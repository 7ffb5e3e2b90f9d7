//! An API's driver library as a worker holds it: opened once, on first use, its entry points
//! in a table (the generated `ffi::Table`) that the generated wrappers read on every call with
//! one atomic load. `wh` links no driver: without one, the table is empty, the reason is kept
//! (the worker refuses its session with it), and nothing else fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// A driver library and its table of entry points `T`.
pub struct DriverTable<T: 'static> {
    loaded: OnceLock<Result<(libloading::Library, T), String>>,
    open: fn() -> Result<(libloading::Library, T), String>,
    empty: T,
    /// The driver in log lines ("the CUDA driver").
    name: &'static str,
    /// What calls to an entry point the driver lacks answer, in log lines.
    unsupported: &'static str,
}

impl<T: Sync> DriverTable<T> {
    /// `open` loads the library and its table (it logs why it cannot); `empty` is the table
    /// of no driver.
    pub const fn new(
        name: &'static str,
        unsupported: &'static str,
        open: fn() -> Result<(libloading::Library, T), String>,
        empty: T,
    ) -> Self {
        DriverTable {
            loaded: OnceLock::new(),
            open,
            empty,
            name,
            unsupported,
        }
    }

    /// Opens the driver if no call did yet; Err says why there is none (logged once, by
    /// `open`). A worker refuses its session on Err.
    pub fn load(&self) -> Result<(), &str> {
        match self.loaded.get_or_init(self.open) {
            Ok(_) => Ok(()),
            Err(reason) => Err(reason),
        }
    }

    /// The entry points (empty without a driver).
    #[inline]
    pub fn table(&self) -> &T {
        match self.loaded.get_or_init(self.open) {
            Ok((_, table)) => table,
            Err(_) => &self.empty,
        }
    }

    /// A wrapper found no entry point `entry` (a driver older than the description): logged
    /// once per entry point (`logged` is its own flag). Without a driver at all, the failed
    /// load was logged already.
    #[cold]
    pub fn missing(&self, entry: &str, logged: &AtomicBool) {
        if matches!(self.loaded.get(), Some(Ok(_))) && !logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{} has no {entry}: calls to it answer {}",
                self.name,
                self.unsupported
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Table(u32);

    static NONE: DriverTable<Table> = DriverTable::new(
        "no driver",
        "NOT_SUPPORTED",
        || Err("no such library".into()),
        Table(0),
    );

    fn libc() -> Result<(libloading::Library, Table), String> {
        // SAFETY: the C library has no initialisers that expect anything of us.
        let lib = unsafe { libloading::Library::new("libc.so.6") }.map_err(|e| e.to_string())?;
        Ok((lib, Table(7)))
    }

    static LIBC: DriverTable<Table> = DriverTable::new("libc", "NOT_SUPPORTED", libc, Table(0));

    #[test]
    fn without_a_driver_the_table_is_empty_and_the_reason_kept() {
        assert_eq!(NONE.load(), Err("no such library"));
        assert_eq!(NONE.table().0, 0);
    }

    #[test]
    fn a_driver_is_opened_once_and_its_table_served() {
        assert_eq!(LIBC.load(), Ok(()));
        assert_eq!(LIBC.table().0, 7);
        assert!(std::ptr::eq(LIBC.table(), LIBC.table()));
    }
}
