//! Asynchronous events (`ibv_get_async_event`): errors that belong to no work request.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// `struct ibv_async_event`, for the events this device raises.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overran (more completions than its capacity) and is in error.
    CqErr {
        /// The CQ's [`id`](crate::verbs::CompletionQueue::id).
        cq: u32,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state by itself (a transport error).
    QpFatal {
        /// The QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: a WQE taken from the SRQ (its
    /// [`id`](crate::verbs::SharedReceiveQueue::id)) left fewer than its armed limit; the limit is
    /// now disarmed (0) until [`modify`](crate::verbs::SharedReceiveQueue::modify) arms it again.
    SrqLimitReached {
        /// The SRQ's [`id`](crate::verbs::SharedReceiveQueue::id).
        srq: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on a shared receive queue entered the error state
    /// (by a verb, the CM or a transport error); it takes no more WQEs from the SRQ.
    QpLastWqeReached {
        /// The QP number.
        qp_num: u32,
    },
}

/// Events kept when nobody reads them; the oldest go first.
const MAX_QUEUED: usize = 4096;

/// The context's queue of async events, with an eventfd (`ibv_context.async_fd`) that holds one
/// count per queued event, so the queue can sit in `poll`/`epoll` as libibverbs' does.
pub(crate) struct AsyncQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
    fd: Option<OwnedFd>,
}

impl Default for AsyncQueue {
    fn default() -> Self {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        AsyncQueue {
            q: Mutex::new(VecDeque::new()),
            fd,
        }
    }
}

impl AsyncQueue {
    pub(crate) fn push(&self, e: AsyncEvent) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= MAX_QUEUED {
            // The dropped event's count stays in the eventfd; `pop` tolerates the surplus.
            q.pop_front();
        } else if let Some(fd) = &self.fd {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        }
        q.push_back(e);
    }

    pub(crate) fn pop(&self) -> Option<AsyncEvent> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let e = q.pop_front()?;
        if let Some(fd) = &self.fd {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd. It does not block: the
            // queue held `e`, so the count is at least 1.
            unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
        Some(e)
    }

    /// The eventfd: readable while an event is queued (-1 if it could not be created).
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}
