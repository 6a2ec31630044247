//! The requester (rxe_req.c): turns send WQEs into request packets — segmentation at the path
//! MTU, PSN assignment, AckReq, the unacknowledged-PSN window, the READ/atomic limit, fences —
//! and repositions to an earlier PSN when the completer asks for a retransmission.

use std::collections::VecDeque;

use crate::transport::memory::{MemError, MemoryAccess};
use crate::transport::types::*;
use crate::wire::{AtomicEth, Bth, Opcode, Packet, Position, Psn, Reth};

/// Unacknowledged PSNs the requester lets out before waiting for ACKs (rxe: RXE_MAX_UNACKED_PSNS).
pub(crate) const MAX_UNACKED_PSNS: i32 = 128;
/// Packets of one message sent without AckReq before one is forced (rxe: RXE_MAX_PKT_PER_ACK).
pub(crate) const MAX_PKT_PER_ACK: u32 = 64;
/// The smallest loss window ([`Requester::cwnd`]): one 64 KiB message at a 4096-byte MTU.
pub(crate) const MIN_CWND: u32 = 16;

/// Where a tail-loss probe stands ([`Requester::probe`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Sending as the window allows.
    #[default]
    Off,
    /// Send a copy of the last packet sent (the one before the cursor), with AckReq, and go
    /// on where the cursor is.
    Last,
    /// The cursor is at the oldest unacknowledged PSN: send that one packet, with AckReq.
    Due,
    /// The probe went out: send nothing more until a response (or a timer) moves things on.
    Sent,
}

/// A send WQE on the send queue, with its transport progress.
#[derive(Debug)]
pub(crate) struct SendEntry {
    pub wqe: SendWqe,
    /// Bytes the WQE moves.
    pub len: u32,
    /// Whether a completion is generated on success.
    pub signaled: bool,
    /// PSNs were assigned (the first packet went out at least once).
    pub started: bool,
    /// First PSN (valid when `started`).
    pub first_psn: Psn,
    /// PSNs the WQE consumes: packets for SEND/WRITE, response packets for READ, 1 for atomics.
    pub npkts: u32,
    /// READ: response packets received and placed so far.
    pub resp_pkts: u32,
}

impl SendEntry {
    pub(crate) fn new(wqe: SendWqe, signaled: bool, mtu: usize) -> Self {
        let len = wqe.length() as u32;
        let npkts = match wqe.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
            _ => npkts_for(len, mtu),
        };
        SendEntry {
            wqe,
            len,
            signaled,
            started: false,
            first_psn: Psn::new(0),
            npkts,
            resp_pkts: 0,
        }
    }
    pub(crate) fn is_read(&self) -> bool {
        matches!(self.wqe.op, SendOp::RdmaRead { .. })
    }
    pub(crate) fn is_atomic(&self) -> bool {
        matches!(
            self.wqe.op,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }
    pub(crate) fn is_rd_atomic(&self) -> bool {
        self.is_read() || self.is_atomic()
    }
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
    /// Whether `psn` is one of this (started) WQE's PSNs.
    pub(crate) fn contains(&self, psn: Psn) -> bool {
        self.started && !psn.before(self.first_psn) && !psn.after(self.last_psn())
    }
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        wc_opcode(&self.wqe.op)
    }
}

pub(crate) fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

/// Packets a message of `len` bytes takes at `mtu` (a zero-length message still takes one).
pub(crate) fn npkts_for(len: u32, mtu: usize) -> u32 {
    if len == 0 {
        1
    } else {
        (len as usize).div_ceil(mtu) as u32
    }
}

/// Parameters of the QP the requester needs to build a packet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReqParams {
    pub mtu: usize,
    pub dest_qpn: u32,
    pub max_rd_atomic: u32,
    /// SQD: finish what was started, start nothing new.
    pub draining: bool,
    /// Unreliable Connected: UC opcodes, and no window of unacknowledged PSNs (nothing is ever
    /// acknowledged); the QP retires each WQE once its last packet is out.
    pub unreliable: bool,
    /// Send a multi-packet RDMA WRITE (without immediate) as one RDMA WRITE Only per packet,
    /// each with its own RETH, instead of First/Middle/Last ([`RcQp::set_split_writes`]).
    ///
    /// [`RcQp::set_split_writes`]: super::RcQp::set_split_writes
    pub split_writes: bool,
}

