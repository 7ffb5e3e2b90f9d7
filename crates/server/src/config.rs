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
    /// Most sessions served at once; further clients are refused with a reason.
    pub max_sessions: usize,
    /// Lanes per session (application threads that can wait independently).
    pub lanes: u32,
    /// Size of each ring of a lane, KiB (a power of two).
    pub ring_kib: u64,
    /// Prefix of forwarded device names.
    pub name_prefix: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: wormhole_protocol::default_socket_path(),
            tcp: None,
            max_sessions: 64,
            lanes: 16,
            ring_kib: 256,
            name_prefix: "Wormhole \u{2192} ".into(),
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
        if self.lanes == 0 || self.lanes > 256 {
            return Err(ConfigError::Invalid(format!(
                "lanes = {} must be 1..=256",
                self.lanes
            )));
        }
        Ok(())
    }

    pub fn layout(&self) -> wormhole_transport::Layout {
        wormhole_transport::Layout {
            lanes: self.lanes,
            ring_capacity: self.ring_kib * 1024,
        }
    }
}
