//! The Verbs API: libibverbs' objects and semantics in safe Rust.
//!
//! ```text
//! devices() -> Device::open() -> Context
//!   Context::alloc_pd() -> ProtectionDomain -> alloc_mr()/register()/register_raw() -> MemoryRegion
//!   Context::create_comp_channel() -> CompletionChannel (an fd for epoll)
//!   Context::create_cq() -> CompletionQueue -> poll()/req_notify()/ack_events()
//!   ProtectionDomain::create_qp() -> QueuePair -> modify()/post_send()/post_recv()
//!   ProtectionDomain::create_ah() -> AddressHandle (UD: QueuePair::post_send_ud())
//!   ProtectionDomain::create_srq() -> SharedReceiveQueue -> post_recv()/modify()/query()
//! ```

mod ah;
mod buf;
mod channel;
mod connect;
mod context;
mod cq;
mod device;
mod error;
mod mr;
mod netif;
mod pd;
mod qp;
mod srq;
mod typed;
mod wc;

pub use crate::driver::share::ShareError;
pub use crate::endpoint::events::AsyncEvent;
pub use ah::{AddressHandle, AhAttr};
pub use buf::{LocalSlice, RemoteSlice};
pub use channel::CompletionChannel;
pub use connect::{ConnectOptions, QpEndpoint};
pub use context::{Context, ContextOptions};
pub use cq::{CompletionQueue, Drain, WorkCompletion};
pub use device::{
    devices, gid_from_ipv4, ipv4_from_gid, AtomicCap, Device, DeviceAttr, PortAttr, PortState,
};
pub use error::{Result, VerbsError};
pub use mr::{MemoryRegion, MrGuard};
pub use pd::ProtectionDomain;
pub use qp::{QpInitAttr, QpType, QueuePair, RecvWr, SendWr, UdSend, UdSendWr};
pub use srq::{SharedReceiveQueue, SrqAttr, SrqInitAttr};
pub use typed::{Connected, PostRecv, PostSend, Qp, QpKind, Rc, Uc, Ud};
pub use wc::WcError;

/// Bytes at the front of every UD receive buffer that receive the GRH area.
pub use crate::transport::ud::GRH_LEN;
/// The transport types the verbs take and return, so `use softrdma::verbs::*` is enough.
pub use crate::transport::{
    AccessFlags, AccessRefusals, AddressVector, CqSide, MemError, Mtu, PostError, QpAttr, QpCaps,
    QpError, QpState, SendFlags, SendOp, SendWqe, Sge, WcGrh, WcOpcode, WcStatus,
};

pub(crate) use context::WeakContext;
