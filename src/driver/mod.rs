//! The thin driver around the sans-IO transport: UDP sockets (IPv4 and IPv6), the engine that moves datagrams
//! between it and the queue pairs, a progress thread, and packet capture.

pub(crate) mod batch;
pub(crate) mod capture;
pub(crate) mod engine;
pub(crate) mod forward;
pub(crate) mod holder;
pub(crate) mod probe;
pub(crate) mod progress;
pub(crate) mod runtime;
pub(crate) mod share;
pub(crate) mod sockaddr;
pub(crate) mod socket;
pub(crate) mod steer;
pub(crate) mod tx;

pub use engine::Stats;
