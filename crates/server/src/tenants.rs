//! Tenants made while the server runs (`wh tenant add|remove`): their tokens and limits, kept
//! in the server's state directory so that they outlive a restart. Tokens are minted here and
//! handed out once; only their SHA-256 digests are stored, so the state file names no secret.
//!
//! One server owns a state directory at a time (an exclusive lock on `tenants.lock`); a second
//! server started on the same directory serves its configured tenants only and says why.

use crate::admin::TenantAdd;
use crate::config::Tenant;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The state file's name in the state directory.
const FILE: &str = "tenants.json";
/// Bumped when the file's meaning changes; an unknown version is refused, not guessed at.
const VERSION: u32 = 1;

/// A tenant made at run time, as stored: what `wh tenant add` asked for (changed since by
/// `wh tenant set`), and its token's digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredTenant {
    pub spec: TenantAdd,
    /// SHA-256 of the token, hex.
    pub token_sha256: String,
    /// Seconds since the epoch; for the operator's eyes.
    pub created: u64,
}

impl StoredTenant {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The tenant's settings as the rest of the server knows them (identified by token only).
    pub fn settings(&self) -> Tenant {
        let s = &self.spec;
        Tenant {
            name: s.name.clone(),
            uids: Vec::new(),
            token: None,
            mem_quota_mib: s.mem_quota_mib,
            max_sessions: s.max_sessions,
            max_objects: s.max_objects,
            devices: s.devices.clone(),
            cpu_weight: s.cpu_weight,
            max_queued: s.max_queued,
        }
    }

    pub fn digest(&self) -> Option<[u8; 32]> {
        let bytes = hex_decode(&self.token_sha256)?;
        bytes.try_into().ok()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StateFile {
    version: u32,
    tenants: Vec<StoredTenant>,
}

/// The state directory, locked for this server.
pub struct Registry {
    dir: PathBuf,
    _lock: Flock<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot use the state directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the state directory {0} is in use by another server")]
    Busy(PathBuf),
    #[error("{path}: {why}")]
    Corrupt { path: PathBuf, why: String },
}

impl Registry {
    /// Locks `dir` (made 0700 if missing) for this server.
    pub fn open(dir: &Path) -> Result<Registry, RegistryError> {
        let io = |source| RegistryError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        // Whoever may write the directory could plant tenants (digests of their own tokens) or
        // links: it must be the server's own and no one else's to write.
        let meta = std::fs::symlink_metadata(dir).map_err(io)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
            return Err(io(std::io::Error::other(format!(
                "it must be a directory of uid {me} that no one else may write"
            ))));
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join("tenants.lock"))
            .map_err(io)?;
        let lock = Flock::lock(lock, FlockArg::LockExclusiveNonblock)
            .map_err(|_| RegistryError::Busy(dir.to_path_buf()))?;
        Ok(Registry {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The stored tenants (none if there is no file yet).
    pub fn load(&self) -> Result<Vec<StoredTenant>, RegistryError> {
        let path = self.path();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(RegistryError::Dir {
                    dir: self.dir.clone(),
                    source,
                })
            }
        };
        let corrupt = |why: String| RegistryError::Corrupt {
            path: path.clone(),
            why,
        };
        let file: StateFile = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
        if file.version != VERSION {
            return Err(corrupt(format!(
                "version {} (this server reads version {VERSION})",
                file.version
            )));
        }
        for t in &file.tenants {
            if t.digest().is_none() || valid_name(t.name()).is_err() {
                return Err(corrupt(format!("bad entry for tenant {:?}", t.name())));
            }
        }
        Ok(file.tenants)
    }

    /// Replaces the stored tenants: written to a new file and renamed over the old one, so a
    /// crash leaves either the old list or the new one.
    pub fn save(&self, tenants: &[StoredTenant]) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(&StateFile {
            version: VERSION,
            tenants: tenants.to_vec(),
        })
        .map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{FILE}.{}", std::process::id()));
        // A leftover of a crashed save is ours to replace; a new file is made, never one
        // written through (it could be a link).
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.path())?;
        File::open(&self.dir)?.sync_all()
    }
}

/// A new token: 32 random bytes, hex (printable, and safe in environment variables and files).
pub fn mint_token() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(format!("wh1_{}", hex(&bytes)))
}

/// SHA-256 of a token.
pub fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Tenant names become cgroup directory names and command-line arguments: letters, digits,
/// `.`, `_`, `-`, at most 64, not starting with `.` or `-`.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        ))
    }
}

/// The state directory when none is configured: `$XDG_STATE_HOME/wormhole`, or
/// `~/.local/state/wormhole`.
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .map(|d| d.join("wormhole"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(name: &str, token: &str) -> StoredTenant {
        StoredTenant {
            spec: TenantAdd {
                name: name.into(),
                mem_quota_mib: Some(10240),
                max_sessions: Some(2),
                ..TenantAdd::default()
            },
            token_sha256: hex(&digest(token.as_bytes())),
            created: 1,
        }
    }

    #[test]
    fn tenants_survive_a_save_and_the_directory_is_one_servers() {
        let dir = std::env::temp_dir().join(format!("wh-reg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let reg = Registry::open(&dir).unwrap();
        assert!(reg.load().unwrap().is_empty());
        let list = vec![stored("job-1", "a"), stored("job.2", "b")];
        reg.save(&list).unwrap();
        assert_eq!(reg.load().unwrap(), list);
        assert_eq!(list[0].digest(), Some(digest(b"a")));
        // The secret itself is nowhere in the file.
        assert!(!std::fs::read_to_string(reg.path())
            .unwrap()
            .contains("\"a\""));
        assert!(matches!(Registry::open(&dir), Err(RegistryError::Busy(_))));
        drop(reg);
        let reg = Registry::open(&dir).unwrap();
        std::fs::write(reg.path(), b"{\"version\": 99, \"tenants\": []}").unwrap();
        assert!(matches!(reg.load(), Err(RegistryError::Corrupt { .. })));
        drop(reg);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            Registry::open(&dir),
            Err(RegistryError::Dir { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tokens_are_random_and_names_are_checked() {
        let (a, b) = (mint_token().unwrap(), mint_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 64);
        for good in ["job-42", "a", "x.y_z"] {
            assert!(valid_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", ".x", "a/b", "a b", &"x".repeat(65)] {
            assert!(valid_name(bad).is_err(), "{bad}");
        }
        assert_eq!(hex_decode("0aff"), Some(vec![10, 255]));
        assert_eq!(hex_decode("0g"), None);
    }
}
