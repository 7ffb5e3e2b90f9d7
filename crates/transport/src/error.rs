use wormhole_wire::{DecodeError, FrameTooLarge};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The other side is gone (process exited, socket closed, session ended).
    #[error("peer is gone")]
    PeerGone,
    /// The peer wrote control words that cannot be right: the session is poisoned.
    #[error("shared ring corrupted: {0}")]
    Corrupt(&'static str),
    #[error("malformed frame: {0}")]
    Frame(#[from] DecodeError),
    /// A frame this side was about to send exceeds the limit; nothing was sent.
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
    #[error("shared region layout invalid: {0}")]
    Layout(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl From<nix::Error> for TransportError {
    fn from(e: nix::Error) -> Self {
        TransportError::Io(std::io::Error::from(e))
    }
}
