//! Server configuration: command-line flags or a TOML file.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Unix socket for local sessions.
    pub socket: PathBuf,
    /// Optional TCP address for remote sessions (e.g. "127.0.0.1:7700").
    pub tcp: Option<String>,
    /// Certificate chain (PEM) for TCP sessions; with `tls_key`, TCP sessions use TLS and plain
    /// TCP clients are refused.
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Optional address of a Prometheus metrics endpoint (e.g. "127.0.0.1:9464").
    pub metrics: Option<String>,
    /// Most sessions served at once; further clients are refused with a reason.
    pub max_sessions: usize,
    /// Lanes per session (application threads that can wait independently).
    pub lanes: u32,
    /// Size of each ring of a lane, KiB (a power of two).
    pub ring_kib: u64,
    /// Prefix of forwarded device names.
    pub name_prefix: String,
    /// Who may open sessions, and within which limits. Without any, every local user is the
    /// tenant "default" without limits.
    #[serde(rename = "tenant")]
    pub tenants: Vec<Tenant>,
    /// VM guests served through an ivshmem region each (a file the server creates and QEMU
    /// maps as the BAR of an `ivshmem-plain` device).
    #[serde(rename = "guest")]
    pub guests: Vec<Guest>,
    /// Where built programs are kept for every session (`program_cache`): a directory, or
    /// `false` to compile every program. Default: `$XDG_CACHE_HOME/wormhole/programs`
    /// (`~/.cache/wormhole/programs`).
    pub program_cache: ProgramCacheSetting,
    /// The most the program cache holds on disk, MiB (least recently used entries go first).
    pub program_cache_mib: u64,
    /// Where each tenant's workers get a cgroup of their own (its `cpu_weight`): `true` finds
    /// the CPU controller (cgroup v2 or v1) and makes `wormhole/tenant-<name>` under the
    /// server's own cgroup; a directory makes the tenants' groups in that group instead;
    /// `false` leaves workers where the server is. Unset: as `true` if some tenant sets a
    /// `cpu_weight`, else off (under cgroup v1 a group of all of Wormhole's workers weighs as
    /// one process against the rest of the host: a change nobody should get unasked).
    #[serde(default)]
    pub cgroup: Option<CgroupSetting>,
    /// Where tenants made at run time (`wh tenant add`) are kept across restarts; one server
    /// per directory. Default: `$XDG_STATE_HOME/wormhole` (`~/.local/state/wormhole`).
    pub state_dir: Option<PathBuf>,
    /// Whether workers, while the CPUs are oversubscribed, ask the kernel for short CPU time
    /// slices for their lanes and for the driver threads that run briefly, and keep those on
    /// their local client's CPU, so that their hand-offs neither wait for a scheduler tick
    /// nor cross CPUs busy with others' work (see `slices`). Default: true.
    pub short_slices: bool,
    /// Whether builds of tenants that could not read the server's files themselves (other
    /// users, containers, remote hosts, VM guests) may read only the system's and the
    /// driver's files (see `build_sandbox`). Default: true.
    pub build_sandbox: bool,
    /// Whether a tenant's standby worker readies the tenant's first device before a session
    /// comes, where its API has a costly step beyond loading the driver (CUDA: the device's
    /// primary context, which holds some of its memory while it waits). Default: true.
    pub warm_device: bool,
    /// Serve tenant administration (`wh tenant ...`) on this socket only (mode 0600: root and
    /// the server's user); the session socket then refuses it. For servers whose session
    /// socket is handed to containers, where uid 0 is a tenant's root, not the operator.
    pub admin_socket: Option<PathBuf>,
    /// Sessions are identified by their token only: a local peer's uid makes it no tenant
    /// (not even "default"). For a session socket handed to containers, where uids are the
    /// containers' and tenants are minted per workload (`wh tenant add`).
    pub tokens_only: bool,
}

/// `cgroup = true | false | "/sys/fs/cgroup/..."`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CgroupSetting {
    On(bool),
    Dir(PathBuf),
}

/// `program_cache = true | false | "/dir"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ProgramCacheSetting {
    On(bool),
    Dir(PathBuf),
}

/// A VM guest: its region and the tenant its sessions belong to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guest {
    /// The backing file of the guest's ivshmem device (e.g. /dev/shm/wormhole-vm1). Only this
    /// guest may map it: it is the guest's credential.
    pub region: PathBuf,
    /// Its size, MiB: a power of two (the BAR size QEMU is given).
    #[serde(default = "Guest::default_size_mib")]
    pub size_mib: u64,
    /// The tenant the guest's sessions count against (required when tenants are configured).
    #[serde(default)]
    pub tenant: Option<String>,
    /// The API the guest's sessions speak (default: the server's first, OpenCL).
    #[serde(default)]
    pub api: Option<String>,
}

