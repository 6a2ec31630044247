//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_ack_cq_events`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::channel::ChannelShared;
use super::context::Shared;
use super::error::{Result, VerbsError};
use super::event::{AsyncEvent, AsyncQueue};
use super::quota::QuotaSlot;
use crate::transport::{Completion, WcStatus};

/// A work completion (`struct ibv_wc`).
pub type WorkCompletion = Completion;

impl Default for Completion {
    fn default() -> Self {
        Completion::send(0, WcStatus::GeneralErr, crate::transport::WcOpcode::Send, 0)
    }
}

#[derive(Default)]
struct CqState {
    q: VecDeque<Completion>,
    /// More completions arrived than the CQ holds: the CQ is in error (IBA 11.4.2.1).
    overrun: bool,
    /// Armed by `req_notify`: `Some(solicited_only)`.
    armed: Option<bool>,
    /// Events `get_cq_event` returned (an event still queued on the channel is not counted: as
    /// in rdma-core, destroying the CQ discards it instead of waiting for it).
    events_delivered: u64,
    events_acked: u64,
    destroyed: bool,
}

pub(crate) struct CqShared {
    /// This CQ's share of `max_cq`, held until the last handle and QP let go of it.
    _slot: QuotaSlot,
    pub id: u32,
    cap: usize,
    state: Mutex<CqState>,
    pub(crate) channel: Option<Arc<ChannelShared>>,
    /// QPs using this CQ.
    pub(crate) qp_refs: AtomicU32,
    async_events: Arc<AsyncQueue>,
}

impl CqShared {
    pub(crate) fn new(
        slot: QuotaSlot,
        id: u32,
        cap: usize,
        channel: Option<Arc<ChannelShared>>,
        async_events: Arc<AsyncQueue>,
    ) -> Self {
        CqShared {
            _slot: slot,
            id,
            cap,
            state: Mutex::new(CqState::default()),
            channel,
            qp_refs: AtomicU32::new(0),
            async_events,
        }
    }

    /// Counts an event `get_cq_event` took off the channel; false (the event is dropped) if
    /// the CQ was destroyed meanwhile.
    pub(crate) fn take_event(&self) -> bool {
        let mut st = self.state();
        if st.destroyed {
            return false;
        }
        st.events_delivered += 1;
        true
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CqState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a completion (called by the engine). A full CQ overruns, as on hardware.
    pub(crate) fn push(self: &Arc<Self>, c: Completion) {
        let mut st = self.state();
        if st.overrun {
            return;
        }
        if st.q.len() >= self.cap {
            // IBA 11.4.2.1 / C11-29: the CQ goes to error and the consumer gets an async event.
            st.overrun = true;
            drop(st);
            self.async_events.push(AsyncEvent::CqErr { cq: self.id });
            return;
        }
        st.q.push_back(c);
        if let Some(solicited_only) = st.armed {
            // IBA 11.4.2.2: a solicited-only request fires on solicited receives and on errors.
            let fire = !solicited_only || c.solicited || c.status != WcStatus::Success;
            if fire {
                st.armed = None;
                drop(st);
                if let Some(ch) = &self.channel {
                    ch.notify(self.clone());
                }
            }
        }
    }

    fn pop_into(&self, out: &mut [Completion]) -> Result<usize> {
        let mut st = self.state();
        if st.overrun {
            return Err(VerbsError::CqOverrun);
        }
        let n = out.len().min(st.q.len());
        for (slot, c) in out.iter_mut().zip(st.q.drain(..n)) {
            *slot = c;
        }
        Ok(n)
    }

    pub(crate) fn len(&self) -> usize {
        self.state().q.len()
    }
}

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
            return Ok(n);
        }
        self.shared.try_drive();
        self.inner.pop_into(out)
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
        let mut st = self.inner.state();
        st.armed = Some(match st.armed {
            // A pending "any" request is not narrowed by a later solicited-only one.
            Some(false) => false,
            _ => solicited_only,
        });
        Ok(())
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        let mut st = self.inner.state();
        st.events_acked = (st.events_acked + n as u64).min(st.events_delivered);
    }

    /// Capacity (`cq->cqe`).
    pub fn capacity(&self) -> usize {
        self.inner.cap
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
        if self.inner.qp_refs.load(Ordering::Acquire) > 0 {
            return Err((VerbsError::Busy("CQ still used by a QP"), self));
        }
        let mut st = self.inner.state();
        if st.events_acked < st.events_delivered {
            drop(st);
            return Err((VerbsError::Busy("CQ has unacknowledged events"), self));
        }
        st.destroyed = true;
        Ok(())
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.inner.state().destroyed
    }

    /// True once the CQ overran (then [`CompletionQueue::poll`] fails with `CqOverrun`).
    pub fn is_overrun(&self) -> bool {
        self.inner.state().overrun
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
            self.inner.id, self.inner.cap
        )
    }
}
