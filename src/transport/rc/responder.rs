//! The responder (rxe_resp.c): checks and executes incoming requests against memory — SEND into
//! receive WQEs, RDMA WRITE, RDMA READ, atomics — detects duplicates and PSN gaps, and queues
//! ACKs, NAKs, READ responses and atomic ACKs in PSN order for transmission.

use std::collections::VecDeque;

use crate::transport::inbound::{check_mtu_length, check_rkey, Inbound, WriteCursor};
use crate::transport::memory::{MemError, MemoryAccess};
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::aeth::CREDITS_INVALID;
use crate::wire::{
    Aeth, AtomicAckEth, AtomicEth, Bth, Kind, NakCode, OpInfo, Opcode, Packet, Psn, Reth, Syndrome,
};

use super::requester::npkts_for;
use super::resp_error::{Nak, RespError};

/// Most responses queued behind each other before duplicate requests are dropped instead of
/// answered (bounds memory under hostile traffic).
const MAX_QUEUED: usize = 256;

/// QP parameters the responder needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RespParams {
    pub mtu: usize,
    pub dest_qpn: u32,
    pub access: AccessFlags,
    pub max_dest_rd_atomic: u32,
    pub min_rnr_timer: u8,
}

/// A packet waiting to be sent, in PSN order.
#[derive(Clone, Copy, Debug)]
enum Out {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// READ response packets still to send: next PSN, address, remaining bytes, and whether
    /// the next one is the first of the response.
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        resid: u32,
        first: bool,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// A READ/atomic remembered for duplicate handling (IBA 9.7.5.2.6 responder resources).
#[derive(Clone, Copy, Debug)]
enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// What the QP must do after the responder handled a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RespEvent {
    None,
    /// A responder-side error: the NAK is queued; the QP goes to ERR (IBA 9.9.3.1.x class B/C/D).
    Error,
}

#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number (24 bits).
    pub msn: u32,
    /// The QP's own receive queue (unused when it takes WQEs from a shared receive queue).
    pub rq: VecDeque<RecvWqe>,
    /// The message in progress and the receive WQE it holds.
    pub msg: Inbound,
    /// A PSN-sequence or RNR NAK went out; stay silent until back in sequence (IBA C9-90).
    nak_sent: bool,
    out: VecDeque<Out>,
    res: VecDeque<Resource>,
    /// Counters for [`super::RcStats`].
    pub refused: super::qp::AccessRefusals,
    pub seq_naks: u64,
    pub out_of_seq: u64,
    pub duplicates: u64,
}

fn msn_inc(m: u32) -> u32 {
    m.wrapping_add(1) & 0x00ff_ffff
}

impl Responder {
    pub(crate) fn reset(&mut self, psn: Psn) {
        self.epsn = psn;
        self.msn = 0;
        self.rq.clear();
        self.msg = Inbound::default();
        self.nak_sent = false;
        self.out.clear();
        self.res.clear();
    }

    /// After the QP entered ERR (and flushed [`Inbound::wqe`]): only NAKs already queued
    /// still go out.
    pub(crate) fn keep_naks_only(&mut self) {
        self.out.retain(|o| {
            matches!(
                o,
                Out::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.msg.cur = None;
        self.res.clear();
    }

    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Owe an ACK for `psn`: coalesce with an ACK already queued at the tail (IBA 9.7.5.1.4).
    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Out::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.out.back_mut()
        {
            if !psn.before(*p) {
                *p = psn;
                *m = msn;
            }
            return;
        }
        self.out.push_back(Out::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credits: CREDITS_INVALID,
            },
            msn,
        });
    }

    /// A request-kind packet for this QP, with the QP in RTR, RTS or SQD. `srq`: the shared
    /// receive queue the QP takes its receive WQEs from; `None` for its own [`Responder::rq`].
    ///
    /// The steps of rxe's responder in its order: [`Responder::check_psn`], then for a request
    /// in sequence [`Responder::check_op_seq`], the length, the per-kind access, rkey and
    /// resource checks, the execution, and the acknowledgement. A failing step's
    /// [`RespError`] is answered by [`Responder::respond_error`].
    pub(crate) fn on_request(
        &mut self,
        pkt: &Packet<'_>,
        p: &RespParams,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        out: &mut dyn FnMut(Completion),
    ) -> RespEvent {
        let Some(info) = pkt.info() else {
            return RespEvent::None;
        };
        match self.check_psn(pkt.bth.psn) {
            PsnCheck::Duplicate => {
                self.duplicates += 1;
                self.duplicate(pkt);
                RespEvent::None
            }
            PsnCheck::OutOfSequence => {
                self.out_of_sequence();
                RespEvent::None
            }
            PsnCheck::InSequence => match self.in_sequence(pkt, info, p, mem, srq, out) {
                Ok(()) => RespEvent::None,
                Err(e) => self.respond_error(pkt.bth.psn, e, p, out),
            },
        }
    }

