//! Asynchronous events (`ibv_get_async_event`): errors that belong to no work request.

use std::collections::VecDeque;
use std::sync::Mutex;

/// `struct ibv_async_event`, for the events this device raises.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overran (more completions than its capacity) and is in error.
    CqErr { cq: u32 },
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state by itself (a transport error).
    QpFatal { qp_num: u32 },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: a WQE taken from the SRQ (its
    /// [`id`](super::SharedReceiveQueue::id)) left fewer than its armed limit; the limit is
    /// now disarmed (0) until [`modify`](super::SharedReceiveQueue::modify) arms it again.
    SrqLimitReached { srq: u32 },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on a shared receive queue entered the error state
    /// (by a verb, the CM or a transport error); it takes no more WQEs from the SRQ.
    QpLastWqeReached { qp_num: u32 },
}

/// The context's queue of async events.
#[derive(Default)]
pub(crate) struct AsyncQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncQueue {
    pub(crate) fn push(&self, e: AsyncEvent) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: the oldest events go first if nobody reads them.
        if q.len() >= 4096 {
            q.pop_front();
        }
        q.push_back(e);
    }
    pub(crate) fn pop(&self) -> Option<AsyncEvent> {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }
}
