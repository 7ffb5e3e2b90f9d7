//! Reads, writes, maps and unmaps of buffers and images. Every enqueue ends its arguments with
//! the event wait list (event ids, absent for NULL) and the id the client chose for the event
//! it returns (0: the application asked for none).

use super::*;

/// `clEnqueueReadBuffer`; answered by a [`Reply`]`<`[`ReadReply`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBuffer {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub offset: usize,
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// Under which id a non-blocking read's data waits for COLLECT.
    pub read_id: u64,
}

impl Message<'_> for ReadBuffer {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        w.usize(self.offset);
        w.usize(self.size);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.read_id);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ReadBuffer {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            offset: r.usize()?,
            size: r.usize()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            read_id: r.u64()?,
        })
    }
}

/// What a successful read answers (after CL_SUCCESS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadReply {
    /// The data follows this header: `len` bytes, unprefixed (see [`ReadReply::data`]).
    Inline { len: u64 },
    /// The data waits on the server under the read's id, for COLLECT: a non-blocking read's,
    /// or a blocking one's too large for one reply (complete already; collect it at once).
    Deferred,
}

const READ_INLINE: u8 = 0;
const READ_DEFERRED: u8 = 1;

impl ReadReply {
    /// Bytes of a successful inline reply before its data (status, mode, length): a client
    /// that has the transport read the rest straight into the application's memory needs it.
    pub const INLINE_HEAD_LEN: usize = 4 + 1 + 8;

    /// The inline data that follows the header just decoded from `r` (None if deferred).
    pub fn data<'a>(&self, r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
        match self {
            ReadReply::Inline { len } => r.raw(*len).map(Some),
            ReadReply::Deferred => Ok(None),
        }
    }
}

impl Message<'_> for ReadReply {
    fn encode(&self, w: &mut Writer) {
        match self {
            ReadReply::Inline { len } => {
                w.u8(READ_INLINE);
                w.u64(*len);
            }
            ReadReply::Deferred => w.u8(READ_DEFERRED),
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            READ_INLINE => Ok(ReadReply::Inline { len: r.u64()? }),
            READ_DEFERRED => Ok(ReadReply::Deferred),
            _ => Err(DecodeError::BadValue("read reply mode")),
        }
    }
}

/// How a write's data travels (the bytes of a write request, or of an unmap that gives back
/// a writing map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteData {
    /// None: the application passed a NULL pointer (the driver's verdict is wanted).
    Absent,
    /// `len` bytes that follow the request's header unprefixed, sent from the application's
    /// memory.
    Inline(u64),
    /// `len` bytes staged before the request under `id` (STAGE requests): data too large to
    /// travel in one frame with it.
    Staged { id: u64, len: u64 },
    /// `len` bytes that the session's pending non-blocking read `read` brings, from `offset`
    /// of its data: the application writes from memory that read has not filled yet, and the
    /// driver, as natively, reads them only when the write runs (after the read).
    FromRead { read: u64, offset: u64, len: u64 },
}

const DATA_ABSENT: u8 = 0;
const DATA_INLINE: u8 = 1;
const DATA_STAGED: u8 = 2;
const DATA_FROM_READ: u8 = 3;

impl WriteData {
    /// How `len` bytes travel after a request header of `head` bytes: inline when the frame
    /// holds them, else staged under a fresh id that `fresh` gives.
    pub fn for_len(head: usize, len: usize, fresh: impl FnOnce() -> u64) -> WriteData {
        let fits = head
            .checked_add(len)
            .is_some_and(|n| n <= wormhole_wire::MAX_BODY as usize);
        if fits {
            WriteData::Inline(len as u64)
        } else {
            WriteData::Staged {
                id: fresh(),
                len: len as u64,
            }
        }
    }

    /// The data's length (0 when absent).
    pub fn len(&self) -> u64 {
        match *self {
            WriteData::Absent => 0,
            WriteData::Inline(n)
            | WriteData::Staged { len: n, .. }
            | WriteData::FromRead { len: n, .. } => n,
        }
    }

    /// Whether the data has no bytes (absent, or empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inline data that follows the header just decoded from `r` (None unless inline).
    pub fn inline<'a>(&self, r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
        match *self {
            WriteData::Inline(n) => r.raw(n).map(Some),
            _ => Ok(None),
        }
    }
}

