//! RDMA for Rust, with no NIC, no kernel module and no root: libibverbs' Verbs and librdmacm's
//! connection manager, in safe Rust, over a user-space RoCEv2 transport that speaks to Linux
//! Soft-RoCE (`rdma_rxe`) and RoCE NICs on the wire.
//!
//! Every example below runs as it is (they are this crate's doctests), on the loopback device
//! every machine has.
//!
//! # Verbs: device, protection domain, memory, queue pairs
//!
//! ```
//! use std::time::Duration;
//! use softrdma::verbs::*;
//!
//! // The device list, as `ibv_get_device_list`: one device per network interface, the
//! // loopback one last.
//! let dev = devices()?.pop().expect("the loopback device");
//! let ctx = dev.open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//!
//! // Memory a peer may read and write; here, two RC queue pairs talk to each other.
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
//! let mr = pd.alloc_mr(8192, access)?;
//! let (a, b) = (pd.create_rc_qp(&cq)?, pd.create_rc_qp(&cq)?);
//!
//! // Each side sends its endpoint (QPN, PSN, GID, MTU) to the other by any means; connect
//! // does RESET -> INIT -> RTR -> RTS.
//! a.connect(&b.endpoint(), &ConnectOptions::default())?;
//! b.connect(&a.endpoint(), &ConnectOptions::default())?;
//!
//! // A peer's buffer is a RemoteSlice (address, length, rkey): 20 bytes on the wire.
//! let theirs: RemoteSlice = mr.remote(4096..8192)?;
//!
//! // RDMA WRITE, then READ it back; work requests are signaled unless told otherwise.
//! mr.write(0, b"hello, remote memory")?;
//! a.write(mr.slice(..20)?, theirs).id(1).post()?;
//! let wc = cq.wait(Duration::from_secs(5))?.ok()?;
//! assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::RdmaWrite));
//! a.read(mr.slice(100..120)?, theirs).id(2).post()?;
//! cq.wait(Duration::from_secs(5))?.ok()?;
//! let mut back = [0u8; 20];
//! mr.read(100, &mut back)?;
//! assert_eq!(&back, b"hello, remote memory");
//!
//! // SEND with immediate data into a posted receive.
//! b.recv(mr.slice(200..264)?).id(3).post()?;
//! a.send(mr.slice(..5)?).imm(42).post()?;
//! let mut got = Vec::new();
//! while got.len() < 2 {
//!     got.push(cq.wait(Duration::from_secs(5))?.ok()?);
//! }
//! let recv = got.iter().find(|wc| wc.opcode == WcOpcode::Recv).unwrap();
//! assert_eq!((recv.wr_id, recv.byte_len, recv.imm()), (3, 5, Some(42)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A failed work request completes with its status: [`verbs::WorkCompletion::ok`] makes it an
//! error that says what failed and why it usually does.
//!
//! ```
//! # use std::time::Duration;
//! # use softrdma::verbs::*;
//! # let ctx = devices()?.pop().unwrap().open()?;
//! # let pd = ctx.alloc_pd()?;
//! # let cq = ctx.create_cq(64, None)?;
//! # let (a, b) = (pd.create_rc_qp(&cq)?, pd.create_rc_qp(&cq)?);
//! # a.connect(&b.endpoint(), &ConnectOptions::default())?;
//! # b.connect(&a.endpoint(), &ConnectOptions::default())?;
//! let local = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! let read_only = pd.alloc_mr(64, AccessFlags::REMOTE_READ)?;
//! // Writing where the peer only allows reading: a remote access error.
//! a.write(local.slice(..8)?, read_only.remote(..)?).post()?;
//! let err = cq.wait(Duration::from_secs(5))?.ok().unwrap_err();
//! assert_eq!(err.wc.status, WcStatus::RemAccessErr);
//! assert!(err.to_string().contains("remote access error"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Memory can be the application's own: [`verbs::ProtectionDomain::register`] takes a
//! `Vec<u8>` and [`verbs::MemoryRegion::into_inner`] gives it back;
//! [`verbs::ProtectionDomain::register_borrowed`] lends a `&mut [u8]` for a scope.
//!
//! ```
//! # use softrdma::verbs::*;
//! # let ctx = devices()?.pop().unwrap().open()?;
//! # let pd = ctx.alloc_pd()?;
//! let mr = pd.register(vec![7u8; 4096], AccessFlags::LOCAL_WRITE)?;
//! let buf: Vec<u8> = mr.into_inner().map_err(|(e, _)| e)?;
//! assert_eq!(buf, vec![7u8; 4096]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # rdma_cm: connections by IP address
//!
//! [`rdma_cm::Connection::connect`] and [`rdma_cm::Listener::accept`] are each side of the
//! connection manager's handshake in one call (resolve, PD, CQ, QP, connect or accept, private
//! data both ways); [`rdma_cm::CmId`] is librdmacm's API call by call.
//!
//! ```
//! use softrdma::rdma_cm::{Connection, ConnectionOptions, Listener};
//! use softrdma::verbs::{AccessFlags, RemoteSlice};
//!
//! let listener = Listener::bind("127.0.0.1:0".parse()?)?;
//! let to = listener.local_addr().unwrap();
//! let server = std::thread::spawn(move || {
//!     // Register the memory on the connection's PD, then accept with where it is.
//!     listener.accept_with(|pd| {
//!         let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
//!         mr.write(0, b"served")?;
//!         let data = mr.remote(..)?.to_bytes();
//!         Ok((mr, ConnectionOptions::default().with_private_data(&data)))
//!     })
//! });
//! let conn = Connection::connect(to, &ConnectionOptions::default())?;
//! let theirs = RemoteSlice::from_bytes(conn.peer_data())?;
//! let mr = conn.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! conn.qp().read(mr.slice(..6)?, theirs).post()?;
//! conn.cq().wait(std::time::Duration::from_secs(5))?.ok()?;
//! let mut got = [0u8; 6];
//! mr.read(0, &mut got)?;
//! assert_eq!(&got, b"served");
//! let (_server_conn, _server_mr) = server.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Event loops and async
//!
//! Completion channels, rdma_cm event channels and a context's async events are file
//! descriptors (`AsFd`) for `epoll`/`poll`. With the `tokio` feature, the `tokio` module
//! awaits completions and connection events (`examples/async_echo.rs`).
//!
//! # What else is here
//! - [`verbs`]: the whole Verbs API: RC, UC and UD queue pairs, shared receive queues, address
//!   handles, completion channels, async events, raw work requests as libibverbs has them.
//! - [`rdma_cm`]: the connection manager, wire-compatible with Linux's.
//! - [`wire`]: RoCEv2 headers with `parse`/`emit`, the ICRC, pcap files.
//! - The `softrdma` command and `libibverbs.so.1`/`librdmacm.so.1` for C programs are in the
//!   `softrdma-capi` crate of the same repository.
#![deny(missing_docs)]

/// An event for a `tracing` subscriber (feature `tracing`: drops, retransmissions, NAKs, QP
/// errors); nothing without the feature.
macro_rules! trace_event {
    ($($t:tt)*) => {
        #[cfg(feature = "tracing")]
        {
            tracing::debug!(target: "softrdma", $($t)*);
        }
    };
}

#[doc(hidden)]
pub mod cm;
pub(crate) mod driver;
pub(crate) mod endpoint;
pub mod rdma_cm;
#[doc(hidden)]
pub mod transport;
pub mod verbs;
pub mod wire;

/// The sans-IO transport simulator (lossy, reordering links between RC QPs in one thread),
/// for the project's own tests and benchmarks; not an API.
#[doc(hidden)]
pub use transport::sim;

#[cfg(feature = "tokio")]
#[path = "async_tokio.rs"]
pub mod tokio;

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
