//! Errors of the Verbs API. Each maps to the errno libibverbs would return.

use crate::transport::{MemError, PostError, QpError};

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    #[error("resource busy: {0}")]
    Busy(&'static str),
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    #[error("no such device or address: {0}")]
    NotFound(String),
    /// A pinned device's address (`SOFTRDMA_ADDR`) is held by another endpoint.
    #[error(
        "UDP port 4791 of {0} is in use by another RoCE endpoint (kernel rdma_rxe or another softrdma process)"
    )]
    AddrInUse(std::net::IpAddr),
    #[error("operation would block")]
    WouldBlock,
    #[error("completion queue overrun: more completions than its capacity")]
    CqOverrun,
    #[error(transparent)]
    Qp(#[from] QpError),
    /// `ibv_post_send`/`ibv_post_recv` refused the work request at `index` of the list (the
    /// `bad_wr`); the ones before it were posted.
    #[error("post failed at work request {index}: {error}")]
    Post { index: usize, error: PostError },
    /// An inline send's scatter/gather list could not be read at post time (the `bad_wr` is at
    /// `index`; the ones before it were posted).
    #[error("post failed at work request {index}: inline data: {error}")]
    PostInline { index: usize, error: MemError },
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
            VerbsError::AddrInUse(_) => libc::EADDRINUSE,
            VerbsError::WouldBlock => libc::EAGAIN,
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

pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
