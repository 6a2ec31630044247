//! The driver-facing RC queue pair: the QP state machine and attribute checks (IBA 10.3,
//! 11.2.4.2), post-time checks of work requests, and the glue between the requester, the
//! completer and the responder, which talk through typed events ([`ReqEvent`], [`CompAction`],
//! [`RespEvent`]) that this module turns into timer, cursor and state changes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::transport::connected::{connected_getters, ConnectedCore};
use crate::transport::memory::MemoryAccess;
use crate::transport::modify::modify_connected;
use crate::transport::modify::{
    ACCESS, AV, CUR_STATE, DEST_QPN, MAX_DEST_RD, MAX_RD, MIN_RNR, PATH_MTU, PKEY, PORT, RETRY,
    RNR_RETRY, RQ_PSN, SQ_PSN, TIMEOUT,
};
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::{Kind, Packet, Psn, Service};

use super::completer::{complete, CompAction, CompResult, Completer};
use super::requester::{Probe, ReqEvent, ReqParams, Requester, SendEntry};
use super::responder::{RespEvent, RespParams, Responder};
use super::timer::{Timer, TimerTable};

/// Errors of `modify_qp` (the verbs return `EINVAL` for all of them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QpError {
    #[error("invalid QP state transition {from:?} -> {to:?}")]
    InvalidTransition { from: QpState, to: QpState },
    #[error("current state is {actual:?}, not {expected:?}")]
    WrongCurrentState { expected: QpState, actual: QpState },
    #[error("attribute {0} is required for this transition")]
    MissingAttr(&'static str),
    #[error("attribute {0} is not allowed for this transition")]
    UnexpectedAttr(&'static str),
    #[error("attribute {0} is out of range")]
    BadAttr(&'static str),
}

/// Errors of `post_send`/`post_recv` detected at post time (`EINVAL`/`ENOMEM` in libibverbs).
/// The longest message a work request may carry: 2^31 bytes, the `max_msg_sz` rdma_rxe
/// advertises (`RXE_MAX_MSG_SIZE`); RETH's DMA length is 32 bits.
pub const MAX_MSG_LEN: u64 = 1 << 31;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    #[error("QP state {0:?} does not accept this work request")]
    InvalidState(QpState),
    #[error("work queue is full")]
    QueueFull,
    #[error("too many scatter/gather elements ({got} > {max})")]
    TooManySge { got: usize, max: u32 },
    #[error("inline data too long ({got} > {max})")]
    InlineTooLong { got: usize, max: u32 },
    #[error("message too long ({0} bytes)")]
    MessageTooLong(u64),
    #[error("atomic operations take exactly one 8-byte buffer")]
    BadAtomicLength,
    #[error("operation not supported on this QP type")]
    UnsupportedOp,
    #[error("the QP takes its receive WQEs from a shared receive queue: post there")]
    HasSrq,
    /// An RDMA READ or atomic on a QP whose `max_rd_atomic` is 0: it may issue none (a NIC or
    /// kernel rxe would never send it).
    #[error(
        "max_rd_atomic is 0: this QP may issue no RDMA READ or atomic (give max_rd_atomic a \
         value above 0 when moving it to RTS; with rdma_cm, initiator_depth)"
    )]
    NoRdAtomic,
}

/// The shortest tail-loss probe timeout.
const PROBE_FLOOR: Duration = Duration::from_millis(1);
/// The probe timeout before the first round-trip sample.
const PROBE_INITIAL: Duration = Duration::from_millis(10);

/// Required and optional attributes of an RC transition (IBA Table 91 ff., the kernel's
/// `qp_state_table` in `ib_modify_qp_is_ok`); `None` if the transition is not allowed.
fn transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (PKEY | PORT | ACCESS, 0),
        (Init, Init) => (0, PKEY | PORT | ACCESS),
        (Init, Rtr) => (
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR,
            ACCESS | PKEY,
        ),
        (Rtr, Rts) => (
            TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_RD,
            CUR_STATE | ACCESS | MIN_RNR,
        ),
        (Rts, Rts) => (0, CUR_STATE | ACCESS | MIN_RNR),
        (Rts, Sqd) => (0, 0),
        (Sqd, Rts) => (0, CUR_STATE | ACCESS | MIN_RNR),
        (Sqd, Sqd) => (
            0,
            PORT | AV
                | TIMEOUT
                | RETRY
                | RNR_RETRY
                | MAX_RD
                | MAX_DEST_RD
                | ACCESS
                | PKEY
                | MIN_RNR
                | CUR_STATE,
        ),
        (Sqe, Rts) => (0, CUR_STATE | ACCESS),
        _ => return None,
    })
}

