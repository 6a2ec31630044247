//! Errors of the rdma_cm calls, each with the errno librdmacm would set.

use crate::verbs::VerbsError;

/// An rdma_cm call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmaError {
    /// A parameter is wrong (the text says which).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The call does not fit where the id is in its life (connect before the route is
    /// resolved, say); the text says where it is and what comes first.
    #[error("not now: the id {0}")]
    InvalidState(&'static str),
    /// A one-call helper ([`super::Connection`], [`super::Listener`]) waited too long.
    #[error("no {0} event within the timeout")]
    TimedOut(&'static str),
    /// A one-call helper got another event than the one it waited for.
    #[error("waiting for {waiting_for}, got {got} (status {status})")]
    Unexpected {
        /// The event awaited.
        waiting_for: &'static str,
        /// The event that came.
        got: super::EventType,
        /// Its status (negative errno, or the REJ reason).
        status: i32,
    },
    /// The rdma_cm port is taken on that address (another id binds or listens on it).
    #[error("address already in use")]
    AddrInUse,
    #[error("address not available on this host: {0}")]
    /// No device has that address.
    AddrNotAvailable(std::net::IpAddr),
    #[error("no ephemeral port left")]
    /// Every ephemeral rdma_cm port is in use.
    NoPorts,
    #[error("private data of {len} bytes is larger than {max}")]
    /// Private data longer than the message carries.
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message carries.
        max: usize,
    },
    #[error("no RDMA device")]
    /// No RDMA device could be opened, or the id has none yet.
    NoDevice,
    #[error("no event is waiting (non-blocking channel)")]
    /// A non-blocking channel has no event.
    WouldBlock,
    #[error("the id still has {0} event(s) not acknowledged")]
    /// The id still has this many events not acknowledged (drop or `ack` them first).
    Busy(u64),
    #[error("the QP is on another device than the id")]
    /// The QP or PD is on another device than the id.
    WrongDevice,
    #[error(transparent)]
    /// A verb underneath failed.
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    /// The system refused something (an fd, a thread).
    Io(#[from] std::io::Error),
}

impl CmaError {
    /// The errno librdmacm sets for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            CmaError::InvalidArgument(_) | CmaError::InvalidState(_) => libc::EINVAL,
            CmaError::TimedOut(_) => libc::ETIMEDOUT,
            CmaError::Unexpected { .. } => libc::ECONNREFUSED,
            CmaError::AddrInUse => libc::EADDRINUSE,
            CmaError::AddrNotAvailable(_) => libc::EADDRNOTAVAIL,
            CmaError::NoPorts => libc::EADDRNOTAVAIL,
            CmaError::PrivateDataTooLong { .. } => libc::EINVAL,
            CmaError::NoDevice => libc::ENODEV,
            CmaError::WouldBlock => libc::EAGAIN,
            CmaError::Busy(_) => libc::EBUSY,
            CmaError::WrongDevice => libc::EINVAL,
            CmaError::Verbs(e) => e.errno(),
            CmaError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// The result of an rdma_cm call.
pub type Result<T> = std::result::Result<T, CmaError>;

impl From<crate::endpoint::EndpointError> for CmaError {
    fn from(e: crate::endpoint::EndpointError) -> Self {
        CmaError::Verbs(e.into())
    }
}
