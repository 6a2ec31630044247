//! Reliable Connected transport: requester, completer and responder, as the IBA and rdma_rxe
//! split it, behind one driver-facing type, [`RcQp`].

mod completer;
mod qp;
mod requester;
mod resp_error;
mod responder;
mod timer;

pub(crate) use completer::complete;
pub(crate) use qp::{check_send_lists, check_send_wqe, flush_recv, Cq};
pub use qp::{AccessRefusals, PostError, QpError, RcQp, RcStats, MAX_MSG_LEN};
pub(crate) use requester::{ReqEvent, ReqParams, Requester};
pub(crate) use resp_error::RespError;