/// Counters of one RC QP's loss recovery (for benchmarks and tests; nothing depends on them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcStats {
    /// Request packets transmitted, first transmissions and retransmissions.
    pub sent: u64,
    /// Of those, retransmissions (a PSN sent before).
    pub retransmitted: u64,
    /// Go-backs on a PSN sequence error NAK or an implied NAK.
    pub nak_retries: u64,
    /// Local ACK timeouts that retransmitted (each consumed one retry).
    pub timeouts: u64,
    /// Tail-loss probes sent before the local ACK timeout.
    pub probes: u64,
    /// PSNs rewound by go-backs (timeouts, NAKs and probes): already sent, sent again.
    pub rewound: u64,
    /// Responder: PSN sequence error NAKs queued.
    pub seq_naks: u64,
    /// Responder: out-of-sequence requests dropped (after the NAK, or the NAK itself).
    pub out_of_seq: u64,
    /// Responder: duplicate requests received.
    pub duplicates: u64,
    /// Responder: why it refused remote accesses (each is a remote access error NAK).
    pub refused: AccessRefusals,
}

/// Why a responder refused remote accesses (RDMA WRITE, READ, atomics), counted by reason: the
/// requester only sees `RemAccessErr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessRefusals {
    /// The QP's access flags lack the operation (`qp_access_flags`).
    pub qp_access: u64,
    /// No region has the rkey in the QP's protection domain.
    pub unknown_key: u64,
    /// The rkey's region was deregistered.
    pub deregistered: u64,
    /// The region's access flags lack the operation.
    pub region_access: u64,
    /// The range is not inside the region.
    pub out_of_bounds: u64,
}

impl AccessRefusals {
    /// Count one refusal for `e`.
    pub(crate) fn count(&mut self, e: &super::resp_error::RespError) {
        use super::resp_error::RespError;
        use crate::transport::MemError;
        match e {
            RespError::QpAccess => self.qp_access += 1,
            RespError::Rkey(MemError::InvalidKey) => self.unknown_key += 1,
            RespError::Rkey(MemError::Deregistered) => self.deregistered += 1,
            RespError::Rkey(MemError::AccessDenied) => self.region_access += 1,
            RespError::Rkey(_) => self.out_of_bounds += 1,
            _ => {}
        }
    }

    /// Add `o`'s counts.
    pub fn add(&mut self, o: &AccessRefusals) {
        self.qp_access += o.qp_access;
        self.unknown_key += o.unknown_key;
        self.deregistered += o.deregistered;
        self.region_access += o.region_access;
        self.out_of_bounds += o.out_of_bounds;
    }
}

