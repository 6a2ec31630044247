//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_post_srq_recv`, `ibv_destroy_srq`).
//!
//! Any number of QPs of the SRQ's protection domain (RC or UD, created with
//! [`QpInitAttr::srq`](super::QpInitAttr::srq)) take their receive WQEs from it; each receive
//! completion goes to the receiving QP's receive CQ and names that QP (`qp_num`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::context::Shared;
use super::device::{MAX_SRQ_SGE, MAX_SRQ_WR};
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use super::qp::RecvWr;
pub(crate) use crate::endpoint::srq::SrqShared;
use crate::transport::{RecvWqe, Srq, SrqError};

/// `struct ibv_srq_init_attr` (its `attr`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SrqInitAttr {
    /// WQEs the SRQ holds: 1 ..= `max_srq_wr`.
    pub max_wr: u32,
    /// Scatter/gather elements per WQE: up to `max_srq_sge` (0 is granted as 1, as rxe does).
    pub max_sge: u32,
    /// Arms the limit event at creation when non-zero (rxe honours it); at most `max_wr`.
    pub srq_limit: u32,
}

/// `struct ibv_srq_attr`, as [`SharedReceiveQueue::query`] reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SrqAttr {
    /// Receive work requests it holds.
    pub max_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// The armed limit; 0 when the limit event is not armed.
    pub srq_limit: u32,
}

/// A shared receive queue. Dropping it destroys it (`ibv_destroy_srq`); QPs still using it keep
/// it alive until the last of them is destroyed. [`SharedReceiveQueue::destroy`] is the checked
/// form: it refuses (EBUSY) while a QP uses the SRQ.
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqShared>,
    pub(crate) shared: Arc<Shared>,
}

fn invalid(e: SrqError) -> VerbsError {
    VerbsError::InvalidArgument(match e {
        SrqError::ZeroMaxWr => "max_wr must be at least 1",
        SrqError::BelowPosted { .. } => "max_wr is below the number of WQEs posted",
        SrqError::LimitAboveMaxWr { .. } => "srq_limit is above max_wr",
    })
}

impl SharedReceiveQueue {
    pub(crate) fn create(pd: &ProtectionDomain, attr: SrqInitAttr) -> Result<SharedReceiveQueue> {
        if attr.max_wr > MAX_SRQ_WR {
            return Err(VerbsError::InvalidArgument("max_wr above max_srq_wr"));
        }
        if attr.max_sge > MAX_SRQ_SGE {
            return Err(VerbsError::InvalidArgument("max_sge above max_srq_sge"));
        }
        let srq = Srq::new(attr.max_wr, attr.max_sge.max(1), attr.srq_limit).map_err(invalid)?;
        let inner = Arc::new(SrqShared::new(
            pd.shared.srq_quota.take()?,
            pd.shared.next_id(),
            pd.id,
            srq,
            pd.shared.async_events.clone(),
        ));
        Ok(SharedReceiveQueue {
            inner,
            shared: pd.shared.clone(),
        })
    }

    /// The SRQ's state, for a verb called by the application. A thread that holds a
    /// memory-region guard gets [`VerbsError::Busy`]: the engine may hold this SRQ while it
    /// waits for that very region.
    fn lock_for_verb(&self) -> Result<MutexGuard<'_, Srq>> {
        if crate::endpoint::memory::guards_held() {
            return Err(VerbsError::Busy(
                "this thread holds a MemoryRegion::lock guard; drop it before calling this verb",
            ));
        }
        Ok(self.inner.lock())
    }

    /// `ibv_post_srq_recv`: queue the WRs in order. Stops at the first WR that cannot be posted
    /// (too many SGEs: EINVAL; the SRQ full: ENOMEM) and returns its index, like `bad_wr`.
    ///
    /// # Errors
    /// [`VerbsError::Post`] with the index of the first work request not posted (a full queue, too many SGEs).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let mut srq = self.lock_for_verb()?;
        for (index, wr) in wrs.iter().enumerate() {
            srq.post_recv(RecvWqe {
                wr_id: wr.wr_id,
                sg_list: crate::transport::SgList::from_slice(wr.sg_list),
            })
            .map_err(|error| VerbsError::Post { index, error })?;
        }
        Ok(())
    }

    /// `ibv_modify_srq`: `max_wr` (`IBV_SRQ_MAX_WR`) resizes the SRQ, as rxe does (not below
    /// the WQEs posted, nor the armed limit, nor above `max_srq_wr`); `srq_limit`
    /// (`IBV_SRQ_LIMIT`) arms the limit event, 0 disarms it. The event fires when a WQE taken
    /// from the SRQ leaves fewer than the limit (checked at each take, as rxe does: arming a
    /// limit above the current count fires at the next take). EINVAL, changing nothing, on a
    /// bad value.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a size below what is posted or above `max_srq_wr`, or a limit above the size.
    pub fn modify(&self, max_wr: Option<u32>, srq_limit: Option<u32>) -> Result<()> {
        if max_wr.is_some_and(|n| n > MAX_SRQ_WR) {
            return Err(VerbsError::InvalidArgument("max_wr above max_srq_wr"));
        }
        if srq_limit.is_some_and(|n| n > MAX_SRQ_WR) {
            return Err(VerbsError::InvalidArgument("srq_limit above max_srq_wr"));
        }
        self.lock_for_verb()?
            .modify(max_wr, srq_limit)
            .map_err(invalid)
    }

    /// `ibv_query_srq`.
    ///
    /// # Errors
    /// None today (a `Result` as `ibv_query_srq` has).
    pub fn query(&self) -> Result<SrqAttr> {
        let srq = self.lock_for_verb()?;
        Ok(SrqAttr {
            max_wr: srq.max_wr(),
            max_sge: srq.max_sge(),
            srq_limit: srq.limit(),
        })
    }

    /// WQEs posted and not yet taken by a QP.
    ///
    /// # Errors
    /// None today.
    pub fn posted(&self) -> Result<usize> {
        Ok(self.lock_for_verb()?.len())
    }

    /// Identity of the SRQ within its context (the `srq` of
    /// [`AsyncEvent::SrqLimitReached`](super::AsyncEvent::SrqLimitReached)).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// `ibv_destroy_srq`: fails with [`VerbsError::Busy`] (EBUSY), handing the SRQ back, while
    /// a QP uses it.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (with the SRQ back) while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (VerbsError, SharedReceiveQueue)> {
        if self.inner.qp_refs.load(Ordering::Acquire) > 0 {
            return Err((VerbsError::Busy("SRQ still used by a QP"), self));
        }
        Ok(())
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue({})", self.inner.id)
    }
}
