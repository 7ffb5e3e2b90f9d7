//! A session's handle table, for any API: maps the ids the client knows objects by to the
//! driver's real objects, typed by the API's handle kinds. Ids are only meaningful inside one
//! session: another session's ids (or made-up ones) resolve to nothing.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use wormhole_wire::SERVER_ID_BIT;

/// Why a client-chosen id for a new object was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewIdError {
    /// 0, in the server's id space, or already in use.
    Invalid,
    /// The session holds its limit of objects.
    TooMany,
}

/// What an id names.
struct Entry<K> {
    kind: K,
    ptr: usize,
    /// The application's references, for an object it created, as its retains and releases
    /// reached the server: the driver's own count of the object may be higher (what the
    /// driver itself holds, e.g. a kernel holds its program). None for objects the server
    /// exported (devices, objects returned by queries).
    refs: Option<u32>,
}

impl<K: Copy + Eq> Entry<K> {
    /// The object, if it is of `kind`.
    fn of(&self, kind: K) -> Option<usize> {
        (self.kind == kind).then_some(self.ptr)
    }
}

struct Table<K> {
    by_id: HashMap<u64, Entry<K>>,
    by_ptr: HashMap<usize, u64>,
    next_server_id: u64,
}

pub struct HandleTable<K> {
    t: Mutex<Table<K>>,
    /// Held (shared) by a retain or release from resolving its id to counting it, and
    /// (exclusively) while an id's references move to another object: a retain between the
    /// two would land on one object and be counted for the other.
    moving: RwLock<()>,
}

impl<K> Default for HandleTable<K> {
    fn default() -> Self {
        HandleTable {
            t: Mutex::new(Table {
                by_id: HashMap::new(),
                by_ptr: HashMap::new(),
                next_server_id: 0,
            }),
            moving: RwLock::new(()),
        }
    }
}