/// One RC queue pair's transport state.
///
/// Call order for a driver, after quinn-proto: feed every received packet for this QP to
/// [`RcQp::handle_packet`]; when [`RcQp::poll_timeout`]'s deadline passes, call
/// [`RcQp::handle_timeout`]; after either, and after posting, drain [`RcQp::poll_transmit`] until
/// it returns `None` and [`RcQp::poll_completion`] until it returns `None`.
///
/// A QP made by [`RcQp::with_srq`] has no receive queue: it takes receive WQEs from the shared
/// receive queue the driver passes to [`RcQp::handle_packet_srq`].
pub struct RcQp {
    core: ConnectedCore,
    req: Requester,
    comp: Completer,
    resp: Responder,
    timers: TimerTable,
    /// PSN to resume from when the RNR timer fires.
    rnr_psn: Psn,
    /// Alternates the transmitter between responder and requester.
    resp_turn: bool,
    stats: RcStats,
    /// Smoothed round-trip time and its variation (RFC 6298), from AckReq'd first
    /// transmissions; `None` before the first sample.
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The packet being timed (first transmissions only, as Karn's rule says): PSN, sent at.
    rtt_timed: Option<(Psn, Instant)>,
    /// Tail-loss probes since the last progress: each doubles the probe timeout.
    probes_in_row: u32,
    /// Where the cursor was when the probe took it back, and whether the probed packet was a
    /// READ or atomic request.
    probe_resume: Psn,
    probe_rd: bool,
    /// The probe out is the one sent at once after a duplicate answer.
    probe_chained: bool,
    /// See [`RcQp::set_split_writes`].
    split_writes: bool,
}

impl RcQp {
    /// A new QP in RESET. `sq_sig_all` makes every send WR signaled.
    pub fn new(qpn: u32, caps: QpCaps, sq_sig_all: bool) -> Self {
        let attr = QpAttr {
            path_mtu: Some(Mtu::Mtu1024),
            qkey: None,
            rq_psn: Some(0),
            sq_psn: Some(0),
            dest_qp_num: Some(0),
            qp_access_flags: Some(AccessFlags::NONE),
            pkey_index: Some(0),
            port_num: Some(1),
            ah_attr: None,
            timeout: Some(0),
            retry_cnt: Some(0),
            rnr_retry: Some(0),
            min_rnr_timer: Some(0),
            max_rd_atomic: Some(0),
            max_dest_rd_atomic: Some(0),
            ..QpAttr::default()
        };
        RcQp {
            core: ConnectedCore::new(qpn, caps, sq_sig_all, attr),
            req: Requester::default(),
            comp: Completer::default(),
            resp: Responder::default(),
            timers: TimerTable::default(),
            rnr_psn: Psn::new(0),
            resp_turn: false,
            stats: RcStats::default(),
            srtt: None,
            rttvar: Duration::ZERO,
            rtt_timed: None,
            probes_in_row: 0,
            probe_resume: Psn::new(0),
            probe_rd: false,
            probe_chained: false,
            split_writes: false,
        }
    }

    /// Send each packet of a multi-packet RDMA WRITE (without immediate) as a message of its
    /// own, an RDMA WRITE Only with a RETH for its part, instead of First, Middle... Last.
    ///
    /// The memory the peer ends up with is the same; what changes is that every packet of the
    /// WRITE has the same length. A First carries a 16-byte RETH that the Middle and Last
    /// packets behind it do not, and UDP segmentation offload (one `sendmsg` of equal-sized
    /// datagrams but the last) can then batch a WRITE's packets only from the second one on,
    /// and never a Last with the next WRITE's First: two system calls' worth of datagrams per
    /// WRITE where SENDs take one. The driver turns this on where it batches with GSO.
    /// Costs: 16 bytes per packet; the peer checks the key once per packet (it does the
    /// same work once per message otherwise) and counts a message (MSN) per packet. A WRITE with
    /// immediate keeps its one message: its receive completion reports the whole length. One
    /// difference shows only in error: a WRITE whose range the peer refuses part-way (it runs
    /// past the region) has placed its packets before the refused one, where one message is
    /// refused whole at its First; either way the WR completes with REM_ACCESS_ERR and both QPs
    /// go to ERR.
    pub fn set_split_writes(&mut self, on: bool) {
        self.split_writes = on;
    }
    /// A new QP in RESET that takes its receive WQEs from a shared receive queue (lent with
    /// each packet, [`RcQp::handle_packet_srq`]) and has none of its own: `caps.max_recv_wr`
    /// and `max_recv_sge` are ignored (0), and [`RcQp::post_recv`] fails.
    pub fn with_srq(qpn: u32, caps: QpCaps, sq_sig_all: bool) -> Self {
        let q = RcQp::new(qpn, caps, sq_sig_all);
        RcQp {
            core: q.core.on_srq(),
            ..q
        }
    }
    connected_getters!();
    /// Loss-recovery counters since the QP was created.
    pub fn stats(&self) -> RcStats {
        let mut s = self.stats;
        s.seq_naks = self.resp.seq_naks;
        s.out_of_seq = self.resp.out_of_seq;
        s.duplicates = self.resp.duplicates;
        s.refused = self.resp.refused;
        s
    }

    /// Go back to `psn` (counting what is sent again).
    fn rewind(&mut self, psn: Psn) {
        let d = self.req.sent_max.diff(psn);
        if d > 0 {
            self.stats.rewound += d as u64;
        }
        self.rtt_timed = None;
        self.req.probe = Probe::Off;
        self.req.seek(psn);
    }

