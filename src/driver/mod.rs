//! The thin driver around the sans-IO transport: a UDP socket, the engine that moves datagrams
//! between it and the queue pairs, a progress thread, and packet capture.

pub(crate) mod batch;
pub(crate) mod capture;
pub(crate) mod engine;
pub(crate) mod probe;
pub(crate) mod progress;
pub(crate) mod share;
pub(crate) mod socket;
pub(crate) mod steer;

pub use engine::Stats;
