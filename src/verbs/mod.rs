//! The Verbs API: libibverbs' objects and semantics in safe Rust.
//!
//! ```text
//! devices() -> Device::open() -> Context
//!   Context::alloc_pd() -> ProtectionDomain -> alloc_mr()/register() -> MemoryRegion
//!   Context::create_comp_channel() -> CompletionChannel (an fd for epoll)
//!   Context::create_cq() -> CompletionQueue -> poll()/req_notify()/ack_events()
//!   ProtectionDomain::create_qp() -> QueuePair -> modify()/post_send()/post_recv()
//! ```

mod channel;
mod context;
mod cq;
mod device;
mod error;
mod mr;
mod pd;
mod qp;

pub use channel::CompletionChannel;
pub use context::Context;
pub use cq::{CompletionQueue, WorkCompletion};
pub use device::{
    devices, gid_from_ipv4, ipv4_from_gid, AtomicCap, Device, DeviceAttr, PortAttr, PortState,
};
pub use error::{Result, VerbsError};
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub use qp::{QpInitAttr, QpType, QueuePair, RecvWr, SendWr};

pub(crate) use context::Shared;
pub(crate) use cq::CqShared;
pub(crate) use mr::MrTable;
