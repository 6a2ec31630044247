//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_ack_cq_events`).

use std::sync::Arc;

use super::context::Shared;
use super::error::{Result, VerbsError};
pub(crate) use crate::endpoint::cq::CqShared;
use crate::transport::Completion;

/// A work completion (`struct ibv_wc`).
pub type WorkCompletion = Completion;

/// A completion queue. Cloning gives another handle to the same CQ.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqShared>,
    pub(crate) shared: Arc<Shared>,
}

impl CompletionQueue {
    /// `ibv_poll_cq`: move up to `out.len()` completions into `out`; returns how many.
    ///
    /// An empty CQ drives the transport on the caller's thread first (receive, timers, transmit),
    /// so an application that busy-polls needs no thread hop on its latency path.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let n = self.inner.pop_into(out)?;
        if n > 0 || out.is_empty() {
            self.shared.note_app(std::time::Instant::now());
            return Ok(n);
        }
        self.shared.try_drive();
        Ok(self.inner.pop_into(out)?)
    }

    /// Poll one completion.
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut c = [Completion::default()];
        Ok((self.poll(&mut c)? == 1).then_some(c[0]))
    }

    /// `ibv_req_notify_cq`: arm the CQ's channel for the next completion (or the next solicited
    /// or error one). One-shot, as in verbs.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(VerbsError::InvalidArgument("CQ has no completion channel"));
        }
        // Arming means the application means to sleep: its progress thread takes over now.
        self.shared.app_blocking();
        self.inner.arm(solicited_only);
        Ok(())
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.inner.ack_events(n);
    }

    /// Capacity (`cq->cqe`).
    pub fn capacity(&self) -> usize {
        self.inner.cap()
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ibv_destroy_cq`: fails with [`VerbsError::Busy`] (EBUSY), handing the CQ back, while a
    /// QP uses it or channel events are unacknowledged. Other handles to a destroyed CQ can
    /// still poll what it holds, but no QP can be created on it.
    pub fn destroy(self) -> std::result::Result<(), (VerbsError, CompletionQueue)> {
        match self.inner.destroy() {
            Ok(()) => Ok(()),
            Err(e) => Err((e.into(), self)),
        }
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.inner.is_destroyed()
    }

    /// True once the CQ overran (then [`CompletionQueue::poll`] fails with `CqOverrun`).
    pub fn is_overrun(&self) -> bool {
        self.inner.is_overrun()
    }

    /// Identity of the CQ (stable across clones).
    pub fn id(&self) -> u32 {
        self.inner.id
    }
}

impl PartialEq for CompletionQueue {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CompletionQueue({}, cap {})",
            self.inner.id,
            self.inner.cap()
        )
    }
}