    /// The tail-loss probe timeout: a few round trips (RFC 6298's RTO formula, at least two
    /// smoothed RTTs), at least [`PROBE_FLOOR`], doubled per probe already sent without
    /// progress; `None` when it would not come before the local ACK timeout (or there is
    /// none: timeout 0 means never retransmit).
    fn probe_timeout(&self) -> Option<Duration> {
        let ack = self.ack_timeout()?;
        let base = match self.srtt {
            Some(s) => (s * 2).max(s + self.rttvar * 4),
            None => PROBE_INITIAL,
        }
        .max(PROBE_FLOOR);
        // The second probe comes as soon as the first (a copy of the last packet, which a
        // responder that sent its NAK ignores); later ones back off.
        let pto = base.checked_mul(1 << self.probes_in_row.saturating_sub(1).min(16))?;
        (pto < ack).then_some(pto)
    }

    fn arm_probe(&mut self, now: Instant) {
        if self.req.outstanding() && !self.req.rnr_paused {
            if let Some(d) = self.probe_timeout() {
                self.timers.set(Timer::Probe, now + d);
                return;
            }
        }
        self.timers.stop(Timer::Probe);
    }

    fn rtt_sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let dev = if s > r { s - r } else { r - s };
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    /// Local ACK timeout: 4.096 µs × 2^timeout; `None` for 0 (infinite, IBA 9.7.6.1.3).
    fn ack_timeout(&self) -> Option<Duration> {
        match self.core.attr.timeout.unwrap_or(0) {
            0 => None,
            t => Some(Duration::from_nanos(4096u64 << t.min(31))),
        }
    }

    fn req_params(&self) -> ReqParams {
        ReqParams {
            mtu: self.core.mtu(),
            dest_qpn: self.core.dest_qpn(),
            max_rd_atomic: self.core.attr.max_rd_atomic.unwrap_or(0) as u32,
            draining: self.core.state == QpState::Sqd,
            unreliable: false,
            split_writes: self.split_writes,
        }
    }

    fn resp_params(&self) -> RespParams {
        RespParams {
            mtu: self.core.mtu(),
            dest_qpn: self.core.dest_qpn(),
            access: self.core.attr.qp_access_flags.unwrap_or_default(),
            max_dest_rd_atomic: self.core.attr.max_dest_rd_atomic.unwrap_or(0) as u32,
            min_rnr_timer: self.core.attr.min_rnr_timer.unwrap_or(0),
        }
    }

    /// `ibv_modify_qp`: checks the transition and its required/optional attributes (IBA 11.2.4.2,
    /// as `ib_modify_qp_is_ok` does); moving to ERR flushes outstanding work.
    pub fn modify(&mut self, attr: &QpAttr, now: Instant) -> Result<(), QpError> {
        let _ = now;
        let cur = self.core.state;
        let next = modify_connected(cur, &mut self.core.attr, attr, transition, false)?;
        match (cur, next) {
            (_, QpState::Reset) => {
                // To RESET: queues emptied without completions (the CQ keeps what it has).
                self.req.reset(Psn::new(0));
                self.resp.reset(Psn::new(0));
                self.timers.stop_all();
                self.reset_rtt();
                self.core.state = QpState::Reset;
            }
            (QpState::Err, QpState::Err) => {}
            (_, QpState::Err) => self.enter_err(None),
            (QpState::Init, QpState::Rtr) => {
                let rq = std::mem::take(&mut self.resp.rq);
                self.resp
                    .reset(Psn::new(self.core.attr.rq_psn.unwrap_or(0)));
                self.resp.rq = rq;
                self.core.state = next;
            }
            (QpState::Rtr, QpState::Rts) => {
                self.req.reset(Psn::new(self.core.attr.sq_psn.unwrap_or(0)));
                self.reset_rtt();
                self.comp.set_counters(
                    self.core.attr.retry_cnt.unwrap_or(0),
                    self.core.attr.rnr_retry.unwrap_or(0),
                );
                self.core.state = next;
            }
            _ => {
                if attr.retry_cnt.is_some() || attr.rnr_retry.is_some() {
                    self.comp.set_counters(
                        self.core.attr.retry_cnt.unwrap_or(0),
                        self.core.attr.rnr_retry.unwrap_or(0),
                    );
                }
                self.core.state = next;
            }
        }
        Ok(())
    }

    fn reset_rtt(&mut self) {
        self.srtt = None;
        self.rttvar = Duration::ZERO;
        self.rtt_timed = None;
        self.probes_in_row = 0;
    }

