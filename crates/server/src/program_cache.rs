//! The program cache every session of the server shares: the binaries of programs built from
//! source, keyed by what determines them (the source, the build options, and the device and
//! its driver). A tenant that builds a program any session built before gets it from the
//! binary in about a millisecond instead of waiting for the compiler (PoCL here: ~0.7 s cold,
//! ~45 ms even from its own kernel cache). `custom/program.rs` decides when an entry may serve
//! a build; this module only keeps entries.
//!
//! Only the server writes entries, into a directory of its own (owner-only; refused otherwise):
//! tenants send source, never a binary that another tenant would then run. Every entry is
//! checked on reading (magic, its own key, lengths, a digest of its body); a bad one is
//! removed and the program is compiled as if nothing was cached. The directory is bounded: past `max_bytes` the least
//! recently used entries go.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

const MAGIC: &[u8; 8] = b"WHPROG01";
/// magic, key, SHA-256 of the body, log length, binary length; then the log and the binary.
const HEADER: usize = 8 + 32 + 32 + 8 + 8;
/// What the cache may hold on disk by default.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Builds served from the cache, and builds that compiled (and then filled the cache).
pub static HITS: AtomicU64 = AtomicU64::new(0);
pub static MISSES: AtomicU64 = AtomicU64::new(0);

static CACHE: OnceLock<ProgramCache> = OnceLock::new();

/// The worker's cache, if the server has one (set once at start; none in tests and fuzzing).
pub fn get() -> Option<&'static ProgramCache> {
    CACHE.get()
}

/// Sets the worker's cache; call once, before serving.
pub fn set(cache: ProgramCache) {
    let _ = CACHE.set(cache);
}

/// What determines a built program's binary on one device.
pub type Key = [u8; 32];

/// The key of a program built from `source` with `options` for a device described by
/// `device_identity` (platform and device names and versions, driver version).
fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    let mut d = [0u8; 32];
    d.copy_from_slice(ctx.finish().as_ref());
    d
}

pub fn key(device_identity: &[&[u8]], options: &[u8], source: &[u8]) -> Key {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // Every part is length-prefixed, so no two different inputs hash the same bytes.
    let mut part = |b: &[u8]| {
        ctx.update(&(b.len() as u64).to_le_bytes());
        ctx.update(b);
    };
    part(MAGIC);
    for d in device_identity {
        part(d);
    }
    part(options);
    part(source);
    let mut k = [0u8; 32];
    k.copy_from_slice(ctx.finish().as_ref());
    k
}

/// One device's share of a built program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub binary: Vec<u8>,
    pub log: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create or open {0}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("{0} is not the server's own (owner uid {1}, the server runs as {2})")]
    NotOwned(PathBuf, u32, u32),
    #[error("{0} may be written by others (mode {1:o}): anyone could plant binaries there")]
    Writable(PathBuf, u32),
}

