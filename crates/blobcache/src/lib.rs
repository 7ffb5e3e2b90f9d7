//! A content-addressed store of build products that every session of a server shares: the
//! OpenCL backend keeps programs' binaries here (keyed by source, options, device and driver),
//! and a CUDA backend keeps module images by content hash. Callers decide what a key covers
//! and when an entry may serve; this crate only keeps entries, safely.
//!
//! Only the server writes entries, into a directory of its own (owner-only; refused
//! otherwise): tenants send sources, never products that another tenant would then run. Every
//! entry is checked on reading (magic, its own key, lengths, a digest of its body); a bad one is
//! removed and the caller rebuilds as if nothing was stored. The directory is bounded: past
//! `max_bytes` the least recently used entries go.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"WHBLOB01";
/// magic, key, SHA-256 of the body, number of parts; then each part's length; then the parts.
const HEADER: usize = 8 + 32 + 32 + 8;
/// Most parts one entry may have (a bound for the reader of a damaged file).
const MAX_PARTS: usize = 64;
/// What a cache may hold on disk by default.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// What determines an entry: a SHA-256 over everything that went into the product.
pub type Key = [u8; 32];

/// The digest of an entry's body: every part, length-prefixed (so damage to the lengths in
/// the header is caught too).
fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(&(p.len() as u64).to_le_bytes());
        ctx.update(p);
    }
    let mut d = [0u8; 32];
    d.copy_from_slice(ctx.finish().as_ref());
    d
}

/// The key of a product of `kind` (e.g. `b"opencl-program"`) made from `inputs`. Every input
/// is length-prefixed, so no two different input lists hash the same bytes, and kinds never
/// share keys.
pub fn key(kind: &[u8], inputs: &[&[u8]]) -> Key {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut part = |b: &[u8]| {
        ctx.update(&(b.len() as u64).to_le_bytes());
        ctx.update(b);
    };
    part(MAGIC);
    part(kind);
    for i in inputs {
        part(i);
    }
    let mut k = [0u8; 32];
    k.copy_from_slice(ctx.finish().as_ref());
    k
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create or open {0}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("{0} is not the server's own (owner uid {1}, the server runs as {2})")]
    NotOwned(PathBuf, u32, u32),
    #[error("{0} may be written by others (mode {1:o}): anyone could plant entries there")]
    Writable(PathBuf, u32),
}

#[derive(Debug)]
pub struct BlobCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl BlobCache {
    /// Opens (creating it, owner-only) the cache directory, refusing one that another user
    /// owns or that others may write.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<BlobCache, CacheError> {
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
        let mode = meta.mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(CacheError::Writable(dir.into(), mode));
        }
        Ok(BlobCache {
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

    /// The parts stored under `key`, if there is a sound entry. A damaged entry is removed.
    pub fn load(&self, key: &Key) -> Option<Vec<Vec<u8>>> {
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
                tracing::warn!(path = %path.display(), "blob cache: damaged entry removed");
                self.discard(key);
                None
            }
        }
    }

    /// Stores `parts` under `key` (atomically: readers see the whole entry or none), then
    /// trims the cache to its size. Failures only cost future hits: logged, not returned.
    pub fn store(&self, key: &Key, parts: &[&[u8]]) {
        let path = self.path(key);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(MAGIC)?;
            f.write_all(key)?;
            f.write_all(&digest(parts))?;
            f.write_all(&(parts.len() as u64).to_le_bytes())?;
            for p in parts {
                f.write_all(&(p.len() as u64).to_le_bytes())?;
            }
            for p in parts {
                f.write_all(p)?;
            }
            Ok(())
        });
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
            tracing::warn!(path = %path.display(), "blob cache: cannot store an entry: {e}");
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

/// An entry's parts, checked against the key it is read for.
fn decode(key: &Key, bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let header = bytes.get(..HEADER)?;
    if &header[..8] != MAGIC || &header[8..40] != key {
        return None;
    }
    let n = usize::try_from(u64::from_le_bytes(header[72..80].try_into().ok()?)).ok()?;
    if n > MAX_PARTS {
        return None;
    }
    let lens_end = HEADER.checked_add(n.checked_mul(8)?)?;
    let lens = bytes.get(HEADER..lens_end)?;
    let mut body = &bytes[lens_end..];
    let mut parts = Vec::with_capacity(n);
    for l in lens.chunks_exact(8) {
        let len = usize::try_from(u64::from_le_bytes(l.try_into().ok()?)).ok()?;
        if len > body.len() {
            return None;
        }
        let (part, rest) = body.split_at(len);
        parts.push(part);
        body = rest;
    }
    if !body.is_empty() || digest(&parts) != header[40..72] {
        return None;
    }
    Some(parts.into_iter().map(<[u8]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(n: usize) -> Vec<Vec<u8>> {
        vec![b"warning: unused variable".to_vec(), vec![7; n]]
    }

    fn store(c: &BlobCache, k: &Key, e: &[Vec<u8>]) {
        let parts: Vec<&[u8]> = e.iter().map(Vec::as_slice).collect();
        c.store(k, &parts);
    }

    #[test]
    fn keys_separate_every_input() {
        let k = key(b"prog", &[b"pocl", b"-DN=1", b"kernel"]);
        assert_eq!(k, key(b"prog", &[b"pocl", b"-DN=1", b"kernel"]));
        assert_ne!(k, key(b"prog", &[b"pocl", b"-DN=2", b"kernel"]));
        assert_ne!(k, key(b"image", &[b"pocl", b"-DN=1", b"kernel"]));
        // Moving bytes between inputs changes the key (length prefixes).
        assert_ne!(key(b"p", &[b"ab", b"c"]), key(b"p", &[b"a", b"bc"]));
    }

    #[test]
    fn stores_loads_and_rejects_damage() {
        let dir = std::env::temp_dir().join(format!("wh-blob-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = BlobCache::open(&dir, DEFAULT_MAX_BYTES).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let k = key(b"p", &[b"src"]);
        assert_eq!(c.load(&k), None);
        store(&c, &k, &entry(100));
        assert_eq!(c.load(&k), Some(entry(100)));
        // An entry read under another key (a renamed file) is not trusted.
        let other = key(b"p", &[b"other"]);
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
        let dir = std::env::temp_dir().join(format!("wh-blob-open-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            BlobCache::open(&dir, DEFAULT_MAX_BYTES),
            Err(CacheError::Writable(..))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn trims_least_recently_used_first() {
        let dir = std::env::temp_dir().join(format!("wh-blob-trim-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = BlobCache::open(&dir, 2500).unwrap();
        let keys: Vec<Key> = (0..3u8).map(|i| key(b"p", &[&[i]])).collect();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, k) in keys.iter().enumerate() {
            store(&c, k, &entry(1000));
            let f = fs::File::options().write(true).open(c.path(k)).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i as u64))
                .unwrap();
        }
        // Storing the third went over 2500 bytes (3 x ~1130): the oldest went. Using the
        // second makes it the newest, so the next store evicts the third.
        assert!(c.load(&keys[0]).is_none());
        assert!(c.load(&keys[1]).is_some());
        store(&c, &key(b"p", &[b"x"]), &entry(1000));
        assert!(c.load(&keys[1]).is_some());
        assert!(c.load(&keys[2]).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
