//! Frames with attached file descriptors over a Unix socket (SCM_RIGHTS): how a session's
//! shared region reaches the client.

use crate::link::eof_is_gone;
use crate::TransportError;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use wormhole_wire::{FrameHeader, HEADER_LEN};

/// Sends one frame with `fds` attached to its first byte.
pub fn send_frame_with_fds(
    s: &UnixStream,
    frame: &[u8],
    fds: &[RawFd],
) -> Result<(), TransportError> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(frame)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if n < frame.len() {
        let mut rest = &frame[n..];
        std::io::copy(&mut rest, &mut &*s).map_err(eof_is_gone)?;
    }
    Ok(())
}

/// Receives one frame and the descriptors attached to it (at most 4).
pub fn recv_frame_with_fds(
    s: &UnixStream,
    body: &mut Vec<u8>,
) -> Result<(FrameHeader, Vec<OwnedFd>), TransportError> {
    let mut h = [0u8; HEADER_LEN];
    let mut fds = Vec::new();
    let mut got = 0;
    let mut cmsg_space = nix::cmsg_space!([RawFd; 4]);
    while got < HEADER_LEN {
        let mut iov = [IoSliceMut::new(&mut h[got..])];
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        if msg.bytes == 0 {
            return Err(TransportError::PeerGone);
        }
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(list) = c {
                // SAFETY: the kernel just installed these descriptors for us; we own them now.
                fds.extend(
                    list.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        got += msg.bytes;
    }
    let header = FrameHeader::decode(&h)?;
    body.clear();
    body.resize(header.len as usize, 0);
    (&*s).read_exact(body).map_err(eof_is_gone)?;
    Ok((header, fds))
}