#[derive(Debug)]
pub struct ProgramCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl ProgramCache {
    /// Opens (creating it, owner-only) the cache directory, refusing one that another user
    /// owns or that others may write.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<ProgramCache, CacheError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| CacheError::Io(dir.into(), e))?;
        let meta = fs::metadata(dir).map_err(|e| CacheError::Io(dir.into(), e))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(CacheError::NotOwned(dir.into(), meta.uid(), me));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(CacheError::Writable(dir.into(), mode));
        }
        Ok(ProgramCache {
            dir: dir.into(),
            max_bytes,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &Key) -> PathBuf {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.bin"))
    }

    /// The entry stored under `key`, if there is a sound one. A damaged entry is removed.
    pub fn load(&self, key: &Key) -> Option<Entry> {
        let path = self.path(key);
        let bytes = fs::read(&path).ok()?;
        match decode(key, &bytes) {
            Some(e) => {
                // Mark it used, for eviction (least recently used goes first).
                if let Ok(f) = fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(std::time::SystemTime::now());
                }
                Some(e)
            }
            None => {
                tracing::warn!(path = %path.display(), "program cache: damaged entry removed");
                self.discard(key);
                None
            }
        }
    }

    /// Stores `entry` under `key` (atomically: readers see the whole entry or none), then
    /// trims the cache to its size. Failures only cost future hits: logged, not returned.
    pub fn store(&self, key: &Key, entry: &Entry) {
        let path = self.path(key);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(MAGIC)?;
            f.write_all(key)?;
            f.write_all(&digest(&[&entry.log, &entry.binary]))?;
            f.write_all(&(entry.log.len() as u64).to_le_bytes())?;
            f.write_all(&(entry.binary.len() as u64).to_le_bytes())?;
            f.write_all(&entry.log)?;
            f.write_all(&entry.binary)
        });
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
            tracing::warn!(path = %path.display(), "program cache: cannot store an entry: {e}");
            let _ = fs::remove_file(&tmp);
            return;
        }
        self.trim();
    }

    pub fn discard(&self, key: &Key) {
        let _ = fs::remove_file(self.path(key));
    }

    /// Removes the least recently used entries until the cache fits `max_bytes`.
    fn trim(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// An entry's bytes, checked against the key it is read for.
fn decode(key: &Key, bytes: &[u8]) -> Option<Entry> {
    let header = bytes.get(..HEADER)?;
    if &header[..8] != MAGIC || &header[8..40] != key {
        return None;
    }
    let log_len = usize::try_from(u64::from_le_bytes(header[72..80].try_into().ok()?)).ok()?;
    let bin_len = usize::try_from(u64::from_le_bytes(header[80..88].try_into().ok()?)).ok()?;
    let body = &bytes[HEADER..];
    if log_len.checked_add(bin_len)? != body.len() || bin_len == 0 {
        return None;
    }
    let (log, binary) = body.split_at(log_len);
    if digest(&[log, binary]) != header[40..72] {
        return None;
    }
    Some(Entry {
        log: log.to_vec(),
        binary: binary.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize) -> Entry {
        Entry {
            binary: vec![7; n],
            log: b"warning: unused variable".to_vec(),
        }
    }

    #[test]
    fn keys_separate_every_input() {
        let dev: &[&[u8]] = &[b"pocl", b"cpu"];
        let k = key(dev, b"-DN=1", b"kernel");
        assert_eq!(k, key(dev, b"-DN=1", b"kernel"));
        assert_ne!(k, key(dev, b"-DN=2", b"kernel"));
        assert_ne!(k, key(dev, b"-DN=1", b"kernel "));
        assert_ne!(k, key(&[b"pocl", b"gpu"], b"-DN=1", b"kernel"));
        // Moving bytes between parts changes the key (length prefixes).
        assert_ne!(key(dev, b"ab", b"c"), key(dev, b"a", b"bc"));
    }

    #[test]
    fn stores_loads_and_rejects_damage() {
        let dir = std::env::temp_dir().join(format!("wh-pc-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = ProgramCache::open(&dir, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let k = key(&[b"d"], b"", b"src");
        assert_eq!(c.load(&k), None);
        c.store(&k, &entry(100));
        assert_eq!(c.load(&k), Some(entry(100)));
        // An entry read under another key (a renamed file) is not trusted.
        let other = key(&[b"d"], b"", b"other");
        fs::copy(c.path(&k), c.path(&other)).unwrap();
        assert_eq!(c.load(&other), None);
        assert!(!c.path(&other).exists(), "damaged entry is removed");
        // A truncated entry, or one with a changed byte, is removed, not used.
        let bytes = fs::read(c.path(&k)).unwrap();
        fs::write(c.path(&k), &bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(c.load(&k), None);
        assert!(!c.path(&k).exists());
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(c.path(&k), &flipped).unwrap();
        assert_eq!(c.load(&k), None);
        fs::write(c.path(&k), &bytes).unwrap();
        assert_eq!(c.load(&k), Some(entry(100)));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_may_write() {
        let dir = std::env::temp_dir().join(format!("wh-pc-open-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            ProgramCache::open(&dir, DEFAULT_MAX_BYTES),
            Err(CacheError::Writable(..))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn trims_least_recently_used_first() {
        let dir = std::env::temp_dir().join(format!("wh-pc-trim-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = ProgramCache::open(&dir, 2500).unwrap();
        let keys: Vec<Key> = (0..3u8).map(|i| key(&[&[i]], b"", b"s")).collect();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, k) in keys.iter().enumerate() {
            c.store(k, &entry(1000));
            let f = fs::File::options().write(true).open(c.path(k)).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i as u64))
                .unwrap();
        }
        // Storing the third went over 2500 bytes (3 x 1112): the oldest went. Using the second makes it
        // the newest, so the next store evicts the third.
        assert!(c.load(&keys[0]).is_none());
        assert!(c.load(&keys[1]).is_some());
        c.store(&key(&[b"x"], b"", b"s"), &entry(1000));
        assert!(c.load(&keys[1]).is_some());
        assert!(c.load(&keys[2]).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