/// What the requester produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReqEvent {
    /// A packet of this many bytes is in the buffer.
    Packet(usize),
    /// The WQE at the head of what is being sent could not be gathered: it completes with
    /// LOC_PROT_ERR and the QP goes to ERR (IBA 10.8.3.1 / rxe COMPST_ERROR).
    LocalError(WcStatus),
}

/// The send queue and the requester's transmit cursor.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// WQEs posted and not yet completed, oldest first. Started ones form a prefix.
    pub sq: VecDeque<SendEntry>,
    /// Oldest unacknowledged PSN (advanced by the completer).
    pub una: Psn,
    /// One past the highest PSN assigned to a WQE.
    pub max_psn: Psn,
    /// One past the highest PSN ever transmitted.
    pub sent_max: Psn,
    /// Next PSN the cursor transmits.
    pub next_psn: Psn,
    /// Index into `sq` of the WQE the cursor is in, and the packet within it.
    pub idx: usize,
    pub pkt: u32,
    /// Packets sent since the last AckReq.
    noack_pkts: u32,
    /// Stopped by an RNR NAK until the RNR timer fires.
    pub rnr_paused: bool,
    /// Unacknowledged PSNs let out at once, at most [`MAX_UNACKED_PSNS`]: halved by a loss,
    /// grown by one per window acknowledged ([`Requester::on_loss`], [`Requester::on_acked`]).
    /// Go-back-N throws away everything in flight behind a lost packet, so a window far
    /// beyond the path's bandwidth-delay product only queues packets that a loss then wastes.
    pub cwnd: u32,
    /// PSNs acknowledged toward the next increment of `cwnd`.
    cwnd_acked: u32,
    /// Losses of PSNs before this one belong to the episode that already shrank the window.
    recover: Psn,
    /// A tail-loss probe in progress, and the PSN of the last one sent.
    pub probe: Probe,
    pub last_probe: Psn,
    /// The packet being built asks for an ACK whatever its place.
    force_ack: bool,
    /// The last packet built: its PSN, whether it carried AckReq, whether it was sent before.
    pub last_psn: Psn,
    pub last_ack_req: bool,
    pub last_again: bool,
}

impl Requester {
    /// Start over at `psn` with an empty send queue (RTR->RTS, or RESET).
    pub(crate) fn reset(&mut self, psn: Psn) {
        self.sq.clear();
        self.una = psn;
        self.max_psn = psn;
        self.sent_max = psn;
        self.next_psn = psn;
        self.idx = 0;
        self.pkt = 0;
        self.noack_pkts = 0;
        self.rnr_paused = false;
        self.cwnd = MAX_UNACKED_PSNS as u32;
        self.cwnd_acked = 0;
        self.recover = psn;
        self.probe = Probe::Off;
        self.last_ack_req = false;
    }

    /// The window in force (a requester never reset has the full one).
    fn window(&self) -> i32 {
        if self.cwnd == 0 {
            MAX_UNACKED_PSNS
        } else {
            self.cwnd.min(MAX_UNACKED_PSNS as u32) as i32
        }
    }

    /// A loss was detected at `psn` (NAK, implied NAK, probe or timeout): halve the window,
    /// once per episode (the PSNs sent before the first reaction belong to it).
    pub(crate) fn on_loss(&mut self, psn: Psn) {
        if psn.before(self.recover) {
            return;
        }
        self.cwnd = (self.window() as u32 / 2).max(MIN_CWND);
        self.cwnd_acked = 0;
        self.recover = self.sent_max;
    }

    /// `n` more PSNs were acknowledged: one more PSN of window per window acknowledged.
    pub(crate) fn on_acked(&mut self, n: u32) {
        let w = self.window() as u32;
        if w >= MAX_UNACKED_PSNS as u32 {
            return;
        }
        self.cwnd_acked += n;
        if self.cwnd_acked >= w {
            self.cwnd_acked -= w;
            self.cwnd = w + 1;
        }
    }

    /// The oldest WQE has packets out whose acknowledgement is awaited.
    pub(crate) fn outstanding(&self) -> bool {
        self.sq.front().is_some_and(|e| e.started)
    }

