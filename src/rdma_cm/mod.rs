//! The RDMA connection manager (librdmacm's API) over softrdma's user-space RoCEv2 transport,
//! speaking Linux's wire protocol: rdma_cm's IP addressing over the IB Communication Manager on
//! the GSI QP1, so it connects to and accepts from kernel rdma_rxe peers.
//!
//! ```text
//! EventChannel::new() -> create_id(PortSpace::Tcp) -> CmId
//!   server: bind_addr -> listen -> CONNECT_REQUEST(new id) -> create_qp -> accept -> ESTABLISHED
//!   client: resolve_addr -> ADDR_RESOLVED -> resolve_route -> ROUTE_RESOLVED -> create_qp
//!           -> connect -> ESTABLISHED
//!   either: disconnect -> DISCONNECTED (-> TIMEWAIT_EXIT)
//! ```
//! [`Connection::connect`] and [`Listener::accept`] do a whole side of that in one call.
//!
//! Events come from [`EventChannel::get_cm_event`] (its [`EventChannel::fd`] is pollable) and
//! are acknowledged by [`CmEvent::ack`] or by dropping them. The ids share one device context
//! per device ([`CmId::context`]): allocate the PD and CQs there.
//!
//! Addresses are IPv4 or IPv6 (`SocketAddr`), as with Linux: an id bound to `[::]` listens on
//! every device and takes IPv4 and IPv6 connections; one bound to `0.0.0.0` every device,
//! IPv4 only; an IPv6 connection runs over the devices' IPv6 GIDs (the rdma_cm header's IPv6
//! form in the REQ, RoCEv2 over IPv6 on the wire).

mod channel;
pub(crate) mod connection;
pub(crate) mod core;
mod error;
mod event;
mod id;
mod listeners;
mod route;

pub use crate::cm::endpoint::UNCLAIMED_REQ_WAIT;
pub use crate::cm::service_id::PortSpace;
pub use channel::{EventChannel, WaitError};
pub use connection::{Connection, ConnectionOptions, Listener};
pub use error::{CmaError, Result};
pub use event::{CmEvent, ConnParam, EventParam, EventType, UdParam};
pub use id::{CmId, CmTimeouts};

/// The device contexts rdma_cm ids use, one for each device that can be opened (librdmacm's
/// `rdma_get_devices`): the same [`crate::verbs::Context`] that [`CmId::context`] returns for
/// an id on that device.
///
/// # Errors
/// [`CmaError::NoDevice`] if no device can be opened.
pub fn device_contexts() -> Result<Vec<crate::verbs::Context>> {
    route::all_contexts()
}
