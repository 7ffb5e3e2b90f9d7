//! Shared virtual memory. SVM pointers travel as the addresses they are: the client mirrors
//! each allocation at the address the server's driver chose.

use super::*;

/// `clSVMAlloc`; answered by an [`SvmAllocReply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvmAlloc {
    pub context: u64,
    pub flags: u64,
    pub size: usize,
    pub alignment: u32,
}

impl Message<'_> for SvmAlloc {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.context);
        w.u64(self.flags);
        w.usize(self.size);
        w.u32(self.alignment);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmAlloc {
            context: r.u64()?,
            flags: r.u64()?,
            size: r.usize()?,
            alignment: r.u32()?,
        })
    }
}

/// The address of the new allocation (0: none was made; clSVMAlloc has no error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvmAllocReply {
    pub ptr: u64,
}

impl Message<'_> for SvmAllocReply {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.ptr);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmAllocReply { ptr: r.u64()? })
    }
}

/// `clSVMFree`; answered by CL_SUCCESS (clSVMFree has no error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvmFree {
    pub context: u64,
    pub ptr: u64,
}

impl Message<'_> for SvmFree {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.context);
        w.u64(self.ptr);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmFree {
            context: r.u64()?,
            ptr: r.u64()?,
        })
    }
}

/// `clEnqueueSVMFree` (without a free callback); answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueSvmFree {
    pub queue: u64,
    pub ptrs: Vec<u64>,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// The client's callback id for the application's free function (0: none, the driver
    /// frees). With one, the application frees the pointers itself when it is called.
    pub callback: u64,
}

impl Message<'_> for EnqueueSvmFree {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.opt_u64s(Some(&self.ptrs));
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.callback);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(EnqueueSvmFree {
            queue: r.u64()?,
            ptrs: u64s(r)?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            callback: r.u64()?,
        })
    }
}

/// Which side of an SVM copy lives in the client's plain memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvmCopy<'a> {
    SvmToSvm,
    /// The source bytes travel with the request.
    HostToSvm(&'a [u8]),
    /// The bytes travel back with the reply.
    SvmToHost,
    /// Plain host memory on both sides: the source bytes travel with the request and come
    /// back as a copy to the host's do, so the device orders the copy (and its event is an
    /// SVM copy's) as natively.
    HostToHost(&'a [u8]),
}

const COPY_SVM_TO_SVM: u8 = 0;
const COPY_HOST_TO_SVM: u8 = 1;
const COPY_SVM_TO_HOST: u8 = 2;
const COPY_HOST_TO_HOST: u8 = 3;

/// `clEnqueueSVMMemcpy` (copies within the client's plain memory never leave it); answered by
/// a [`Reply`]`<`[`SvmCopied`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmMemcpy<'a> {
    pub queue: u64,
    pub blocking: u32,
    pub copy: SvmCopy<'a>,
    pub dst: u64,
    pub src: u64,
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// A non-blocking copy to the host: the id its bytes are collected under (see
    /// [`SvmCopied`]); 0 otherwise.
    pub read: u64,
}

impl<'a> Message<'a> for SvmMemcpy<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u32(self.blocking);
        w.u8(match self.copy {
            SvmCopy::SvmToSvm => COPY_SVM_TO_SVM,
            SvmCopy::HostToSvm(_) => COPY_HOST_TO_SVM,
            SvmCopy::SvmToHost => COPY_SVM_TO_HOST,
            SvmCopy::HostToHost(_) => COPY_HOST_TO_HOST,
        });
        w.u64(self.dst);
        w.u64(self.src);
        w.usize(self.size);
        if let SvmCopy::HostToSvm(data) | SvmCopy::HostToHost(data) = self.copy {
            w.bytes(data);
        }
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.read);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let (queue, blocking, mode) = (r.u64()?, r.u32()?, r.u8()?);
        let (dst, src, size) = (r.u64()?, r.u64()?, r.usize()?);
        let copy = match mode {
            COPY_SVM_TO_SVM => SvmCopy::SvmToSvm,
            COPY_HOST_TO_SVM => SvmCopy::HostToSvm(r.bytes()?),
            COPY_SVM_TO_HOST => SvmCopy::SvmToHost,
            COPY_HOST_TO_HOST => SvmCopy::HostToHost(r.bytes()?),
            _ => return Err(DecodeError::BadValue("SVM copy direction")),
        };
        Ok(SvmMemcpy {
            queue,
            blocking,
            copy,
            dst,
            src,
            size,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            read: r.u64()?,
        })
    }
}

/// A successful SVM copy: for a blocking copy to the host, the header of its bytes, which
/// follow it unprefixed (see [`SvmCopied::data`]); nothing otherwise (a non-blocking copy's
/// bytes are collected under the request's `read` id at a synchronisation point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvmCopied {
    pub to_host: Option<u64>,
}