    /// Move the cursor to `psn` (go-back-N, IBA 9.7.5.1.2; or forward past acknowledged PSNs).
    pub(crate) fn seek(&mut self, psn: Psn) {
        for (i, e) in self.sq.iter().enumerate() {
            if e.contains(psn) {
                self.idx = i;
                self.pkt = psn.diff(e.first_psn) as u32;
                self.next_psn = psn;
                return;
            }
        }
        // Past every started WQE: the first unstarted one.
        self.idx = self
            .sq
            .iter()
            .position(|e| !e.started)
            .unwrap_or(self.sq.len());
        self.pkt = 0;
        self.next_psn = self.max_psn;
    }

    /// The completer retired the oldest WQE.
    pub(crate) fn pop_front(&mut self) -> Option<SendEntry> {
        let e = self.sq.pop_front()?;
        if self.idx > 0 {
            self.idx -= 1;
        } else {
            self.pkt = 0;
        }
        // Keep the cursor at or after the oldest unacknowledged PSN.
        if self.next_psn.before(self.una) {
            let una = self.una;
            self.seek(una);
        }
        Some(e)
    }

    /// Build the next request packet into `buf`, if one may go now.
    pub(crate) fn next_packet(
        &mut self,
        p: &ReqParams,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
    ) -> Option<ReqEvent> {
        if self.probe == Probe::Last && !self.rnr_paused {
            self.probe = Probe::Off;
            let saved = (self.idx, self.pkt, self.next_psn, self.noack_pkts);
            let last = self.next_psn.sub(1);
            if !last.before(self.una) {
                self.seek(last);
                self.force_ack = true;
                let r = self.build(p, mem, buf);
                self.force_ack = false;
                (self.idx, self.pkt, self.next_psn, self.noack_pkts) = saved;
                if r.is_some() {
                    return r;
                }
            }
        }
        self.build(p, mem, buf)
    }

