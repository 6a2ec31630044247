//! What RC and UC queue pairs share: the QP number, caps, state and attributes, the send
//! queue's signaling, whether receive WQEs come from a shared receive queue, and the
//! completions not yet polled. [`ConnectedCore`] holds them with the checks and steps that do not
//! depend on the service: posting, querying, entering ERR and lending the shared receive queue
//! to a packet's receive steps.

use std::collections::VecDeque;

use crate::transport::rc::{complete, flush_recv, Cq, PostError, Requester};
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::{bth, Packet, Psn};

/// The part of an RC or UC queue pair that does not depend on the service.
pub(crate) struct ConnectedCore {
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    /// Receive WQEs come from a shared receive queue.
    pub(crate) srq: bool,
    pub(crate) state: QpState,
    /// Attribute values as last set (current PSNs come from the parts).
    pub(crate) attr: QpAttr,
    pub(crate) cq: Cq,
}

impl ConnectedCore {
    /// A QP in RESET with its own receive queue and the attributes `attr` to start from.
    pub(crate) fn new(qpn: u32, caps: QpCaps, sq_sig_all: bool, attr: QpAttr) -> Self {
        ConnectedCore {
            qpn: qpn & 0x00ff_ffff,
            caps,
            sq_sig_all,
            srq: false,
            state: QpState::Reset,
            attr,
            cq: Cq::new(qpn & 0x00ff_ffff),
        }
    }

    /// The same QP taking its receive WQEs from a shared receive queue: it has no receive queue
    /// of its own (`max_recv_wr` and `max_recv_sge` are 0).
    pub(crate) fn on_srq(self) -> Self {
        let caps = QpCaps {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..self.caps
        };
        ConnectedCore {
            caps,
            srq: true,
            ..self
        }
    }

    pub(crate) fn mtu(&self) -> usize {
        self.attr.path_mtu.unwrap_or(Mtu::Mtu1024).bytes()
    }

    pub(crate) fn dest_qpn(&self) -> u32 {
        self.attr.dest_qp_num.unwrap_or(0)
    }

    /// The packet is addressed to this QP: its destination QPN, and its P_Key in the QP's
    /// partition (IBA 9.6.1.1, C9-41: only the default partition exists here; the membership
    /// bit is not compared).
    pub(crate) fn addressed_to(&self, pkt: &Packet<'_>) -> bool {
        pkt.bth.dest_qpn == self.qpn && pkt.bth.pkey & 0x7fff == bth::DEFAULT_PKEY & 0x7fff
    }

