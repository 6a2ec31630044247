//! Unreliable Connected queue pairs, sans-IO.
//!
//! A [`UcQp`] is connected to one remote QP like an RC QP (address vector, destination QPN, PSNs)
//! and moves SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM, segmented at the path MTU
//! exactly as RC (the RC requester builds the packets, with the UC opcodes 0x20..0x2b). There are
//! no ACKs, no retransmission and no RNR: a send completes, successfully, once its last packet is
//! handed to the wire (rxe: `rxe_xmit_packet` completes a non-RC WQE at its END packet).
//! RDMA READ and atomics do not exist on UC and are refused at post time.
//!
//! The receiving side follows IBA 9.7.4 / 9.9 for UC as rdma_rxe implements it (`check_psn`,
//! `check_op_seq`, `check_op_valid` and the class D/E error paths of `rxe_resp.c`):
//!
//! - PSNs must follow each other. A packet with another PSN, or one out of the message's opcode
//!   sequence (a MIDDLE or LAST without its FIRST, a SEND packet inside a WRITE), breaks the
//!   message in progress: it is dropped silently (no completion) and so is everything up to the
//!   next FIRST or ONLY packet, which is accepted whatever its PSN (the expected PSN
//!   resynchronizes on it, as in rxe).
//! - The receive WQE a broken SEND was filling stays at the head of the receive queue and starts
//!   over with the next SEND (rxe resets its DMA state, `do_class_d1e_error`); the bytes already
//!   scattered into it are simply overwritten. On a shared receive queue ([`UcQp::with_srq`]) a
//!   WQE taken cannot go back: it completes with `REM_INV_REQ_ERR` (`REM_ACCESS_ERR` for a key
//!   violation) and the QP carries on (rxe: class E).
//! - An RDMA WRITE the QP does not allow (no REMOTE_WRITE), whose rkey or range is refused, or
//!   whose packet lengths do not add up to its DMA length is dropped silently, whole from the
//!   failing packet on (rxe: `drop_msg`, class D / E); packets already written stay written, as on
//!   any UC link. A SEND or WRITE_WITH_IMM that finds no receive WQE is dropped the same way.
//! - A SEND longer than its receive WQE completes that WQE with `LOC_LEN_ERR`, and a receive
//!   buffer outside the PD with `LOC_PROT_ERR`; either moves the QP to ERR. rxe moves the QP to
//!   ERR too, completing the WQE with `LOC_QP_OP_ERR` (`copy_data` fails with -EINVAL: a
//!   malformed WQE, class A); softrdma reports the IBA statuses, as its RC responder does.
//!
//! One difference from rxe, on purpose: when a message breaks and the next FIRST or ONLY arrives
//! while the broken one was still in progress (its LAST never came), rxe discards that FIRST/ONLY
//! as well (`do_class_d1e_error` returns CLEANUP), losing an intact message; here it starts the
//! new message, as IBA's "resume at the next First or Only" says.
//!
//! Same call order as [`super::RcQp`]: [`UcQp::handle_packet`] for each received packet, then
//! drain [`UcQp::poll_transmit`] and [`UcQp::poll_completion`]. UC has no timers.

use std::collections::VecDeque;

use crate::transport::connected::{connected_getters, ConnectedCore};
use crate::transport::inbound::{check_mtu_length, check_rkey, Inbound, WriteCursor};
use crate::transport::memory::MemoryAccess;
use crate::transport::modify::modify_connected;
use crate::transport::modify::{
    ACCESS, AV, CUR_STATE, DEST_QPN, PATH_MTU, PKEY, PORT, RQ_PSN, SQ_PSN,
};
use crate::transport::rc::{
    check_send_wqe, complete, PostError, QpError, ReqEvent, ReqParams, Requester, RespError,
};
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::{Kind, OpInfo, Packet, Psn, Service};

/// Required and optional attributes of a UC transition (IBA 11.2.4.2; the kernel's
/// `qp_state_table` for `IB_QPT_UC`, without the alternate path and migration state, which
/// softrdma does not have); `None` if the transition is not allowed.
fn transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (PKEY | PORT | ACCESS, 0),
        (Init, Init) => (0, PKEY | PORT | ACCESS),
        (Init, Rtr) => (AV | PATH_MTU | DEST_QPN | RQ_PSN, ACCESS | PKEY),
        (Rtr, Rts) => (SQ_PSN, CUR_STATE | ACCESS),
        (Rts, Rts) => (0, CUR_STATE | ACCESS),
        (Rts, Sqd) => (0, 0),
        (Sqd, Rts) => (0, CUR_STATE | ACCESS),
        (Sqd, Sqd) => (0, AV | ACCESS | PKEY),
        (Sqe, Rts) => (0, CUR_STATE | ACCESS),
        _ => return None,
    })
}

