//! The frame header every message starts with, on every transport.

use crate::DecodeError;

/// "WH" little-endian: the first two bytes of every frame.
pub const MAGIC: u16 = 0x4857;
/// Protocol version; a peer rejects frames of another version (5: CUDA launches carry their
/// attributes).
pub const VERSION: u8 = 5;
/// Size of [`FrameHeader`] on the wire.
pub const HEADER_LEN: usize = 16;
/// Largest body a peer accepts (bulk data beyond it is split by the sender).
pub const MAX_BODY: u32 = 1 << 30;

/// Flag: this frame answers a request.
pub const FLAG_REPLY: u8 = 1;
/// Flag: the sender does not wait for a reply.
pub const FLAG_ASYNC: u8 = 2;
/// Flag on a reply: output of the device (a kernel's `printf`) went to the client before it,
/// on the session's callback channel, ending with a `MARK` naming this reply's lane and seq;
/// the call returns only once the client has written everything up to that mark.
pub const FLAG_OUTPUT: u8 = 4;

/// Opcodes outside the API range: session control.
pub mod control {
    /// Client → supervisor: open a session (body: protocol version, api name).
    pub const HELLO: u16 = 0xF000;
    /// Server → client: the session is ready (body: session id, region size; memfd attached).
    pub const WELCOME: u16 = 0xF001;
    /// Server → client on the control socket: a callback fired.
    pub const CALLBACK: u16 = 0xF002;
    /// Client → server: fetch server-side data of finished non-blocking reads.
    pub const COLLECT: u16 = 0xF003;
    /// Supervisor status query (`wh status`).
    pub const STATUS: u16 = 0xF004;
    /// Server → client: the session was refused (body: reason).
    pub const REFUSED: u16 = 0xF005;
    /// Client → server: bytes the host changed in fine-grained SVM (addr, bytes)*.
    pub const SVM_PUSH: u16 = 0xF006;
    /// Client → server: the current contents of fine-grained SVM ranges (addr, len)*.
    pub const SVM_PULL: u16 = 0xF007;
    /// Client → server: wait as a blocking transfer of a windowed buffer would, then let the
    /// client copy its bytes in the shared arena itself (body: queue, mem; reply: status).
    pub const DIRECT: u16 = 0xF008;
    /// Supervisor → standby worker: serve this session (body: transport name; the session's
    /// socket attached).
    pub const HANDOFF: u16 = 0xF009;
    /// Worker → client on the callback channel: bytes the session's driver wrote to its
    /// standard output (a kernel's `printf`), for the application's own (body: the bytes).
    pub const OUTPUT: u16 = 0xF00A;
    /// Worker → client on the callback channel: every `OUTPUT` before this one precedes the
    /// reply with `FLAG_OUTPUT` on lane `lane`, number `seq` (the frame's own header fields;
    /// no body).
    pub const MARK: u16 = 0xF00B;
    /// Supervisor → worker on its stats line, then worker → client on the callback channel:
    /// the server ends this session (body: the reason, e.g. the tenant was removed).
    pub const ENDED: u16 = 0xF00C;
    /// Client → worker: a piece of a transfer's data too large for one frame with its request,
    /// kept under an id until the request that names it (body: id, total, offset, length, then
    /// the bytes; reply: status).
    pub const STAGE: u16 = 0xF00D;
    /// Client → worker, before a build: the headers the build includes from the directories its
    /// options name with `-I`, as the application's side found and read them (body: program
    /// id, then per file its directory's index, relative path and bytes; reply: status).
    pub const INCLUDES: u16 = 0xF00E;
}

/// `magic u16 | version u8 | flags u8 | opcode u16 | lane u16 | len u32 | seq u32`,
/// little-endian. `len` counts the body only, so a peer can skip a frame it does not know;
/// `lane` says which of the session's lanes a frame belongs to on transports that multiplex
/// lanes over one stream (TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub flags: u8,
    pub opcode: u16,
    pub lane: u16,
    pub len: u32,
    pub seq: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.flags;
        b[4..6].copy_from_slice(&self.opcode.to_le_bytes());
        b[6..8].copy_from_slice(&self.lane.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Validates magic, version and length before anything looks at the body.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<FrameHeader, DecodeError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if b[2] != VERSION {
            return Err(DecodeError::BadVersion(b[2]));
        }
        let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if len > MAX_BODY {
            return Err(DecodeError::TooLarge(u64::from(len)));
        }
        Ok(FrameHeader {
            flags: b[3],
            opcode: u16::from_le_bytes([b[4], b[5]]),
            lane: u16::from_le_bytes([b[6], b[7]]),
            len,
            seq: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

/// Sets `flag` in the header of `frame`, an encoded frame (a reply already built).
pub fn add_flag(frame: &mut [u8], flag: u8) {
    if let Some(flags) = frame.get_mut(3) {
        *flags |= flag;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_layout() {
        let h = FrameHeader {
            flags: FLAG_REPLY,
            opcode: 0x1234,
            lane: 3,
            len: 99,
            seq: 7,
        };
        let b = h.encode();
        assert_eq!(&b[0..2], b"WH");
        assert_eq!(b[4], 0x34);
        assert_eq!(FrameHeader::decode(&b).unwrap(), h);
        let mut frame = b.to_vec();
        add_flag(&mut frame, FLAG_OUTPUT);
        let got = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(got.flags, FLAG_REPLY | FLAG_OUTPUT);
        assert_eq!(
            FrameHeader {
                flags: h.flags,
                ..got
            },
            h
        );
    }

    #[test]
    fn header_rejects_garbage() {
        let mut b = FrameHeader {
            flags: 0,
            opcode: 1,
            lane: 0,
            len: 1,
            seq: 1,
        }
        .encode();
        b[0] = 0;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(DecodeError::BadMagic(_))
        ));
        let mut b = FrameHeader {
            flags: 0,
            opcode: 1,
            lane: 0,
            len: 1,
            seq: 1,
        }
        .encode();
        b[2] = 9;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(DecodeError::BadVersion(9))
        ));
        let mut b = FrameHeader {
            flags: 0,
            opcode: 1,
            lane: 0,
            len: 0,
            seq: 1,
        }
        .encode();
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(DecodeError::TooLarge(_))
        ));
    }
}
