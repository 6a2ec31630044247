//! The driver-facing RC queue pair (contract; to be implemented).

use std::time::Instant;

use crate::transport::memory::MemoryAccess;
use crate::transport::types::*;
use crate::wire::Packet;

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
}

/// One RC queue pair's transport state.
///
/// Call order for a driver, after quinn-proto: feed every received packet for this QP to
/// [`RcQp::handle_packet`]; when [`RcQp::poll_timeout`]'s deadline passes, call
/// [`RcQp::handle_timeout`]; after either, and after posting, drain [`RcQp::poll_transmit`] until
/// it returns `None` and [`RcQp::poll_completion`] until it returns `None`.
pub struct RcQp {
    _todo: (),
}

impl RcQp {
    /// A new QP in RESET. `sq_sig_all` makes every send WR signaled.
    pub fn new(qpn: u32, caps: QpCaps, sq_sig_all: bool) -> Self {
        let _ = (qpn, caps, sq_sig_all);
        todo!()
    }
    pub fn qpn(&self) -> u32 {
        todo!()
    }
    pub fn state(&self) -> QpState {
        todo!()
    }
    pub fn caps(&self) -> QpCaps {
        todo!()
    }
    /// `ibv_modify_qp`: checks the transition and its required/optional attributes (IBA 11.2.4.2,
    /// as `ib_modify_qp_is_ok` does); moving to ERR flushes outstanding work.
    pub fn modify(&mut self, attr: &QpAttr, now: Instant) -> Result<(), QpError> {
        let _ = (attr, now);
        todo!()
    }
    /// `ibv_query_qp`: every attribute's current value.
    pub fn query(&self) -> QpAttr {
        todo!()
    }
    /// The address vector set at INIT->RTR: where packets go.
    pub fn destination(&self) -> Option<AddressVector> {
        todo!()
    }
    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostError> {
        let _ = wqe;
        todo!()
    }
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        let _ = wqe;
        todo!()
    }
    /// A packet addressed to this QP (ICRC already verified by the driver).
    pub fn handle_packet(&mut self, now: Instant, pkt: &Packet<'_>, mem: &dyn MemoryAccess) {
        let _ = (now, pkt, mem);
        todo!()
    }
    /// Timers due at or before `now` fire (retransmit, RNR wait, ...).
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }
    /// The next packet to send, written into `buf` (BTH to ICRC; the ICRC field is left for the
    /// driver, which knows the IP header). Returns its length, or `None` if nothing is to send.
    /// `buf` must hold at least path MTU + 64 bytes.
    pub fn poll_transmit(&mut self, now: Instant, mem: &dyn MemoryAccess, buf: &mut [u8]) -> Option<usize> {
        let _ = (now, mem, buf);
        todo!()
    }
    /// The earliest deadline at which [`RcQp::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
    /// The next completion for the send or receive CQ.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        todo!()
    }
}