    fn build(&mut self, p: &ReqParams, mem: &dyn MemoryAccess, buf: &mut [u8]) -> Option<ReqEvent> {
        if self.rnr_paused || self.probe == Probe::Sent {
            return None;
        }
        // Skip a cursor left behind acknowledged PSNs.
        if self.next_psn.before(self.una) {
            let una = self.una;
            self.seek(una);
        }
        let idx = self.idx;
        let e = self.sq.get(idx)?;
        if !e.started {
            if p.draining {
                return None;
            }
            let prior = self.sq.iter().take(idx);
            // IBA 10.8.3.3: a fenced WQE waits for every prior READ and atomic to complete.
            if e.wqe.flags.contains(SendFlags::FENCE) && prior.clone().any(|x| x.is_rd_atomic()) {
                return None;
            }
            // IBA 9.5 / o9-20: at most max_rd_atomic READ/atomic requests outstanding.
            if e.is_rd_atomic()
                && prior.filter(|x| x.is_rd_atomic()).count() as u32 >= p.max_rd_atomic.max(1)
            {
                return None;
            }
        }
        // Flow window on unacknowledged PSNs (RC only, as rxe: UC is never acknowledged).
        if !p.unreliable && self.next_psn.diff(self.una) >= self.window() {
            return None;
        }
        let max_psn = self.max_psn;
        let w = self.window();
        let e = &mut self.sq[idx];
        if !e.started {
            e.started = true;
            e.first_psn = max_psn;
            e.resp_pkts = 0;
            self.max_psn = max_psn.add(e.npkts);
            self.next_psn = max_psn;
            self.pkt = 0;
        }
        let psn = self.next_psn;
        let k = self.pkt;
        let mtu = p.mtu;
        let last = k + 1 >= e.npkts;
        let (opcode, consumed, payload_off, payload_len) = match e.wqe.op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::RdmaWrite { .. }
            | SendOp::RdmaWriteWithImm { .. } => {
                let off = k as usize * mtu;
                let plen = (e.len as usize).saturating_sub(off).min(mtu);
                let only = e.npkts == 1;
                let op = match (e.wqe.op, only, k == 0, last) {
                    (SendOp::Send, true, ..) => Opcode::RC_SEND_ONLY,
                    (SendOp::SendWithImm { .. }, true, ..) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (SendOp::RdmaWrite { .. }, true, ..) => Opcode::RC_RDMA_WRITE_ONLY,
                    (SendOp::RdmaWrite { .. }, ..) if p.split_writes => Opcode::RC_RDMA_WRITE_ONLY,
                    (SendOp::RdmaWriteWithImm { .. }, true, ..) => {
                        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                    }
                    (SendOp::Send | SendOp::SendWithImm { .. }, false, true, _) => {
                        Opcode::RC_SEND_FIRST
                    }
                    (SendOp::Send, false, false, true) => Opcode::RC_SEND_LAST,
                    (SendOp::SendWithImm { .. }, false, false, true) => {
                        Opcode::RC_SEND_LAST_WITH_IMMEDIATE
                    }
                    (SendOp::Send | SendOp::SendWithImm { .. }, ..) => Opcode::RC_SEND_MIDDLE,
                    (_, false, true, _) => Opcode::RC_RDMA_WRITE_FIRST,
                    (SendOp::RdmaWrite { .. }, false, false, true) => Opcode::RC_RDMA_WRITE_LAST,
                    (_, false, false, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                    _ => Opcode::RC_RDMA_WRITE_MIDDLE,
                };
                (op, 1, off, plen)
            }
            SendOp::RdmaRead { .. } => (Opcode::RC_RDMA_READ_REQUEST, e.npkts - k, 0, 0),
            SendOp::CompareSwap { .. } => (Opcode::RC_COMPARE_SWAP, 1, 0, 0),
            SendOp::FetchAdd { .. } => (Opcode::RC_FETCH_ADD, 1, 0, 0),
        };
        // IBA Table 38: a UC SEND/WRITE opcode is the RC one with service bits 001 (0x20..0x2b);
        // the headers are the same. READs and atomics never reach a UC send queue.
        let opcode = if p.unreliable {
            Opcode(opcode.0 | 0x20)
        } else {
            opcode
        };
        let ends = k + consumed >= e.npkts;
        let mut bth = Bth::new(opcode, p.dest_qpn, psn);
        bth.pad_count = Bth::pad_for(payload_len);
        // AckReq on the last packet of a message, and within a long one once more than
        // MAX_PKT_PER_ACK packets went without (exactly as rxe_req.c counts them); UC packets
        // carry it too, as rxe's do, and the UC responder ignores it.
        // A tail-loss probe asks for one too, and so does a packet that fills the window or
        // half of it: a window smaller than a message must still be clocked by ACKs.
        // (With the full window, the packets ask exactly as rxe's do.)
        let window_ack = !p.unreliable
            && w < MAX_UNACKED_PSNS
            && (psn.add(consumed).diff(self.una) >= w || self.noack_pkts + 1 >= w as u32 / 2);
        bth.ack_req = ends
            || self.noack_pkts > MAX_PKT_PER_ACK
            || self.probe == Probe::Due
            || self.force_ack
            || window_ack;
        // The SE bit goes on the last packet of a SEND or RDMA WRITE with immediate (IBA 9.2.2).
        bth.solicited = ends
            && e.wqe.flags.contains(SendFlags::SOLICITED)
            && matches!(
                e.wqe.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::RdmaWriteWithImm { .. }
            );
        let mut pkt = Packet::new(bth, &[]);
        let info = opcode.info().expect("requester opcodes are in the table");
        match e.wqe.op {
            // RETH on the packet that starts a WRITE message (IBA 9.3.3), naming the message's
            // bytes: a First all of the WQE's, an Only those it carries (all of a one-packet
            // WRITE, its part of a split one).
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } if info.headers.reth => {
                let (off, dma_len) = match info.position {
                    Position::Only => (payload_off as u64, payload_len as u32),
                    _ => (0, e.len),
                };
                pkt.reth = Some(Reth {
                    va: remote_addr.wrapping_add(off),
                    rkey,
                    dma_len,
                });
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                // A retried READ resumes at the first response PSN not yet received (IBA 9.7.5.1.4).
                let off = (k as u64) * mtu as u64;
                pkt.reth = Some(Reth {
                    va: remote_addr.wrapping_add(off),
                    rkey,
                    dma_len: e.len - off as u32,
                });
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                pkt.atomic_eth = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                pkt.atomic_eth = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
            }
            _ => {}
        }
        if info.headers.immdt {
            if let SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } = e.wqe.op {
                pkt.immdt = Some(imm);
            }
        }
        let hlen = info.header_len();
        let total = hlen + payload_len + bth.pad_count as usize + crate::wire::packet::ICRC_LEN;
        if buf.len() < total {
            return None;
        }
        pkt.emit(buf).ok()?;
        if let Err(_err) = gather(e, payload_off, &mut buf[hlen..hlen + payload_len], mem) {
            return Some(ReqEvent::LocalError(WcStatus::LocProtErr));
        }
        buf[hlen + payload_len..total].fill(0);
        // Advance the cursor.
        self.noack_pkts = if bth.ack_req { 0 } else { self.noack_pkts + 1 };
        self.last_ack_req = bth.ack_req;
        self.last_psn = psn;
        self.last_again = psn.before(self.sent_max);
        if self.probe == Probe::Due {
            self.probe = Probe::Sent;
            self.last_probe = psn;
        }
        self.next_psn = psn.add(consumed);
        if self.next_psn.after(self.sent_max) {
            self.sent_max = self.next_psn;
        }
        if ends {
            self.idx += 1;
            self.pkt = 0;
        } else {
            self.pkt += consumed;
        }
        Some(ReqEvent::Packet(total))
    }
}

