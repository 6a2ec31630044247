//! libibverbs: `ibv_*` over softrdma's Verbs API.

pub(crate) mod ah;
mod async_event;
pub(crate) mod context;
pub(crate) mod cq;
mod cq_ex;
pub(crate) mod device;
pub(crate) mod pd;
pub(crate) mod qp;
mod qp_ex;
mod srq;
mod strings;
mod unsupported;
mod wr;