    /// `ibv_query_qp`: every attribute's current value.
    pub fn query(&self) -> QpAttr {
        self.core.query(&self.req, self.resp.epsn)
    }

    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostError> {
        self.core.check_send_state()?;
        let rd_atomic = matches!(
            wqe.op,
            SendOp::RdmaRead { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        if wqe.flags.contains(SendFlags::INLINE) && rd_atomic {
            return Err(PostError::UnsupportedOp);
        }
        if rd_atomic && self.core.attr.max_rd_atomic.unwrap_or(0) == 0 {
            return Err(PostError::NoRdAtomic);
        }
        let len = check_send_wqe(&wqe, &self.core.caps)?;
        if matches!(wqe.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }) && len != 8 {
            return Err(PostError::BadAtomicLength);
        }
        self.core.queue_send(&mut self.req, wqe)
    }

    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        let holding = self.resp.msg.wqe.is_some();
        self.core.post_recv(&mut self.resp.rq, holding, wqe)
    }

    /// Move to ERR (IBA 10.3.1.x): `fail` completes the WQE at send-queue index `at` with that
    /// status; every other outstanding send and receive WQE is flushed with WR_FLUSH_ERR. A QP
    /// on a shared receive queue flushes only the WQE its message in progress took; the ones
    /// still on the SRQ belong to the SRQ.
    fn enter_err_at(&mut self, fail: Option<(usize, WcStatus)>) {
        self.timers.stop_all();
        let held = self.resp.msg.wqe.take();
        let rq = std::mem::take(&mut self.resp.rq);
        self.core.flush_all(&mut self.req, fail, held, rq);
        self.resp.keep_naks_only();
    }

    fn enter_err(&mut self, fail: Option<WcStatus>) {
        self.enter_err_at(fail.map(|s| (0, s)));
    }

    fn arm_retransmit(&mut self, now: Instant) {
        match self.ack_timeout() {
            Some(to) if self.req.outstanding() && !self.req.rnr_paused => {
                self.timers.set(Timer::Retransmit, now + to)
            }
            _ => self.timers.stop(Timer::Retransmit),
        }
    }

    fn apply_comp(&mut self, now: Instant, una_before: Psn, r: CompResult) {
        if r.progress {
            let acked = self.req.una.diff(una_before);
            if acked > 0 {
                self.req.on_acked(acked as u32);
            }
            if let Some((psn, at)) = self.rtt_timed {
                if self.req.una.after(psn) {
                    self.rtt_timed = None;
                    self.rtt_sample(now.saturating_duration_since(at));
                }
            }
            self.probes_in_row = 0;
            if r.action == CompAction::None {
                self.probe_answered();
            }
            self.arm_retransmit(now);
            self.arm_probe(now);
        }
        match r.action {
            CompAction::None => {}
            CompAction::Retry(psn) => {
                if !self.req.rnr_paused {
                    // IBA 9.7.5.1.2: go back at once to the NAK'd PSN.
                    self.stats.nak_retries += 1;
                    trace_event!(qpn = self.core.qpn, psn = psn.value(), "NAK: going back");
                    self.req.on_loss(psn);
                    self.rewind(psn);
                    self.arm_retransmit(now);
                    self.arm_probe(now);
                }
            }
            CompAction::RnrWait(psn, micros) => {
                self.req.rnr_paused = true;
                self.req.probe = Probe::Off;
                self.rnr_psn = psn;
                self.timers.stop(Timer::Retransmit);
                self.timers.stop(Timer::Probe);
                self.timers
                    .set(Timer::Rnr, now + Duration::from_micros(micros));
            }
            CompAction::Fatal(status) => self.enter_err(Some(status)),
        }
    }

    /// A packet addressed to this QP (ICRC already verified by the driver). A QP made by
    /// [`RcQp::with_srq`] takes [`RcQp::handle_packet_srq`] instead: given no SRQ here, it has
    /// no receive WQE for a SEND (RNR NAK).
    pub fn handle_packet(&mut self, now: Instant, pkt: &Packet<'_>, mem: &dyn MemoryAccess) {
        let uses_srq = self.core.srq;
        ConnectedCore::lend_srq(uses_srq, None, |srq| self.on_packet(now, pkt, mem, srq));
    }

