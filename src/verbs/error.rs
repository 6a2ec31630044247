//! Errors of the Verbs API. Each maps to the errno libibverbs would return.

use crate::transport::{MemError, PostError, QpError};

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A parameter is wrong (the text says which); `EINVAL`.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The object is in use (the text says by what); `EBUSY`.
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// A device limit is reached (the text says which); `ENOMEM`.
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    /// No such device or address; `ENODEV`.
    #[error("no such device or address: {0}")]
    NotFound(String),
    /// UDP port 4791 of the device's address is held by something softrdma cannot share it
    /// with: another user, kernel rdma_rxe, a program of its own (`holder` says which). The
    /// device is never moved to another address.
    #[error(
        "UDP port 4791 of {addr} is held by {holder}. RoCEv2 peers send to port 4791, and \
         softrdma shares it only among one user's processes: stop that program, open another \
         device, or have the administrator reserve port 4791 for softrdma (`softrdma holder`, \
         docs/security.md)"
    )]
    AddrInUse {
        /// The device's address.
        addr: std::net::IpAddr,
        /// Who holds the port (uid, pid and command when visible).
        holder: String,
    },
    /// The device's address could not be shared with this user's other processes (an unsafe
    /// state directory, another softrdma version on the address, a stuck registry).
    #[error(transparent)]
    Share(crate::driver::share::ShareError),
    /// A non-blocking channel has no event; `EAGAIN`.
    #[error("operation would block")]
    WouldBlock,
    /// Nothing came within the time given (a wait).
    #[error("nothing came within {0:?}")]
    Timeout(std::time::Duration),
    /// A range is not inside the buffer it is cut from.
    #[error("{start}..{end} is not inside the {what} of {size} bytes")]
    OutOfBounds {
        /// What was cut ("memory region", "remote buffer").
        what: &'static str,
        /// Start of the range asked for.
        start: u64,
        /// End of the range asked for (exclusive).
        end: u64,
        /// Size of the buffer.
        size: u64,
    },
    /// A work request completed with an error ([`WorkCompletion::ok`](super::WorkCompletion::ok)).
    #[error(transparent)]
    Completion(#[from] super::WcError),
    #[error("completion queue overrun: more completions than its capacity")]
    /// More completions came than the CQ holds; `EOVERFLOW`.
    CqOverrun,
    #[error(transparent)]
    /// The QP refused the change (state machine, attribute checks); `EINVAL`.
    Qp(#[from] QpError),
    /// `ibv_post_send`/`ibv_post_recv` refused the work request at `index` of the list (the
    /// `bad_wr`); the ones before it were posted.
    #[error("post failed at work request {index}: {error}")]
    Post {
        /// Index of the first work request not posted.
        index: usize,
        /// Why.
        error: PostError,
    },
    /// An inline send's scatter/gather list could not be read at post time (the `bad_wr` is at
    /// `index`; the ones before it were posted).
    #[error("post failed at work request {index}: inline data: {error}")]
    PostInline {
        /// Index of the first work request not posted.
        index: usize,
        /// Why the data could not be read.
        error: MemError,
    },
    /// The system refused something (a socket, an fd, a thread).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl VerbsError {
    /// The errno libibverbs would report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            VerbsError::InvalidArgument(_) | VerbsError::Qp(_) => libc::EINVAL,
            VerbsError::Busy(_) => libc::EBUSY,
            VerbsError::NoResources(_) => libc::ENOMEM,
            VerbsError::NotFound(_) => libc::ENODEV,
            VerbsError::AddrInUse { .. } => libc::EADDRINUSE,
            VerbsError::Share(e) => e.errno(),
            VerbsError::WouldBlock => libc::EAGAIN,
            VerbsError::Timeout(_) => libc::ETIMEDOUT,
            VerbsError::OutOfBounds { .. } => libc::EINVAL,
            VerbsError::Completion(_) => libc::EIO,
            VerbsError::CqOverrun => libc::EOVERFLOW,
            VerbsError::Post { error, .. } => match error {
                PostError::QueueFull => libc::ENOMEM,
                _ => libc::EINVAL,
            },
            VerbsError::PostInline { .. } => libc::EINVAL,
            VerbsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// For a failed post: the index of the first work request not posted (`bad_wr`).
    pub fn bad_wr(&self) -> Option<usize> {
        match self {
            VerbsError::Post { index, .. } | VerbsError::PostInline { index, .. } => Some(*index),
            _ => None,
        }
    }
}

impl From<crate::driver::share::ShareError> for VerbsError {
    fn from(e: crate::driver::share::ShareError) -> Self {
        use crate::driver::share::ShareError as S;
        match e {
            S::PortHeld { addr, holder } => VerbsError::AddrInUse { addr, holder },
            e => VerbsError::Share(e),
        }
    }
}

impl VerbsError {
    /// An I/O error from the driver, with the sharing error it may carry taken out.
    pub(crate) fn from_io(e: std::io::Error) -> Self {
        match crate::driver::share::ShareError::take(e) {
            Ok(s) => s.into(),
            Err(e) => VerbsError::Io(e),
        }
    }
}

impl From<crate::endpoint::EndpointError> for VerbsError {
    fn from(e: crate::endpoint::EndpointError) -> Self {
        use crate::endpoint::EndpointError as D;
        match e {
            D::NoResources(what) => VerbsError::NoResources(what),
            D::Busy(what) => VerbsError::Busy(what),
            D::CqOverrun => VerbsError::CqOverrun,
            D::Io(e) => VerbsError::Io(e),
        }
    }
}

/// The result of a verb.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
