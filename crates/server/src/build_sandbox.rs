//! Builds read files as the tenant would, never as the server. A driver's compiler reads what
//! a program names (`#include "/any/path"`) with the worker's rights, and its build log quotes
//! what it read: through a server running as root, a tenant of another user, a container or
//! a remote host could read every file of the host (the server's TLS key, tenant tokens,
//! `/etc/shadow`). So a build runs on a thread of its own that Landlock lets read only the
//! files of the system and of the driver (`read_paths`), unless the tenant could read
//! everything the worker reads anyway: a process of the server's own user (or root) in the
//! server's own mount and user namespaces. Where the kernel has no Landlock such builds are
//! refused with the reason, never run open; `build_sandbox = false` in the server's config
//! turns the sandbox off.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The credentials of a local session's client, from its socket (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// The client process at the other end of a Unix socket.
pub fn peer_of(sock: BorrowedFd<'_>) -> Option<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are locals of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// How this session's builds run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// On the caller's thread, reading what the worker may.
    Open,
    /// On a thread that may read only the system's and the driver's files.
    Sandboxed,
}

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Decides the session's policy from the server's setting and who the client is (`None`: a
/// remote host or a VM guest). Call once, before serving.
pub fn configure(enabled: bool, peer: Option<PeerCred>) -> Policy {
    let policy = if !enabled {
        tracing::info!("build sandbox off (build_sandbox = false): builds read as the server");
        Policy::Open
    } else if peer.is_some_and(reads_as_the_worker) {
        Policy::Open
    } else {
        tracing::debug!(
            ?peer,
            "builds of this session read only the system's and the driver's files"
        );
        Policy::Sandboxed
    };
    let _ = POLICY.set(policy);
    policy
}

/// The session's policy (Open where none was set: tests, fuzzing).
pub fn policy() -> Policy {
    POLICY.get().copied().unwrap_or(Policy::Open)
}

/// Whether a local client could read whatever the worker reads: it is root or the worker's
/// user, and sees the worker's files as they are (same mount namespace) with the same meaning
/// of its user (same user namespace). A container's root is not the host's root.
fn reads_as_the_worker(peer: PeerCred) -> bool {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if peer.uid != 0 && peer.uid != me {
        return false;
    }
    ["mnt", "user"].iter().all(|ns| {
        let theirs = std::fs::read_link(format!("/proc/{}/ns/{ns}", peer.pid));
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}"));
        // Unreadable (another user's process, a client already gone): not the same.
        matches!((theirs, mine), (Ok(a), Ok(b)) if a == b)
    })
}

/// A build the sandbox could not run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// Runs `build` (a driver call that may read files a program names) under the session's
/// policy; the calling thread waits for it.
pub fn run<T>(build: impl FnOnce() -> T) -> Result<T, Refused> {
    run_reading(&[], build)
}

/// As `run`, the sandbox letting the build read `extra` too (the worker's copies of the
/// tenant's own headers).
pub fn run_reading<T>(extra: &[PathBuf], build: impl FnOnce() -> T) -> Result<T, Refused> {
    if policy() == Policy::Open {
        return Ok(build());
    }
    /// Moves the build and its result across the thread boundary.
    struct Across<X>(X);
    // SAFETY: the build runs on a scoped thread while its caller waits, so whatever it
    // borrows outlives it, and nothing else touches it meanwhile; the driver objects it uses
    // may be used from any thread (an accelerator API's calls are thread-safe).
    unsafe impl<X> Send for Across<X> {}
    let build = Across(build);
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("build".into())
            .spawn_scoped(scope, move || {
                let build = build;
                restrict_reads(extra).map(|()| Across((build.0)()))
            });
        match worker {
            Ok(handle) => match handle.join() {
                Ok(result) => result.map(|r| r.0),
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Err(e) => Err(Refused(format!("no thread for the build: {e}"))),
        }
    })
    .inspect_err(|Refused(why)| tracing::error!("build refused: {why}"))
}

/// Confines the calling thread (and what it starts) to reading `read_paths()` and `extra`.
fn restrict_reads(extra: &[PathBuf]) -> Result<(), Refused> {
    use landlock::{
        path_beneath_rules, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };
    let refused = |e: &dyn std::fmt::Display| Refused(format!("Landlock: {e}"));
    let status = Ruleset::default()
        .handle_access(AccessFs::ReadFile)
        .map_err(|e| refused(&e))?
        .create()
        .map_err(|e| refused(&e))?
        .add_rules(path_beneath_rules(
            read_paths().iter().chain(extra),
            AccessFs::ReadFile,
        ))
        .map_err(|e| refused(&e))?
        .restrict_self()
        .map_err(|e| refused(&e))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(Refused(
            "this kernel has no Landlock, so a build of a tenant that is not the server's \
             user could read any file the server can (build_sandbox = false allows it)"
                .into(),
        ));
    }
    Ok(())
}

