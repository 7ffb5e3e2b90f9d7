//! The messages that open a session, one typed struct each, encoded and decoded here only:
//! the client, the supervisor and every kind of worker (socket, TCP, guest region) use these.

use crate::{
    control, DecodeError, FrameHeader, FrameTooLarge, Reader, Writer, FLAG_REPLY, VERSION,
};

/// Client → server: open a session of `api` (`"opencl"`, `"cuda"`). Remote tenants name
/// themselves with a token; local ones are known by their socket's peer uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u8,
    pub api: String,
    pub token: Option<Vec<u8>>,
}

impl Hello {
    pub fn new(api: &str, token: Option<&[u8]>) -> Hello {
        Hello {
            version: VERSION,
            api: api.to_string(),
            token: token.map(<[u8]>::to_vec),
        }
    }

    /// The HELLO frame (an error only for a token beyond a frame's size).
    pub fn encode(&self) -> Result<Vec<u8>, FrameTooLarge> {
        let mut w = Writer::new(control::HELLO);
        w.u8(self.version);
        w.bytes(self.api.as_bytes());
        w.opt_bytes(self.token.as_deref());
        w.finish(0, 0)
    }

    pub fn decode(body: &[u8]) -> Result<Hello, DecodeError> {
        let mut r = Reader::new(body);
        let version = r.u8()?;
        let api = std::str::from_utf8(r.bytes()?)
            .map_err(|_| DecodeError::BadValue("API name is not UTF-8"))?
            .to_string();
        // Older clients sent no token field at all.
        let token = if r.remaining() > 0 {
            r.opt_bytes()?
        } else {
            None
        };
        r.finish()?;
        Ok(Hello {
            version,
            api,
            token,
        })
    }

    /// A HELLO frame as a server receives it: the opcode must be HELLO, the version ours, and
    /// the API one of `apis`. The error is the reason to send back in REFUSED.
    pub fn check(h: &FrameHeader, body: &[u8], apis: &[&str]) -> Result<Hello, String> {
        if h.opcode != control::HELLO {
            return Err(format!("expected HELLO, got opcode {:#06x}", h.opcode));
        }
        let hello = Hello::decode(body).map_err(|e| format!("malformed HELLO: {e}"))?;
        if hello.version != VERSION {
            return Err(format!(
                "unsupported protocol version {} (this server speaks {VERSION})",
                hello.version
            ));
        }
        if !apis.contains(&hello.api.as_str()) {
            return Err(format!(
                "this server does not serve the API {:?} (it serves {})",
                hello.api,
                apis.join(", ")
            ));
        }
        Ok(hello)
    }
}

/// Server → client: the session is ready. Local sessions get the region's memfd (and the
/// buffer arena's, if any) attached; `ring_capacity` is 0 on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The worker's pid, for `wh status` and logs.
    pub session: u64,
    /// Lanes the client may use for calls.
    pub lanes: u32,
    pub ring_capacity: u64,
}

/// Most lanes a session may have (one per application thread, reused round-robin).
pub const MAX_LANES: u32 = 1024;

impl Welcome {
    pub fn encode(&self, seq: u32) -> Vec<u8> {
        let mut w = Writer::new(control::WELCOME);
        w.u64(self.session);
        w.u32(self.lanes);
        w.u64(self.ring_capacity);
        // 20 bytes of body: always within a frame.
        w.finish(FLAG_REPLY, seq).unwrap_or_default()
    }

    pub fn decode(body: &[u8]) -> Result<Welcome, DecodeError> {
        let mut r = Reader::new(body);
        let session = r.u64()?;
        let lanes = r.u32()?;
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(DecodeError::BadValue("lane count out of range"));
        }
        let ring_capacity = r.u64()?;
        Ok(Welcome {
            session,
            lanes,
            ring_capacity,
        })
    }
}

/// Longest reason a REFUSED frame carries (longer ones are cut).
const MAX_REASON: usize = 4096;

/// Server → client: the session was refused, and why.
pub fn refused(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut w = Writer::new(control::REFUSED);
    w.bytes(&reason.as_bytes()[..end]);
    // A bounded body: always within a frame.
    w.finish(FLAG_REPLY, 0).unwrap_or_default()
}

/// The client's reading of the server's first answer: WELCOME, or the reason it was refused.
pub fn answer(h: &FrameHeader, body: &[u8]) -> Result<Welcome, String> {
    match h.opcode {
        control::WELCOME => {
            Welcome::decode(body).map_err(|e| format!("malformed WELCOME from the server: {e}"))
        }
        control::REFUSED => {
            let reason = Reader::new(body)
                .bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err(format!("the server refused the session: {reason}"))
        }
        other => Err(format!("unexpected answer {other:#06x} from the server")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEADER_LEN;

    fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let h = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        (h, &frame[HEADER_LEN..])
    }

    #[test]
    fn hello_roundtrip_and_checks() {
        let hello = Hello::new("opencl", Some(b"secret"));
        let frame = hello.encode().unwrap();
        let (h, body) = split(&frame);
        assert_eq!(Hello::check(&h, body, &["opencl", "cuda"]), Ok(hello));
        assert!(Hello::check(&h, body, &["cuda"])
            .unwrap_err()
            .contains("does not serve"));
        let mut bad = Hello::new("opencl", None);
        bad.version = 99;
        let frame = bad.encode().unwrap();
        let (h, body) = split(&frame);
        assert!(Hello::check(&h, body, &["opencl"])
            .unwrap_err()
            .contains("version"));
        assert!(Hello::check(&h, &body[..3], &["opencl"])
            .unwrap_err()
            .contains("malformed"));
    }

    #[test]
    fn welcome_roundtrip_and_refusal() {
        let w = Welcome {
            session: 7,
            lanes: 4,
            ring_capacity: 1 << 20,
        };
        let frame = w.encode(0);
        let (h, body) = split(&frame);
        assert_eq!(answer(&h, body), Ok(w));
        let frame = Welcome { lanes: 0, ..w }.encode(0);
        let (h, body) = split(&frame);
        assert!(answer(&h, body).is_err());
        let frame = refused("no room");
        let (h, body) = split(&frame);
        assert!(answer(&h, body).unwrap_err().contains("no room"));
    }
}
