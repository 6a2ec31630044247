//! A QP in the endpoint: its transport and the device objects it completes into.

use std::sync::Arc;
use std::time::Instant;

use super::cq::CqShared;
use super::events::{AsyncEvent, AsyncQueue};
use super::srq::SrqShared;
use crate::transport::ud::UdQp;
use crate::transport::{QpState, RcQp, UcQp};

/// The transport of one QP.
// Slots stay in the map: boxing the RC QP would only add an indirection on the hot path.
#[allow(clippy::large_enum_variant)]
pub(crate) enum QpTransport {
    Rc(RcQp),
    Uc(UcQp),
    Ud(UdQp),
}

impl QpTransport {
    pub fn state(&self) -> QpState {
        match self {
            QpTransport::Rc(q) => q.state(),
            QpTransport::Uc(q) => q.state(),
            QpTransport::Ud(q) => q.state(),
        }
    }

    /// The next timer (UC and UD have none).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self {
            QpTransport::Rc(q) => q.poll_timeout(),
            QpTransport::Uc(_) | QpTransport::Ud(_) => None,
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let QpTransport::Rc(q) = self {
            q.handle_timeout(now);
        }
    }
}

pub(crate) struct QpSlot {
    pub qp: QpTransport,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub pd: u32,
    /// The state after the last verb or drive: a change to ERR in between is the transport's
    /// doing, reported as `IBV_EVENT_QP_FATAL`.
    pub last_state: QpState,
    /// The shared receive queue the QP takes its receive WQEs from, lent to the transport
    /// with each packet it is fed (as the memory is).
    pub srq: Option<Arc<SrqShared>>,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` was raised for the QP's current stay in ERR.
    pub last_wqe_reported: bool,
}

impl QpSlot {
    /// A QP on an SRQ raises `IBV_EVENT_QP_LAST_WQE_REACHED` once each time it enters ERR (by
    /// a verb, the CM or the transport): it takes no more WQEs from the SRQ. Called after
    /// every verb and drive.
    pub fn check_last_wqe(&mut self, qpn: u32, events: &AsyncQueue) {
        if self.srq.is_none() {
            return;
        }
        let err = self.qp.state() == QpState::Err;
        if err && !self.last_wqe_reported {
            events.push(AsyncEvent::QpLastWqeReached { qp_num: qpn });
        }
        self.last_wqe_reported = err;
    }
}