    /// rxe `check_psn`: where the request's PSN stands against the expected one.
    fn check_psn(&self, psn: Psn) -> PsnCheck {
        match psn.diff(self.epsn) {
            d if d < 0 => PsnCheck::Duplicate,
            0 => PsnCheck::InSequence,
            _ => PsnCheck::OutOfSequence,
        }
    }

    /// IBA C9-90: one PSN sequence error NAK, then silence until back in sequence.
    fn out_of_sequence(&mut self) {
        self.out_of_seq += 1;
        if !self.nak_sent {
            self.seq_naks += 1;
            self.nak_sent = true;
            self.out.push_back(Out::Ack {
                psn: self.epsn,
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: self.msn,
            });
        }
    }

    /// The steps after the PSN check, per kind of request.
    fn in_sequence(
        &mut self,
        pkt: &Packet<'_>,
        info: &OpInfo,
        p: &RespParams,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        out: &mut dyn FnMut(Completion),
    ) -> Result<(), RespError> {
        self.check_op_seq(info)?;
        check_mtu_length(info.position, pkt.payload.len(), p.mtu)?;
        let ends = info.position.ends();
        match info.kind {
            Kind::Send => {
                self.msg.take_wqe(&mut self.rq, srq)?;
                self.msg.execute(pkt, ends, None, mem, p.dest_qpn, out)?;
            }
            Kind::RdmaWrite => {
                let w = self.check_write(pkt, p, mem)?;
                w.check_len(pkt.payload.len(), ends)?;
                // RDMA WRITE with immediate consumes a receive WQE (IBA 9.4.3), taken before
                // the data lands: RNR if none (the write state stays, so the retried LAST
                // continues this message).
                if ends && pkt.immdt.is_some() {
                    self.msg.take_wqe(&mut self.rq, srq)?;
                }
                self.msg.execute(pkt, ends, Some(w), mem, p.dest_qpn, out)?;
            }
            // A QP that serves no READ or atomic (max_dest_rd_atomic 0) refuses them, as rxe
            // and NICs do (softrdma used to take 0 for 1).
            Kind::ReadRequest | Kind::CompareSwap | Kind::FetchAdd if p.max_dest_rd_atomic == 0 => {
                return Err(RespError::NoRdAtomic);
            }
            Kind::ReadRequest => {
                let reth = check_read(pkt, p, mem)?;
                self.execute_read(pkt.bth.psn, &reth, p);
                return Ok(());
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let (a, op) = check_atomic(pkt, info.kind, p)?;
                return self.execute_atomic(pkt.bth.psn, &a, op, p, mem);
            }
            // Responses and anything else are not requests.
            _ => return Ok(()),
        }
        if ends {
            self.msn = msn_inc(self.msn);
        }
        self.acknowledge(pkt, ends);
        Ok(())
    }

    /// rxe `check_op_seq` (IBA 9.7.4.1.4 / C9-94): a message's middle and last packets follow
    /// its first; a new message starts only after the last one ended.
    fn check_op_seq(&self, info: &OpInfo) -> Result<(), RespError> {
        let ok = if info.position.starts() {
            self.msg.cur.is_none()
        } else {
            self.msg.continues(info.kind)
        };
        if ok {
            Ok(())
        } else {
            Err(RespError::OpSeq)
        }
    }

    /// rxe `check_op_valid` and `check_rkey` for a WRITE: the cursor of the WRITE in progress,
    /// or, at its first packet, the RETH checked against the QP's access and the rkey.
    fn check_write(
        &self,
        pkt: &Packet<'_>,
        p: &RespParams,
        mem: &dyn MemoryAccess,
    ) -> Result<WriteCursor, RespError> {
        if let Some(w) = self.msg.write_cursor() {
            return Ok(w);
        }
        let reth = pkt.reth.ok_or(RespError::Malformed)?;
        check_qp_access(p, AccessFlags::REMOTE_WRITE)?;
        check_rkey(mem, &reth, AccessFlags::REMOTE_WRITE)?;
        Ok(WriteCursor::new(&reth))
    }