    /// [`RcQp::handle_packet`] for a QP made by [`RcQp::with_srq`], with the shared receive
    /// queue it takes receive WQEs from (on a QP with its own receive queue, `srq` is not
    /// touched). Collect [`Srq::take_limit_event`] afterwards.
    pub fn handle_packet_srq(
        &mut self,
        now: Instant,
        pkt: &Packet<'_>,
        mem: &dyn MemoryAccess,
        srq: &mut Srq,
    ) {
        let uses_srq = self.core.srq;
        ConnectedCore::lend_srq(uses_srq, Some(srq), |srq| {
            self.on_packet(now, pkt, mem, srq)
        });
    }

    fn on_packet(
        &mut self,
        now: Instant,
        pkt: &Packet<'_>,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
    ) {
        if !self.core.addressed_to(pkt) {
            return;
        }
        let Some(info) = pkt.info() else { return };
        if info.service != Service::Rc {
            return;
        }
        match info.kind {
            Kind::Ack | Kind::AtomicAck | Kind::ReadResponse => {
                // The completer runs while the send queue is active (IBA 10.3.1: RTS, SQD).
                if !matches!(self.core.state, QpState::Rts | QpState::Sqd) {
                    return;
                }
                let mtu = self.core.mtu();
                let una_before = self.req.una;
                let cq = &mut self.core.cq;
                let r = self.comp.on_packet(
                    &mut self.req,
                    pkt,
                    mtu,
                    self.core.sq_sig_all,
                    mem,
                    &mut |c| cq.push(c),
                );
                self.apply_comp(now, una_before, r);
            }
            Kind::Send
            | Kind::RdmaWrite
            | Kind::ReadRequest
            | Kind::CompareSwap
            | Kind::FetchAdd => {
                // IBA 10.3.1: the responder works in RTR, RTS and SQD; elsewhere requests are dropped.
                if !matches!(self.core.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                    return;
                }
                let p = self.resp_params();
                let cq = &mut self.core.cq;
                let ev = self.resp.on_request(pkt, &p, mem, srq, &mut |c| cq.push(c));
                if ev == RespEvent::Error {
                    self.enter_err(None);
                }
            }
            Kind::Cnp => {}
        }
    }

