//! The checks `ibv_modify_qp` makes before any attribute applies, shared by every QP type: the
//! expected current state, a legal transition, and every required attribute given and no other
//! (IBA 11.2.4.2; the kernel's `ib_modify_qp_is_ok`). Each QP type supplies its own table, over
//! the one set of attribute mask bits here.

use super::rc::QpError;
use super::types::{QpAttr, QpState};

/// Check `attr` against the transition table of a QP type and return the next state.
/// `transition(from, to)` gives the (required, optional) attribute masks of a legal transition;
/// `mask` is the set of attributes present in `attr`; `names` names each mask bit.
pub(crate) fn check_transition(
    cur: QpState,
    attr: &QpAttr,
    transition: impl Fn(QpState, QpState) -> Option<(u32, u32)>,
    mask: u32,
    names: impl Iterator<Item = (u32, &'static str)> + Clone,
) -> Result<QpState, QpError> {
    if let Some(c) = attr.cur_qp_state {
        if c != cur {
            return Err(QpError::WrongCurrentState {
                expected: c,
                actual: cur,
            });
        }
    }
    let next = attr.qp_state.unwrap_or(cur);
    let (required, optional) = transition(cur, next).ok_or(QpError::InvalidTransition {
        from: cur,
        to: next,
    })?;
    for (bit, name) in names.clone() {
        if required & bit != 0 && mask & bit == 0 {
            return Err(QpError::MissingAttr(name));
        }
    }
    for (bit, name) in names {
        if mask & bit != 0 && (required | optional) & bit == 0 {
            return Err(QpError::UnexpectedAttr(name));
        }
    }
    Ok(next)
}

// Attribute mask bits (as `enum ibv_qp_attr_mask`, in our own order).
pub(crate) const CUR_STATE: u32 = 1 << 0;
pub(crate) const PATH_MTU: u32 = 1 << 1;
pub(crate) const QKEY: u32 = 1 << 2;
pub(crate) const RQ_PSN: u32 = 1 << 3;
pub(crate) const SQ_PSN: u32 = 1 << 4;
pub(crate) const DEST_QPN: u32 = 1 << 5;
pub(crate) const ACCESS: u32 = 1 << 6;
pub(crate) const PKEY: u32 = 1 << 7;
pub(crate) const PORT: u32 = 1 << 8;
pub(crate) const AV: u32 = 1 << 9;
pub(crate) const TIMEOUT: u32 = 1 << 10;
pub(crate) const RETRY: u32 = 1 << 11;
pub(crate) const RNR_RETRY: u32 = 1 << 12;
pub(crate) const MIN_RNR: u32 = 1 << 13;
pub(crate) const MAX_RD: u32 = 1 << 14;
pub(crate) const MAX_DEST_RD: u32 = 1 << 15;
pub(crate) const SQ_DRAINING: u32 = 1 << 16;

const ATTR_NAMES: [&str; 17] = [
    "cur_qp_state",
    "path_mtu",
    "qkey",
    "rq_psn",
    "sq_psn",
    "dest_qp_num",
    "qp_access_flags",
    "pkey_index",
    "port_num",
    "ah_attr",
    "timeout",
    "retry_cnt",
    "rnr_retry",
    "min_rnr_timer",
    "max_rd_atomic",
    "max_dest_rd_atomic",
    "sq_draining",
];

/// Each mask bit with the name of its attribute, in bit order (the order errors name them in).
pub(crate) fn attr_names() -> impl Iterator<Item = (u32, &'static str)> + Clone {
    ATTR_NAMES.iter().enumerate().map(|(i, n)| (1u32 << i, *n))
}

/// The mask of the attributes present in `a`.
pub(crate) fn attr_mask(a: &QpAttr) -> u32 {
    let mut m = 0;
    let mut set = |present: bool, bit: u32| {
        if present {
            m |= bit
        }
    };
    set(a.cur_qp_state.is_some(), CUR_STATE);
    set(a.path_mtu.is_some(), PATH_MTU);
    set(a.qkey.is_some(), QKEY);
    set(a.rq_psn.is_some(), RQ_PSN);
    set(a.sq_psn.is_some(), SQ_PSN);
    set(a.dest_qp_num.is_some(), DEST_QPN);
    set(a.qp_access_flags.is_some(), ACCESS);
    set(a.pkey_index.is_some(), PKEY);
    set(a.port_num.is_some(), PORT);
    set(a.ah_attr.is_some(), AV);
    set(a.timeout.is_some(), TIMEOUT);
    set(a.retry_cnt.is_some(), RETRY);
    set(a.rnr_retry.is_some(), RNR_RETRY);
    set(a.min_rnr_timer.is_some(), MIN_RNR);
    set(a.max_rd_atomic.is_some(), MAX_RD);
    set(a.max_dest_rd_atomic.is_some(), MAX_DEST_RD);
    set(a.sq_draining.is_some(), SQ_DRAINING);
    m
}
