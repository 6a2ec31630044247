//! Work completions as results: [`WorkCompletion::ok`] turns a failed one into a [`WcError`]
//! that says which request failed, how, and what usually causes it.

use crate::transport::{Completion, WcOpcode, WcStatus};

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl WcOpcode {
    /// The operation's name ("RDMA READ", "SEND", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            WcOpcode::Send => "SEND",
            WcOpcode::RdmaWrite => "RDMA WRITE",
            WcOpcode::RdmaRead => "RDMA READ",
            WcOpcode::CompSwap => "atomic compare-and-swap",
            WcOpcode::FetchAdd => "atomic fetch-and-add",
            WcOpcode::Recv => "receive",
            WcOpcode::RecvRdmaWithImm => "receive (RDMA WRITE with immediate)",
        }
    }
}

impl std::fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What usually causes a failed status, to say with it.
fn hint(s: WcStatus) -> &'static str {
    match s {
        WcStatus::RemAccessErr => {
            "the peer refused the access: its rkey is unknown or deregistered, the range is \
             outside its region, or the region or the peer's QP lacks the access flag \
             (REMOTE_READ/REMOTE_WRITE/REMOTE_ATOMIC); the peer's Context::stats().refused \
             says which"
        }
        WcStatus::RemInvReqErr => {
            "the peer found the request invalid: an operation its QP does not allow \
             (max_dest_rd_atomic 0 for READ and atomics), a length over its limit, or a \
             misaligned atomic"
        }
        WcStatus::RemOpErr => "the peer could not complete it (its receive buffer was too small?)",
        WcStatus::RetryExcErr => {
            "no answer after every retransmission: the peer is gone, unreachable, or its QP is \
             not in RTR/RTS"
        }
        WcStatus::RnrRetryExcErr => "the peer had no receive posted, through every RNR retry",
        WcStatus::LocLenErr => "the buffers are too small for the message (or over max_msg_sz)",
        WcStatus::LocProtErr => {
            "a local buffer is not inside a region of this QP's protection domain, or lacks \
             LOCAL_WRITE where data lands"
        }
        WcStatus::LocQpOpErr => "the QP cannot do this (its state, or the transport)",
        WcStatus::WrFlushErr => "flushed: the QP had gone to the error state before it ran",
        _ => "",
    }
}

/// A work request that completed with an error (from
/// [`WorkCompletion::ok`](super::WorkCompletion::ok)).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WcError {
    /// The completion as it came.
    pub wc: Completion,
}

impl std::fmt::Display for WcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wc = &self.wc;
        write!(
            f,
            "{} (wr_id {}) on QP {:#x} failed: {}",
            wc.opcode, wc.wr_id, wc.qp_num, wc.status
        )?;
        match hint(wc.status) {
            "" => Ok(()),
            h => write!(f, " ({h})"),
        }
    }
}

impl std::error::Error for WcError {}

impl Completion {
    /// The completion if it succeeded, else a [`WcError`] that says what failed.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// let wc = WorkCompletion { status: WcStatus::RetryExcErr, wr_id: 7, ..Default::default() };
    /// let e = wc.ok().unwrap_err();
    /// assert!(e.to_string().contains("transport retry counter exceeded"));
    /// # let _ = WorkCompletion { status: WcStatus::Success, ..Default::default() }.ok().unwrap();
    /// ```
    ///
    /// # Errors
    /// [`WcError`] unless the status is [`WcStatus::Success`].
    pub fn ok(self) -> Result<Completion, WcError> {
        if self.status == WcStatus::Success {
            Ok(self)
        } else {
            Err(WcError { wc: self })
        }
    }

    /// The immediate data, if the message carried some.
    pub fn imm(&self) -> Option<u32> {
        self.imm_data
    }
}
