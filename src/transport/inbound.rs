//! The message a connected QP is receiving, shared by the RC responder and the UC receiver: the
//! steps that take a receive WQE, place a SEND packet into it and an RDMA WRITE packet into the
//! region its RETH named, and the length and rkey checks both transports make alike (rxe_resp.c
//! `check_resource`, `check_length`, `check_rkey`, `send_data_in`, `write_data_in`). Failures
//! are [`RespError`]s; each transport decides what one means for it.

use std::collections::VecDeque;

use crate::transport::memory::{scatter, MemoryAccess};
use crate::transport::rc::RespError;
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::{Kind, Packet, Position, Reth};

/// An RDMA WRITE in progress: next address, rkey, bytes still expected, total length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteCursor {
    pub va: u64,
    pub rkey: u32,
    pub resid: u32,
    pub total: u32,
}

impl WriteCursor {
    /// A WRITE that starts with this RETH.
    pub(crate) fn new(reth: &Reth) -> Self {
        WriteCursor {
            va: reth.va,
            rkey: reth.rkey,
            resid: reth.dma_len,
            total: reth.dma_len,
        }
    }

    /// No packet carries more than remains, and the last one exactly that.
    pub(crate) fn check_len(&self, plen: usize, ends: bool) -> Result<(), RespError> {
        if plen as u32 > self.resid || (ends && plen as u32 != self.resid) {
            return Err(RespError::Length);
        }
        Ok(())
    }
}

/// A multi-packet message in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) enum InMsg {
    /// SEND into the receive WQE taken when it started ([`Inbound::wqe`]); `off` bytes placed
    /// so far.
    Send {
        off: u32,
    },
    Write(WriteCursor),
}

/// IBA C9-95..: FIRST and MIDDLE carry exactly the path MTU, LAST and ONLY at most that.
pub(crate) fn check_mtu_length(pos: Position, plen: usize, mtu: usize) -> Result<(), RespError> {
    let full = matches!(pos, Position::First | Position::Middle);
    if (full && plen != mtu) || plen > mtu {
        return Err(RespError::Length);
    }
    Ok(())
}

/// IBA C9-88 / o10-2: the rkey must grant `access` over the RETH's range; a zero-length
/// request names no memory and needs no key.
pub(crate) fn check_rkey(
    mem: &dyn MemoryAccess,
    reth: &Reth,
    access: AccessFlags,
) -> Result<(), RespError> {
    if reth.dma_len > 0 {
        mem.remote_check(reth.rkey, reth.va, reth.dma_len as u64, access)
            .map_err(RespError::Rkey)?;
    }
    Ok(())
}

/// A receive completion in error: no data, no immediate.
pub(crate) fn recv_error(wr_id: u64, status: WcStatus, src_qp: u32) -> Completion {
    Completion::recv(wr_id, status, WcOpcode::Recv, 0, None, src_qp, false)
}

/// The message in progress and the receive WQE it holds.
#[derive(Debug, Default)]
pub(crate) struct Inbound {
    /// The receive WQE of the message in progress: taken from the receive queue (the QP's own
    /// or the shared one) when a message that needs one starts (a SEND's first packet, a WRITE
    /// with immediate's last), held until it completes (rxe's `resp.wqe`).
    pub wqe: Option<RecvWqe>,
    pub cur: Option<InMsg>,
}

impl Inbound {
    /// IBA 9.7.4.1.4 / C9-94: a MIDDLE or LAST packet of `kind` continues the message in
    /// progress only if it is of the same kind.
    pub(crate) fn continues(&self, kind: Kind) -> bool {
        matches!(
            (self.cur, kind),
            (Some(InMsg::Send { .. }), Kind::Send) | (Some(InMsg::Write(_)), Kind::RdmaWrite)
        )
    }

    /// The WRITE in progress, if any.
    pub(crate) fn write_cursor(&self) -> Option<WriteCursor> {
        match self.cur {
            Some(InMsg::Write(w)) => Some(w),
            _ => None,
        }
    }