impl<K: Copy + Eq + Hash> HandleTable<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table<K>> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object behind `id` if it is of `kind`.
    pub fn get(&self, id: u64, kind: K) -> Option<usize> {
        self.lock().by_id.get(&id)?.of(kind)
    }

    /// The objects behind `ids`, all of `kind`, or None if any is not.
    pub fn get_all(&self, ids: &[u64], kind: K) -> Option<Vec<usize>> {
        let t = self.lock();
        ids.iter().map(|id| t.by_id.get(id)?.of(kind)).collect()
    }

    /// Whether `id` may name a new object: fresh, in the client's id space, and within `max`
    /// objects. Only [`HandleTable::bind_new`] settles it (another lane may take the id
    /// between the two); this lets a handler refuse before it calls the driver.
    pub fn check_new(&self, id: u64, max: Option<usize>) -> Result<(), NewIdError> {
        Self::admit(&self.lock(), id, max)
    }

    fn admit(t: &Table<K>, id: u64, max: Option<usize>) -> Result<(), NewIdError> {
        if id == 0 || id & SERVER_ID_BIT != 0 || t.by_id.contains_key(&id) {
            return Err(NewIdError::Invalid);
        }
        if max.is_some_and(|m| t.by_id.len() >= m) {
            return Err(NewIdError::TooMany);
        }
        Ok(())
    }

    /// Binds a new object under the id the client chose, checking the id under the same lock
    /// (no other lane can take it between the check and the insert).
    pub fn bind_new(
        &self,
        id: u64,
        kind: K,
        ptr: usize,
        max: Option<usize>,
    ) -> Result<(), NewIdError> {
        let mut t = self.lock();
        Self::admit(&t, id, max)?;
        let refs = Some(1);
        t.by_id.insert(id, Entry { kind, ptr, refs });
        t.by_ptr.insert(ptr, id);
        Ok(())
    }

    /// The application retained `id` once more.
    pub fn retained(&self, id: u64) {
        if let Some(n) = self.lock().by_id.get_mut(&id).and_then(|e| e.refs.as_mut()) {
            *n = n.saturating_add(1);
        }
    }

    /// The application released `id` once: whether that was its last reference, after which
    /// the caller forgets the id ([`HandleTable::forget`]).
    ///
    /// For an object the application created, the server's own count decides, not
    /// `client_last` (the client's count, which said whether this release took it to zero):
    /// two threads' releases are sent without waiting, each on its own lane, and nothing
    /// orders them, so the one the client counted last may arrive first. Releases commute;
    /// forgetting at the client's last would refuse the other one. Objects the server exported
    /// are not counted here, so for them the client's count decides.
    pub fn released(&self, id: u64, client_last: bool) -> bool {
        let mut t = self.lock();
        let Some(e) = t.by_id.get_mut(&id) else {
            return false;
        };
        match e.refs.as_mut() {
            Some(n) => {
                *n = n.saturating_sub(1);
                if (*n == 0) != client_last {
                    tracing::trace!(id, left = *n, "releases of two lanes arrived crossed");
                }
                *n == 0
            }
            None => client_last,
        }
    }

    /// Held across a retain or release: no id is pointed elsewhere meanwhile.
    pub fn counting(&self) -> RwLockReadGuard<'_, ()> {
        self.moving.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while an id's references move to another object and the id is pointed at it.
    pub fn repointing(&self) -> RwLockWriteGuard<'_, ()> {
        self.moving.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The application's references to `id`, if it created the object behind it (objects the
    /// server exported, such as devices, are not counted).
    pub fn refs(&self, id: u64) -> Option<u32> {
        self.lock().by_id.get(&id)?.refs
    }

    /// Points an existing id at another real object of its kind; the application's
    /// references stay with the id.
    pub fn rebind(&self, id: u64, kind: K, ptr: usize) {
        let mut t = self.lock();
        let Some(e) = t.by_id.get_mut(&id) else {
            return;
        };
        let old = std::mem::replace(&mut e.ptr, ptr);
        e.kind = kind;
        if t.by_ptr.get(&old) == Some(&id) {
            t.by_ptr.remove(&old);
        }
        t.by_ptr.insert(ptr, id);
    }

    /// The client dropped its last reference to `id`: what it named, if anything.
    pub fn forget(&self, id: u64) -> Option<(K, usize)> {
        let mut t = self.lock();
        let Entry { kind, ptr, .. } = t.by_id.remove(&id)?;
        if t.by_ptr.get(&ptr) == Some(&id) {
            t.by_ptr.remove(&ptr);
        }
        Some((kind, ptr))
    }

    /// The id under which the client knows `ptr`, assigning a server id to objects the client
    /// has not seen yet (devices, objects returned by queries). 0 for NULL.
    pub fn export(&self, kind: K, ptr: usize) -> u64 {
        if ptr == 0 {
            return 0;
        }
        let mut t = self.lock();
        if let Some(id) = t.by_ptr.get(&ptr) {
            if t.by_id.get(id).is_some_and(|e| e.kind == kind) {
                return *id;
            }
        }
        if t.next_server_id == 0 {
            // A random start: ids are meaningful only in this table, and not guessable.
            use std::hash::{BuildHasher, Hasher};
            t.next_server_id = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
                >> 4;
        }
        t.next_server_id += 1;
        let id = SERVER_ID_BIT | t.next_server_id;
        let refs = None;
        t.by_id.insert(id, Entry { kind, ptr, refs });
        t.by_ptr.insert(ptr, id);
        id
    }

    /// Writes objects the driver returned as a list of the ids the client knows them by
    /// (count first), new ones given a server id (see [`HandleTable::export`]).
    pub fn write_exported<P>(&self, w: &mut wormhole_wire::Writer, kind: K, ptrs: &[*mut P]) {
        w.u32(ptrs.len() as u32);
        for p in ptrs {
            w.u64(self.export(kind, *p as usize));
        }
    }

    /// The live objects of `kind`.
    pub fn objects_of(&self, kind: K) -> Vec<usize> {
        self.lock()
            .by_id
            .values()
            .filter_map(|e| e.of(kind))
            .collect()
    }

    /// Live objects per kind.
    pub fn counts(&self) -> HashMap<K, usize> {
        let mut counts = HashMap::new();
        for e in self.lock().by_id.values() {
            *counts.entry(e.kind).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_typed_fresh_and_bounded() {
        let t = HandleTable::<u8>::default();
        assert_eq!(t.bind_new(5, 1, 0x1000, None), Ok(()));
        assert_eq!(t.get(5, 1), Some(0x1000));
        assert_eq!(t.get(5, 2), None);
        assert_eq!(t.get(6, 1), None);
        assert_eq!(t.bind_new(5, 1, 0x2000, None), Err(NewIdError::Invalid));
        assert_eq!(t.bind_new(0, 1, 0x2000, None), Err(NewIdError::Invalid));
        assert_eq!(
            t.bind_new(SERVER_ID_BIT | 1, 1, 0x2000, None),
            Err(NewIdError::Invalid)
        );
        assert_eq!(t.bind_new(7, 1, 0x2000, Some(1)), Err(NewIdError::TooMany));
        assert_eq!(t.export(1, 0x1000), 5);
        let dev = t.export(3, 0x3000);
        assert_ne!(dev & SERVER_ID_BIT, 0);
        assert_eq!(t.export(3, 0x3000), dev);
        assert_eq!(t.forget(5), Some((1, 0x1000)));
        assert_eq!(t.get(5, 1), None);
        assert_eq!(t.counts().get(&3), Some(&1));
    }

    #[test]
    fn the_applications_references_follow_its_retains_and_releases() {
        let t = HandleTable::<u8>::default();
        t.bind_new(5, 1, 0x1000, None).unwrap();
        assert_eq!(t.refs(5), Some(1), "created with one");
        t.retained(5);
        t.retained(5);
        assert!(!t.released(5, false));
        assert_eq!(t.refs(5), Some(2));
        t.rebind(5, 1, 0x2000);
        assert_eq!(t.refs(5), Some(2), "the id's references move with it");
        let dev = t.export(3, 0x3000);
        t.retained(dev);
        assert_eq!(
            t.refs(dev),
            None,
            "objects the server exported are not counted"
        );
        t.forget(5);
        assert_eq!(t.refs(5), None);
        t.bind_new(5, 1, 0x1000, None).unwrap();
        assert_eq!(t.refs(5), Some(1), "an id bound anew starts again");
    }

    #[test]
    fn the_last_release_is_the_servers_count_not_the_clients_word() {
        let t = HandleTable::<u8>::default();
        t.bind_new(5, 1, 0x1000, None).unwrap();
        t.retained(5);
        // The release the client counted last arrives first: the other one still counts.
        assert!(!t.released(5, true), "one reference left");
        assert!(t.released(5, false), "and now none");
        // Exported objects are not counted: the client's word decides.
        let dev = t.export(3, 0x3000);
        assert!(!t.released(dev, false));
        assert!(t.released(dev, true));
        assert!(!t.released(99, true), "an unknown id is nobody's last");
    }

    #[test]
    fn a_new_id_is_bound_once_whatever_the_race() {
        // Many lanes offering the same id: exactly one wins.
        let t = std::sync::Arc::new(HandleTable::<u8>::default());
        let wins: usize = (0..8)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || t.bind_new(42, 1, 0x1000 + i, None).is_ok())
            })
            .map(|h| h.join().unwrap() as usize)
            .sum();
        assert_eq!(wins, 1);
    }
}
