//! Kernel arguments: a value may be a handle of ours (a memory object, sampler or queue), which
//! travels as an id for the server to translate.

use super::*;
use crate::HandleKind;

/// What `arg_value` points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgValue<'a> {
    /// NULL (a local memory argument, or a NULL buffer).
    Null,
    /// `arg_size` plain bytes.
    Bytes(&'a [u8]),
    /// A live object of this session.
    Handle(HandleKind, u64),
}

const ARG_NULL: u8 = 0;
const ARG_BYTES: u8 = 1;
const ARG_HANDLE: u8 = 2;

/// `clSetKernelArg`; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetKernelArg<'a> {
    pub kernel: u64,
    pub index: u32,
    pub size: usize,
    pub value: ArgValue<'a>,
}

impl<'a> Message<'a> for SetKernelArg<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.kernel);
        w.u32(self.index);
        w.usize(self.size);
        match self.value {
            ArgValue::Null => w.u8(ARG_NULL),
            ArgValue::Bytes(b) => {
                w.u8(ARG_BYTES);
                w.bytes(b);
            }
            ArgValue::Handle(kind, id) => {
                w.u8(ARG_HANDLE);
                w.u8(kind as u8);
                w.u64(id);
            }
        }
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let (kernel, index, size) = (r.u64()?, r.u32()?, r.usize()?);
        let value = match r.u8()? {
            ARG_NULL => ArgValue::Null,
            ARG_BYTES => ArgValue::Bytes(r.bytes()?),
            ARG_HANDLE => {
                let kind =
                    HandleKind::from_u8(r.u8()?).ok_or(DecodeError::BadValue("handle kind"))?;
                ArgValue::Handle(kind, r.u64()?)
            }
            _ => return Err(DecodeError::BadValue("kernel argument mode")),
        };
        Ok(SetKernelArg {
            kernel,
            index,
            size,
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn arguments_roundtrip() {
        for value in [
            ArgValue::Null,
            ArgValue::Bytes(b"\x01\x00\x00\x00"),
            ArgValue::Handle(HandleKind::Mem, 77),
            ArgValue::Handle(HandleKind::Sampler, 78),
        ] {
            roundtrip(&SetKernelArg {
                kernel: 1,
                index: 2,
                size: 4,
                value,
            });
        }
        let mut b = body(&SetKernelArg {
            kernel: 1,
            index: 2,
            size: 8,
            value: ArgValue::Handle(HandleKind::Mem, 3),
        })
        .to_vec();
        b[21] = 0xEE; // the handle kind
        assert!(SetKernelArg::decode_all(&b).is_err());
        b[20] = 9; // the mode
        assert!(SetKernelArg::decode_all(&b).is_err());
    }
}
