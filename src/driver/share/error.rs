//! Why a device address could not be shared: each error names what it found and what to do.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

/// Why a context could not join its address's group (see `driver::share`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShareError {
    /// The directory where softrdma keeps its registries is not private to this user (another
    /// user owns it, others may write in it, or it is a symbolic link): it is never used.
    #[error(
        "softrdma's state directory {path} is not safe to use: {why}. softrdma keeps its device \
         registry there and refuses it; remove it (it may have been planted by another user), or \
         set XDG_RUNTIME_DIR (or TMPDIR) to a directory only you can write"
    )]
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// UDP port 4791 of the address is bound by something that is not a softrdma process of
    /// this user (another user, kernel rdma_rxe, another program): the device stays on its
    /// address and is not opened.
    #[error(
        "UDP port 4791 of {addr} is held by {holder}. RoCEv2 peers send to port 4791, and \
         softrdma shares it only among one user's processes: stop that program, open another \
         device, or have the administrator reserve port 4791 for softrdma (`softrdma holder`, \
         docs/security.md)"
    )]
    PortHeld {
        /// The device's address.
        addr: IpAddr,
        /// Who holds the port (uid, pid and command when visible).
        holder: String,
    },
    /// The address's group has a member that speaks another sharing protocol (an older
    /// softrdma) or none: sharing with it would misroute live connections.
    #[error(
        "UDP port 4791 of {addr} is shared with {who}, which {what}. This softrdma speaks sharing \
         protocol {ours} and cannot share an address with it without misrouting connections: \
         stop that process, or run every program on this address with one softrdma version"
    )]
    OtherVersion {
        /// The address.
        addr: IpAddr,
        /// The stranger's process(es).
        who: String,
        /// What it speaks, as its probe answers tell.
        what: String,
        /// The sharing protocol this build speaks.
        ours: u8,
    },
    /// Port 4791 is privileged on this host (`net.ipv4.ip_unprivileged_port_start` above it:
    /// the administrator reserved it for softrdma) and the softrdma holder did not give this
    /// user a socket.
    #[error(
        "UDP port 4791 of {addr} is reserved on this host (a privileged port) and {why}; the \
         administrator runs `softrdma holder` to hand it to softrdma users (docs/security.md)"
    )]
    Reserved {
        /// The address.
        addr: IpAddr,
        /// Why no socket came from the holder.
        why: String,
    },
    /// The registry's lock stayed taken (a process stopped while changing it).
    #[error("the softrdma registry of {addr} stayed locked for {secs} s (a process stopped while changing it?)")]
    Locked {
        /// The address.
        addr: IpAddr,
        /// How long it waited.
        secs: u64,
    },
}

impl ShareError {
    /// The `errno` libibverbs would give.
    pub fn errno(&self) -> i32 {
        match self {
            ShareError::UnsafeDir { .. } => libc::EACCES,
            ShareError::PortHeld { .. } | ShareError::OtherVersion { .. } => libc::EADDRINUSE,
            ShareError::Reserved { .. } => libc::EACCES,
            ShareError::Locked { .. } => libc::EBUSY,
        }
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            ShareError::UnsafeDir { .. } | ShareError::Reserved { .. } => {
                io::ErrorKind::PermissionDenied
            }
            ShareError::PortHeld { .. } | ShareError::OtherVersion { .. } => {
                io::ErrorKind::AddrInUse
            }
            ShareError::Locked { .. } => io::ErrorKind::TimedOut,
        }
    }

    /// The `ShareError` inside an I/O error made by `From`, if it is one.
    pub(crate) fn take(e: io::Error) -> Result<ShareError, io::Error> {
        if e.get_ref().is_some_and(|r| r.is::<ShareError>()) {
            let inner = e.into_inner().expect("checked");
            return Ok(*inner.downcast::<ShareError>().expect("checked"));
        }
        Err(e)
    }
}

impl From<ShareError> for io::Error {
    fn from(e: ShareError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}
