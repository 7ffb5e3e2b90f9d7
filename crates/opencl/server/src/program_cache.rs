//! The program cache every session of the server shares: the binaries of programs built from
//! source, keyed by what determines them (the source, the build options, and the device and
//! its driver), kept in the server's blob cache (`wormhole-blobcache`). A tenant that builds a
//! program any session built before gets it from the binary in about a millisecond instead of
//! waiting for the compiler (PoCL here: ~0.7 s cold, ~45 ms even from its own kernel cache).
//! `custom/program.rs` decides when an entry may serve a build.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use wormhole_blobcache::BlobCache;
pub use wormhole_blobcache::Key;

/// Builds served from the cache, and builds that compiled (and then filled the cache).
pub static HITS: AtomicU64 = AtomicU64::new(0);
pub static MISSES: AtomicU64 = AtomicU64::new(0);
/// Builds not stored because a build from their binary would describe its kernels otherwise.
pub static UNCACHEABLE: AtomicU64 = AtomicU64::new(0);

static CACHE: OnceLock<ProgramCache> = OnceLock::new();

/// The worker's cache, if the server has one (set once at start; none in tests and fuzzing).
pub fn get() -> Option<&'static ProgramCache> {
    CACHE.get()
}

/// Sets the worker's cache; call once, before serving.
pub fn set(cache: BlobCache) {
    let _ = CACHE.set(ProgramCache(cache));
}

/// The key of a program built from `source` with `options` for a device described by
/// `device_identity` (platform and device names and versions, driver version).
pub fn key(device_identity: &[&[u8]], options: &[u8], source: &[u8]) -> Key {
    let mut inputs: Vec<&[u8]> = device_identity.to_vec();
    inputs.push(options);
    inputs.push(source);
    // The domain names what an entry promises: "/2" entries were checked to describe their
    // kernels as the compiled program does (see custom/program.rs), so older ones never match.
    wormhole_blobcache::key(b"opencl-program/2", &inputs)
}

/// One device's share of a built program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub binary: Vec<u8>,
    pub log: Vec<u8>,
}

#[derive(Debug)]
pub struct ProgramCache(BlobCache);

impl ProgramCache {
    /// The entry stored under `key`, if there is a sound one (a program needs a binary).
    pub fn load(&self, key: &Key) -> Option<Entry> {
        match <[Vec<u8>; 2]>::try_from(self.0.load(key)?) {
            Ok([log, binary]) if !binary.is_empty() => Some(Entry { binary, log }),
            _ => {
                self.0.discard(key);
                None
            }
        }
    }

    pub fn store(&self, key: &Key, entry: &Entry) {
        self.0.store(key, &[&entry.log, &entry.binary]);
    }

    pub fn discard(&self, key: &Key) {
        self.0.discard(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_every_input() {
        let dev: &[&[u8]] = &[b"pocl", b"cpu"];
        let k = key(dev, b"-DN=1", b"kernel");
        assert_eq!(k, key(dev, b"-DN=1", b"kernel"));
        assert_ne!(k, key(dev, b"-DN=2", b"kernel"));
        assert_ne!(k, key(&[b"pocl", b"gpu"], b"-DN=1", b"kernel"));
        // An option moved into the device identity is another key.
        assert_ne!(key(&[b"a"], b"b", b"s"), key(&[b"a", b"b"], b"", b"s"));
    }

    #[test]
    fn entries_roundtrip_through_the_blob_cache() {
        let dir = std::env::temp_dir().join(format!("wh-pc-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = ProgramCache(BlobCache::open(&dir, 1 << 20).unwrap());
        let k = key(&[b"d"], b"", b"src");
        let e = Entry {
            binary: vec![1, 2, 3],
            log: b"ok".to_vec(),
        };
        assert_eq!(c.load(&k), None);
        c.store(&k, &e);
        assert_eq!(c.load(&k), Some(e));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
