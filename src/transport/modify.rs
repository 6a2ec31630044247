//! The checks `ibv_modify_qp` makes before any attribute applies, shared by every QP type: the
//! expected current state, a legal transition, and every required attribute given and no other
//! (IBA 11.2.4.2; the kernel's `ib_modify_qp_is_ok`). Each QP type supplies its own table, over
//! the one set of attribute mask bits here.

use super::rc::QpError;
use super::types::{QpAttr, QpState};
use crate::wire::Psn;

/// Most READ/atomic requests outstanding either way (rxe: RXE_MAX_QP_RD_ATOM = 128).
const MAX_RD_ATOMIC: u8 = 128;

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

/// `ibv_modify_qp` on a connected QP (RC and UC): [`check_transition`] against the QP type's
/// table, the attributes' ranges (IBA 11.2.4.2, rxe_qp_chk_attr), then the values given are
/// stored into `stored` (PSNs masked to 24 bits). `pkey_index_zero`: refuse any P_Key index
/// but 0 (UC checks it, RC leaves it to the partition check on each packet). Attributes a QP
/// type's table does not allow are refused by the transition check before their ranges
/// matter. Returns the next state; nothing is stored on error.
pub(crate) fn modify_connected(
    cur: QpState,
    stored: &mut QpAttr,
    attr: &QpAttr,
    transition: impl Fn(QpState, QpState) -> Option<(u32, u32)>,
    pkey_index_zero: bool,
) -> Result<QpState, QpError> {
    let next = check_transition(cur, attr, transition, attr_mask(attr), attr_names())?;
    let bad = [
        ("retry_cnt", attr.retry_cnt.is_some_and(|v| v > 7)),
        ("rnr_retry", attr.rnr_retry.is_some_and(|v| v > 7)),
        ("timeout", attr.timeout.is_some_and(|v| v > 31)),
        ("min_rnr_timer", attr.min_rnr_timer.is_some_and(|v| v > 31)),
        ("port_num", attr.port_num.is_some_and(|v| v != 1)),
        (
            "pkey_index",
            pkey_index_zero && attr.pkey_index.is_some_and(|v| v != 0),
        ),
        (
            "max_rd_atomic",
            attr.max_rd_atomic.is_some_and(|v| v > MAX_RD_ATOMIC),
        ),
        (
            "max_dest_rd_atomic",
            attr.max_dest_rd_atomic.is_some_and(|v| v > MAX_RD_ATOMIC),
        ),
        (
            "dest_qp_num",
            attr.dest_qp_num.is_some_and(|v| v > 0x00ff_ffff),
        ),
        (
            "ah_attr.port_num",
            attr.ah_attr.is_some_and(|av| av.port_num > 1),
        ),
    ];
    if let Some((name, _)) = bad.iter().find(|(_, b)| *b) {
        return Err(QpError::BadAttr(name));
    }
    macro_rules! take {
        ($($f:ident),*) => { $( if let Some(v) = attr.$f { stored.$f = Some(v); } )* };
    }
    take!(
        path_mtu,
        dest_qp_num,
        qp_access_flags,
        pkey_index,
        port_num,
        ah_attr,
        timeout,
        retry_cnt,
        rnr_retry,
        min_rnr_timer,
        max_rd_atomic,
        max_dest_rd_atomic
    );
    if let Some(p) = attr.rq_psn {
        stored.rq_psn = Some(p & Psn::MASK);
    }
    if let Some(p) = attr.sq_psn {
        stored.sq_psn = Some(p & Psn::MASK);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: QpState, _: QpState) -> Option<(u32, u32)> {
        Some((0, !0))
    }

    #[test]
    fn ranges_checked_before_anything_is_stored() {
        let to_init = |a: QpAttr| QpAttr {
            qp_state: Some(QpState::Init),
            ..a
        };
        let mut stored = QpAttr::default();
        // P_Key index: UC refuses all but 0, RC takes it.
        let pkey = to_init(QpAttr {
            pkey_index: Some(1),
            rq_psn: Some(0x0100_0005),
            ..Default::default()
        });
        assert_eq!(
            modify_connected(QpState::Reset, &mut stored, &pkey, any, true),
            Err(QpError::BadAttr("pkey_index"))
        );
        assert_eq!(stored.pkey_index, None);
        assert_eq!(
            modify_connected(QpState::Reset, &mut stored, &pkey, any, false),
            Ok(QpState::Init)
        );
        assert_eq!((stored.pkey_index, stored.rq_psn), (Some(1), Some(5)));
        for (bad, name) in [
            (
                QpAttr {
                    retry_cnt: Some(8),
                    port_num: Some(2),
                    ..Default::default()
                },
                "retry_cnt",
            ),
            (
                QpAttr {
                    max_dest_rd_atomic: Some(129),
                    dest_qp_num: Some(1 << 24),
                    ..Default::default()
                },
                "max_dest_rd_atomic",
            ),
        ] {
            assert_eq!(
                modify_connected(QpState::Reset, &mut stored, &to_init(bad), any, false),
                Err(QpError::BadAttr(name))
            );
        }
    }
}
