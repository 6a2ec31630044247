//! softrdma: RDMA for Rust over a pure user-space RoCEv2 transport.

pub mod cm;
pub mod transport;
pub mod wire;
