//! OpenCL's control requests (opcodes outside the API range, `wormhole_wire::control`):
//! collecting non-blocking reads, staging the data of writes too large for one frame, keeping
//! fine-grained SVM coherent, and the client's own copies of windowed buffers.

use super::*;

/// COLLECT: the data of these non-blocking reads, where they have completed; answered by a
/// [`CollectReply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collect {
    pub reads: Vec<u64>,
}

impl Message<'_> for Collect {
    fn encode(&self, w: &mut Writer) {
        w.opt_u64s(Some(&self.reads));
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Collect { reads: u64s(r)? })
    }
}

/// Where a collected read stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collected<'a> {
    /// Not complete yet: ask again at the next synchronisation point.
    Pending,
    /// Complete: the rest of its data (all of it, unless parts came before).
    Done(&'a [u8]),
    /// Complete, but more data than this reply carries: its next bytes (perhaps none, when
    /// other reads filled the reply), after those of the parts before; ask again for the rest.
    Part(&'a [u8]),
    /// Failed, or unknown to the server: no data will come.
    Failed,
}

const COLLECT_PENDING: u8 = 0;
const COLLECT_DONE: u8 = 1;
const COLLECT_FAILED: u8 = 2;
const COLLECT_PART: u8 = 3;

/// One entry per read asked for: its id and where it stands. The data of all its entries
/// together is at most [`crate::TRANSFER_CHUNK`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectReply<'a> {
    pub reads: Vec<(u64, Collected<'a>)>,
}

impl<'a> Message<'a> for CollectReply<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.reads.len() as u32);
        for (id, state) in &self.reads {
            w.u64(*id);
            match state {
                Collected::Pending => w.u8(COLLECT_PENDING),
                Collected::Done(data) => {
                    w.u8(COLLECT_DONE);
                    w.bytes(data);
                }
                Collected::Part(data) => {
                    w.u8(COLLECT_PART);
                    w.bytes(data);
                }
                Collected::Failed => w.u8(COLLECT_FAILED),
            }
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let n = count(r, 9, usize::MAX)?;
        let reads = (0..n)
            .map(|_| {
                let id = r.u64()?;
                let state = match r.u8()? {
                    COLLECT_PENDING => Collected::Pending,
                    COLLECT_DONE => Collected::Done(r.bytes()?),
                    COLLECT_PART => Collected::Part(r.bytes()?),
                    COLLECT_FAILED => Collected::Failed,
                    _ => return Err(DecodeError::BadValue("collect state")),
                };
                Ok((id, state))
            })
            .collect::<Result<_, _>>()?;
        Ok(CollectReply { reads })
    }
}

/// STAGE: bytes `offset..offset + len` of the `total` bytes of a transfer's data, kept under
/// `id` (the client's choice, fresh per transfer) for the request that names it
/// ([`crate::requests::WriteData::Staged`]). The bytes follow this header unprefixed; pieces
/// come in order, each at most [`crate::TRANSFER_CHUNK`] bytes. Answered by the status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    pub id: u64,
    pub total: u64,
    pub offset: u64,
    pub len: u64,
}

impl Stage {
    /// The data that follows the header just decoded from `r`.
    pub fn data<'a>(&self, r: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
        r.raw(self.len)
    }
}

impl Message<'_> for Stage {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.id);
        w.u64(self.total);
        w.u64(self.offset);
        w.u64(self.len);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Stage {
            id: r.u64()?,
            total: r.u64()?,
            offset: r.u64()?,
            len: r.u64()?,
        })
    }
}

/// SVM_PUSH: bytes the host changed in fine-grained SVM, as (address, bytes) runs of at most
/// [`crate::SVM_SYNC_BATCH`] bytes in all; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmPush<'a> {
    pub runs: Vec<(u64, &'a [u8])>,
}

impl<'a> Message<'a> for SvmPush<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.runs.len() as u32);
        for (addr, bytes) in &self.runs {
            w.u64(*addr);
            w.bytes(bytes);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let n = count(r, 16, usize::MAX)?;
        let runs = (0..n)
            .map(|_| Ok((r.u64()?, r.bytes()?)))
            .collect::<Result<_, DecodeError>>()?;
        Ok(SvmPush { runs })
    }
}

