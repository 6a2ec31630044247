//! softrdma as a drop-in `libibverbs.so.1` and `librdmacm.so.1` (rdma-core 44's ABI, Debian
//! 12), so RDMA programs built against rdma-core run unmodified on softrdma's user-space
//! RoCEv2 transport.
//!
//! One shared object holds everything: libibverbs' verbs (`verbs/`), librdmacm's connection
//! manager (`rdmacm/`) and stand-ins for the provider libraries perftest links directly
//! (`stubs/`). The other library names are symbolic links to it, so the dynamic loader maps it
//! once and every library shares one runtime: an `ibv_context` that librdmacm hands out is the
//! one libibverbs' calls receive. Each exported function is bound to its rdma-core version node
//! (`export.rs`); the layouts of the C structures come from the system headers (`abi.rs`).
//!
//! Every entry point checks its pointers, converts a Rust panic into an error return (nothing
//! unwinds into C) and reports errors the way rdma-core does: `errno` plus a NULL or non-zero
//! return.

#![allow(clippy::missing_safety_doc)]

pub mod abi;
#[macro_use]
mod export;
mod handle;
mod rdmacm;
mod stubs;
mod verbs;