impl Guest {
    pub fn default_size_mib() -> u64 {
        16
    }

    /// Lanes of a guest region: 7 for calls (application threads) and one for callbacks.
    pub const LANES: u32 = 8;

    pub fn layout(&self) -> Option<wormhole_transport::Layout> {
        wormhole_transport::Layout::fitting(self.size_mib << 20, Self::LANES)
    }
}

/// A tenant: the users (local) or token (TCP) that identify it and the limits of its sessions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    pub name: String,
    /// Local users (peer credentials of the Unix socket) that are this tenant.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Shared secret a TCP client presents (`WORMHOLE_TOKEN`) to be this tenant.
    #[serde(default)]
    pub token: Option<String>,
    /// Device memory all sessions of the tenant may hold together, MiB.
    #[serde(default)]
    pub mem_quota_mib: Option<u64>,
    /// Sessions the tenant may have open at once.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// Objects one session may hold at once.
    #[serde(default)]
    pub max_objects: Option<usize>,
    /// The devices the tenant may use: substrings of device names (empty: all).
    #[serde(default)]
    pub devices: Vec<String>,
    /// The tenant's share of the CPU against other tenants (its workers' cgroup; cgroup v2
    /// `cpu.weight` semantics: 1 to 10000, 100 is an ordinary share). Unset: 100.
    #[serde(default)]
    pub cpu_weight: Option<u32>,
    /// The most device commands one session may have enqueued and not finished, per command
    /// queue (further enqueues wait, which slows only this session's own lane).
    #[serde(default)]
    pub max_queued: Option<u64>,
}

impl Tenant {
    /// The tenant of a configuration that names none: everyone, no limits.
    pub fn open() -> Tenant {
        Tenant {
            name: "default".into(),
            uids: Vec::new(),
            token: None,
            mem_quota_mib: None,
            max_sessions: None,
            max_objects: None,
            devices: Vec::new(),
            cpu_weight: None,
            max_queued: None,
        }
    }

    /// The CPU weight in force (100 unless set).
    pub fn weight(&self) -> u32 {
        self.cpu_weight.unwrap_or(100)
    }

