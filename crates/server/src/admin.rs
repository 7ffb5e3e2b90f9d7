//! What the operator asks the supervisor on its Unix socket besides sessions (`wh status`,
//! `wh tenant`): a `STATUS` frame whose body's first byte says what is asked. The answer is a
//! `STATUS` frame carrying JSON, or `REFUSED` with the reason.
//!
//! Changing or listing tenants is for root and the server's own user only (the socket's peer
//! credentials); `wh status` is for everyone, as before.

use std::path::PathBuf;
use wormhole_wire::{DecodeError, Reader, Writer};

/// The server's state: sessions, their objects and memory (an empty body asks this too).
pub const STATUS: u8 = 0;
/// The tenants' settings now ([`TenantList`]).
pub const TENANT_LIST: u8 = 1;
/// Changes a tenant's settings ([`TenantChange`]); answers its [`TenantSettings`].
pub const TENANT_SET: u8 = 2;
/// Makes a tenant ([`TenantAdd`], JSON) and mints its token; answers [`TenantAdded`].
pub const TENANT_ADD: u8 = 3;
/// Removes a tenant made at run time (its name), revoking its token and ending its sessions;
/// answers [`TenantRemoved`].
pub const TENANT_REMOVE: u8 = 4;

/// The devices each API's driver offers and where the server listens ([`Devices`]); for
/// everyone, like [`STATUS`].
pub const DEVICES: u8 = 5;

/// The answer to [`DEVICES`]: what a cluster integration publishes about this server.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Devices {
    pub apis: Vec<ApiDevices>,
    /// The local socket sessions connect to.
    pub socket: PathBuf,
    /// The TCP address sessions may connect to, if any, and whether it speaks TLS.
    pub tcp: Option<String>,
    pub tls: bool,
}

/// One API's devices, or why they could not be listed (`error`: something failed, asking
/// again may help), or why this server has none (`not_installed`: no driver for the API).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ApiDevices {
    pub api: String,
    pub devices: Vec<crate::backend::DeviceInventory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_installed: Option<String>,
}

/// A tenant to make while the server runs. It is identified by the token minted for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantAdd {
    pub name: String,
    pub mem_quota_mib: Option<u64>,
    pub max_sessions: Option<usize>,
    pub max_objects: Option<usize>,
    #[serde(default)]
    pub devices: Vec<String>,
    pub cpu_weight: Option<u32>,
    pub max_queued: Option<u64>,
}

impl TenantAdd {
    pub fn encode(&self, w: &mut Writer) {
        w.u8(TENANT_ADD);
        w.bytes(&serde_json::to_vec(self).unwrap_or_default());
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<TenantAdd, String> {
        let json = r.bytes().map_err(|e| e.to_string())?;
        r.finish().map_err(|e| e.to_string())?;
        serde_json::from_slice(json).map_err(|e| e.to_string())
    }
}

/// The answer to [`TENANT_ADD`]: the tenant, and its token (shown this once: the server keeps
/// only its digest).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TenantAdded {
    pub tenant: TenantSettings,
    pub token: String,
}

/// The answer to [`TENANT_REMOVE`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TenantRemoved {
    pub name: String,
    /// Sessions that were open and are being ended.
    pub sessions_ended: usize,
}

/// Encodes a removal request.
pub fn encode_remove(w: &mut Writer, name: &str) {
    w.u8(TENANT_REMOVE);
    w.bytes(name.as_bytes());
}

/// A change of a tenant's settings while the server runs; what is None stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantChange {
    pub name: String,
    pub cpu_weight: Option<u32>,
    /// 0 removes the limit.
    pub max_queued: Option<u64>,
}

impl TenantChange {
    pub fn encode(&self, w: &mut Writer) {
        w.u8(TENANT_SET);
        w.bytes(self.name.as_bytes());
        w.u8(u8::from(self.cpu_weight.is_some()));
        w.u32(self.cpu_weight.unwrap_or(0));
        w.u8(u8::from(self.max_queued.is_some()));
        w.u64(self.max_queued.unwrap_or(0));
    }

    /// Decodes what follows the request's first byte.
    pub fn decode(r: &mut Reader<'_>) -> Result<TenantChange, DecodeError> {
        let name = String::from_utf8_lossy(r.bytes()?).into_owned();
        let has_weight = r.u8()? != 0;
        let weight = r.u32()?;
        let has_queued = r.u8()? != 0;
        let queued = r.u64()?;
        r.finish()?;
        Ok(TenantChange {
            name,
            cpu_weight: has_weight.then_some(weight),
            max_queued: has_queued.then_some(queued),
        })
    }
}

/// A tenant's settings as they are now (they last until the server stops).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TenantSettings {
    pub name: String,
    /// Made with `wh tenant add` (not in the configuration file).
    pub added_at_run_time: bool,
    pub mem_quota_mib: Option<u64>,
    pub max_sessions: Option<usize>,
    pub cpu_weight: u32,
    pub max_queued: Option<u64>,
    /// Sessions open now.
    pub sessions: usize,
    /// The tenant's cgroup, when CPU weights are on.
    pub cgroup: Option<PathBuf>,
}

/// Every tenant's settings, and whether CPU weights are enforced.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TenantList {
    /// The group the tenants' cgroups are in, when CPU weights are on...
    pub cgroups: Option<PathBuf>,
    /// ...and why they are off otherwise.
    pub cgroups_off: Option<String>,
    pub tenants: Vec<TenantSettings>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_survives_its_encoding() {
        for c in [
            TenantChange {
                name: "alice".into(),
                cpu_weight: Some(300),
                max_queued: None,
            },
            TenantChange {
                name: String::new(),
                cpu_weight: None,
                max_queued: Some(0),
            },
        ] {
            let mut w = Writer::new(0);
            c.encode(&mut w);
            let frame = w.finish(0, 0).unwrap();
            let mut r = Reader::new(&frame[wormhole_wire::HEADER_LEN..]);
            assert_eq!(r.u8().unwrap(), TENANT_SET);
            assert_eq!(TenantChange::decode(&mut r).unwrap(), c);
        }
        // A truncated request is an error, not a change.
        assert!(TenantChange::decode(&mut Reader::new(&[5, 0, 0, 0, b'a'])).is_err());
    }
}
