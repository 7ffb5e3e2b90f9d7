//! Buffer and image creation. The host data of USE/COPY_HOST_PTR travels with the request: after
//! its header, or staged before it when the two do not fit one frame ([`WriteData`]).

use super::*;

/// `clCreateBuffer`; answered by a [`CreateBufferReply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateBuffer {
    /// The id the client chose for the new buffer.
    pub new_id: u64,
    pub context: u64,
    pub flags: u64,
    pub size: usize,
    /// The application passed a host pointer (whether or not its data travels).
    pub host_ptr: bool,
    /// The host pointer, when it lies in the session's shared virtual memory (0: it does not):
    /// the buffer then uses that memory, at the same address on the server.
    pub svm_ptr: u64,
    /// The host data (USE/COPY_HOST_PTR), `size` bytes (inline data follows the header).
    pub data: WriteData,
}

impl CreateBuffer {
    fn encode_with(&self, w: &mut Writer, props: Option<Option<&[u64]>>) {
        w.u64(self.new_id);
        w.u64(self.context);
        if let Some(p) = props {
            w.opt_u64s(p);
        }
        w.u64(self.flags);
        w.usize(self.size);
        w.bool(self.host_ptr);
        w.u64(self.svm_ptr);
        self.data.encode(w);
    }

    /// Decodes the buffer, and the property list between its context and flags if
    /// `with_props`.
    fn decode_with(
        r: &mut Reader<'_>,
        with_props: bool,
    ) -> Result<(Self, Option<Vec<u64>>), DecodeError> {
        let (new_id, context) = (r.u64()?, r.u64()?);
        let props = if with_props { decode_props(r)? } else { None };
        let b = CreateBuffer {
            new_id,
            context,
            flags: r.u64()?,
            size: r.usize()?,
            host_ptr: r.bool()?,
            svm_ptr: r.u64()?,
            data: WriteData::decode(r)?,
        };
        Ok((b, props))
    }
}

impl Message<'_> for CreateBuffer {
    fn encode(&self, w: &mut Writer) {
        self.encode_with(w, None);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(CreateBuffer::decode_with(r, false)?.0)
    }
}

/// `clCreateBufferWithProperties`: as [`CreateBuffer`], with the property list after the
/// context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateBufferWithProperties {
    /// Zero-terminated (None: NULL).
    pub props: Option<Vec<u64>>,
    pub buffer: CreateBuffer,
}

impl Message<'_> for CreateBufferWithProperties {
    fn encode(&self, w: &mut Writer) {
        self.buffer.encode_with(w, Some(self.props.as_deref()));
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let (buffer, props) = CreateBuffer::decode_with(r, true)?;
        Ok(CreateBufferWithProperties { props, buffer })
    }
}

/// The answer to a buffer creation: the status, and where the buffer's bytes lie in the
/// session's shared arena if they do (for the client's own copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateBufferReply {
    pub status: i32,
    pub window: Option<u64>,
}

impl Message<'_> for CreateBufferReply {
    fn encode(&self, w: &mut Writer) {
        w.i32(self.status);
        put_window(w, self.window);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(CreateBufferReply {
            status: r.i32()?,
            window: window(r)?,
        })
    }
}

/// An image's format and shape as `cl_image_desc` gives them (the deprecated 2D/3D creations
/// send one too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageDesc {
    pub image_type: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub array_size: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    /// The id of the buffer or image it is made from (0: none).
    pub mem_object: u64,
}

impl Message<'_> for ImageDesc {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.image_type);
        for v in [
            self.width,
            self.height,
            self.depth,
            self.array_size,
            self.row_pitch,
            self.slice_pitch,
        ] {
            w.usize(v);
        }
        w.u32(self.num_mip_levels);
        w.u32(self.num_samples);
        w.u64(self.mem_object);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ImageDesc {
            image_type: r.u32()?,
            width: r.usize()?,
            height: r.usize()?,
            depth: r.usize()?,
            array_size: r.usize()?,
            row_pitch: r.usize()?,
            slice_pitch: r.usize()?,
            num_mip_levels: r.u32()?,
            num_samples: r.u32()?,
            mem_object: r.u64()?,
        })
    }
}

