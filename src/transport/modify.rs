//! The checks `ibv_modify_qp` makes before any attribute applies, shared by every QP type: the
//! expected current state, a legal transition, and every required attribute given and no other
//! (IBA 11.2.4.2; the kernel's `ib_modify_qp_is_ok`). Each QP type supplies its own table.

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
