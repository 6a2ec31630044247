//! Completion channels (`ibv_create_comp_channel`, `ibv_get_cq_event`): an eventfd that becomes
//! readable when an armed CQ gets a completion, so it can sit in an epoll set with other fds.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use super::context::Shared;
use super::cq::{CompletionQueue, CqShared};
use super::error::{Result, VerbsError};

pub(crate) struct ChannelShared {
    /// A semaphore eventfd: one count per event.
    fd: OwnedFd,
    events: Mutex<VecDeque<Arc<CqShared>>>,
}

impl ChannelShared {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ChannelShared {
            fd,
            events: Mutex::new(VecDeque::new()),
        })
    }

    pub(crate) fn notify(&self, cq: Arc<CqShared>) {
        self.events.lock().unwrap().push_back(cq);
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

/// A completion channel.
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelShared>,
    pub(crate) shared: Arc<Shared>,
}

impl CompletionChannel {
    /// The fd to put in `epoll`/`poll`: readable while an event is pending.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Make [`CompletionChannel::get_cq_event`] return `WouldBlock` instead of waiting (what the
    /// seeds do with `fcntl(fd, F_SETFL, O_NONBLOCK)`; that works too).
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
            let cq = self
                .inner
                .events
                .lock()
                .unwrap()
                .pop_front()
                .ok_or(VerbsError::WouldBlock)?;
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
