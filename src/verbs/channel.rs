//! Completion channels (`ibv_create_comp_channel`, `ibv_get_cq_event`): an eventfd that becomes
//! readable when an armed CQ gets a completion, so it can sit in an epoll set with other fds.

use std::os::fd::RawFd;
use std::sync::Arc;

use super::context::Shared;
use super::cq::CompletionQueue;
use super::error::{Result, VerbsError};
pub(crate) use crate::endpoint::channel::ChannelShared;

/// A completion channel.
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelShared>,
    pub(crate) shared: Arc<Shared>,
}

impl std::os::fd::AsFd for CompletionChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the fd is the channel's own, open as long as `self` (which borrows it).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.inner.fd()) }
    }
}

impl std::os::fd::AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd()
    }
}

impl CompletionChannel {
    /// The fd to put in `epoll`/`poll`: readable while an event is pending.
    pub fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    /// Make [`CompletionChannel::get_cq_event`] return `WouldBlock` instead of waiting (what the
    /// seeds do with `fcntl(fd, F_SETFL, O_NONBLOCK)`; that works too).
    ///
    /// # Errors
    /// [`VerbsError::Io`] if `fcntl` fails.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        let fd = self.fd();
        // SAFETY: fcntl on our own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// `ibv_get_cq_event`: wait for the next event and return the CQ it is for. Each event must
    /// be acknowledged with [`CompletionQueue::ack_events`].
    ///
    /// # Errors
    /// [`VerbsError::WouldBlock`] on a non-blocking channel with no event.
    pub fn get_cq_event(&self) -> Result<CompletionQueue> {
        let mut v: u64 = 0;
        self.shared.app_blocking();
        loop {
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
            let r = unsafe { libc::read(self.fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
            if r != 8 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock => return Err(VerbsError::WouldBlock),
                    _ => return Err(e.into()),
                }
            }
            let cq = self.inner.pop_event().ok_or(VerbsError::WouldBlock)?;
            // An event of a CQ destroyed since is dropped, as rdma-core drops the unread events
            // of a destroyed CQ.
            if cq.take_event() {
                return Ok(CompletionQueue {
                    inner: cq,
                    shared: self.shared.clone(),
                });
            }
        }
    }
}