    /// Queue the READ response and remember the request for duplicates (IBA 9.7.5.2.6).
    fn execute_read(&mut self, psn: Psn, reth: &Reth, p: &RespParams) {
        let n = npkts_for(reth.dma_len, p.mtu);
        self.msn = msn_inc(self.msn);
        self.remember(
            p,
            Resource::Read {
                first: psn,
                last: psn.add(n - 1),
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
            },
        );
        self.out.push_back(Out::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            resid: reth.dma_len,
            first: true,
            msn: self.msn,
        });
        self.epsn = psn.add(n);
        self.nak_sent = false;
    }

    /// Execute the atomic, queue its ACK and remember the result for duplicates (IBA C9-106).
    fn execute_atomic(
        &mut self,
        psn: Psn,
        a: &AtomicEth,
        op: AtomicOp,
        p: &RespParams,
        mem: &dyn MemoryAccess,
    ) -> Result<(), RespError> {
        let orig = mem.remote_atomic(a.rkey, a.va, op).map_err(|e| match e {
            MemError::Misaligned => RespError::Misaligned,
            e => RespError::Rkey(e),
        })?;
        self.msn = msn_inc(self.msn);
        self.remember(p, Resource::Atomic { psn, orig });
        self.out.push_back(Out::Atomic {
            psn,
            orig,
            msn: self.msn,
        });
        self.epsn = psn.add(1);
        self.nak_sent = false;
        Ok(())
    }

    /// A SEND or WRITE packet executed: expect the next PSN, and owe an ACK if asked for, or
    /// at the end of a message that consumed a receive WQE. A plain RDMA WRITE that does not
    /// ask is not acknowledged, as rxe does it (rxe_resp.c acknowledges only AckReq): a
    /// requester that splits a WRITE into a message per packet asks on the last one
    /// (`RcQp::set_split_writes`), and an ACK per packet would double the datagrams.
    fn acknowledge(&mut self, pkt: &Packet<'_>, ends: bool) {
        let psn = pkt.bth.psn;
        self.epsn = psn.add(1);
        self.nak_sent = false;
        let plain_write = matches!(
            pkt.bth.opcode,
            Opcode::RC_RDMA_WRITE_ONLY | Opcode::RC_RDMA_WRITE_LAST
        );
        if pkt.bth.ack_req || (ends && !plain_write) {
            self.push_ack(psn);
        }
    }

    /// rxe's error states: queue the NAK [`RespError::answer`] gives. An RNR NAK goes out for
    /// every in-sequence attempt without a receive WQE, and the packets that follow it are then
    /// out of sequence and get no NAK of their own. A fatal error completes a receive WQE the
    /// message holds in error, ends the message, and moves the QP to ERR.
    fn respond_error(
        &mut self,
        psn: Psn,
        e: RespError,
        p: &RespParams,
        out: &mut dyn FnMut(Completion),
    ) -> RespEvent {
        self.refused.count(&e);
        trace_event!(dest_qpn = p.dest_qpn, psn = psn.value(), error = ?e, "responder refused a request");
        let a = e.answer();
        if let Some(status) = a.status {
            self.msg.fail_wqe(status, p.dest_qpn, out);
        }
        let syndrome = match a.nak {
            Nak::Rnr => Syndrome::RnrNak {
                timer: p.min_rnr_timer,
            },
            Nak::Code(code) => Syndrome::Nak(code),
        };
        self.out.push_back(Out::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
        if a.fatal {
            self.msg.cur = None;
            RespEvent::Error
        } else {
            self.nak_sent = true;
            RespEvent::None
        }
    }

    fn remember(&mut self, p: &RespParams, r: Resource) {
        // At most max_dest_rd_atomic resources; the oldest is reused (rxe get_resource).
        while self.res.len() >= p.max_dest_rd_atomic.max(1) as usize {
            self.res.pop_front();
        }
        self.res.push_back(r);
    }

    /// A request with a PSN before the expected one (IBA 9.7.5.1.x duplicate handling).
    fn duplicate(&mut self, pkt: &Packet<'_>) {
        let Some(info) = pkt.info() else { return };
        let psn = pkt.bth.psn;
        if self.out.len() >= MAX_QUEUED {
            return;
        }
        match info.kind {
            // IBA C9-104: a duplicate SEND/WRITE is not executed again; re-ACK the latest PSN.
            Kind::Send | Kind::RdmaWrite => self.push_ack(self.epsn.sub(1)),
            // IBA C9-105: a duplicate READ is executed again for the range it asks for, which
            // must lie within the original request.
            Kind::ReadRequest => {
                let Some(reth) = pkt.reth else { return };
                let found = self.res.iter().rev().find_map(|r| match *r {
                    Resource::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } if !psn.before(first) && !psn.after(last) => Some((va, rkey, len)),
                    _ => None,
                });
                let Some((va, rkey, len)) = found else { return };
                let end = reth.va.wrapping_add(reth.dma_len as u64);
                if reth.rkey != rkey
                    || reth.va < va
                    || end > va.wrapping_add(len as u64)
                    || end < reth.va
                {
                    return;
                }
                self.out.push_back(Out::Read {
                    psn,
                    va: reth.va,
                    rkey,
                    resid: reth.dma_len,
                    first: true,
                    msn: self.msn,
                });
            }
            // IBA C9-106: a duplicate atomic is never executed again; the saved result is replayed.
            Kind::CompareSwap | Kind::FetchAdd => {
                let found = self.res.iter().rev().find_map(|r| match *r {
                    Resource::Atomic { psn: q, orig } if q == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = found {
                    self.out.push_back(Out::Atomic {
                        psn,
                        orig,
                        msn: self.msn,
                    });
                }
            }
            _ => {}
        }
    }

    /// Emit the next queued response into `buf`. Returns its length and whether it was a NAK
    /// that reported a fatal error (for tracing). Reads are produced packet by packet, reading
    /// memory only as each packet is built.
    pub(crate) fn next_packet(
        &mut self,
        p: &RespParams,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
    ) -> Option<usize> {
        loop {
            let o = self.out.front_mut()?;
            match o {
                Out::Ack { psn, syndrome, msn } => {
                    let mut pkt =
                        Packet::new(Bth::new(Opcode::RC_ACKNOWLEDGE, p.dest_qpn, *psn), &[]);
                    pkt.aeth = Some(Aeth {
                        syndrome: *syndrome,
                        msn: *msn,
                    });
                    let n = pkt.emit(buf).ok();
                    self.out.pop_front();
                    if n.is_some() {
                        return n;
                    }
                }
                Out::Atomic { psn, orig, msn } => {
                    let mut pkt = Packet::new(
                        Bth::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, p.dest_qpn, *psn),
                        &[],
                    );
                    pkt.aeth = Some(Aeth {
                        syndrome: Syndrome::Ack {
                            credits: CREDITS_INVALID,
                        },
                        msn: *msn,
                    });
                    pkt.atomic_ack_eth = Some(AtomicAckEth { orig: *orig });
                    let n = pkt.emit(buf).ok();
                    self.out.pop_front();
                    if n.is_some() {
                        return n;
                    }
                }
                Out::Read {
                    psn,
                    va,
                    rkey,
                    resid,
                    first,
                    msn,
                } => {
                    let plen = (*resid as usize).min(p.mtu);
                    let last = *resid as usize <= p.mtu;
                    let opcode = match (*first, last) {
                        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let mut bth = Bth::new(opcode, p.dest_qpn, *psn);
                    bth.pad_count = Bth::pad_for(plen);
                    let mut pkt = Packet::new(bth, &[]);
                    pkt.aeth = Some(Aeth {
                        syndrome: Syndrome::Ack {
                            credits: CREDITS_INVALID,
                        },
                        msn: *msn,
                    });
                    let info = opcode.info().expect("in table");
                    let hlen = info.header_len();
                    let total =
                        hlen + plen + bth.pad_count as usize + crate::wire::packet::ICRC_LEN;
                    if buf.len() < total || pkt.emit(buf).is_err() {
                        return None;
                    }
                    if plen > 0
                        && mem
                            .remote_read(*rkey, *va, &mut buf[hlen..hlen + plen])
                            .is_err()
                    {
                        // The region went away under the READ: NAK it instead (IBA C9-...).
                        let psn = *psn;
                        let msn = *msn;
                        *o = Out::Ack {
                            psn,
                            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                            msn,
                        };
                        continue;
                    }
                    buf[hlen + plen..total].fill(0);
                    if last {
                        self.out.pop_front();
                    } else {
                        *psn = psn.add(1);
                        *va = va.wrapping_add(plen as u64);
                        *resid -= plen as u32;
                        *first = false;
                    }
                    return Some(total);
                }
            }
        }
    }
}

/// Where a request's PSN stands (rxe `check_psn`).
enum PsnCheck {
    Duplicate,
    InSequence,
    OutOfSequence,
}

/// rxe `check_op_valid`: the QP must allow the operation (IBA C9-88 / o10-2).
fn check_qp_access(p: &RespParams, access: AccessFlags) -> Result<(), RespError> {
    if p.access.contains(access) {
        Ok(())
    } else {
        Err(RespError::QpAccess)
    }
}

/// The checks of a READ request: its RETH, its length (IBA 9.4.4: at most 2^31 bytes), the
/// QP's access and the rkey.
fn check_read(pkt: &Packet<'_>, p: &RespParams, mem: &dyn MemoryAccess) -> Result<Reth, RespError> {
    let reth = pkt.reth.ok_or(RespError::Malformed)?;
    if reth.dma_len > 1 << 31 {
        return Err(RespError::Length);
    }
    check_qp_access(p, AccessFlags::REMOTE_READ)?;
    check_rkey(mem, &reth, AccessFlags::REMOTE_READ)?;
    Ok(reth)
}

/// The checks of an atomic request: its AtomicETH, the QP's access and the address's
/// alignment (IBA C9-101: 8 bytes); the rkey is checked as it executes. Returns the operation.
fn check_atomic(
    pkt: &Packet<'_>,
    kind: Kind,
    p: &RespParams,
) -> Result<(AtomicEth, AtomicOp), RespError> {
    let a = pkt.atomic_eth.ok_or(RespError::Malformed)?;
    check_qp_access(p, AccessFlags::REMOTE_ATOMIC)?;
    if a.va % 8 != 0 {
        return Err(RespError::Misaligned);
    }
    let op = if kind == Kind::CompareSwap {
        AtomicOp::CompareSwap {
            compare: a.compare,
            swap: a.swap_add,
        }
    } else {
        AtomicOp::FetchAdd { add: a.swap_add }
    };
    Ok((a, op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sim::{pattern, VecMemory};
    use crate::wire::{AtomicEth, Reth};

    const P: RespParams = RespParams {
        mtu: 256,
        dest_qpn: 0x77,
        access: AccessFlags::all(),
        max_dest_rd_atomic: 4,
        min_rnr_timer: 3,
    };

    struct T {
        r: Responder,
        mem: VecMemory,
        comps: Vec<Completion>,
    }

    impl T {
        fn new() -> Self {
            let mut r = Responder::default();
            r.reset(Psn::new(10));
            T {
                r,
                mem: VecMemory::new(),
                comps: Vec::new(),
            }
        }
        fn feed(&mut self, pkt: Packet<'_>) -> RespEvent {
            let mut buf = vec![0u8; 2048];
            let n = pkt.emit(&mut buf).unwrap();
            let p = Packet::parse(&buf[..n]).unwrap();
            let comps = &mut self.comps;
            self.r
                .on_request(&p, &P, &self.mem, None, &mut |c| comps.push(c))
        }
        #[allow(clippy::type_complexity)]
        fn out(&mut self) -> Vec<(Opcode, u32, Option<Syndrome>, Vec<u8>, Option<u64>)> {
            let mut v = Vec::new();
            let mut buf = vec![0u8; 2048];
            while let Some(n) = self.r.next_packet(&P, &self.mem, &mut buf) {
                let p = Packet::parse(&buf[..n]).unwrap();
                v.push((
                    p.bth.opcode,
                    p.bth.psn.value(),
                    p.aeth.map(|a| a.syndrome),
                    p.payload.to_vec(),
                    p.atomic_ack_eth.map(|a| a.orig),
                ));
            }
            v
        }
    }

    fn write(psn: u32, va: u64, rkey: u32, data: &[u8]) -> Packet<'_> {
        let mut b = Bth::new(Opcode::RC_RDMA_WRITE_ONLY, 1, Psn::new(psn));
        b.ack_req = true;
        let mut p = Packet::new(b, data);
        p.bth.pad_count = Bth::pad_for(data.len());
        p.reth = Some(Reth {
            va,
            rkey,
            dma_len: data.len() as u32,
        });
        p
    }

    fn read(psn: u32, va: u64, rkey: u32, dma_len: u32) -> Packet<'static> {
        let mut p = Packet::new(
            Bth::new(Opcode::RC_RDMA_READ_REQUEST, 1, Psn::new(psn)),
            &[],
        );
        p.reth = Some(Reth { va, rkey, dma_len });
        p
    }

    const ACK: Option<Syndrome> = Some(Syndrome::Ack { credits: 0x1f });

    #[test]
    fn coalesces_acks_and_reacks_duplicates_without_executing() {
        let mut t = T::new();
        let mr = t.mem.register(256, AccessFlags::all());
        t.feed(write(10, mr.addr, mr.rkey, &[1; 16]));
        t.feed(write(11, mr.addr + 16, mr.rkey, &[2; 16]));
        // One ACK for the highest PSN.
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 11, ACK, vec![], None)]
        );
        t.mem.write(mr.addr, &[9; 16]);
        // IBA C9-104: a duplicate is re-ACKed, not executed again.
        t.feed(write(10, mr.addr, mr.rkey, &[1; 16]));
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 11, ACK, vec![], None)]
        );
        assert_eq!(t.mem.read(mr.addr, 16), vec![9; 16]);
        assert_eq!(t.r.epsn, Psn::new(12));
        assert_eq!(t.r.msn, 2);
    }

    #[test]
    fn a_write_that_does_not_ask_is_not_acknowledged() {
        // As rxe: a plain WRITE message without AckReq gets no ACK (a split WRITE asks on its
        // last packet only); a SEND is acknowledged at its end whether it asks or not.
        let mut t = T::new();
        let mr = t.mem.register(256, AccessFlags::all());
        let mut w = write(10, mr.addr, mr.rkey, &[1; 16]);
        w.bth.ack_req = false;
        t.feed(w);
        assert_eq!(t.out(), vec![]);
        assert_eq!(t.mem.read(mr.addr, 16), vec![1; 16]);
        t.feed(write(11, mr.addr + 16, mr.rkey, &[2; 16]));
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 11, ACK, vec![], None)]
        );
        t.r.rq.push_back(RecvWqe {
            wr_id: 1,
            sg_list: vec![mr.sge(64, 64)].into(),
        });
        t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_ONLY, 1, Psn::new(12)),
            &[3; 8],
        ));
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 12, ACK, vec![], None)]
        );
        assert_eq!(t.comps.len(), 1);
    }

    #[test]
    fn one_sequence_nak_per_gap() {
        let mut t = T::new();
        let mr = t.mem.register(256, AccessFlags::all());
        for psn in [12, 13, 14] {
            t.feed(write(psn, mr.addr, mr.rkey, &[1; 4]));
        }
        assert_eq!(
            t.out(),
            vec![(
                Opcode::RC_ACKNOWLEDGE,
                10,
                Some(Syndrome::Nak(NakCode::PsnSequenceError)),
                vec![],
                None
            )]
        );
        assert_eq!(t.mem.read(mr.addr, 4), vec![0; 4]);
        // Back in sequence, then a new gap: a new NAK.
        t.feed(write(10, mr.addr, mr.rkey, &[1; 4]));
        t.feed(write(12, mr.addr, mr.rkey, &[1; 4]));
        assert_eq!(
            t.out(),
            vec![
                (Opcode::RC_ACKNOWLEDGE, 10, ACK, vec![], None),
                (
                    Opcode::RC_ACKNOWLEDGE,
                    11,
                    Some(Syndrome::Nak(NakCode::PsnSequenceError)),
                    vec![],
                    None
                ),
            ]
        );
    }

    #[test]
    fn rnr_nak_every_attempt_without_receive() {
        let mut t = T::new();
        let mr = t.mem.register(256, AccessFlags::all());
        let mut b = Bth::new(Opcode::RC_SEND_ONLY, 1, Psn::new(10));
        b.ack_req = true;
        for _ in 0..2 {
            t.feed(Packet::new(b, &[7; 8]));
            assert_eq!(
                t.out(),
                vec![(
                    Opcode::RC_ACKNOWLEDGE,
                    10,
                    Some(Syndrome::RnrNak { timer: 3 }),
                    vec![],
                    None
                )]
            );
            assert_eq!(t.r.epsn, Psn::new(10));
        }
        t.r.rq.push_back(RecvWqe {
            wr_id: 5,
            sg_list: vec![mr.sge(0, 64)].into(),
        });
        t.feed(Packet::new(b, &[7; 8]));
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 10, ACK, vec![], None)]
        );
        assert_eq!(t.comps.len(), 1);
        assert_eq!(
            (t.comps[0].wr_id, t.comps[0].byte_len, t.comps[0].src_qp),
            (5, 8, 0x77)
        );
    }

    #[test]
    fn duplicate_read_is_reexecuted_from_its_offset() {
        let mut t = T::new();
        let mr = t.mem.register(1000, AccessFlags::all());
        let data = pattern(3, 1000);
        t.mem.write(mr.addr, &data);
        let p = read(10, mr.addr, mr.rkey, 1000);
        t.feed(p);
        let o = t.out();
        assert_eq!(
            o.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            vec![
                (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 10),
                (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 11),
                (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 12),
                (Opcode::RC_RDMA_READ_RESPONSE_LAST, 13),
            ]
        );
        assert_eq!(o.iter().flat_map(|x| x.3.clone()).collect::<Vec<_>>(), data);
        assert_eq!(o[1].2, None, "MIDDLE carries no AETH");
        assert_eq!(t.r.epsn, Psn::new(14));
        // Memory changes; the requester asks again from PSN 12 (offset 512).
        t.mem.write(mr.addr + 512, &[0xee; 488]);
        let p = read(12, mr.addr + 512, mr.rkey, 488);
        t.feed(p);
        let o = t.out();
        assert_eq!(
            o.iter().map(|x| (x.0, x.1, x.3.len())).collect::<Vec<_>>(),
            vec![
                (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 12, 256),
                (Opcode::RC_RDMA_READ_RESPONSE_LAST, 13, 232),
            ]
        );
        assert!(o.iter().all(|x| x.3.iter().all(|&b| b == 0xee)));
        // A "duplicate" asking for more than the original is refused.
        let p = read(12, mr.addr + 512, mr.rkey, 600);
        t.feed(p);
        assert!(t.out().is_empty());
    }

    #[test]
    fn duplicate_atomic_replays_without_executing() {
        let mut t = T::new();
        let mr = t.mem.register(64, AccessFlags::all());
        t.mem.write(mr.addr, &40u64.to_ne_bytes());
        let mut p = Packet::new(Bth::new(Opcode::RC_FETCH_ADD, 1, Psn::new(10)), &[]);
        p.atomic_eth = Some(AtomicEth {
            va: mr.addr,
            rkey: mr.rkey,
            swap_add: 2,
            compare: 0,
        });
        t.feed(p);
        t.feed(p);
        t.feed(p);
        let o = t.out();
        assert_eq!(o.len(), 3);
        assert!(o
            .iter()
            .all(|x| x.0 == Opcode::RC_ATOMIC_ACKNOWLEDGE && x.1 == 10 && x.4 == Some(40)));
        assert_eq!(
            t.mem.read(mr.addr, 8),
            42u64.to_ne_bytes().to_vec(),
            "executed exactly once"
        );
    }

    #[test]
    fn multi_packet_send_and_length_error() {
        let mut t = T::new();
        let mr = t.mem.register(1024, AccessFlags::all());
        t.r.rq.push_back(RecvWqe {
            wr_id: 1,
            sg_list: vec![mr.sge(0, 300), mr.sge(500, 300)].into(),
        });
        t.r.rq.push_back(RecvWqe {
            wr_id: 2,
            sg_list: vec![mr.sge(0, 100)].into(),
        });
        let d = pattern(1, 600);
        t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_FIRST, 1, Psn::new(10)),
            &d[..256],
        ));
        t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_MIDDLE, 1, Psn::new(11)),
            &d[256..512],
        ));
        t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_LAST, 1, Psn::new(12)),
            &d[512..600],
        ));
        assert_eq!(t.comps.len(), 1);
        assert_eq!(
            (t.comps[0].wr_id, t.comps[0].status, t.comps[0].byte_len),
            (1, WcStatus::Success, 600)
        );
        assert_eq!(t.mem.read(mr.addr, 300), d[..300].to_vec());
        assert_eq!(t.mem.read(mr.addr + 500, 300), d[300..].to_vec());
        // 256 bytes into a 100-byte buffer.
        let ev = t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_FIRST, 1, Psn::new(13)),
            &d[..256],
        ));
        assert_eq!(ev, RespEvent::Error);
        assert_eq!(
            (t.comps[1].wr_id, t.comps[1].status),
            (2, WcStatus::LocLenErr)
        );
        let o = t.out();
        assert_eq!(
            o.last().unwrap().2,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        );
    }

    #[test]
    fn write_with_imm_without_receive_is_rnr_naked_and_resumes_at_its_last() {
        let mut t = T::new();
        let mr = t.mem.register(1024, AccessFlags::all());
        let d = pattern(5, 300);
        let mut first = Packet::new(
            Bth::new(Opcode::RC_RDMA_WRITE_FIRST, 1, Psn::new(10)),
            &d[..256],
        );
        first.reth = Some(Reth {
            va: mr.addr,
            rkey: mr.rkey,
            dma_len: 300,
        });
        let mut last = Packet::new(
            Bth::new(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 1, Psn::new(11)),
            &d[256..],
        );
        last.immdt = Some(0x1234);
        t.feed(first);
        assert_eq!(t.feed(last), RespEvent::None);
        let rnr = Some(Syndrome::RnrNak { timer: 3 });
        assert_eq!(
            t.out().iter().map(|o| (o.1, o.2)).collect::<Vec<_>>(),
            vec![(11, rnr)]
        );
        assert_eq!(t.r.epsn, Psn::new(11));
        t.r.rq.push_back(RecvWqe {
            wr_id: 9,
            sg_list: vec![].into(),
        });
        t.feed(last);
        assert_eq!(
            (
                t.comps[0].wr_id,
                t.comps[0].opcode,
                t.comps[0].byte_len,
                t.comps[0].imm_data
            ),
            (9, WcOpcode::RecvRdmaWithImm, 300, Some(0x1234))
        );
        assert_eq!(t.mem.read(mr.addr, 300), d);
        assert_eq!(
            t.out(),
            vec![(Opcode::RC_ACKNOWLEDGE, 11, ACK, vec![], None)]
        );
        assert_eq!(t.r.msn, 1);
    }

    #[test]
    fn a_fatal_error_completes_the_held_receive_and_naks() {
        let mut t = T::new();
        let mr = t.mem.register(1024, AccessFlags::all());
        t.r.rq.push_back(RecvWqe {
            wr_id: 4,
            sg_list: vec![mr.sge(0, 1024)].into(),
        });
        t.feed(Packet::new(
            Bth::new(Opcode::RC_SEND_FIRST, 1, Psn::new(10)),
            &[1; 256],
        ));
        // A WRITE inside the SEND: out of the opcode sequence.
        assert_eq!(
            t.feed(write(11, mr.addr, mr.rkey, &[2; 8])),
            RespEvent::Error
        );
        assert_eq!(
            (t.comps[0].wr_id, t.comps[0].status, t.comps[0].byte_len),
            (4, WcStatus::RemInvReqErr, 0)
        );
        assert_eq!(
            t.out().last().map(|o| (o.1, o.2)),
            Some((11, Some(Syndrome::Nak(NakCode::InvalidRequest))))
        );
        // A misaligned atomic and a READ the QP does not allow.
        let mut t = T::new();
        let mr = t.mem.register(64, AccessFlags::all());
        let mut a = Packet::new(Bth::new(Opcode::RC_FETCH_ADD, 1, Psn::new(10)), &[]);
        a.atomic_eth = Some(AtomicEth {
            va: mr.addr + 4,
            rkey: mr.rkey,
            swap_add: 1,
            compare: 0,
        });
        assert_eq!(t.feed(a), RespEvent::Error);
        let r = read(10, mr.addr, mr.rkey, 8);
        let mut buf = vec![0u8; 2048];
        let n = r.emit(&mut buf).unwrap();
        let r = Packet::parse(&buf[..n]).unwrap();
        let p = RespParams {
            access: AccessFlags::REMOTE_WRITE,
            ..P
        };
        assert_eq!(
            t.r.on_request(&r, &p, &t.mem, None, &mut |_| {}),
            RespEvent::Error
        );
        assert_eq!(
            t.out().iter().map(|o| (o.1, o.2)).collect::<Vec<_>>(),
            vec![
                (10, Some(Syndrome::Nak(NakCode::InvalidRequest))),
                (10, Some(Syndrome::Nak(NakCode::RemoteAccessError))),
            ]
        );
        assert!(t.comps.is_empty());
    }
}