/// Counters of what a UC responder dropped, by reason (nothing is reported to the sender).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct UcDrops {
    /// Packets that are not a UC SEND or WRITE for this QP (opcode, P_Key, destination QPN), or
    /// that arrived while the QP was not receiving (before RTR, or in ERR).
    pub invalid: u64,
    /// Messages broken by a PSN gap or a packet out of the opcode sequence.
    pub broken: u64,
    /// Packets thrown away while waiting for the next FIRST or ONLY (the rest of a dropped
    /// message, or the middle of one whose FIRST was lost).
    pub discarded: u64,
    /// SENDs and WRITEs with immediate dropped for lack of a receive WQE.
    pub no_wqe: u64,
    /// RDMA WRITEs dropped by the access checks: QP without REMOTE_WRITE, rkey, range.
    pub access: u64,
    /// Messages dropped for a packet of the wrong length (FIRST/MIDDLE not a full MTU, a packet
    /// over the MTU, WRITE packets not adding up to the RETH's DMA length).
    pub length: u64,
}

/// Why a message is dropped.
#[derive(Clone, Copy, Debug)]
enum DropReason {
    Broken,
    NoWqe,
    Access,
    Length,
}

impl DropReason {
    /// What a failed step of the shared receive path means on UC: no receive WQE, an access
    /// or key violation, or a length or format error drop the message (rxe: class D / E).
    fn of(e: RespError) -> DropReason {
        match e {
            RespError::Rnr => DropReason::NoWqe,
            RespError::QpAccess | RespError::Rkey(_) => DropReason::Access,
            _ => DropReason::Length,
        }
    }
}

/// The receiving half of a UC QP.
#[derive(Debug, Default)]
struct Receiver {
    /// The PSN the next packet of the message in progress must carry.
    epsn: Psn,
    /// The QP's own receive queue (unused when it takes WQEs from a shared receive queue).
    rq: VecDeque<RecvWqe>,
    /// The message in progress and the receive WQE it holds.
    msg: Inbound,
    /// Throwing packets away until the next FIRST or ONLY (rxe's `drop_msg`).
    dropping: bool,
    drops: UcDrops,
}

impl Receiver {
    fn reset(&mut self, psn: Psn) {
        self.epsn = psn;
        self.rq.clear();
        self.msg = Inbound::default();
        self.dropping = false;
    }

    /// Drop the message in progress and everything up to the next FIRST or ONLY. A receive WQE
    /// the message held goes back to the head of the QP's own receive queue for the next
    /// message (rxe resets it, class D1); one taken from a shared receive queue cannot go back
    /// and completes in error (rxe: class E, REM_ACCESS_ERR for a key violation, else
    /// REM_INV_REQ_ERR).
    fn drop_message(
        &mut self,
        why: DropReason,
        srq: bool,
        p: &RxParams,
        out: &mut dyn FnMut(Completion),
    ) {
        self.msg.cur = None;
        self.dropping = true;
        if srq {
            let status = match why {
                DropReason::Access => WcStatus::RemAccessErr,
                _ => WcStatus::RemInvReqErr,
            };
            self.msg.fail_wqe(status, p.dest_qpn, out);
        } else if let Some(w) = self.msg.wqe.take() {
            self.rq.push_front(w);
        }
        let d = &mut self.drops;
        match why {
            DropReason::Broken => d.broken += 1,
            DropReason::NoWqe => d.no_wqe += 1,
            DropReason::Access => d.access += 1,
            DropReason::Length => d.length += 1,
        }
    }

    /// A UC SEND or WRITE packet for this QP, in RTR, RTS or SQD; `srq`: the shared receive
    /// queue the QP takes its receive WQEs from, `None` for its own. Returns true if a local
    /// error on a receive WQE must move the QP to ERR.
    fn on_packet(
        &mut self,
        pkt: &Packet<'_>,
        info: &OpInfo,
        p: &RxParams,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        out: &mut dyn FnMut(Completion),
    ) -> bool {
        let psn = pkt.bth.psn;
        let starts = info.position.starts();
        let on_srq = srq.is_some();
        // rxe `check_psn` (UC): out of sequence, or discarding: only a FIRST/ONLY gets through,
        // and it resynchronizes the expected PSN.
        if self.dropping || psn != self.epsn {
            if !starts {
                if self.dropping {
                    self.drops.discarded += 1;
                } else {
                    // A packet of the message (or the FIRST of this one) is missing.
                    self.drop_message(DropReason::Broken, on_srq, p, out);
                }
                return false;
            }
            self.dropping = false;
        }
        // rxe `check_op_seq` (UC): MIDDLE/LAST continue the message of their own kind; a
        // FIRST/ONLY starts a new one, abandoning one left unfinished.
        if starts {
            if self.msg.cur.is_some() {
                self.drop_message(DropReason::Broken, on_srq, p, out);
                self.dropping = false;
            }
        } else if !self.msg.continues(info.kind) {
            // A MIDDLE/LAST of the other kind, or with no message in progress.
            self.drop_message(DropReason::Broken, on_srq, p, out);
            return false;
        }
        match self.execute(pkt, info, p, mem, srq, out) {
            Ok(()) => self.epsn = psn.add(1),
            // A SEND that overflows its receive WQE or cannot be written to it completes the
            // WQE with the RC responder's status for that error (class A): the QP fails.
            Err(e @ (RespError::RecvTooLong | RespError::RecvProt)) => {
                if let Some(status) = e.answer().status {
                    self.msg.fail_wqe(status, p.dest_qpn, out);
                }
                self.msg.cur = None;
                return true;
            }
            Err(e) => self.drop_message(DropReason::of(e), on_srq, p, out),
        }
        false
    }

