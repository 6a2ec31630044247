//! softrdma: RDMA for Rust over a pure user-space RoCEv2 transport.
//!
//! - [`verbs`]: the Verbs API (devices, PDs, MRs, CQs and channels, RC queue pairs).
//! - [`transport`]: the sans-IO RC transport core (requester, completer, responder).
//! - [`wire`]: RoCEv2 headers, the ICRC, pcap.
//! - [`cm`]: IB Communication Manager MADs (the rdma_cm wire protocol).

pub mod cm;
pub(crate) mod driver;
pub mod transport;
pub mod verbs;
pub mod wire;

pub use driver::Stats;
pub use verbs::devices;