/// Every image creation (`clCreateImage`, `...WithProperties`, `clCreateImage2D/3D`) has this
/// one form; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateImage {
    pub new_id: u64,
    pub context: u64,
    /// Zero-terminated (None: NULL, and always None for the calls without properties).
    pub props: Option<Vec<u64>>,
    pub flags: u64,
    /// `cl_image_format`: channel order and type (None: NULL).
    pub format: Option<[u32; 2]>,
    pub desc: Option<ImageDesc>,
    /// The application passed a host pointer (whether or not its data travels).
    pub host_ptr: bool,
    /// The host data the descriptor implies (USE/COPY_HOST_PTR; inline data follows the
    /// header).
    pub data: WriteData,
}

impl Message<'_> for CreateImage {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.new_id);
        w.u64(self.context);
        w.opt_u64s(self.props.as_deref());
        w.u64(self.flags);
        w.bool(self.format.is_some());
        if let Some([order, ty]) = self.format {
            w.u32(order);
            w.u32(ty);
        }
        w.bool(self.desc.is_some());
        if let Some(d) = &self.desc {
            d.encode(w);
        }
        w.bool(self.host_ptr);
        self.data.encode(w);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(CreateImage {
            new_id: r.u64()?,
            context: r.u64()?,
            props: decode_props(r)?,
            flags: r.u64()?,
            format: if r.bool()? {
                Some([r.u32()?, r.u32()?])
            } else {
                None
            },
            desc: if r.bool()? {
                Some(ImageDesc::decode(r)?)
            } else {
                None
            },
            host_ptr: r.bool()?,
            data: WriteData::decode(r)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn buffers_roundtrip() {
        let b = CreateBuffer {
            new_id: 1,
            context: 2,
            flags: 3,
            size: 4,
            host_ptr: true,
            svm_ptr: 0,
            data: WriteData::Inline(4),
        };
        roundtrip(&b);
        roundtrip(&CreateBuffer {
            host_ptr: false,
            svm_ptr: 0x1000,
            data: WriteData::Absent,
            ..b.clone()
        });
        let with = CreateBufferWithProperties {
            props: Some(vec![9, 8, 0]),
            buffer: b.clone(),
        };
        roundtrip(&with);
        roundtrip(&CreateBufferWithProperties {
            props: None,
            buffer: CreateBuffer {
                data: WriteData::Staged { id: 5, len: 4 },
                ..b.clone()
            },
        });
        // The property list sits between context and flags, and must be terminated.
        let mut w = Writer::new(0);
        b.encode_with(&mut w, Some(Some(&[1, 2])));
        assert!(CreateBufferWithProperties::decode_all(w.body()).is_err());
        roundtrip(&CreateBufferReply {
            status: 0,
            window: Some(8192),
        });
        roundtrip(&CreateBufferReply {
            status: -61,
            window: None,
        });
    }

    #[test]
    fn images_roundtrip() {
        let desc = ImageDesc {
            image_type: 0x10F1,
            width: 1,
            height: 2,
            depth: 3,
            array_size: 4,
            row_pitch: 5,
            slice_pitch: 6,
            num_mip_levels: 7,
            num_samples: 8,
            mem_object: 9,
        };
        roundtrip(&CreateImage {
            new_id: 1,
            context: 2,
            props: Some(vec![0]),
            flags: 3,
            format: Some([0x10B5, 0x10DE]),
            desc: Some(desc),
            host_ptr: true,
            data: WriteData::Staged { id: 10, len: 6 },
        });
        roundtrip(&CreateImage {
            new_id: 1,
            context: 2,
            props: None,
            flags: 0,
            format: None,
            desc: None,
            host_ptr: false,
            data: WriteData::Absent,
        });
    }
}