    /// The steps in rxe's order (`check_op_valid`, `check_resource`, `check_length`,
    /// `check_rkey`), then the packet's data.
    fn execute(
        &mut self,
        pkt: &Packet<'_>,
        info: &OpInfo,
        p: &RxParams,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        out: &mut dyn FnMut(Completion),
    ) -> Result<(), RespError> {
        let plen = pkt.payload.len();
        let ends = info.position.ends();
        let write = info.kind == Kind::RdmaWrite;
        // rxe `check_op_valid` (UC): a QP without REMOTE_WRITE drops WRITEs.
        if write && !p.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(RespError::QpAccess);
        }
        // rxe `check_resource`: a SEND, and a WRITE with immediate at its last packet (IBA
        // 9.4.3), take a receive WQE; none: class D (UC has no RNR NAK).
        if !write || (ends && pkt.immdt.is_some()) {
            self.msg.take_wqe(&mut self.rq, srq)?;
        }
        check_mtu_length(info.position, plen, p.mtu)?;
        if !write {
            return self.msg.execute(pkt, ends, None, mem, p.dest_qpn, out);
        }
        // rxe `check_rkey`: the RETH of the first packet against the region (a zero-length
        // WRITE needs no key), then every packet's length against what remains.
        let w = match self.msg.write_cursor() {
            Some(w) => w,
            None => {
                let reth = pkt.reth.ok_or(RespError::Length)?;
                if reth.dma_len > 1 << 31 {
                    return Err(RespError::Length);
                }
                check_rkey(mem, &reth, AccessFlags::REMOTE_WRITE)?;
                WriteCursor::new(&reth)
            }
        };
        w.check_len(plen, ends)?;
        self.msg.execute(pkt, ends, Some(w), mem, p.dest_qpn, out)
    }
}

/// QP parameters the receiver needs.
struct RxParams {
    mtu: usize,
    dest_qpn: u32,
    access: AccessFlags,
}

/// One UC queue pair's transport state.
///
/// A QP made by [`UcQp::with_srq`] has no receive queue: it takes receive WQEs from the shared
/// receive queue the driver passes to [`UcQp::handle_packet_srq`].
pub struct UcQp {
    core: ConnectedCore,
    req: Requester,
    rx: Receiver,
}

impl UcQp {
    /// A new UC QP in RESET. `sq_sig_all` makes every send WR signaled.
    pub fn new(qpn: u32, caps: QpCaps, sq_sig_all: bool) -> Self {
        let attr = QpAttr {
            path_mtu: Some(Mtu::Mtu1024),
            rq_psn: Some(0),
            sq_psn: Some(0),
            dest_qp_num: Some(0),
            qp_access_flags: Some(AccessFlags::NONE),
            pkey_index: Some(0),
            port_num: Some(1),
            ..QpAttr::default()
        };
        UcQp {
            core: ConnectedCore::new(qpn, caps, sq_sig_all, attr),
            req: Requester::default(),
            rx: Receiver::default(),
        }
    }

    /// A new UC QP in RESET that takes its receive WQEs from a shared receive queue (lent with
    /// each packet, [`UcQp::handle_packet_srq`]) and has none of its own: `caps.max_recv_wr`
    /// and `max_recv_sge` are ignored (0), and [`UcQp::post_recv`] fails.
    pub fn with_srq(qpn: u32, caps: QpCaps, sq_sig_all: bool) -> Self {
        let q = UcQp::new(qpn, caps, sq_sig_all);
        UcQp {
            core: q.core.on_srq(),
            ..q
        }
    }

    connected_getters!();
    /// What the receiving side dropped so far.
    pub fn drops(&self) -> UcDrops {
        self.rx.drops
    }

    /// `ibv_modify_qp` for a UC QP (IBA 11.2.4.2): RESET→INIT needs `pkey_index`, `port_num` and
    /// `qp_access_flags` (only REMOTE_WRITE matters: UC has no READ or atomics); INIT→RTR the
    /// address vector, `path_mtu`, `dest_qp_num` and `rq_psn`; RTR→RTS `sq_psn`. Any RC-only
    /// attribute (timeouts, retry counts, RNR timer, READ/atomic depths) or `qkey` is refused.
    pub fn modify(&mut self, attr: &QpAttr) -> Result<(), QpError> {
        let cur = self.core.state;
        let next = modify_connected(cur, &mut self.core.attr, attr, transition, true)?;
        match (cur, next) {
            (_, QpState::Reset) => {
                // Queues emptied without completions (the CQ keeps what it has).
                self.req.reset(Psn::new(0));
                self.rx.reset(Psn::new(0));
            }
            (QpState::Err, QpState::Err) => {}
            (_, QpState::Err) => self.enter_err(None),
            (QpState::Init, QpState::Rtr) => {
                let rq = std::mem::take(&mut self.rx.rq);
                self.rx.reset(Psn::new(self.core.attr.rq_psn.unwrap_or(0)));
                self.rx.rq = rq;
            }
            (QpState::Rtr, QpState::Rts) => {
                self.req.reset(Psn::new(self.core.attr.sq_psn.unwrap_or(0)));
            }
            _ => {}
        }
        self.core.state = next;
        Ok(())
    }

