//! A completion queue's state (`ibv_cq`), shared by its handles and the engine slots of the QPs
//! that complete into it: the engine pushes, the application polls.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::channel::ChannelShared;
use super::error::EndpointError;
use super::events::{AsyncEvent, AsyncQueue};
use super::quota::QuotaSlot;
use crate::transport::{Completion, WcStatus};

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
    /// Completions (or an overrun) wait: set under the state lock by whoever changes the queue,
    /// read without it by a poll, so that polling an empty CQ takes no lock.
    waiting: AtomicBool,
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
            waiting: AtomicBool::new(false),
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
            self.waiting.store(true, Ordering::Release);
            drop(st);
            self.async_events.push(AsyncEvent::CqErr { cq: self.id });
            return;
        }
        st.q.push_back(c);
        self.waiting.store(true, Ordering::Release);
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

    pub(crate) fn pop_into(&self, out: &mut [Completion]) -> Result<usize, EndpointError> {
        // An empty CQ answers without its lock (a busy poll's usual case). A push that races
        // with this is seen by the next poll, as it would be had this poll locked first.
        if !self.waiting.load(Ordering::Acquire) {
            return Ok(0);
        }
        let mut st = self.state();
        if st.overrun {
            return Err(EndpointError::CqOverrun);
        }
        let n = out.len().min(st.q.len());
        for (slot, c) in out.iter_mut().zip(st.q.drain(..n)) {
            *slot = c;
        }
        if st.q.is_empty() {
            self.waiting.store(false, Ordering::Relaxed);
        }
        Ok(n)
    }

    pub(crate) fn len(&self) -> usize {
        self.state().q.len()
    }

    /// Capacity (`cq->cqe`).
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// `ibv_req_notify_cq`: arm for the next completion (or the next solicited or error one).
    pub(crate) fn arm(&self, solicited_only: bool) {
        let mut st = self.state();
        st.armed = Some(match st.armed {
            // A pending "any" request is not narrowed by a later solicited-only one.
            Some(false) => false,
            _ => solicited_only,
        });
    }

    /// `ibv_ack_cq_events`.
    pub(crate) fn ack_events(&self, n: u32) {
        let mut st = self.state();
        st.events_acked = (st.events_acked + n as u64).min(st.events_delivered);
    }

    /// `ibv_destroy_cq`'s checks, then mark it destroyed: refused while a QP uses it or channel
    /// events are unacknowledged.
    pub(crate) fn destroy(&self) -> Result<(), EndpointError> {
        if self.qp_refs.load(Ordering::Acquire) > 0 {
            return Err(EndpointError::Busy("CQ still used by a QP"));
        }
        let mut st = self.state();
        if st.events_acked < st.events_delivered {
            return Err(EndpointError::Busy("CQ has unacknowledged events"));
        }
        st.destroyed = true;
        Ok(())
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.state().destroyed
    }

    pub(crate) fn is_overrun(&self) -> bool {
        self.state().overrun
    }
}