    /// The range of `cpu_weight` (that of cgroup v2's `cpu.weight`).
    pub const CPU_WEIGHTS: std::ops::RangeInclusive<u32> = 1..=10000;
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: wormhole_wire::default_socket_path(),
            tcp: None,
            metrics: None,
            tls_cert: None,
            tls_key: None,
            max_sessions: 64,
            lanes: 16,
            ring_kib: 256,
            name_prefix: "Wormhole \u{2192} ".into(),
            tenants: Vec::new(),
            guests: Vec::new(),
            program_cache: ProgramCacheSetting::On(true),
            program_cache_mib: wormhole_blobcache::DEFAULT_MAX_BYTES >> 20,
            cgroup: None,
            state_dir: None,
            short_slices: true,
            build_sandbox: true,
            warm_device: true,
            admin_socket: None,
            tokens_only: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl Config {
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let c: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.ring_kib * 1024).is_power_of_two() || self.ring_kib < 4 || self.ring_kib > 1 << 20
        {
            return Err(ConfigError::Invalid(format!(
                "ring_kib = {} must be a power of two between 4 and 1048576",
                self.ring_kib
            )));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "tls_cert and tls_key go together".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for t in &self.tenants {
            crate::tenants::valid_name(&t.name).map_err(ConfigError::Invalid)?;
            if !names.insert(&t.name) {
                return Err(ConfigError::Invalid(format!(
                    "tenant {} is defined twice",
                    t.name
                )));
            }
            let has_guest = self
                .guests
                .iter()
                .any(|g| g.tenant.as_deref() == Some(t.name.as_str()));
            if t.uids.is_empty() && t.token.is_none() && !has_guest {
                return Err(ConfigError::Invalid(format!(
                    "tenant {} has neither uids nor a token",
                    t.name
                )));
            }
            if !Tenant::CPU_WEIGHTS.contains(&t.weight()) {
                return Err(ConfigError::Invalid(format!(
                    "tenant {}: cpu_weight = {} must be 1..=10000",
                    t.name,
                    t.weight()
                )));
            }
            if t.max_queued == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "tenant {}: max_queued must be at least 1 (leave it out for no limit)",
                    t.name
                )));
            }
        }
        let mut regions = std::collections::HashSet::new();
        for g in &self.guests {
            if !regions.insert(&g.region) {
                return Err(ConfigError::Invalid(format!(
                    "guest region {} is listed twice (a region is never shared)",
                    g.region.display()
                )));
            }
            if !g.size_mib.is_power_of_two() || g.layout().is_none() || g.size_mib > 1 << 14 {
                return Err(ConfigError::Invalid(format!(
                    "guest region {}: size_mib = {} must be a power of two from 1 to 16384",
                    g.region.display(),
                    g.size_mib
                )));
            }
            match &g.tenant {
                Some(name) if !self.tenants.iter().any(|t| &t.name == name) => {
                    return Err(ConfigError::Invalid(format!(
                        "guest region {}: no tenant named {name}",
                        g.region.display()
                    )))
                }
                None if !self.tenants.is_empty() => {
                    return Err(ConfigError::Invalid(format!(
                        "guest region {} needs a tenant (tenants are configured)",
                        g.region.display()
                    )))
                }
                _ => {}
            }
        }
        if self.program_cache_mib == 0 {
            return Err(ConfigError::Invalid(
                "program_cache_mib must be at least 1 (program_cache = false turns the cache off)"
                    .into(),
            ));
        }
        if let Some(CgroupSetting::Dir(d)) = &self.cgroup {
            if !d.is_absolute() {
                return Err(ConfigError::Invalid(format!(
                    "cgroup = {:?} must be an absolute path (or true, or false)",
                    d.display()
                )));
            }
        }
        if self.lanes == 0 || self.lanes > 256 {
            return Err(ConfigError::Invalid(format!(
                "lanes = {} must be 1..=256",
                self.lanes
            )));
        }
        Ok(())
    }

    /// The program cache's directory, if the cache is on (and a default can be found).
    pub fn program_cache_dir(&self) -> Option<PathBuf> {
        match &self.program_cache {
            ProgramCacheSetting::On(false) => None,
            ProgramCacheSetting::Dir(d) => Some(d.clone()),
            ProgramCacheSetting::On(true) => std::env::var_os("XDG_CACHE_HOME")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("wormhole").join("programs")),
        }
    }

    /// Where tenants made at run time are kept, if a directory is set or can be found.
    pub fn state_dir(&self) -> Option<PathBuf> {
        self.state_dir.clone().or_else(crate::tenants::default_dir)
    }

    pub fn layout(&self) -> wormhole_transport::Layout {
        wormhole_transport::Layout {
            lanes: self.lanes,
            ring_capacity: self.ring_kib * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: "t.toml".into(),
            source,
        })?;
        c.validate().map(|()| c)
    }

    #[test]
    fn fairness_settings_are_read_and_checked() {
        let c = parse("cgroup = \"/sys/fs/cgroup/cpu/mine\"\n[[tenant]]\nname = \"a\"\nuids = [1]\ncpu_weight = 300\nmax_queued = 64\n[[tenant]]\nname = \"b\"\nuids = [2]\n").unwrap();
        assert_eq!(
            c.cgroup,
            Some(CgroupSetting::Dir("/sys/fs/cgroup/cpu/mine".into()))
        );
        assert_eq!(
            (c.tenants[0].weight(), c.tenants[0].max_queued),
            (300, Some(64))
        );
        assert_eq!(
            (
                c.tenants[1].cpu_weight,
                c.tenants[1].weight(),
                c.tenants[1].max_queued
            ),
            (None, 100, None)
        );
        assert_eq!(Config::default().cgroup, None);
        assert!(Config::default().short_slices);
        assert!(!parse("short_slices = false").unwrap().short_slices);
        assert!(Config::default().build_sandbox);
        assert!(!parse("build_sandbox = false").unwrap().build_sandbox);
        assert!(Config::default().warm_device);
        assert!(!parse("warm_device = false").unwrap().warm_device);
        assert_eq!(
            parse("cgroup = false").unwrap().cgroup,
            Some(CgroupSetting::On(false))
        );
        for bad in [
            "[[tenant]]\nname = \"a\"\nuids = [1]\ncpu_weight = 0\n",
            "[[tenant]]\nname = \"a\"\nuids = [1]\ncpu_weight = 10001\n",
            "[[tenant]]\nname = \"a\"\nuids = [1]\nmax_queued = 0\n",
            "cgroup = \"relative/dir\"\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ConfigError::Invalid(_))),
                "accepted: {bad}"
            );
        }
    }
}
