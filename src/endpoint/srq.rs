//! A shared receive queue's state, shared by its handle and the engine slots of the QPs that
//! take their receive WQEs from it.

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};

use super::events::{AsyncEvent, AsyncQueue};
use super::quota::QuotaSlot;
use crate::transport::Srq;

/// The SRQ's state, shared by its handle and the engine slots of the QPs that use it (as a
/// CQ's is): the engine locks it, under the engine lock, while it feeds one of those QPs a
/// packet.
pub(crate) struct SrqShared {
    /// This SRQ's share of `max_srq`, held until the handle and the last QP let go of it.
    _slot: QuotaSlot,
    pub id: u32,
    pub pd: u32,
    state: Mutex<Srq>,
    /// QPs using this SRQ.
    pub(crate) qp_refs: AtomicU32,
    async_events: Arc<AsyncQueue>,
}

impl SrqShared {
    pub(crate) fn new(
        slot: QuotaSlot,
        id: u32,
        pd: u32,
        srq: Srq,
        async_events: Arc<AsyncQueue>,
    ) -> Self {
        SrqShared {
            _slot: slot,
            id,
            pd,
            state: Mutex::new(srq),
            qp_refs: AtomicU32::new(0),
            async_events,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Srq> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After the transport took WQEs from `srq` (this SRQ, locked): raise
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` if a take fired the limit.
    pub(crate) fn raise_events(&self, srq: &mut Srq) {
        if srq.take_limit_event() {
            self.async_events
                .push(AsyncEvent::SrqLimitReached { srq: self.id });
        }
    }
}