impl Message<'_> for WriteData {
    fn encode(&self, w: &mut Writer) {
        match *self {
            WriteData::Absent => w.u8(DATA_ABSENT),
            WriteData::Inline(n) => {
                w.u8(DATA_INLINE);
                w.u64(n);
            }
            WriteData::Staged { id, len } => {
                w.u8(DATA_STAGED);
                w.u64(id);
                w.u64(len);
            }
            WriteData::FromRead { read, offset, len } => {
                w.u8(DATA_FROM_READ);
                w.u64(read);
                w.u64(offset);
                w.u64(len);
            }
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            DATA_ABSENT => Ok(WriteData::Absent),
            DATA_INLINE => Ok(WriteData::Inline(r.u64()?)),
            DATA_STAGED => Ok(WriteData::Staged {
                id: r.u64()?,
                len: r.u64()?,
            }),
            DATA_FROM_READ => Ok(WriteData::FromRead {
                read: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            }),
            _ => Err(DecodeError::BadValue("write data mode")),
        }
    }
}

/// The header of `clEnqueueWriteBuffer`: inline data (if the application passed any, and the
/// frame holds it) follows it, `data.len()` bytes unprefixed, sent from the application's
/// memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBuffer {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub offset: usize,
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub data: WriteData,
}

impl WriteBuffer {
    /// Bytes of the shortest header (no wait list, no data): every header is at least this
    /// long, so a receiver may take this many before it decodes one.
    pub const MIN_LEN: usize = 8 + 8 + 4 + 8 + 8 + 1 + 8 + 1;

    /// The inline data that follows the header just decoded from `r`.
    pub fn data<'a>(&self, r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
        self.data.inline(r)
    }
}

impl Message<'_> for WriteBuffer {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        w.usize(self.offset);
        w.usize(self.size);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        self.data.encode(w);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WriteBuffer {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            offset: r.usize()?,
            size: r.usize()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            data: WriteData::decode(r)?,
        })
    }
}

/// The geometry of a rectangular buffer transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub buffer_origin: [usize; 3],
    pub host_origin: [usize; 3],
    pub region: [usize; 3],
    /// Buffer row and slice pitch, host row and slice pitch.
    pub pitches: [usize; 4],
}

impl Message<'_> for Rect {
    fn encode(&self, w: &mut Writer) {
        put_triple(w, &self.buffer_origin);
        put_triple(w, &self.host_origin);
        put_triple(w, &self.region);
        for p in self.pitches {
            w.usize(p);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Rect {
            buffer_origin: triple(r)?,
            host_origin: triple(r)?,
            region: triple(r)?,
            pitches: [r.usize()?, r.usize()?, r.usize()?, r.usize()?],
        })
    }
}

/// `clEnqueueReadBufferRect`; answered as [`ReadBuffer`] (the data: the region's host
/// footprint, from host origin 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBufferRect {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub rect: Rect,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub read_id: u64,
}

impl Message<'_> for ReadBufferRect {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        self.rect.encode(w);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.read_id);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ReadBufferRect {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            rect: Rect::decode(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            read_id: r.u64()?,
        })
    }
}

/// The header of `clEnqueueWriteBufferRect`: the data is the region's host footprint (from
/// host origin 0), inline after the header or staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBufferRect {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub rect: Rect,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub data: WriteData,
}

impl Message<'_> for WriteBufferRect {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        self.rect.encode(w);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        self.data.encode(w);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WriteBufferRect {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            rect: Rect::decode(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            data: WriteData::decode(r)?,
        })
    }
}

/// The region of an image transfer and its host pitches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRegion {
    pub origin: [usize; 3],
    pub region: [usize; 3],
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

impl Message<'_> for ImageRegion {
    fn encode(&self, w: &mut Writer) {
        put_triple(w, &self.origin);
        put_triple(w, &self.region);
        w.usize(self.row_pitch);
        w.usize(self.slice_pitch);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ImageRegion {
            origin: triple(r)?,
            region: triple(r)?,
            row_pitch: r.usize()?,
            slice_pitch: r.usize()?,
        })
    }
}

/// `clEnqueueReadImage`; answered as [`ReadBuffer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadImage {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub image: ImageRegion,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub read_id: u64,
}

