//! A completion channel's state: a semaphore eventfd with one count per CQ event, and the CQs of
//! the events in order (an armed CQ that gets a completion adds one).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use super::cq::CqShared;

pub(crate) struct ChannelShared {
    /// A semaphore eventfd: one count per event.
    fd: OwnedFd,
    events: Mutex<VecDeque<Arc<CqShared>>>,
}

impl ChannelShared {
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ChannelShared {
            fd,
            events: Mutex::new(VecDeque::new()),
        })
    }

    /// The eventfd, readable while an event is pending.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The CQ of the oldest event (its count was read from the eventfd).
    pub(crate) fn pop_event(&self) -> Option<Arc<CqShared>> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    pub(crate) fn notify(&self, cq: Arc<CqShared>) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(cq);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}