/// SVM_PULL: the current contents of fine-grained SVM ranges (address, length), at most
/// [`crate::SVM_SYNC_BATCH`] bytes in all; answered by a [`Reply`]`<`[`SvmPulled`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmPull {
    pub ranges: Vec<(u64, usize)>,
}

impl Message<'_> for SvmPull {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.ranges.len() as u32);
        for (addr, len) in &self.ranges {
            w.u64(*addr);
            w.usize(*len);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = count(r, 16, usize::MAX)?;
        let ranges = (0..n)
            .map(|_| Ok((r.u64()?, r.usize()?)))
            .collect::<Result<_, DecodeError>>()?;
        Ok(SvmPull { ranges })
    }
}

/// The bytes of each range pulled, in the request's order (as many as it asked for: they fill
/// the rest of the reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmPulled<'a> {
    pub ranges: Vec<&'a [u8]>,
}

impl<'a> Message<'a> for SvmPulled<'a> {
    fn encode(&self, w: &mut Writer) {
        for bytes in &self.ranges {
            w.bytes(bytes);
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let mut ranges = Vec::new();
        while r.remaining() > 0 {
            ranges.push(r.bytes()?);
        }
        Ok(SvmPulled { ranges })
    }
}

/// DIRECT: wait as a blocking transfer of this windowed buffer would, then let the client copy
/// its bytes in the shared arena itself; answered by CL_SUCCESS or [`DIRECT_DECLINED`].
/// `wait_ns` bounds the wait: [`WAIT_ALL`] for a blocking transfer; a non-blocking one may not
/// keep the application waiting for its queue, so it is declined (and queued as usual) when
/// the commands before it have not finished within that time (0: unless the server knows
/// they have).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Direct {
    pub queue: u64,
    pub mem: u64,
    pub wait_ns: u64,
}

/// `Direct::wait_ns` of a blocking transfer: as long as the commands before it take.
pub const WAIT_ALL: u64 = u64::MAX;

/// A `DIRECT` answer meaning "use the ordinary path" (which then reports any error exactly as
/// the driver does).
pub const DIRECT_DECLINED: i32 = 1;

impl Message<'_> for Direct {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.mem);
        w.u64(self.wait_ns);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Direct {
            queue: r.u64()?,
            mem: r.u64()?,
            wait_ns: r.u64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn collections_roundtrip() {
        roundtrip(&Collect {
            reads: vec![1, 2, 3],
        });
        roundtrip(&Collect { reads: vec![] });
        roundtrip(&CollectReply {
            reads: vec![
                (1, Collected::Pending),
                (2, Collected::Done(b"data")),
                (3, Collected::Failed),
                (4, Collected::Done(b"")),
                (5, Collected::Part(b"first")),
                (6, Collected::Part(b"")),
            ],
        });
        roundtrip(&CollectReply { reads: vec![] });
        let mut b = body(&CollectReply {
            reads: vec![(1, Collected::Pending)],
        })
        .to_vec();
        b[12] = 5; // the state
        assert!(CollectReply::decode_all(&b).is_err());
    }

    #[test]
    fn staged_pieces_carry_their_bytes_after_the_header() {
        let head = Stage {
            id: 1,
            total: 10,
            offset: 4,
            len: 3,
        };
        assert_eq!(roundtrip(&head).len(), 4 * 8);
        let mut b = body(&head).to_vec();
        b.extend_from_slice(b"abc");
        let mut r = Reader::new(&b);
        let h = Stage::decode(&mut r).unwrap();
        assert_eq!(h.data(&mut r).unwrap(), b"abc");
        r.finish().unwrap();
        let mut r = Reader::new(&b[..b.len() - 1]);
        let h = Stage::decode(&mut r).unwrap();
        assert!(h.data(&mut r).is_err());
    }

    #[test]
    fn svm_synchronisations_roundtrip() {
        roundtrip(&SvmPush {
            runs: vec![(0x1000, b"ab"), (0x2000, b"")],
        });
        roundtrip(&SvmPull {
            ranges: vec![(0x1000, 2), (0x2000, 0)],
        });
        roundtrip_open_ended(&Ok::<_, i32>(SvmPulled {
            ranges: vec![b"ab", b"", b"c"],
        }));
        roundtrip(&Err::<SvmPulled, _>(-30));
        roundtrip(&Direct {
            queue: 1,
            mem: 2,
            wait_ns: WAIT_ALL,
        });
    }
}