    /// Timers due at or before `now` fire (retransmit, RNR wait, tail-loss probe).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.timers.take_expired(Timer::Rnr, now) {
            self.req.rnr_paused = false;
            let from = if self.rnr_psn.before(self.req.una) {
                self.req.una
            } else {
                self.rnr_psn
            };
            self.req.seek(from);
            self.arm_retransmit(now);
            self.arm_probe(now);
        }
        if self.timers.take_expired(Timer::Retransmit, now) {
            match self.comp.on_timeout(&self.req) {
                CompAction::Retry(psn) => {
                    // IBA 9.7.6.1.3: the local ACK timeout, counted against retry_cnt.
                    self.stats.timeouts += 1;
                    trace_event!(
                        qpn = self.core.qpn,
                        psn = psn.value(),
                        "ACK timeout: retransmitting"
                    );
                    self.req.on_loss(psn);
                    self.rewind(psn);
                    self.arm_retransmit(now);
                    self.arm_probe(now);
                }
                CompAction::Fatal(st) => {
                    self.enter_err(Some(st));
                    return;
                }
                _ => {}
            }
        }
        if self.timers.take_expired(Timer::Probe, now) {
            self.probe(now);
        }
    }

    /// Tail-loss probe: nothing answered for a few round trips. When the last packets of a
    /// burst are lost, or the responder's one sequence NAK is, or the retransmission that
    /// answered it, nothing else would move before the local ACK timeout (perftest's is
    /// 67 ms). This consumes no retry: only the local ACK timeout does.
    ///
    /// The first probe after progress is a copy of the last packet sent, with AckReq (as TCP's
    /// tail-loss probe): if it arrived, the copy is a duplicate and the responder ACKs all it
    /// holds; if it and packets before it were lost, the copy is out of sequence and draws the
    /// responder's NAK, and the requester goes back as for any NAK. Either way nothing else
    /// changes, so a probe that was not needed costs one packet. A responder that already sent
    /// its one NAK stays silent (IBA C9-90), so the next probe is the oldest unacknowledged
    /// packet itself, with nothing more sent until it is answered ([`RcQp::probe_answered`]).
    fn probe(&mut self, now: Instant) {
        if !self.req.outstanding()
            || self.req.rnr_paused
            || !matches!(self.core.state, QpState::Rts | QpState::Sqd)
        {
            return;
        }
        self.stats.probes += 1;
        self.probes_in_row += 1;
        self.rtt_timed = None;
        let last = self.req.next_psn.sub(1);
        let copy_ok = self.req.probe == Probe::Off
            && self.probes_in_row == 1
            && !last.before(self.req.una)
            && self
                .req
                .sq
                .iter()
                .find(|e| e.contains(last))
                .is_some_and(|e| !e.is_rd_atomic());
        if copy_ok {
            self.req.probe = Probe::Last;
        } else {
            if self.req.probe != Probe::Sent && self.req.probe != Probe::Due {
                self.probe_resume = self.req.next_psn;
            }
            self.probe_chained = false;
            self.probe_oldest();
        }
        self.arm_probe(now);
    }

    /// The next probe is the oldest unacknowledged packet itself: the cursor goes back to it,
    /// and nothing more is sent until it is answered.
    fn probe_oldest(&mut self) {
        let una = self.req.una;
        self.req.seek(una);
        self.probe_rd = self
            .req
            .sq
            .get(self.req.idx)
            .is_some_and(|e| e.is_rd_atomic());
        self.req.probe = Probe::Due;
    }

    /// The cursor goes back to where the probe found it, or to the oldest unacknowledged PSN
    /// if that is past it.
    fn resume_after_probe(&mut self) {
        let una = self.req.una;
        let resume = if self.probe_resume.before(una) {
            una
        } else {
            self.probe_resume
        };
        self.req.seek(resume);
    }

    /// Progress while a probe is out. The responder answers a probe it takes in sequence
    /// with an ACK of exactly that PSN, and a duplicate with an ACK of the last PSN it holds
    /// (IBA C9-104; rdma_rxe: the PSN before the one it expects). An ACK of exactly the
    /// probed PSN of a SEND or WRITE means the hole was there: what was sent after it was lost
    /// or dropped (a responder that NAKed drops everything out of sequence), so go back to the
    /// new oldest unacknowledged PSN — a loss. Anything else (a later PSN: the probe was a
    /// duplicate, e.g. ACKs were lost or merely late) leaves the cursor where the probe found
    /// it: a gap still there draws a NAK from the next packet, or the next probe finds it.
    fn probe_answered(&mut self) {
        match self.req.probe {
            Probe::Off => {}
            Probe::Last => self.req.probe = Probe::Off,
            Probe::Due => {
                self.req.probe = Probe::Off;
                self.resume_after_probe();
            }
            Probe::Sent => {
                self.req.probe = Probe::Off;
                let una = self.req.una;
                if !self.probe_rd && una == self.req.last_probe.add(1) {
                    self.req.on_loss(self.req.last_probe);
                    self.rewind(una);
                } else if !self.probe_chained && una.before(self.probe_resume) {
                    // A duplicate: the responder expects `una`, and packets from there on
                    // were sent before the probe. Probe once more, at once, at `una`: taken
                    // in sequence, it finds the hole (a lost NAK or retransmission leaves
                    // the responder silent); a duplicate again, they were only late.
                    self.probe_chained = true;
                    self.stats.probes += 1;
                    self.probe_oldest();
                } else {
                    self.resume_after_probe();
                }
            }
        }
    }

    /// The next packet to send, written into `buf` (BTH to ICRC; the ICRC field is left for the
    /// driver, which knows the IP header). Returns its length, or `None` if nothing is to send.
    /// `buf` must hold at least path MTU + 64 bytes.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
    ) -> Option<usize> {
        let (resp_ok, req_ok) = match self.core.state {
            QpState::Rtr => (true, false),
            QpState::Rts | QpState::Sqd => (true, true),
            // In ERR only the NAK reporting the error still goes out.
            QpState::Err => (true, false),
            _ => (false, false),
        };
        for _ in 0..2 {
            self.resp_turn = !self.resp_turn;
            if self.resp_turn {
                if resp_ok && self.resp.has_output() {
                    let p = self.resp_params();
                    if let Some(n) = self.resp.next_packet(&p, mem, buf) {
                        return Some(n);
                    }
                }
            } else if req_ok {
                let p = self.req_params();
                match self.req.next_packet(&p, mem, buf) {
                    Some(ReqEvent::Packet(n)) => {
                        self.stats.sent += 1;
                        if self.req.last_again {
                            self.stats.retransmitted += 1;
                        } else if self.req.last_ack_req && self.rtt_timed.is_none() {
                            self.rtt_timed = Some((self.req.last_psn, now));
                        }
                        if !self.timers.is_armed(Timer::Retransmit) {
                            self.arm_retransmit(now);
                        }
                        self.arm_probe(now);
                        return Some(n);
                    }
                    Some(ReqEvent::LocalError(st)) => {
                        let at = self.req.idx;
                        self.enter_err_at(Some((at, st)));
                        return None;
                    }
                    None => {}
                }
            }
        }
        None
    }

    /// The earliest deadline at which [`RcQp::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }
}