impl Message<'_> for ReadImage {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        self.image.encode(w);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.read_id);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ReadImage {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            image: ImageRegion::decode(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            read_id: r.u64()?,
        })
    }
}

/// The header of `clEnqueueWriteImage`: the data is the region's host footprint, inline after
/// the header or staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteImage {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub image: ImageRegion,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub data: WriteData,
}

impl Message<'_> for WriteImage {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        self.image.encode(w);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        self.data.encode(w);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WriteImage {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            image: ImageRegion::decode(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            data: WriteData::decode(r)?,
        })
    }
}

/// `clEnqueueMapBuffer`; answered by a [`Reply`]`<`[`Mapped`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapBuffer {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub flags: u64,
    pub offset: usize,
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// The client's name for the mapping (the unmap sends it back).
    pub token: u64,
    /// The client maps the session's arena: a mapping that lies there may be handed out as is.
    pub in_place_ok: bool,
}

impl Message<'_> for MapBuffer {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        w.u64(self.flags);
        w.usize(self.offset);
        w.usize(self.size);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.token);
        w.bool(self.in_place_ok);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(MapBuffer {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            flags: r.u64()?,
            offset: r.usize()?,
            size: r.usize()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            token: r.u64()?,
            in_place_ok: r.bool()?,
        })
    }
}

/// `clEnqueueMapImage`; answered by a [`Reply`]`<`[`Mapped`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapImage {
    pub queue: u64,
    pub mem: u64,
    pub blocking: u32,
    pub flags: u64,
    pub origin: [usize; 3],
    pub region: [usize; 3],
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub token: u64,
    pub in_place_ok: bool,
}

impl Message<'_> for MapImage {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u32(self.blocking);
        w.u64(self.flags);
        put_triple(w, &self.origin);
        put_triple(w, &self.region);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.token);
        w.bool(self.in_place_ok);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(MapImage {
            queue: r.u64()?,
            mem: r.u64()?,
            blocking: r.u32()?,
            flags: r.u64()?,
            origin: triple(r)?,
            region: triple(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            token: r.u64()?,
            in_place_ok: r.bool()?,
        })
    }
}

/// A successful map: where the mapping is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped<'a> {
    /// Row and slice pitch (images; 0 for buffers).
    pub pitches: [usize; 2],
    /// Where the mapping lies in the session's arena, if the client may use it in place.
    pub in_place: Option<u64>,
    /// The mapping's length.
    pub len: u64,
    /// A non-blocking map's bytes come later, collected under the map's token like a
    /// non-blocking read's.
    pub deferred: bool,
    /// Its bytes: empty when in place, deferred, for an invalidating map, or for an empty
    /// mapping.
    pub data: &'a [u8],
}

impl<'a> Message<'a> for Mapped<'a> {
    fn encode(&self, w: &mut Writer) {
        w.usize(self.pitches[0]);
        w.usize(self.pitches[1]);
        put_window(w, self.in_place);
        w.u64(self.len);
        w.u8(self.deferred as u8);
        w.bytes(self.data);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(Mapped {
            pitches: [r.usize()?, r.usize()?],
            in_place: window(r)?,
            len: r.u64()?,
            deferred: r.u8()? != 0,
            data: r.bytes()?,
        })
    }
}

/// The header of `clEnqueueUnmapMemObject`: the bytes of a writing map travel back with it,
/// inline after the header or staged (absent: nothing to give back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnmapMemObject {
    pub queue: u64,
    pub mem: u64,
    pub token: u64,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    pub data: WriteData,
    /// The client's mapping is the application's own memory (`CL_MEM_USE_HOST_PTR`) and the
    /// map's bytes are still to be collected: they stay due after the unmap (read again once
    /// it is done), where otherwise they are dropped.
    pub keep_bytes: bool,
}