    /// `ibv_query_qp`: the attributes that apply to UC.
    pub fn query(&self) -> QpAttr {
        self.core.query(&self.req, self.rx.epsn)
    }

    /// `ibv_post_send`: SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM. RDMA READ and
    /// atomics are refused ([`PostError::UnsupportedOp`], `EINVAL`), as the kernel's rxe refuses
    /// an opcode its table has no UC entry for.
    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostError> {
        self.core.check_send_state()?;
        if matches!(
            wqe.op,
            SendOp::RdmaRead { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        ) {
            return Err(PostError::UnsupportedOp);
        }
        check_send_wqe(&wqe, &self.core.caps)?;
        self.core.queue_send(&mut self.req, wqe)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        let holding = self.rx.msg.wqe.is_some();
        self.core.post_recv(&mut self.rx.rq, holding, wqe)
    }

    /// Move to ERR: `fail` completes the send WQE at index `at` with that status; every other
    /// outstanding send and receive WQE is flushed with WR_FLUSH_ERR. A QP on a shared receive
    /// queue flushes only the WQE its message in progress took.
    fn enter_err(&mut self, fail: Option<(usize, WcStatus)>) {
        let held = self.rx.msg.wqe.take();
        let rq = std::mem::take(&mut self.rx.rq);
        self.core.flush_all(&mut self.req, fail, held, rq);
        self.rx.msg.cur = None;
        self.rx.dropping = false;
    }

    /// A packet addressed to this QP (ICRC already verified by the driver). Anything that is not
    /// an acceptable UC SEND or WRITE packet is dropped silently and counted. A QP made by
    /// [`UcQp::with_srq`] takes [`UcQp::handle_packet_srq`] instead: given no SRQ here, it has
    /// no receive WQE for a SEND (dropped).
    pub fn handle_packet(&mut self, pkt: &Packet<'_>, mem: &dyn MemoryAccess) {
        let uses_srq = self.core.srq;
        ConnectedCore::lend_srq(uses_srq, None, |srq| self.on_packet(pkt, mem, srq));
    }

    /// [`UcQp::handle_packet`] for a QP made by [`UcQp::with_srq`], with the shared receive
    /// queue it takes receive WQEs from (on a QP with its own receive queue, `srq` is not
    /// touched). Collect [`Srq::take_limit_event`] afterwards.
    pub fn handle_packet_srq(&mut self, pkt: &Packet<'_>, mem: &dyn MemoryAccess, srq: &mut Srq) {
        let uses_srq = self.core.srq;
        ConnectedCore::lend_srq(uses_srq, Some(srq), |srq| self.on_packet(pkt, mem, srq));
    }

    fn on_packet(&mut self, pkt: &Packet<'_>, mem: &dyn MemoryAccess, srq: Option<&mut Srq>) {
        // IBA 10.3.1: the receive side works in RTR, RTS and SQD.
        let receiving = matches!(self.core.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        let info = pkt
            .info()
            .filter(|i| i.service == Service::Uc && matches!(i.kind, Kind::Send | Kind::RdmaWrite));
        let Some(info) = info.filter(|_| receiving && self.core.addressed_to(pkt)) else {
            self.rx.drops.invalid += 1;
            return;
        };
        let p = RxParams {
            mtu: self.core.mtu(),
            dest_qpn: self.core.dest_qpn(),
            access: self.core.attr.qp_access_flags.unwrap_or_default(),
        };
        let cq = &mut self.core.cq;
        if self
            .rx
            .on_packet(pkt, info, &p, mem, srq, &mut |c| cq.push(c))
        {
            // A local length or protection error on a receive WQE (class A): the QP fails.
            self.enter_err(None);
        }
    }

    /// The next packet to send, written into `buf` (BTH to ICRC; the ICRC field is left for the
    /// driver, which knows the IP header). Returns its length, or `None` if nothing is to send.
    /// A WQE completes as its last packet is returned. `buf` must hold at least path MTU + 64
    /// bytes.
    pub fn poll_transmit(&mut self, mem: &dyn MemoryAccess, buf: &mut [u8]) -> Option<usize> {
        if !matches!(self.core.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let p = ReqParams {
            mtu: self.core.mtu(),
            dest_qpn: self.core.dest_qpn(),
            max_rd_atomic: 0,
            draining: self.core.state == QpState::Sqd,
            unreliable: true,
            // UC keeps First/Middle/Last: with nothing retransmitted, a responder drops the
            // rest of a message after a lost packet, which per-packet messages would not.
            split_writes: false,
        };
        match self.req.next_packet(&p, mem, buf)? {
            ReqEvent::Packet(n) => {
                // The cursor moved past the head WQE: its last packet is this one.
                if self.req.idx > 0 {
                    // Nothing is acknowledged on UC: the PSN window's lower edge follows.
                    self.req.una = self.req.next_psn;
                    if let Some(e) = self.req.pop_front() {
                        let cq = &mut self.core.cq;
                        complete(&e, WcStatus::Success, self.core.sq_sig_all, &mut |c| {
                            cq.push(c)
                        });
                    }
                }
                Some(n)
            }
            ReqEvent::LocalError(st) => {
                let at = self.req.idx;
                self.enter_err(Some((at, st)));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sim::{pattern, send_wr, VecMemory};
    use crate::wire::{Bth, Opcode, Reth};

    const DEST: u32 = 0x77;

    fn rts(mtu: Mtu, access: AccessFlags) -> UcQp {
        let mut q = UcQp::new(0x42, QpCaps::default(), false);
        bring_up(&mut q, mtu, access);
        q
    }

    /// A WRITE of `d` (more than 256 bytes) in two packets at MTU 256: FIRST at `psn` with
    /// `reth`, LAST after it.
    fn write_first_last(q: &mut UcQp, mem: &VecMemory, psn: u32, d: &[u8], reth: Option<Reth>) {
        feed(q, mem, Opcode::UC_RDMA_WRITE_FIRST, psn, &d[..256], reth);
        feed(q, mem, Opcode::UC_RDMA_WRITE_LAST, psn + 1, &d[256..], None);
    }

    /// `rts` at MTU 256 with receive WQE 5 posted: 1024 bytes of a region with `mr_access`.
    fn with_recv(
        mr_access: AccessFlags,
        access: AccessFlags,
    ) -> (VecMemory, crate::transport::sim::MemRegion, UcQp) {
        let mem = VecMemory::new();
        let mr = mem.register(4096, mr_access);
        let mut q = rts(Mtu::Mtu256, access);
        q.post_recv(RecvWqe {
            wr_id: 5,
            sg_list: vec![mr.sge(0, 1024)].into(),
        })
        .unwrap();
        (mem, mr, q)
    }

    /// RESET -> INIT -> RTR -> RTS toward QP `DEST`, receiving from PSN 10, sending from
    /// 0xfffffe.
    fn bring_up(q: &mut UcQp, mtu: Mtu, access: AccessFlags) {
        q.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(access),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            ah_attr: Some(AddressVector {
                port_num: 1,
                ..Default::default()
            }),
            path_mtu: Some(mtu),
            dest_qp_num: Some(DEST),
            rq_psn: Some(10),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0xff_fffe),
            ..Default::default()
        })
        .unwrap();
    }

    fn feed(q: &mut UcQp, mem: &VecMemory, op: Opcode, psn: u32, data: &[u8], reth: Option<Reth>) {
        let mut b = Bth::new(op, 0x42, Psn::new(psn));
        b.pad_count = Bth::pad_for(data.len());
        let mut p = Packet::new(b, data);
        p.reth = reth;
        if op.info().unwrap().headers.immdt {
            p.immdt = Some(0xabcd);
        }
        let mut buf = vec![0u8; 2048];
        let n = p.emit(&mut buf).unwrap();
        let p = Packet::parse(&buf[..n]).unwrap();
        q.handle_packet(&p, mem);
    }

    fn comps(q: &mut UcQp) -> Vec<Completion> {
        std::iter::from_fn(|| q.poll_completion()).collect()
    }

    #[test]
    fn segments_with_uc_opcodes_and_completes_at_the_last_packet() {
        let mem = VecMemory::new();
        let mr = mem.register(1000, AccessFlags::LOCAL_WRITE);
        mem.write(mr.addr, &pattern(1, 1000));
        let mut q = rts(Mtu::Mtu256, AccessFlags::NONE);
        q.post_send(send_wr(
            1,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x5000,
                rkey: 7,
                imm: 9,
            },
            vec![mr.sge(0, 700)],
        ))
        .unwrap();
        q.post_send(send_wr(2, SendOp::Send, vec![mr.sge(0, 10)]))
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let mut ops = Vec::new();
        while let Some(n) = q.poll_transmit(&mem, &mut buf) {
            let p = Packet::parse(&buf[..n]).unwrap();
            ops.push((p.bth.opcode, p.bth.psn.value(), p.bth.ack_req));
            // Completions come as each message's last packet leaves.
            let done: Vec<u64> = comps(&mut q).iter().map(|c| c.wr_id).collect();
            match p.bth.opcode {
                Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE => assert_eq!(done, vec![1]),
                Opcode::UC_SEND_ONLY => assert_eq!(done, vec![2]),
                _ => assert!(done.is_empty()),
            }
        }
        assert_eq!(
            ops,
            vec![
                (Opcode::UC_RDMA_WRITE_FIRST, 0xff_fffe, false),
                (Opcode::UC_RDMA_WRITE_MIDDLE, 0xff_ffff, false),
                (Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 0, true),
                (Opcode::UC_SEND_ONLY, 1, true),
            ]
        );
        assert_eq!(q.query().sq_psn, Some(2));
    }

    #[test]
    fn long_messages_are_not_held_by_a_window() {
        // RC stops after 128 unacknowledged PSNs; UC has no ACKs and sends the whole message.
        let mem = VecMemory::new();
        let mr = mem.register(256 * 300, AccessFlags::LOCAL_WRITE);
        let mut q = rts(Mtu::Mtu256, AccessFlags::NONE);
        q.post_send(send_wr(1, SendOp::Send, vec![mr.sge(0, 256 * 300)]))
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = std::iter::from_fn(|| q.poll_transmit(&mem, &mut buf)).count();
        assert_eq!(n, 300);
        assert_eq!(comps(&mut q).len(), 1);
    }

    #[test]
    fn read_and_atomics_are_refused_at_post() {
        let mut q = rts(Mtu::Mtu1024, AccessFlags::all());
        let sge = Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        };
        for op in [
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 1,
            },
            SendOp::CompareSwap {
                remote_addr: 0,
                rkey: 1,
                compare: 0,
                swap: 1,
            },
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: 1,
                add: 1,
            },
        ] {
            assert_eq!(
                q.post_send(send_wr(1, op, vec![sge])),
                Err(PostError::UnsupportedOp)
            );
        }
        assert_eq!(q.state(), QpState::Rts);
    }

    #[test]
    fn a_gap_drops_the_message_and_keeps_the_receive_wqe() {
        let (mem, mr, mut q) = with_recv(AccessFlags::LOCAL_WRITE, AccessFlags::NONE);
        let d = pattern(2, 600);
        // FIRST at 10, MIDDLE 11 lost, LAST 12: dropped, no completion.
        feed(&mut q, &mem, Opcode::UC_SEND_FIRST, 10, &d[..256], None);
        feed(&mut q, &mem, Opcode::UC_SEND_LAST, 12, &d[512..], None);
        assert!(comps(&mut q).is_empty());
        // A MIDDLE that follows is discarded too.
        feed(&mut q, &mem, Opcode::UC_SEND_MIDDLE, 13, &d[..256], None);
        assert_eq!(
            q.drops(),
            UcDrops {
                broken: 1,
                discarded: 1,
                ..Default::default()
            }
        );
        // The next FIRST, at any PSN, starts a message into the same WQE, from its start.
        let e = pattern(3, 300);
        feed(&mut q, &mem, Opcode::UC_SEND_FIRST, 40, &e[..256], None);
        feed(
            &mut q,
            &mem,
            Opcode::UC_SEND_LAST_WITH_IMMEDIATE,
            41,
            &e[256..],
            None,
        );
        let c = comps(&mut q);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].byte_len, c[0].imm_data),
            (5, WcStatus::Success, 300, Some(0xabcd))
        );
        assert_eq!(c[0].src_qp, DEST);
        assert_eq!(mem.read(mr.addr, 300), e);
        assert_eq!(q.query().rq_psn, Some(42));
    }

    #[test]
    fn a_new_first_abandons_an_unfinished_message() {
        let (mem, _, mut q) = with_recv(AccessFlags::LOCAL_WRITE, AccessFlags::NONE);
        let d = pattern(2, 600);
        feed(&mut q, &mem, Opcode::UC_SEND_FIRST, 10, &d[..256], None);
        // The LAST of that message and the FIRST of the next are lost; this ONLY is intact.
        feed(&mut q, &mem, Opcode::UC_SEND_ONLY, 14, &d[..100], None);
        let c = comps(&mut q);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].byte_len, 100);
        assert_eq!(q.drops().broken, 1);
    }

    #[test]
    fn out_of_sequence_opcodes_drop_the_message() {
        let (mem, _, mut q) = with_recv(AccessFlags::all(), AccessFlags::REMOTE_WRITE);
        let d = pattern(2, 600);
        // A WRITE packet in the middle of a SEND, at the expected PSN.
        feed(&mut q, &mem, Opcode::UC_SEND_FIRST, 10, &d[..256], None);
        feed(&mut q, &mem, Opcode::UC_RDMA_WRITE_LAST, 11, &d[..10], None);
        feed(&mut q, &mem, Opcode::UC_SEND_LAST, 12, &d[..10], None);
        // A MIDDLE with no FIRST before it.
        feed(&mut q, &mem, Opcode::UC_SEND_ONLY, 20, &d[..8], None);
        feed(&mut q, &mem, Opcode::UC_SEND_MIDDLE, 21, &d[..256], None);
        let c = comps(&mut q);
        assert_eq!(c.len(), 1, "only the ONLY completes: {c:?}");
        assert_eq!(c[0].byte_len, 8);
        assert_eq!(q.state(), QpState::Rts);
    }

    #[test]
    fn write_access_and_length_errors_drop_silently() {
        let mem = VecMemory::new();
        let ro = mem.register(4096, AccessFlags::REMOTE_READ);
        let rw = mem.register(4096, AccessFlags::all());
        let mut q = rts(Mtu::Mtu256, AccessFlags::REMOTE_WRITE);
        let d = pattern(4, 300);
        let reth = |mr: &crate::transport::sim::MemRegion, len: u32| {
            Some(Reth {
                va: mr.addr,
                rkey: mr.rkey,
                dma_len: len,
            })
        };
        // An rkey without REMOTE_WRITE: the FIRST and the rest are dropped.
        write_first_last(&mut q, &mem, 10, &d, reth(&ro, 300));
        // Out of range.
        let mut r = reth(&rw, 300);
        r.as_mut().unwrap().va = rw.addr + 4000;
        feed(&mut q, &mem, Opcode::UC_RDMA_WRITE_ONLY, 12, &d[..200], r);
        // Packets not adding up to the DMA length.
        feed(
            &mut q,
            &mem,
            Opcode::UC_RDMA_WRITE_ONLY,
            13,
            &d[..200],
            reth(&rw, 300),
        );
        assert_eq!(mem.read(ro.addr, 300), vec![0; 300]);
        assert_eq!(mem.read(rw.addr, 4096), vec![0; 4096]);
        assert_eq!(
            q.drops(),
            UcDrops {
                access: 2,
                length: 1,
                discarded: 1,
                ..Default::default()
            }
        );
        // The QP is fine, and a good WRITE lands.
        write_first_last(&mut q, &mem, 14, &d, reth(&rw, 300));
        assert_eq!(mem.read(rw.addr, 300), d);
        assert!(comps(&mut q).is_empty());
        assert_eq!(q.state(), QpState::Rts);
        // A QP without REMOTE_WRITE drops WRITEs whatever the rkey says.
        let mut q2 = rts(Mtu::Mtu256, AccessFlags::NONE);
        feed(
            &mut q2,
            &mem,
            Opcode::UC_RDMA_WRITE_ONLY,
            10,
            &[1; 8],
            reth(&rw, 8),
        );
        assert_eq!(mem.read(rw.addr, 8), d[..8].to_vec());
        assert_eq!(q2.drops().access, 1);
    }

    #[test]
    fn write_with_imm_needs_a_receive_wqe() {
        let mem = VecMemory::new();
        let rw = mem.register(4096, AccessFlags::all());
        let mut q = rts(Mtu::Mtu256, AccessFlags::REMOTE_WRITE);
        let reth = Some(Reth {
            va: rw.addr,
            rkey: rw.rkey,
            dma_len: 8,
        });
        feed(
            &mut q,
            &mem,
            Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            10,
            &[3; 8],
            reth,
        );
        assert_eq!(mem.read(rw.addr, 8), vec![0; 8]);
        assert_eq!(q.drops().no_wqe, 1);
        q.post_recv(RecvWqe {
            wr_id: 8,
            sg_list: vec![].into(),
        })
        .unwrap();
        feed(
            &mut q,
            &mem,
            Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            11,
            &[3; 8],
            reth,
        );
        let c = comps(&mut q);
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].byte_len, c[0].imm_data),
            (8, WcOpcode::RecvRdmaWithImm, 8, Some(0xabcd))
        );
        assert_eq!(mem.read(rw.addr, 8), vec![3; 8]);
    }

    #[test]
    fn send_without_wqe_is_dropped_and_too_long_fails_the_qp() {
        let mem = VecMemory::new();
        let mr = mem.register(4096, AccessFlags::LOCAL_WRITE);
        let mut q = rts(Mtu::Mtu256, AccessFlags::NONE);
        feed(&mut q, &mem, Opcode::UC_SEND_ONLY, 10, &[1; 8], None);
        assert_eq!(q.drops().no_wqe, 1);
        assert!(comps(&mut q).is_empty());
        q.post_recv(RecvWqe {
            wr_id: 1,
            sg_list: vec![mr.sge(0, 100)].into(),
        })
        .unwrap();
        q.post_recv(RecvWqe {
            wr_id: 2,
            sg_list: vec![mr.sge(0, 100)].into(),
        })
        .unwrap();
        feed(&mut q, &mem, Opcode::UC_SEND_FIRST, 11, &[1; 256], None);
        let c = comps(&mut q);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(q.state(), QpState::Err);
    }

    /// `rts` on a shared receive queue.
    fn rts_srq(access: AccessFlags) -> UcQp {
        let mut q = UcQp::with_srq(0x42, QpCaps::default(), false);
        bring_up(&mut q, Mtu::Mtu256, access);
        q
    }

    fn feed_srq(
        q: &mut UcQp,
        mem: &VecMemory,
        srq: &mut Srq,
        op: Opcode,
        psn: u32,
        data: &[u8],
        reth: Option<Reth>,
    ) {
        let mut b = Bth::new(op, 0x42, Psn::new(psn));
        b.pad_count = Bth::pad_for(data.len());
        let mut p = Packet::new(b, data);
        p.reth = reth;
        if op.info().unwrap().headers.immdt {
            p.immdt = Some(0xabcd);
        }
        let mut buf = vec![0u8; 2048];
        let n = p.emit(&mut buf).unwrap();
        q.handle_packet_srq(&Packet::parse(&buf[..n]).unwrap(), mem, srq);
    }

    #[test]
    fn on_an_srq_a_broken_message_completes_its_wqe_in_error() {
        let mem = VecMemory::new();
        let mr = mem.register(8192, AccessFlags::all());
        let mut q = rts_srq(AccessFlags::REMOTE_WRITE);
        assert!(q.uses_srq());
        assert_eq!(
            q.post_recv(RecvWqe {
                wr_id: 1,
                sg_list: vec![].into()
            }),
            Err(PostError::HasSrq)
        );
        let mut srq = Srq::new(16, 1, 0).unwrap();
        for i in 0..4 {
            srq.post_recv(RecvWqe {
                wr_id: 100 + i,
                sg_list: vec![mr.sge(i * 1024, 1024)].into(),
            })
            .unwrap();
        }
        let d = pattern(6, 600);
        // A SEND takes WQE 100 at its FIRST; its MIDDLE is lost: the WQE cannot go back to the
        // SRQ, it completes with REM_INV_REQ_ERR (rxe, class E).
        feed_srq(
            &mut q,
            &mem,
            &mut srq,
            Opcode::UC_SEND_FIRST,
            10,
            &d[..256],
            None,
        );
        feed_srq(
            &mut q,
            &mem,
            &mut srq,
            Opcode::UC_SEND_LAST,
            12,
            &d[512..],
            None,
        );
        // The next message takes WQE 101 and completes.
        feed_srq(
            &mut q,
            &mem,
            &mut srq,
            Opcode::UC_SEND_ONLY,
            13,
            &d[..100],
            None,
        );
        // A WRITE with immediate takes WQE 102 before its rkey is checked (rxe's order):
        // a bad rkey completes it with REM_ACCESS_ERR.
        let bad = Some(Reth {
            va: mr.addr,
            rkey: 0xdead,
            dma_len: 8,
        });
        feed_srq(
            &mut q,
            &mem,
            &mut srq,
            Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            14,
            &[1; 8],
            bad,
        );
        let c = comps(&mut q);
        assert_eq!(
            c.iter()
                .map(|c| (c.wr_id, c.status, c.byte_len, c.qp_num))
                .collect::<Vec<_>>(),
            vec![
                (100, WcStatus::RemInvReqErr, 0, 0x42),
                (101, WcStatus::Success, 100, 0x42),
                (102, WcStatus::RemAccessErr, 0, 0x42),
            ]
        );
        assert_eq!(srq.len(), 1);
        assert_eq!(q.state(), QpState::Rts);
        // Entering ERR flushes only a WQE the QP holds; the SRQ keeps its own.
        feed_srq(
            &mut q,
            &mem,
            &mut srq,
            Opcode::UC_SEND_FIRST,
            20,
            &d[..256],
            None,
        );
        q.modify(&QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
        let c = comps(&mut q);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(103, WcStatus::WrFlushErr)]
        );
        assert_eq!(srq.len(), 0);
    }

    #[test]
    fn uc_transition_table() {
        let mut q = UcQp::new(0x42, QpCaps::default(), false);
        // RC-only attributes are refused at every step.
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        };
        assert_eq!(
            q.modify(&QpAttr {
                qkey: Some(1),
                ..init
            }),
            Err(QpError::UnexpectedAttr("qkey"))
        );
        assert_eq!(
            q.modify(&QpAttr {
                qp_access_flags: None,
                ..init
            }),
            Err(QpError::MissingAttr("qp_access_flags"))
        );
        q.modify(&init).unwrap();
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            ah_attr: Some(AddressVector::default()),
            path_mtu: Some(Mtu::Mtu4096),
            dest_qp_num: Some(3),
            rq_psn: Some(5),
            ..Default::default()
        };
        for (bad, name) in [
            (
                QpAttr {
                    max_dest_rd_atomic: Some(1),
                    ..rtr
                },
                "max_dest_rd_atomic",
            ),
            (
                QpAttr {
                    min_rnr_timer: Some(12),
                    ..rtr
                },
                "min_rnr_timer",
            ),
        ] {
            assert_eq!(q.modify(&bad), Err(QpError::UnexpectedAttr(name)));
        }
        assert_eq!(
            q.modify(&QpAttr {
                rq_psn: None,
                ..rtr
            }),
            Err(QpError::MissingAttr("rq_psn"))
        );
        q.modify(&rtr).unwrap();
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(7),
            ..Default::default()
        };
        for (bad, name) in [
            (
                QpAttr {
                    timeout: Some(14),
                    ..rts
                },
                "timeout",
            ),
            (
                QpAttr {
                    retry_cnt: Some(7),
                    ..rts
                },
                "retry_cnt",
            ),
            (
                QpAttr {
                    rnr_retry: Some(7),
                    ..rts
                },
                "rnr_retry",
            ),
            (
                QpAttr {
                    max_rd_atomic: Some(1),
                    ..rts
                },
                "max_rd_atomic",
            ),
        ] {
            assert_eq!(q.modify(&bad), Err(QpError::UnexpectedAttr(name)));
        }
        q.modify(&rts).unwrap();
        let a = q.query();
        assert_eq!(
            (a.qp_state, a.path_mtu, a.dest_qp_num, a.rq_psn, a.sq_psn),
            (
                Some(QpState::Rts),
                Some(Mtu::Mtu4096),
                Some(3),
                Some(5),
                Some(7)
            )
        );
        assert_eq!(a.timeout, None);
        // RTS->SQD->RTS, access flags may change on the way.
        q.modify(&QpAttr {
            qp_state: Some(QpState::Sqd),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            qp_access_flags: Some(AccessFlags::NONE),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(q.query().qp_access_flags, Some(AccessFlags::NONE));
    }
}
