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

/// What softrdma's own tools (the `softrdma` command) need from the host; not an API.
#[doc(hidden)]
pub mod host {
    /// A directory `name` inside softrdma's state directory: private to this user, checked
    /// (never a link or another user's), made if absent. Returns its path.
    pub fn private_dir(name: &str) -> std::io::Result<std::path::PathBuf> {
        crate::driver::share::dir::StateDir::current()?.subdir(name)
    }

    pub use crate::driver::holder::{serve as serve_holder, HolderPolicy, HOLDER_SOCKET};
}
pub use verbs::devices;