    /// rxe `check_resource`: hold a receive WQE, taking one unless the message holds it
    /// already: from the shared receive queue if the QP has one (`srq`), else from its own
    /// (`rq`). [`RespError::Rnr`] if none is posted.
    pub(crate) fn take_wqe(
        &mut self,
        rq: &mut VecDeque<RecvWqe>,
        srq: Option<&mut Srq>,
    ) -> Result<(), RespError> {
        if self.wqe.is_none() {
            self.wqe = match srq {
                Some(s) => s.take(),
                None => rq.pop_front(),
            };
        }
        match self.wqe {
            Some(_) => Ok(()),
            None => Err(RespError::Rnr),
        }
    }

    /// The held receive WQE, if any, completes with `status`.
    pub(crate) fn fail_wqe(
        &mut self,
        status: WcStatus,
        src_qp: u32,
        out: &mut dyn FnMut(Completion),
    ) {
        if let Some(w) = self.wqe.take() {
            out(recv_error(w.wr_id, status, src_qp));
        }
    }

    /// rxe `send_data_in` / `write_data_in`: place the packet's data, a SEND's (`write` is
    /// `None`) into the held receive WQE after what the message placed so far, a WRITE's at
    /// `w`, the cursor its checks passed. The message's last packet completes the receive WQE
    /// a SEND or a WRITE with immediate holds (IBA 9.4.3). Fails with
    /// [`RespError::RecvTooLong`] past the WQE's buffers, [`RespError::RecvProt`] if they
    /// cannot be written (the WQE stays held for the caller to complete), [`RespError::Rkey`]
    /// if the region refuses a WRITE's data.
    pub(crate) fn execute(
        &mut self,
        pkt: &Packet<'_>,
        ends: bool,
        write: Option<WriteCursor>,
        mem: &dyn MemoryAccess,
        src_qp: u32,
        out: &mut dyn FnMut(Completion),
    ) -> Result<(), RespError> {
        let plen = pkt.payload.len() as u32;
        let next = match write {
            None => InMsg::Send {
                off: self.send_data_in(pkt, mem)?,
            },
            Some(w) => {
                if plen > 0 {
                    mem.remote_write(w.rkey, w.va, pkt.payload)
                        .map_err(RespError::Rkey)?;
                }
                InMsg::Write(WriteCursor {
                    va: w.va.wrapping_add(plen as u64),
                    resid: w.resid.saturating_sub(plen),
                    ..w
                })
            }
        };
        if !ends {
            self.cur = Some(next);
            return Ok(());
        }
        self.cur = None;
        let (opcode, byte_len) = match next {
            InMsg::Send { off } => (WcOpcode::Recv, off),
            InMsg::Write(w) if pkt.immdt.is_some() => (WcOpcode::RecvRdmaWithImm, w.total),
            InMsg::Write(_) => return Ok(()),
        };
        self.complete(pkt, opcode, byte_len, src_qp, out);
        Ok(())
    }

    /// A SEND packet into the held receive WQE at the message's offset; returns the offset
    /// after it.
    fn send_data_in(&self, pkt: &Packet<'_>, mem: &dyn MemoryAccess) -> Result<u32, RespError> {
        let Some(wqe) = self.wqe.as_ref() else {
            return Err(RespError::Rnr);
        };
        let off = match self.cur {
            Some(InMsg::Send { off }) => off,
            _ => 0,
        };
        let plen = pkt.payload.len();
        let cap: u64 = wqe.sg_list.iter().map(|s| s.length as u64).sum();
        if off as u64 + plen as u64 > cap {
            return Err(RespError::RecvTooLong);
        }
        if scatter(&wqe.sg_list, off as usize, pkt.payload, mem).is_err() {
            return Err(RespError::RecvProt);
        }
        Ok(off + plen as u32)
    }

    /// The message's last packet `pkt` completes the held receive WQE: `byte_len` bytes, with
    /// the packet's immediate data and solicited event bit.
    fn complete(
        &mut self,
        pkt: &Packet<'_>,
        opcode: WcOpcode,
        byte_len: u32,
        src_qp: u32,
        out: &mut dyn FnMut(Completion),
    ) {
        if let Some(w) = self.wqe.take() {
            out(Completion::recv(
                w.wr_id,
                WcStatus::Success,
                opcode,
                byte_len,
                pkt.immdt,
                src_qp,
                pkt.bth.solicited,
            ));
        }
    }
}
