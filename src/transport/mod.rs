//! The transport core, sans-IO: state machines fed packets and time, returning packets to send
//! and completions. No sockets, no clocks, no threads (see [`rc::RcQp`] for the call order).

mod connected;
mod inbound;
pub mod memory;
mod modify;
pub mod rc;
pub mod sglist;
pub mod sim;
pub mod srq;
pub mod types;
pub mod uc;
pub mod ud;

pub use memory::{MemError, MemoryAccess};
pub use rc::{AccessRefusals, PostError, QpError, RcQp, RcStats, MAX_MSG_LEN};
pub use sglist::SgList;
pub use srq::{Srq, SrqError};
pub use types::*;
pub use uc::{UcDrops, UcQp};