/// Copy `dst.len()` bytes of the WQE's data starting at byte `off` (inline or across SGEs).
pub(crate) fn gather(
    e: &SendEntry,
    off: usize,
    dst: &mut [u8],
    mem: &dyn MemoryAccess,
) -> Result<(), MemError> {
    if e.wqe.flags.contains(SendFlags::INLINE) && !dst.is_empty() {
        let src = e
            .wqe
            .inline_data
            .get(off..off + dst.len())
            .ok_or(MemError::OutOfBounds)?;
        dst.copy_from_slice(src);
        return Ok(());
    }
    crate::transport::memory::gather(&e.wqe.sg_list, off, dst, mem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sim::{send_wr, VecMemory};
    use crate::wire::Kind;

    fn params() -> ReqParams {
        ReqParams {
            mtu: 256,
            dest_qpn: 0x42,
            max_rd_atomic: 2,
            draining: false,
            unreliable: false,
            split_writes: false,
        }
    }

    fn packets(req: &mut Requester, mem: &VecMemory) -> Vec<Vec<u8>> {
        packets_with(req, mem, &params())
    }

    fn packets_with(req: &mut Requester, mem: &VecMemory, p: &ReqParams) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1024];
        while let Some(ReqEvent::Packet(n)) = req.next_packet(p, mem, &mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn split_write_is_a_write_only_per_packet() {
        let mem = VecMemory::new();
        let mr = mem.register(1000, AccessFlags::LOCAL_WRITE);
        mem.write(mr.addr, &crate::transport::sim::pattern(2, 1000));
        let mut req = Requester::default();
        req.reset(Psn::new(100));
        let write = SendOp::RdmaWrite {
            remote_addr: 0x5000,
            rkey: 7,
        };
        let imm = SendOp::RdmaWriteWithImm {
            remote_addr: 0x9000,
            rkey: 7,
            imm: 5,
        };
        for (id, op) in [(1, write), (2, imm)] {
            req.sq.push_back(SendEntry::new(
                send_wr(id, op, vec![mr.sge(0, 700)]),
                true,
                256,
            ));
        }
        let split = ReqParams {
            split_writes: true,
            ..params()
        };
        let pk = packets_with(&mut req, &mem, &split);
        let p: Vec<_> = pk.iter().map(|b| Packet::parse(b).unwrap()).collect();
        // The WRITE: three messages of one packet, each with a RETH for its part, AckReq on
        // the last; the WRITE with immediate stays one message (its receive completion
        // reports the whole length).
        assert_eq!(
            p.iter()
                .map(|p| (p.bth.opcode, p.reth, p.bth.ack_req))
                .collect::<Vec<_>>(),
            vec![
                (
                    Opcode::RC_RDMA_WRITE_ONLY,
                    Some(Reth {
                        va: 0x5000,
                        rkey: 7,
                        dma_len: 256
                    }),
                    false
                ),
                (
                    Opcode::RC_RDMA_WRITE_ONLY,
                    Some(Reth {
                        va: 0x5100,
                        rkey: 7,
                        dma_len: 256
                    }),
                    false
                ),
                (
                    Opcode::RC_RDMA_WRITE_ONLY,
                    Some(Reth {
                        va: 0x5200,
                        rkey: 7,
                        dma_len: 188
                    }),
                    true
                ),
                (
                    Opcode::RC_RDMA_WRITE_FIRST,
                    Some(Reth {
                        va: 0x9000,
                        rkey: 7,
                        dma_len: 700
                    }),
                    false
                ),
                (Opcode::RC_RDMA_WRITE_MIDDLE, None, false),
                (Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, None, true),
            ]
        );
        // Every packet of the split WRITE is as long as the first (the last carries less).
        assert_eq!(pk[0].len(), pk[1].len());
        let all: Vec<u8> = p[..3].iter().flat_map(|p| p.payload.to_vec()).collect();
        assert_eq!(all, mem.read(mr.addr, 700));
        // A retransmission from the middle packet builds it again, RETH and all.
        req.seek(Psn::new(101));
        let again = packets_with(&mut req, &mem, &split);
        assert_eq!(again.len(), 5);
        assert_eq!(again[..2], pk[1..3]);
    }

    #[test]
    fn segments_write_with_imm() {
        let mem = VecMemory::new();
        let mr = mem.register(1000, AccessFlags::LOCAL_WRITE);
        mem.write(mr.addr, &crate::transport::sim::pattern(1, 1000));
        let mut req = Requester::default();
        req.reset(Psn::new(0xff_fffe));
        let mut w = send_wr(
            1,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x5000,
                rkey: 7,
                imm: 0x1234,
            },
            vec![mr.sge(0, 700)],
        );
        w.flags.insert(SendFlags::SOLICITED);
        req.sq.push_back(SendEntry::new(w, true, 256));
        let pk = packets(&mut req, &mem);
        assert_eq!(pk.len(), 3);
        let p: Vec<_> = pk.iter().map(|b| Packet::parse(b).unwrap()).collect();
        assert_eq!(
            p.iter().map(|p| p.bth.opcode).collect::<Vec<_>>(),
            vec![
                Opcode::RC_RDMA_WRITE_FIRST,
                Opcode::RC_RDMA_WRITE_MIDDLE,
                Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            ]
        );
        // PSNs wrap at 2^24.
        assert_eq!(
            p.iter().map(|p| p.bth.psn.value()).collect::<Vec<_>>(),
            vec![0xff_fffe, 0xff_ffff, 0]
        );
        assert_eq!(
            p[0].reth,
            Some(Reth {
                va: 0x5000,
                rkey: 7,
                dma_len: 700
            })
        );
        assert_eq!(p[2].immdt, Some(0x1234));
        assert_eq!(
            p.iter()
                .map(|p| (p.bth.ack_req, p.bth.solicited))
                .collect::<Vec<_>>(),
            vec![(false, false), (false, false), (true, true)]
        );
        assert_eq!(
            p.iter().map(|p| p.payload.len()).collect::<Vec<_>>(),
            vec![256, 256, 188]
        );
        assert_eq!(p[2].bth.pad_count, 0);
        assert_eq!(p[2].bth.dest_qpn, 0x42);
        let all: Vec<u8> = p.iter().flat_map(|p| p.payload.to_vec()).collect();
        assert_eq!(all, mem.read(mr.addr, 700));
        assert_eq!(req.next_psn, Psn::new(1));
        // Go back to the middle packet: only it and the last are sent again.
        req.seek(Psn::new(0xff_ffff));
        let again = packets(&mut req, &mem);
        assert_eq!(again.len(), 2);
        assert_eq!(again[0], pk[1]);
        assert_eq!(again[1], pk[2]);
    }

    #[test]
    fn read_consumes_response_psns_and_resumes_mid_read() {
        let mem = VecMemory::new();
        let mut req = Requester::default();
        req.reset(Psn::new(10));
        let sge = Sge {
            addr: 0,
            length: 1000,
            lkey: 1,
        };
        req.sq.push_back(SendEntry::new(
            send_wr(
                1,
                SendOp::RdmaRead {
                    remote_addr: 0x9000,
                    rkey: 3,
                },
                vec![sge],
            ),
            true,
            256,
        ));
        req.sq
            .push_back(SendEntry::new(send_wr(2, SendOp::Send, vec![]), true, 256));
        let pk = packets(&mut req, &mem);
        let p: Vec<_> = pk.iter().map(|b| Packet::parse(b).unwrap()).collect();
        assert_eq!(p[0].bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert_eq!(p[0].bth.psn, Psn::new(10));
        assert!(p[0].bth.ack_req);
        // 1000 bytes at 256: 4 response PSNs (10..=13); the SEND gets 14.
        assert_eq!(p[1].bth.psn, Psn::new(14));
        assert_eq!(p[1].bth.opcode, Opcode::RC_SEND_ONLY);
        assert!(p[1].payload.is_empty());
        // Two responses arrived: resume at PSN 12, for the rest of the data.
        req.sq[0].resp_pkts = 2;
        req.seek(Psn::new(12));
        let pk = packets(&mut req, &mem);
        let r = Packet::parse(&pk[0]).unwrap();
        assert_eq!(r.bth.psn, Psn::new(12));
        assert_eq!(
            r.reth,
            Some(Reth {
                va: 0x9000 + 512,
                rkey: 3,
                dma_len: 488
            })
        );
    }

    #[test]
    fn window_rd_atomic_limit_and_fence() {
        let mem = VecMemory::new();
        let mut req = Requester::default();
        req.reset(Psn::new(0));
        let sge = Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        };
        for i in 0..3 {
            req.sq.push_back(SendEntry::new(
                send_wr(
                    i,
                    SendOp::FetchAdd {
                        remote_addr: 0,
                        rkey: 1,
                        add: 1,
                    },
                    vec![sge],
                ),
                true,
                256,
            ));
        }
        // max_rd_atomic = 2: the third atomic waits.
        assert_eq!(packets(&mut req, &mem).len(), 2);
        let mut fenced = send_wr(9, SendOp::Send, vec![]);
        fenced.flags.insert(SendFlags::FENCE);
        let mut req2 = Requester::default();
        req2.sq.push_back(SendEntry::new(
            send_wr(
                1,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: 1,
                },
                vec![],
            ),
            true,
            256,
        ));
        req2.sq.push_back(SendEntry::new(fenced, true, 256));
        assert_eq!(
            packets(&mut req2, &mem).len(),
            1,
            "the fenced SEND waits for the READ"
        );
        req2.una = Psn::new(1);
        req2.pop_front();
        assert_eq!(packets(&mut req2, &mem).len(), 1);
        // Window: a long message stops after MAX_UNACKED_PSNS packets.
        let mut req3 = Requester::default();
        let inline = SendWqe {
            wr_id: 1,
            op: SendOp::Send,
            flags: SendFlags::INLINE,
            sg_list: vec![].into(),
            inline_data: vec![0; 256 * 200],
        };
        req3.sq.push_back(SendEntry::new(inline, true, 256));
        let pk = packets(&mut req3, &mem);
        assert_eq!(pk.len(), MAX_UNACKED_PSNS as usize);
        // AckReq at least every MAX_PKT_PER_ACK packets.
        let acks: Vec<usize> = pk
            .iter()
            .enumerate()
            .filter(|(_, b)| Packet::parse(b).unwrap().bth.ack_req)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            acks,
            vec![MAX_PKT_PER_ACK as usize + 1],
            "the 66th packet asks for an ACK, as in rxe"
        );
        let info = Packet::parse(&pk[1]).unwrap().info().unwrap();
        assert_eq!((info.kind, info.position), (Kind::Send, Position::Middle));
    }

    #[test]
    fn bad_lkey_is_a_local_error() {
        let mem = VecMemory::new();
        let mut req = Requester::default();
        req.sq.push_back(SendEntry::new(
            send_wr(
                1,
                SendOp::Send,
                vec![Sge {
                    addr: 0,
                    length: 8,
                    lkey: 99,
                }],
            ),
            true,
            256,
        ));
        let mut buf = vec![0u8; 1024];
        assert_eq!(
            req.next_packet(&params(), &mem, &mut buf),
            Some(ReqEvent::LocalError(WcStatus::LocProtErr))
        );
    }
}
