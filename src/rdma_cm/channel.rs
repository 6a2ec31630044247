//! The event channel (`rdma_create_event_channel`): a queue of events with a pollable fd that is
//! readable exactly while events wait, for epoll together with completion channels.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::error::{CmaError, Result};
use super::event::{CmEvent, EventType, RawEvent};
use super::id::{CmId, IdInner};
use crate::cm::service_id::PortSpace;

pub(crate) struct ChannelInner {
    q: Mutex<VecDeque<RawEvent>>,
    cv: Condvar,
    fd: OwnedFd,
    nonblocking: AtomicBool,
}

impl ChannelInner {
    /// Queue an event; the fd becomes readable.
    pub(crate) fn push(&self, ev: RawEvent) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(ev);
        if q.len() == 1 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const _, 8) };
        }
        drop(q);
        self.cv.notify_all();
    }

    fn pop(&self, q: &mut VecDeque<RawEvent>) -> Option<RawEvent> {
        let ev = q.pop_front()?;
        if q.is_empty() {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd, which holds 1 (the
            // queue was not empty), so the read does not block.
            unsafe { libc::read(self.fd.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
        }
        Some(ev)
    }

    /// Take out the queued (not yet returned) events of `id`; the caller drops them after
    /// releasing its locks.
    pub(crate) fn purge(&self, id: &Arc<IdInner>) -> Vec<RawEvent> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let had = !q.is_empty();
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(q.len());
        for ev in q.drain(..) {
            if Arc::ptr_eq(ev.id.inner(), id)
                || ev
                    .listen_id
                    .as_ref()
                    .is_some_and(|l| Arc::ptr_eq(l.inner(), id))
            {
                out.push(ev);
            } else {
                keep.push_back(ev);
            }
        }
        *q = keep;
        // The eventfd holds 1 exactly while the queue is not empty, so it is read only then
        // (the fd is blocking: see `EventChannel::new`).
        if had && q.is_empty() {
            let mut v: u64 = 0;
            // SAFETY: as in `pop`.
            unsafe { libc::read(self.fd.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
        }
        out
    }
}

/// An event channel. Ids created on it report their events here. Clones share the channel.
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::os::fd::AsFd for EventChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl std::os::fd::AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`.
    ///
    /// # Errors
    /// [`CmaError::Io`] if no eventfd can be made.
    pub fn new() -> Result<EventChannel> {
        // Blocking, so that a program that sets O_NONBLOCK on the fd itself (as librdmacm's
        // callers do to make `rdma_get_cm_event` non-blocking) can be told apart; the channel
        // reads it only while it holds 1, so no read of ours ever waits.
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                q: Mutex::new(VecDeque::new()),
                cv: Condvar::new(),
                fd,
                nonblocking: AtomicBool::new(false),
            }),
        })
    }

    /// `rdma_create_id`: a new id in port space `ps` (TCP: RC connections; UDP: UD with SIDR).
    ///
    /// # Errors
    /// [`CmaError::Io`] if the id's resources cannot be made.
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId> {
        CmId::new(&self.inner, ps)
    }

    /// The fd to poll: readable while an event waits.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Make [`EventChannel::get_cm_event`] return [`CmaError::WouldBlock`] instead of waiting
    /// (as `fcntl(channel->fd, F_SETFL, O_NONBLOCK)` does in C).
    ///
    /// # Errors
    /// None today (a `Result` as librdmacm's `fcntl` has).
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.inner.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// `rdma_get_cm_event`: the next event; waits for one unless the channel is non-blocking.
    ///
    /// # Errors
    /// [`CmaError::WouldBlock`] on a non-blocking channel with no event.
    pub fn get_cm_event(&self) -> Result<CmEvent> {
        let nb = self.inner.nonblocking.load(Ordering::Relaxed);
        let mut q = self.inner.q.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(ev) = self.inner.pop(&mut q) {
                drop(q);
                return Ok(CmEvent::new(ev));
            }
            if nb {
                return Err(CmaError::WouldBlock);
            }
            q = self.inner.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next event, waiting at most `timeout`; `None` if none came.
    pub fn get_cm_event_timeout(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = Instant::now() + timeout;
        let mut q = self.inner.q.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(ev) = self.inner.pop(&mut q) {
                drop(q);
                return Some(CmEvent::new(ev));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self
                .inner
                .cv
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Wait for an event of type `want` on any id, failing with the unexpected event otherwise
    /// (the pattern of every rdma_cm example's `wait_event`).
    ///
    /// # Errors
    /// [`WaitError::Timeout`] if nothing came in time; [`WaitError::Unexpected`] with the event that came instead.
    pub fn wait_event(
        &self,
        want: EventType,
        timeout: Duration,
    ) -> std::result::Result<CmEvent, WaitError> {
        match self.get_cm_event_timeout(timeout) {
            Some(ev) if ev.event() == want => Ok(ev),
            Some(ev) => Err(WaitError::Unexpected(ev)),
            None => Err(WaitError::Timeout),
        }
    }
}

/// [`EventChannel::wait_event`] did not see the event it wanted.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("unexpected event {:?} (status {})", .0.event(), .0.status())]
    /// Another event came (it is in here, unacknowledged until dropped).
    Unexpected(CmEvent),
    #[error("no event in time")]
    /// No event came in time.
    Timeout,
}