/// A send WR's inline data or gather list against the QP's caps (RC and UD).
pub(crate) fn check_send_lists(wqe: &SendWqe, caps: &QpCaps) -> Result<(), PostError> {
    if wqe.flags.contains(SendFlags::INLINE) {
        if wqe.inline_data.len() > caps.max_inline_data as usize {
            return Err(PostError::InlineTooLong {
                got: wqe.inline_data.len(),
                max: caps.max_inline_data,
            });
        }
    } else if wqe.sg_list.len() > caps.max_send_sge as usize {
        return Err(PostError::TooManySge {
            got: wqe.sg_list.len(),
            max: caps.max_send_sge,
        });
    }
    Ok(())
}

/// A connected QP's send WR (RC and UC): its lists against the caps and its length against
/// [`MAX_MSG_LEN`]. Returns the length.
pub(crate) fn check_send_wqe(wqe: &SendWqe, caps: &QpCaps) -> Result<u64, PostError> {
    check_send_lists(wqe, caps)?;
    let len = wqe.length();
    if len > MAX_MSG_LEN {
        return Err(PostError::MessageTooLong(len));
    }
    Ok(len)
}

/// A receive WQE flushed with WR_FLUSH_ERR (RC and UC).
pub(crate) fn flush_recv(wr_id: u64, src_qp: u32) -> Completion {
    Completion::recv(
        wr_id,
        WcStatus::WrFlushErr,
        WcOpcode::Recv,
        0,
        None,
        src_qp,
        false,
    )
}

/// The completions of this QP not yet polled, with per-side counts (they still occupy their work
/// queue slot until polled, as in libibverbs). RC and UC.
#[derive(Debug, Default)]
pub(crate) struct Cq {
    qpn: u32,
    q: VecDeque<Completion>,
    pub(crate) send_pending: usize,
    pub(crate) recv_pending: usize,
}

impl Cq {
    pub(crate) fn new(qpn: u32) -> Cq {
        Cq {
            qpn,
            ..Cq::default()
        }
    }
    pub(crate) fn push(&mut self, mut c: Completion) {
        c.qp_num = self.qpn;
        match c.side {
            CqSide::Send => self.send_pending += 1,
            CqSide::Recv => self.recv_pending += 1,
        }
        self.q.push_back(c);
    }
    /// Queue a send WR that passed its checks on a connected QP (RC and UC): refused when the
    /// send queue is full (completions not yet polled still hold their slot); on a QP in ERR
    /// it is flushed at once, as rxe does. `sig_all`: the QP signals every WR.
    pub(crate) fn queue_send(
        &mut self,
        req: &mut Requester,
        caps: &QpCaps,
        state: QpState,
        sig_all: bool,
        mtu: usize,
        wqe: SendWqe,
    ) -> Result<(), PostError> {
        if req.sq.len() + self.send_pending >= caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        let signaled = wqe.flags.contains(SendFlags::SIGNALED) || sig_all;
        let e = SendEntry::new(wqe, signaled, mtu);
        if state == QpState::Err {
            complete(&e, WcStatus::WrFlushErr, true, &mut |c| self.push(c));
            return Ok(());
        }
        req.sq.push_back(e);
        Ok(())
    }
    pub(crate) fn pop(&mut self) -> Option<Completion> {
        let c = self.q.pop_front()?;
        match c.side {
            CqSide::Send => self.send_pending -= 1,
            CqSide::Recv => self.recv_pending -= 1,
        }
        Some(c)
    }
}
