//! The responder's error states (rxe_resp.c's `RESPST_ERR_*`): each failing step of the
//! request pipeline yields one [`RespError`], and [`RespError::answer`] is the one table from
//! error to NAK, receive completion status and whether the QP goes to ERR.

use crate::transport::types::WcStatus;
use crate::transport::MemError;
use crate::wire::NakCode;

/// Why the responder refuses a request packet in sequence.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RespError {
    /// No receive WQE for a SEND or an RDMA WRITE with immediate (IBA 9.7.5.2.8): not an error
    /// of the QP; the requester retries after the RNR timer.
    Rnr,
    /// A MIDDLE or LAST without its message, or a FIRST or ONLY inside one (IBA C9-94).
    OpSeq,
    /// A packet of the wrong length: not the path MTU (FIRST, MIDDLE), over it, WRITE packets
    /// not adding up to the RETH's DMA length, a READ over 2^31 bytes (IBA C9-95.., 9.4.4).
    Length,
    /// A request without the RETH or AtomicETH its opcode needs.
    Malformed,
    /// An atomic on an address that is not 8-byte aligned (IBA C9-101).
    Misaligned,
    /// The QP does not allow the operation (no REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    QpAccess,
    /// The rkey refuses the range, or the region went away under a later packet (IBA C9-88):
    /// why, as the memory table said.
    Rkey(MemError),
    /// A SEND longer than its receive buffers (IBA C9-99, class D).
    RecvTooLong,
    /// A receive buffer the SEND's data cannot be written to.
    RecvProt,
    /// An RDMA READ or atomic on a QP whose `max_dest_rd_atomic` is 0: it serves none (rxe's
    /// `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`).
    NoRdAtomic,
}

/// The NAK that answers a refused request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Nak {
    /// Receiver not ready, with the QP's minimum RNR timer.
    Rnr,
    Code(NakCode),
}

/// How the responder answers a [`RespError`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Answer {
    pub nak: Nak,
    /// The status a receive WQE held by the message completes with (none for RNR: the message
    /// keeps its state and no WQE was taken).
    pub status: Option<WcStatus>,
    /// The QP goes to ERR (IBA 9.9.3.1, classes B to D).
    pub fatal: bool,
}

impl RespError {
    /// The one table from error state to answer.
    pub(crate) fn answer(self) -> Answer {
        use NakCode::*;
        use RespError::*;
        let (code, status) = match self {
            Rnr => {
                return Answer {
                    nak: Nak::Rnr,
                    status: None,
                    fatal: false,
                }
            }
            OpSeq | Length | Malformed | Misaligned | NoRdAtomic => {
                (InvalidRequest, WcStatus::RemInvReqErr)
            }
            QpAccess | Rkey(_) => (RemoteAccessError, WcStatus::RemAccessErr),
            RecvTooLong => (InvalidRequest, WcStatus::LocLenErr),
            RecvProt => (RemoteOperationalError, WcStatus::LocProtErr),
        };
        Answer {
            nak: Nak::Code(code),
            status: Some(status),
            fatal: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_answers_as_the_inline_checks_did() {
        let fatal = |code, st| Answer {
            nak: Nak::Code(code),
            status: Some(st),
            fatal: true,
        };
        let rem_inv = fatal(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
        let rem_acc = fatal(NakCode::RemoteAccessError, WcStatus::RemAccessErr);
        for (e, want) in [
            (
                RespError::Rnr,
                Answer {
                    nak: Nak::Rnr,
                    status: None,
                    fatal: false,
                },
            ),
            (RespError::OpSeq, rem_inv),
            (RespError::Length, rem_inv),
            (RespError::Malformed, rem_inv),
            (RespError::Misaligned, rem_inv),
            (RespError::NoRdAtomic, rem_inv),
            (RespError::QpAccess, rem_acc),
            (RespError::Rkey(MemError::InvalidKey), rem_acc),
            (
                RespError::RecvTooLong,
                fatal(NakCode::InvalidRequest, WcStatus::LocLenErr),
            ),
            (
                RespError::RecvProt,
                fatal(NakCode::RemoteOperationalError, WcStatus::LocProtErr),
            ),
        ] {
            assert_eq!(e.answer(), want, "{e:?}");
        }
    }
}
