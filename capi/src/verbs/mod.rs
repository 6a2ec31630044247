//! libibverbs: `ibv_*` over softrdma's Verbs API.

mod ah;
mod async_event;
mod context;
mod cq;
mod cq_ex;
mod device;
mod pd;
mod qp;
mod qp_ex;
mod srq;
mod strings;
mod unsupported;
mod wr;