    /// `ibv_query_qp`: the attributes as last set, with the state, the send queue's next PSN,
    /// the receiving side's expected one (`rq_psn`), and whether SQD is still draining.
    pub(crate) fn query(&self, req: &Requester, rq_psn: Psn) -> QpAttr {
        let state = self.state;
        let mut a = self.attr;
        a.qp_state = Some(state);
        a.cur_qp_state = Some(state);
        if matches!(state, QpState::Rts | QpState::Sqd) {
            a.sq_psn = Some(req.max_psn.value());
        }
        if matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            a.rq_psn = Some(rq_psn.value());
        }
        a.sq_draining = Some(state == QpState::Sqd && req.outstanding());
        a
    }

    /// A connected QP takes send WRs in RTS, SQD and ERR.
    pub(crate) fn check_send_state(&self) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => Ok(()),
            s => Err(PostError::InvalidState(s)),
        }
    }

    /// Queue a send WR that passed its checks on the send queue of `req` ([`Cq::queue_send`]).
    pub(crate) fn queue_send(
        &mut self,
        req: &mut Requester,
        wqe: SendWqe,
    ) -> Result<(), PostError> {
        let mtu = self.mtu();
        self.cq
            .queue_send(req, &self.caps, self.state, self.sq_sig_all, mtu, wqe)
    }

    /// `ibv_post_recv` onto the QP's receive queue `rq`, after [`check_post_recv`]: `holding`,
    /// a message in progress holds a WQE, which still occupies its slot (as do completions not
    /// yet polled). In ERR the WQE is flushed at once.
    pub(crate) fn post_recv(
        &mut self,
        rq: &mut VecDeque<RecvWqe>,
        holding: bool,
        wqe: RecvWqe,
    ) -> Result<(), PostError> {
        let held = rq.len() + holding as usize + self.cq.recv_pending;
        check_post_recv(&wqe, &self.caps, self.srq, self.state, held)?;
        if self.state == QpState::Err {
            let c = flush_recv(wqe.wr_id, self.dest_qpn());
            self.cq.push(c);
            return Ok(());
        }
        rq.push_back(wqe);
        Ok(())
    }

    /// Enter ERR: `fail` completes the send WQE at index `at` with that status; every other
    /// send WQE, then the receive WQE `held` by a message in progress and the receive queue
    /// `rq`, are flushed with WR_FLUSH_ERR.
    pub(crate) fn flush_all(
        &mut self,
        req: &mut Requester,
        fail: Option<(usize, WcStatus)>,
        held: Option<RecvWqe>,
        rq: VecDeque<RecvWqe>,
    ) {
        self.state = QpState::Err;
        trace_event!(qpn = self.qpn, failed = ?fail.map(|f| f.1), "QP in error: flushing");
        let dest = self.dest_qpn();
        let cq = &mut self.cq;
        let sq = std::mem::take(&mut req.sq);
        for (i, e) in sq.iter().enumerate() {
            let status = match fail {
                Some((at, st)) if at == i => st,
                _ => WcStatus::WrFlushErr,
            };
            complete(e, status, true, &mut |c| cq.push(c));
        }
        req.idx = 0;
        req.pkt = 0;
        for w in held.into_iter().chain(rq) {
            cq.push(flush_recv(w.wr_id, dest));
        }
    }

    /// Run a packet's receive steps `on_packet` with the shared receive queue they may take
    /// from: `lent` on a QP made with a shared receive queue (an empty one if none was lent:
    /// no receive WQE), none on a QP with its own receive queue (`lent` is not touched).
    pub(crate) fn lend_srq<R>(
        uses_srq: bool,
        lent: Option<&mut Srq>,
        on_packet: impl FnOnce(Option<&mut Srq>) -> R,
    ) -> R {
        match (uses_srq, lent) {
            (false, _) => on_packet(None),
            (true, Some(srq)) => on_packet(Some(srq)),
            (true, None) => on_packet(Some(&mut Srq::default())),
        }
    }
}

/// The checks `ibv_post_recv` makes (RC, UC and UD): no SRQ, not in RESET, the SGE count, and
/// room: `held` WQEs are taken already (queued, held by a message in progress, or completed and
/// not yet polled).
pub(crate) fn check_post_recv(
    wqe: &RecvWqe,
    caps: &QpCaps,
    srq: bool,
    state: QpState,
    held: usize,
) -> Result<(), PostError> {
    if srq {
        return Err(PostError::HasSrq);
    }
    if state == QpState::Reset {
        return Err(PostError::InvalidState(state));
    }
    if wqe.sg_list.len() > caps.max_recv_sge as usize {
        return Err(PostError::TooManySge {
            got: wqe.sg_list.len(),
            max: caps.max_recv_sge,
        });
    }
    if held >= caps.max_recv_wr as usize {
        return Err(PostError::QueueFull);
    }
    Ok(())
}

/// The getters RC and UC queue pairs share, on a `core: ConnectedCore` field; expanded inside
/// each QP's `impl` so that they stay inherent methods.
macro_rules! connected_getters {
    () => {
        pub fn qpn(&self) -> u32 {
            self.core.qpn
        }
        pub fn state(&self) -> QpState {
            self.core.state
        }
        pub fn caps(&self) -> QpCaps {
            self.core.caps
        }
        /// The QP takes its receive WQEs from a shared receive queue.
        pub fn uses_srq(&self) -> bool {
            self.core.srq
        }
        /// The address vector set at INIT->RTR: where packets go, and whom they are taken from.
        pub fn destination(&self) -> Option<AddressVector> {
            self.core.attr.ah_attr
        }
        /// The next completion for the send or receive CQ.
        pub fn poll_completion(&mut self) -> Option<Completion> {
            self.core.cq.pop()
        }
    };
}
pub(crate) use connected_getters;