impl Message<'_> for UnmapMemObject {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u64(self.token);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        self.data.encode(w);
        w.bool(self.keep_bytes);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(UnmapMemObject {
            queue: r.u64()?,
            mem: r.u64()?,
            token: r.u64()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            data: WriteData::decode(r)?,
            keep_bytes: r.bool()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn reads_roundtrip() {
        let b = roundtrip(&ReadBuffer {
            queue: 1,
            mem: 2,
            blocking: 1,
            offset: 3,
            size: 4,
            wait: Some(vec![5, 6]),
            event: 7,
            read_id: 8,
        });
        assert_eq!(b.len(), 8 + 8 + 4 + 8 + 8 + (1 + 4 + 16) + 8 + 8);
        roundtrip(&ReadBuffer {
            queue: 1,
            mem: 2,
            blocking: 0,
            offset: 0,
            size: 0,
            wait: None,
            event: 0,
            read_id: 9,
        });
        let rect = Rect {
            buffer_origin: [1, 2, 3],
            host_origin: [4, 5, 6],
            region: [7, 8, 9],
            pitches: [10, 11, 12, 13],
        };
        roundtrip(&ReadBufferRect {
            queue: 1,
            mem: 2,
            blocking: 1,
            rect,
            wait: Some(vec![]),
            event: 3,
            read_id: 4,
        });
        roundtrip(&ReadImage {
            queue: 1,
            mem: 2,
            blocking: 0,
            image: ImageRegion {
                origin: [1, 2, 3],
                region: [4, 5, 6],
                row_pitch: 7,
                slice_pitch: 8,
            },
            wait: None,
            event: 0,
            read_id: 4,
        });
    }

    #[test]
    fn read_replies_announce_their_data() {
        let inline: Reply<ReadReply> = Ok(ReadReply::Inline { len: 3 });
        assert_eq!(roundtrip(&inline).len(), ReadReply::INLINE_HEAD_LEN);
        roundtrip(&Ok::<_, i32>(ReadReply::Deferred));
        roundtrip(&Err::<ReadReply, _>(-30));
        // The data follows the header unprefixed; a short one is an error.
        let mut w = Writer::new(0);
        inline.encode(&mut w);
        w.filled_by(3, |p| {
            // SAFETY: `filled_by` hands out room for the 3 bytes written.
            unsafe { std::ptr::copy_nonoverlapping(b"abc".as_ptr(), p, 3) };
            Ok::<(), ()>(())
        })
        .unwrap();
        let body = w.body().to_vec();
        let mut r = Reader::new(&body);
        let head = Reply::<ReadReply>::decode(&mut r).unwrap().unwrap();
        assert_eq!(head.data(&mut r).unwrap(), Some(&b"abc"[..]));
        r.finish().unwrap();
        let mut r = Reader::new(&body[..body.len() - 1]);
        let head = Reply::<ReadReply>::decode(&mut r).unwrap().unwrap();
        assert!(head.data(&mut r).is_err());
        let mut bad = body.clone();
        bad[4] = 9;
        assert!(Reply::<ReadReply>::decode_all(&bad).is_err());
    }

    #[test]
    fn writes_roundtrip() {
        let head = WriteBuffer {
            queue: 1,
            mem: 2,
            blocking: 1,
            offset: 3,
            size: 4,
            wait: Some(vec![5]),
            event: 6,
            data: WriteData::Inline(4),
        };
        roundtrip(&head);
        let shortest = WriteBuffer {
            data: WriteData::Absent,
            wait: None,
            ..head.clone()
        };
        assert_eq!(roundtrip(&shortest).len(), WriteBuffer::MIN_LEN);
        let modes = [
            WriteData::Absent,
            WriteData::Inline(0),
            WriteData::Inline(9),
            WriteData::Staged { id: 7, len: 9 },
            WriteData::FromRead {
                read: 3,
                offset: 8,
                len: 9,
            },
        ];
        for wait in [None, Some(vec![]), Some(vec![1, 2])] {
            for data in modes {
                let h = WriteBuffer {
                    wait: wait.clone(),
                    data,
                    ..head.clone()
                };
                assert!(roundtrip(&h).len() >= WriteBuffer::MIN_LEN);
            }
        }
        let mut bad = body(&shortest).to_vec();
        *bad.last_mut().unwrap() = 3;
        assert!(
            WriteBuffer::decode_all(&bad).is_err(),
            "an unknown data mode"
        );
        // The data follows the header: taken whole, or not at all.
        let mut w = Writer::new(0);
        head.encode(&mut w);
        w.trailer(4);
        let body_len = w.body_len();
        let frame = w.finish(0, 0).unwrap();
        let h = wormhole_wire::FrameHeader::decode(
            frame[..wormhole_wire::HEADER_LEN].try_into().unwrap(),
        )
        .unwrap();
        assert_eq!(h.len as usize, body_len + 4, "the frame counts the trailer");
        let mut b = body(&head).to_vec();
        b.extend_from_slice(b"data");
        let mut r = Reader::new(&b);
        let h = WriteBuffer::decode(&mut r).unwrap();
        assert_eq!(h.data(&mut r).unwrap(), Some(&b"data"[..]));
        r.finish().unwrap();
        let mut r = Reader::new(&b[..b.len() - 1]);
        let h = WriteBuffer::decode(&mut r).unwrap();
        assert!(h.data(&mut r).is_err());
        // Staged data is not in the message.
        let staged = WriteBuffer {
            data: WriteData::Staged { id: 3, len: 4 },
            ..head.clone()
        };
        let b = body(&staged);
        let mut r = Reader::new(b);
        let h = WriteBuffer::decode(&mut r).unwrap();
        assert_eq!(h.data(&mut r).unwrap(), None);
        r.finish().unwrap();

        let rect = Rect {
            buffer_origin: [1, 2, 3],
            host_origin: [4, 5, 6],
            region: [7, 8, 9],
            pitches: [10, 11, 12, 13],
        };
        roundtrip(&WriteBufferRect {
            queue: 1,
            mem: 2,
            blocking: 0,
            rect,
            wait: Some(vec![3]),
            event: 4,
            data: WriteData::Inline(4),
        });
        roundtrip(&WriteImage {
            queue: 1,
            mem: 2,
            blocking: 1,
            image: ImageRegion {
                origin: [0; 3],
                region: [1, 1, 1],
                row_pitch: 0,
                slice_pitch: 0,
            },
            wait: None,
            event: 0,
            data: WriteData::Staged { id: 5, len: 2 },
        });
    }

    #[test]
    fn data_is_staged_only_when_the_frame_cannot_hold_it() {
        let max = wormhole_wire::MAX_BODY as usize;
        let mut fresh = 0;
        let mut next = || {
            fresh += 1;
            fresh
        };
        assert_eq!(WriteData::for_len(100, 0, &mut next), WriteData::Inline(0));
        assert_eq!(
            WriteData::for_len(100, max - 100, &mut next),
            WriteData::Inline((max - 100) as u64)
        );
        assert_eq!(
            WriteData::for_len(100, max - 99, &mut next),
            WriteData::Staged {
                id: 1,
                len: (max - 99) as u64
            }
        );
        assert_eq!(
            WriteData::for_len(usize::MAX, 1, &mut next),
            WriteData::Staged { id: 2, len: 1 }
        );
        assert_eq!(WriteData::Staged { id: 9, len: 4 }.len(), 4);
        assert!(WriteData::Absent.is_empty());
    }

    #[test]
    fn maps_roundtrip() {
        roundtrip(&MapBuffer {
            queue: 1,
            mem: 2,
            blocking: 1,
            flags: 3,
            offset: 4,
            size: 5,
            wait: Some(vec![6]),
            event: 7,
            token: 8,
            in_place_ok: true,
        });
        roundtrip(&MapImage {
            queue: 1,
            mem: 2,
            blocking: 0,
            flags: 3,
            origin: [4, 5, 6],
            region: [7, 8, 9],
            wait: None,
            event: 0,
            token: 10,
            in_place_ok: false,
        });
        roundtrip(&Ok::<_, i32>(Mapped {
            pitches: [1, 2],
            in_place: Some(4096),
            len: 8,
            deferred: false,
            data: b"",
        }));
        roundtrip(&Ok::<_, i32>(Mapped {
            pitches: [0, 0],
            in_place: None,
            len: 3,
            deferred: false,
            data: b"abc",
        }));
        roundtrip(&Ok::<_, i32>(Mapped {
            pitches: [0, 0],
            in_place: None,
            len: 3,
            deferred: true,
            data: b"",
        }));
        roundtrip(&Err::<Mapped, _>(-5));
        roundtrip(&UnmapMemObject {
            queue: 1,
            mem: 2,
            token: 3,
            wait: Some(vec![4]),
            event: 5,
            data: WriteData::Inline(4),
            keep_bytes: false,
        });
        roundtrip(&UnmapMemObject {
            queue: 1,
            mem: 2,
            token: 3,
            wait: None,
            event: 0,
            data: WriteData::Absent,
            keep_bytes: true,
        });
    }
}