/// What a build may read: the system's software, the driver's files and caches, and what
/// the compiler asks of the kernel about the machine. Not `/etc` at large, `/home`, `/root`,
/// `/var`, `/tmp`, `/run`, `/dev/shm`, the server's state, other processes' `/proc`.
pub fn read_paths() -> &'static [PathBuf] {
    static PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let mut paths: Vec<PathBuf> = [
            "/usr",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/bin",
            "/sbin",
            "/opt",
            "/etc/ld.so.cache",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d",
            "/etc/OpenCL",
            "/etc/nvidia",
            "/etc/alternatives",
            "/proc/cpuinfo",
            "/proc/meminfo",
            "/proc/stat",
            "/proc/filesystems",
            "/proc/driver/nvidia",
            "/sys",
            "/dev/null",
            "/dev/zero",
            "/dev/random",
            "/dev/urandom",
            "/dev/dri",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        // The worker's own process: its maps, status and threads (what runtimes look up).
        for own in [
            "maps",
            "status",
            "stat",
            "statm",
            "auxv",
            "cgroup",
            "mountinfo",
            "task",
        ] {
            paths.push(PathBuf::from(format!("/proc/{}/{own}", std::process::id())));
        }
        // The GPU's device files.
        if let Ok(dev) = std::fs::read_dir("/dev") {
            paths.extend(dev.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("nvidia"))
            }));
        }
        paths.extend(driver_caches());
        paths.extend(library_dirs());
        paths.sort();
        paths.dedup();
        paths
    })
}

/// Where drivers keep what they compiled: PoCL's kernel cache, NVIDIA's compute cache.
fn driver_caches() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = env("HOME");
    let xdg_cache = env("XDG_CACHE_HOME").or_else(|| home.as_ref().map(|h| h.join(".cache")));
    [
        env("POCL_CACHE_DIR"),
        xdg_cache.map(|c| c.join("pocl")),
        env("CUDA_CACHE_PATH"),
        home.map(|h| h.join(".nv")),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The directories of the shared libraries the worker has loaded (a driver installed outside
/// the system's directories reads its own files from beside it).
fn library_dirs() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/') && p.contains(".so"))
        .filter_map(|p| Path::new(p).parent().map(Path::to_path_buf))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandboxed_build_reads_the_system_but_not_the_servers_files() {
        let _ = POLICY.set(Policy::Sandboxed);
        let secret = std::env::temp_dir().join(format!("wh-sandbox-{}", std::process::id()));
        std::fs::write(&secret, "not for tenants").unwrap();
        let read = |p: PathBuf| run(move || std::fs::read(&p).map(|_| ()));
        match read(secret.clone()) {
            // A kernel without Landlock: refused, never run open.
            Err(Refused(why)) => assert!(why.contains("Landlock"), "{why}"),
            Ok(r) => {
                assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
                // The system's and the driver's files stay readable, and the caller's thread
                // is not confined.
                let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
                let library = maps
                    .lines()
                    .filter_map(|l| l.split_whitespace().nth(5))
                    .find(|p| p.contains(".so"))
                    .unwrap();
                assert!(read(PathBuf::from(library)).unwrap().is_ok());
                assert!(read(PathBuf::from("/proc/cpuinfo")).unwrap().is_ok());
                assert!(std::fs::read(&secret).is_ok());
            }
        }
        std::fs::remove_file(&secret).unwrap();
    }

    #[test]
    fn the_servers_own_user_in_its_namespaces_reads_as_the_worker() {
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let me = PeerCred {
            pid: std::process::id() as i32,
            uid,
            gid,
        };
        assert!(reads_as_the_worker(me));
        // Another user (unless this is root, whom uid 0 peers equal anyway).
        assert!(!reads_as_the_worker(PeerCred { uid: uid + 1, ..me }) || uid + 1 == 0);
        // A process that is gone (no namespaces to compare).
        assert!(!reads_as_the_worker(PeerCred {
            pid: i32::MAX,
            ..me
        }));
    }
}
