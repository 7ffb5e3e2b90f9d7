//! Errors of calls the client sent without waiting (pipelined), kept until the application can
//! be told: the client returned success at once because it had ruled out every error it could
//! see, so a failure the driver reports anyway (a resource limit, a gap in that validation)
//! must reach the application at its next synchronisation point on the same object instead of
//! only a log line. Each API keys them by what its synchronisation points name: OpenCL by
//! command queue (0: the whole session), CUDA will key sticky errors by context.

use std::collections::HashMap;
use std::sync::Mutex;

/// Every key's first failure since it was last reported.
#[derive(Default)]
pub struct DeferredErrors {
    pending: Mutex<HashMap<u64, i32>>,
}

/// The key of failures that belong to no one object: reported at any synchronisation point.
pub const SESSION: u64 = 0;

impl DeferredErrors {
    /// Records a failed pipelined call; the first failure of a key is the one reported.
    pub fn record(&self, key: u64, status: i32) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(status);
    }

    /// Whether no failure waits to be reported (the common case: nothing to look up).
    pub fn is_empty(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Forgets every failure `which` picks (it was reported another way).
    pub fn forget(&self, which: impl Fn(i32) -> bool) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, st| !which(*st));
    }

    /// The failure to report at a synchronisation point on `keys` (and the session's own), if
    /// any; every key it covers is cleared, so each failure is reported once.
    pub fn take(&self, keys: &[u64]) -> Option<i32> {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_empty() {
            return None;
        }
        let mut found = p.remove(&SESSION);
        for k in keys {
            if let Some(st) = p.remove(k) {
                found.get_or_insert(st);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_is_reported_once_where_it_belongs() {
        let d = DeferredErrors::default();
        assert_eq!(d.take(&[7]), None);
        assert!(d.is_empty());
        d.record(7, -6);
        assert!(!d.is_empty());
        d.record(7, -5); // the first failure of a key wins
        assert_eq!(
            d.take(&[8]),
            None,
            "another queue's sync point does not see it"
        );
        assert_eq!(d.take(&[7]), Some(-6));
        assert_eq!(d.take(&[7]), None, "reported once");
        d.record(SESSION, -48);
        assert_eq!(
            d.take(&[8]),
            Some(-48),
            "session-wide failures go to any sync point"
        );
        assert_eq!(d.take(&[8]), None);
    }

    #[test]
    fn failures_reported_another_way_are_forgotten() {
        let d = DeferredErrors::default();
        d.record(1, 901);
        d.record(2, 700);
        d.forget(|st| (900..=908).contains(&st));
        assert_eq!(d.take(&[1]), None);
        assert_eq!(d.take(&[2]), Some(700));
    }
}