impl SvmCopied {
    /// The bytes of a copy to the host, which follow the header just decoded from `r`.
    pub fn data<'a>(&self, r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
        self.to_host.map(|n| r.raw(n)).transpose()
    }
}

impl Message<'_> for SvmCopied {
    fn encode(&self, w: &mut Writer) {
        if let Some(n) = self.to_host {
            w.u64(n);
        }
    }
    /// The reply of a copy to the host goes on (its length is implied by the request).
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmCopied {
            to_host: if r.remaining() > 0 {
                Some(r.u64()?)
            } else {
                None
            },
        })
    }
}

/// `clEnqueueSVMMemFill`; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmMemFill<'a> {
    pub queue: u64,
    pub ptr: u64,
    pub pattern: &'a [u8],
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
}

impl<'a> Message<'a> for SvmMemFill<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.ptr);
        w.bytes(self.pattern);
        w.usize(self.size);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(SvmMemFill {
            queue: r.u64()?,
            ptr: r.u64()?,
            pattern: r.bytes()?,
            size: r.usize()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
        })
    }
}

/// `clEnqueueSVMMap` (always blocking on the server, so the bytes travel with the reply);
/// answered by a [`Reply`]`<`[`SvmMapped`]`>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmMap {
    pub queue: u64,
    pub blocking: u32,
    pub flags: u64,
    pub ptr: u64,
    pub size: usize,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// The id a non-blocking map's bytes are collected under.
    pub read: u64,
}

impl Message<'_> for SvmMap {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u32(self.blocking);
        w.u64(self.flags);
        w.u64(self.ptr);
        w.usize(self.size);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.u64(self.read);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmMap {
            queue: r.u64()?,
            blocking: r.u32()?,
            flags: r.u64()?,
            ptr: r.u64()?,
            size: r.usize()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            read: r.u64()?,
        })
    }
}

/// The mapped bytes (none for an invalidating map), or word that they come later (a
/// non-blocking map: collected under the request's `read` id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvmMapped<'a> {
    pub deferred: bool,
    pub data: &'a [u8],
}

impl<'a> Message<'a> for SvmMapped<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u8(self.deferred as u8);
        w.bytes(self.data);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(SvmMapped {
            deferred: r.u8()? != 0,
            data: r.bytes()?,
        })
    }
}

/// `clEnqueueSVMUnmap`: the bytes of a writing map travel back with it; answered by the
/// status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmUnmap<'a> {
    pub queue: u64,
    pub ptr: u64,
    pub data: Option<&'a [u8]>,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
}

impl<'a> Message<'a> for SvmUnmap<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.u64(self.ptr);
        w.opt_bytes(self.data);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(SvmUnmap {
            queue: r.u64()?,
            ptr: r.u64()?,
            data: r.opt_bytes_ref()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
        })
    }
}

/// `clSetKernelArgSVMPointer`; answered by the status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetKernelArgSvmPointer {
    pub kernel: u64,
    pub index: u32,
    pub ptr: u64,
}

impl Message<'_> for SetKernelArgSvmPointer {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.kernel);
        w.u32(self.index);
        w.u64(self.ptr);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SetKernelArgSvmPointer {
            kernel: r.u64()?,
            index: r.u32()?,
            ptr: r.u64()?,
        })
    }
}

/// `clSetKernelExecInfo`; answered by the status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetKernelExecInfo<'a> {
    pub kernel: u64,
    pub param: u32,
    pub value: &'a [u8],
}

impl<'a> Message<'a> for SetKernelExecInfo<'a> {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.kernel);
        w.u32(self.param);
        w.bytes(self.value);
    }
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Ok(SetKernelExecInfo {
            kernel: r.u64()?,
            param: r.u32()?,
            value: r.bytes()?,
        })
    }
}

/// `clEnqueueSVMMigrateMem`; answered by the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvmMigrateMem {
    pub queue: u64,
    pub ptrs: Vec<u64>,
    /// One size per pointer (None: NULL, whole allocations).
    pub sizes: Option<Vec<u64>>,
    pub flags: u64,
    pub wait: Option<Vec<u64>>,
    pub event: u64,
    /// A migration to the host: per range of coarse-grained memory, a read id and the
    /// range's length (0: none), under which the bytes reach the client's mirror once the
    /// migration completes (empty otherwise).
    pub host_reads: Vec<u64>,
    pub host_lens: Vec<u64>,
}

