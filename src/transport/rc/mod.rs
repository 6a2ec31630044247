//! Reliable Connected transport: requester, completer and responder, as the IBA and rdma_rxe
//! split it, behind one driver-facing type, [`RcQp`].

mod qp;

pub use qp::{PostError, QpError, RcQp};
