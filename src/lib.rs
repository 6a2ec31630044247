//! softrdma: RDMA for Rust over a pure user-space RoCEv2 transport.
//!
//! - [`verbs`]: the Verbs API (devices, PDs, MRs, CQs and channels, RC queue pairs).
//! - [`transport`]: the sans-IO RC transport core (requester, completer, responder).
//! - [`wire`]: RoCEv2 headers, the ICRC, pcap.
//! - [`rdma_cm`]: the RDMA connection manager (librdmacm's API) over the IB CM on QP1.
//! - [`cm`]: IB Communication Manager MADs and the sans-IO CM state machine.

pub mod cm;
pub(crate) mod driver;
pub(crate) mod endpoint;
pub mod rdma_cm;
pub mod transport;
pub mod verbs;
pub mod wire;

pub use driver::Stats;
pub use verbs::devices;