impl Message<'_> for SvmMigrateMem {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.queue);
        w.opt_u64s(Some(&self.ptrs));
        w.opt_u64s(self.sizes.as_deref());
        w.u64(self.flags);
        w.opt_u64s(self.wait.as_deref());
        w.u64(self.event);
        w.opt_u64s(Some(&self.host_reads));
        w.opt_u64s(Some(&self.host_lens));
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SvmMigrateMem {
            queue: r.u64()?,
            ptrs: u64s(r)?,
            sizes: r.opt_u64s()?,
            flags: r.u64()?,
            wait: r.opt_u64s()?,
            event: r.u64()?,
            host_reads: u64s(r)?,
            host_lens: u64s(r)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn allocations_roundtrip() {
        roundtrip(&SvmAlloc {
            context: 1,
            flags: 2,
            size: 3,
            alignment: 4,
        });
        roundtrip(&SvmAllocReply { ptr: 0x7f00_0000 });
        roundtrip(&SvmFree { context: 1, ptr: 2 });
        roundtrip(&EnqueueSvmFree {
            queue: 1,
            ptrs: vec![2, 3],
            wait: Some(vec![4]),
            event: 5,
            callback: 6,
        });
        roundtrip(&SvmMigrateMem {
            queue: 1,
            ptrs: vec![2],
            sizes: Some(vec![3]),
            flags: 4,
            wait: None,
            event: 0,
            host_reads: vec![7],
            host_lens: vec![3],
        });
        roundtrip(&SvmMigrateMem {
            queue: 1,
            ptrs: vec![2, 3],
            sizes: None,
            flags: 0,
            wait: Some(vec![5]),
            event: 6,
            host_reads: vec![],
            host_lens: vec![],
        });
    }

    #[test]
    fn copies_roundtrip() {
        for copy in [
            SvmCopy::SvmToSvm,
            SvmCopy::HostToSvm(b"host"),
            SvmCopy::SvmToHost,
            SvmCopy::HostToHost(b"both"),
        ] {
            roundtrip(&SvmMemcpy {
                queue: 1,
                blocking: 1,
                copy,
                dst: 2,
                src: 3,
                size: 4,
                wait: Some(vec![5]),
                event: 6,
                read: 7,
            });
        }
        let mut b = body(&SvmMemcpy {
            queue: 1,
            blocking: 0,
            copy: SvmCopy::SvmToSvm,
            dst: 2,
            src: 3,
            size: 4,
            wait: None,
            event: 0,
            read: 0,
        })
        .to_vec();
        b[12] = 7; // the direction
        assert!(SvmMemcpy::decode_all(&b).is_err());

        roundtrip_open_ended(&Ok::<_, i32>(SvmCopied { to_host: Some(4) }));
        roundtrip(&Ok::<_, i32>(SvmCopied { to_host: None }));
        roundtrip(&Err::<SvmCopied, _>(-30));
        let mut w = Writer::new(0);
        Ok::<_, i32>(SvmCopied { to_host: Some(2) }).encode(&mut w);
        w.filled_by(2, |p| {
            // SAFETY: `filled_by` hands out room for the 2 bytes written.
            unsafe { p.write_bytes(7, 2) };
            Ok::<(), ()>(())
        })
        .unwrap();
        let mut r = Reader::new(w.body());
        let c = Reply::<SvmCopied>::decode(&mut r).unwrap().unwrap();
        assert_eq!(c.data(&mut r).unwrap(), Some(&[7u8, 7][..]));
        r.finish().unwrap();
    }

    #[test]
    fn fills_maps_and_arguments_roundtrip() {
        roundtrip(&SvmMemFill {
            queue: 1,
            ptr: 2,
            pattern: b"\x01\x02",
            size: 8,
            wait: None,
            event: 3,
        });
        roundtrip(&SvmMap {
            queue: 1,
            blocking: 1,
            flags: 2,
            ptr: 3,
            size: 4,
            wait: Some(vec![5]),
            event: 6,
            read: 7,
        });
        roundtrip(&Ok::<_, i32>(SvmMapped {
            deferred: false,
            data: b"mapped",
        }));
        roundtrip(&Ok::<_, i32>(SvmMapped {
            deferred: true,
            data: b"",
        }));
        roundtrip(&Err::<SvmMapped, _>(-5));
        roundtrip(&SvmUnmap {
            queue: 1,
            ptr: 2,
            data: Some(b"back"),
            wait: None,
            event: 0,
        });
        roundtrip(&SvmUnmap {
            queue: 1,
            ptr: 2,
            data: None,
            wait: Some(vec![3]),
            event: 4,
        });
        roundtrip(&SetKernelArgSvmPointer {
            kernel: 1,
            index: 2,
            ptr: 3,
        });
        roundtrip(&SetKernelExecInfo {
            kernel: 1,
            param: 0x11B6,
            value: &[0; 16],
        });
    }
}
