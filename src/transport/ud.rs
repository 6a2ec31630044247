//! Unreliable Datagram queue pairs, sans-IO.
//!
//! A [`UdQp`] sends each work request as one UD `SEND_ONLY` (or `SEND_ONLY_WITH_IMMEDIATE`)
//! packet with a DETH carrying the Q_Key and the source QPN, to the destination named in the work
//! request (an address vector, the remote QPN and the remote Q_Key), and turns every accepted
//! incoming UD SEND into a receive completion. There are no acknowledgements, no retries, no RNR:
//! a packet that finds no receive WQE is dropped, as IBA (class D, 9.9.3) and rdma_rxe do.
//!
//! Receive side, as verbs define it for UD and rdma_rxe implements it (`execute()` in
//! `rxe_resp.c`): the first 40 bytes of the receive buffer get the GRH area. Over RoCEv2/IPv6 it
//! is the IPv6 header; over RoCEv2/IPv4 the first 20 bytes are zero and the IPv4 header fills the
//! last 20 (`union rdma_network_hdr`). The payload follows at byte 40 and the completion's
//! `byte_len` counts both. Completions always carry "GRH present" (`IBV_WC_GRH`), as rxe's do.
//!
//! Same call order as [`super::RcQp`]: [`UdQp::handle_packet`] for each received packet,
//! then drain [`UdQp::poll_transmit`] and [`UdQp::poll_completion`]. UD has no timers.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use crate::transport::connected::check_post_recv;
use crate::transport::memory::{gather_all, scatter, MemoryAccess};
use crate::transport::modify::{attr_mask, attr_names, check_transition};
use crate::transport::modify::{CUR_STATE, PKEY, PORT, QKEY, SQ_DRAINING, SQ_PSN};
use crate::transport::rc::{check_send_lists, PostError, QpError};
use crate::transport::srq::Srq;
use crate::transport::types::*;
use crate::wire::gid::gid_from_ipv4;
use crate::wire::{bth, deth::GSI_QKEY, Bth, Deth, Kind, Opcode, Packet, Psn, Service};

/// Length of the GRH area at the front of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// The destination of one UD send: where (the address handle) and to whom (QPN and Q_Key, the
/// `wr.ud` fields of `ibv_send_wr`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct UdDest {
    /// The address handle: for RoCEv2 the destination GID carries the peer's IP address.
    pub av: AddressVector,
    pub remote_qpn: u32,
    /// The remote Q_Key. A value with the high bit set means "use this QP's own Q_Key" (IBA
    /// 10.2.4, Q_Keys: the send-side rule for "controlled" Q_Keys).
    pub remote_qkey: u32,
}

/// Where a packet from [`UdQp::poll_transmit`] goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UdTransmit {
    /// Bytes written into the caller's buffer (BTH to ICRC; the ICRC is left for the driver).
    pub len: usize,
    pub av: AddressVector,
    pub dest_qpn: u32,
}

/// The network header a UD packet arrived with, as the driver saw it; it fills the GRH area.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NetHeader {
    /// The 20-byte IPv4 header (without options).
    V4([u8; 20]),
    /// The 40-byte IPv6 header.
    V6([u8; 40]),
}

/// `enum rdma_network_type` of a completion's GRH.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NetworkType {
    Ipv4,
    Ipv6,
}

impl NetHeader {
    /// The 40-byte GRH area, laid out as rxe writes it.
    pub fn grh_area(&self) -> [u8; GRH_LEN] {
        let mut a = [0u8; GRH_LEN];
        match self {
            NetHeader::V4(h) => a[20..].copy_from_slice(h),
            NetHeader::V6(h) => a.copy_from_slice(h),
        }
        a
    }

    /// The sender's GID (IPv4-mapped for IPv4).
    pub fn src_gid(&self) -> [u8; 16] {
        match self {
            NetHeader::V4(h) => gid_from_ipv4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
            NetHeader::V6(h) => {
                let mut g = [0u8; 16];
                g.copy_from_slice(&h[8..24]);
                g
            }
        }
    }

    /// The GID the packet was sent to (IPv4-mapped for IPv4).
    pub fn dst_gid(&self) -> [u8; 16] {
        match self {
            NetHeader::V4(h) => gid_from_ipv4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
            NetHeader::V6(h) => {
                let mut g = [0u8; 16];
                g.copy_from_slice(&h[24..40]);
                g
            }
        }
    }

    pub fn network_type(&self) -> NetworkType {
        match self {
            NetHeader::V4(_) => NetworkType::Ipv4,
            NetHeader::V6(_) => NetworkType::Ipv6,
        }
    }

    /// The hop limit (TTL) and traffic class (TOS) the packet arrived with.
    fn hop_and_class(&self) -> (u8, u8) {
        match self {
            NetHeader::V4(h) => (h[8], h[1]),
            NetHeader::V6(h) => (h[7], (h[0] << 4) | (h[1] >> 4)),
        }
    }
}

/// Parse the 20-byte IPv4 header at the front of `b`, if it is one.
pub fn net_header_v4(b: &[u8]) -> Option<NetHeader> {
    let h: [u8; 20] = b.get(..20)?.try_into().ok()?;
    (h[0] >> 4 == 4).then_some(NetHeader::V4(h))
}

/// Parse the 40-byte IPv6 header at the front of `b`, if it is one.
pub fn net_header_v6(b: &[u8]) -> Option<NetHeader> {
    let h: [u8; 40] = b.get(..40)?.try_into().ok()?;
    (h[0] >> 4 == 6).then_some(NetHeader::V6(h))
}

/// A UD work completion: the shared [`Completion`] plus what `ibv_wc` carries only for UD.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UdCompletion {
    pub wc: Completion,
    /// `IBV_WC_GRH`: the first 40 bytes of the buffer hold the GRH area (receive completions).
    pub grh: bool,
    /// The network header type (receive completions).
    pub network_type: Option<NetworkType>,
    /// The sender's GID, from the network header (receive completions).
    pub sgid: [u8; 16],
    /// Hop limit and traffic class of the received packet.
    pub hop_limit: u8,
    pub traffic_class: u8,
    /// `pkey_index` (always 0: only the default partition exists).
    pub pkey_index: u16,
}

impl UdCompletion {
    /// An address handle that answers the sender of a received message, as
    /// `ibv_init_ah_from_wc` builds it (GRH-based: destination GID = the sender's GID).
    pub fn reply_av(&self, port_num: u8, sgid_index: u8) -> AddressVector {
        AddressVector {
            dgid: self.sgid,
            sgid_index,
            hop_limit: 0xff,
            traffic_class: self.traffic_class,
            flow_label: 0,
            dlid: 0,
            sl: 0,
            port_num,
        }
    }
}

/// Required and optional attributes of a UD transition (IBA 11.2.4.2 / the kernel's
/// `qp_state_table` for `IB_QPT_UD`); `None` if the transition is not allowed.
fn transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (PKEY | PORT | QKEY, 0),
        (Init, Init) => (0, PKEY | PORT | QKEY),
        (Init, Rtr) => (0, PKEY | QKEY),
        (Rtr, Rts) => (SQ_PSN, CUR_STATE | QKEY),
        (Rts, Rts) => (0, CUR_STATE | QKEY),
        (Rts, Sqd) => (0, 0),
        (Sqd, Rts) => (0, CUR_STATE | QKEY),
        (Sqd, Sqd) => (0, PKEY | QKEY),
        (Sqe, Rts) => (0, CUR_STATE | QKEY),
        _ => return None,
    })
}

fn ud_mask(a: &QpAttr) -> Result<u32, QpError> {
    // Attributes that make no sense on a UD QP.
    let bad = [
        (a.path_mtu.is_some(), "path_mtu"),
        (a.rq_psn.is_some(), "rq_psn"),
        (a.dest_qp_num.is_some(), "dest_qp_num"),
        (a.qp_access_flags.is_some(), "qp_access_flags"),
        (a.ah_attr.is_some(), "ah_attr"),
        (a.timeout.is_some(), "timeout"),
        (a.retry_cnt.is_some(), "retry_cnt"),
        (a.rnr_retry.is_some(), "rnr_retry"),
        (a.min_rnr_timer.is_some(), "min_rnr_timer"),
        (a.max_rd_atomic.is_some(), "max_rd_atomic"),
        (a.max_dest_rd_atomic.is_some(), "max_dest_rd_atomic"),
    ];
    if let Some((_, n)) = bad.iter().find(|(p, _)| *p) {
        return Err(QpError::UnexpectedAttr(n));
    }
    // The others UD has; `sq_draining` is not looked at.
    Ok(attr_mask(a) & !SQ_DRAINING)
}

/// Why [`UdQp::emit_send`] produced no packet.
enum EmitFail {
    /// The gather list is outside the PD's memory: a local protection error.
    Gather,
    /// The caller's buffer is too small.
    NoRoom,
}

struct PendingSend {
    wqe: SendWqe,
    dest: UdDest,
    signaled: bool,
}

/// Counters of packets a UD QP dropped, by reason.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct UdDrops {
    /// Wrong opcode, P_Key or destination QPN, or not in a receiving state.
    pub invalid: u64,
    /// DETH Q_Key did not match (the `qkey_violation` port counter).
    pub qkey: u64,
    /// No receive WQE posted.
    pub no_wqe: u64,
    /// Payload larger than the port MTU.
    pub too_long: u64,
}

/// One UD queue pair's transport state.
///
/// A QP made by [`UdQp::with_srq`] has no receive queue: it takes receive WQEs from the shared
/// receive queue the driver passes to [`UdQp::handle_packet_srq`].
pub struct UdQp {
    qpn: u32,
    caps: QpCaps,
    sq_sig_all: bool,
    /// Receive WQEs come from a shared receive queue.
    srq: bool,
    /// The port's MTU: UD messages are at most one packet of this size (rxe: `port.mtu_cap`).
    mtu: Mtu,
    state: QpState,
    qkey: u32,
    pkey_index: u16,
    port_num: u8,
    sq_psn: Psn,
    sq: VecDeque<PendingSend>,
    rq: VecDeque<RecvWqe>,
    cq: VecDeque<UdCompletion>,
    send_pending: usize,
    recv_pending: usize,
    drops: UdDrops,
    /// The payload of the packet being built, reused from packet to packet.
    tx_payload: Vec<u8>,
}

impl UdQp {
    /// A new UD QP in RESET on a port whose MTU is `port_mtu`. QPN 1 is the GSI QP, whose Q_Key
    /// is always [`GSI_QKEY`].
    pub fn new(qpn: u32, caps: QpCaps, sq_sig_all: bool, port_mtu: Mtu) -> Self {
        UdQp {
            qpn: qpn & 0x00ff_ffff,
            caps,
            sq_sig_all,
            srq: false,
            mtu: port_mtu,
            state: QpState::Reset,
            qkey: if qpn == 1 { GSI_QKEY } else { 0 },
            pkey_index: 0,
            port_num: 1,
            sq_psn: Psn::new(0),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            cq: VecDeque::new(),
            send_pending: 0,
            recv_pending: 0,
            drops: UdDrops::default(),
            tx_payload: Vec::new(),
        }
    }

    /// A new UD QP in RESET that takes its receive WQEs from a shared receive queue (lent with
    /// each packet, [`UdQp::handle_packet_srq`]) and has none of its own: `caps.max_recv_wr`
    /// and `max_recv_sge` are ignored (0), and [`UdQp::post_recv`] fails.
    pub fn with_srq(qpn: u32, caps: QpCaps, sq_sig_all: bool, port_mtu: Mtu) -> Self {
        let caps = QpCaps {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..caps
        };
        UdQp {
            srq: true,
            ..UdQp::new(qpn, caps, sq_sig_all, port_mtu)
        }
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    pub fn state(&self) -> QpState {
        self.state
    }
    /// The QP takes its receive WQEs from a shared receive queue.
    pub fn uses_srq(&self) -> bool {
        self.srq
    }
    pub fn qkey(&self) -> u32 {
        self.qkey
    }
    pub fn mtu(&self) -> Mtu {
        self.mtu
    }
    pub fn drops(&self) -> UdDrops {
        self.drops
    }

    /// `ibv_modify_qp` for a UD QP: RESET→INIT needs `pkey_index`, `port_num` and `qkey`;
    /// RTR→RTS needs `sq_psn`; `qkey` may change in most states.
    pub fn modify(&mut self, attr: &QpAttr) -> Result<(), QpError> {
        let cur = self.state;
        let next = check_transition(cur, attr, transition, ud_mask(attr)?, attr_names())?;
        if attr.port_num.is_some_and(|p| p != 1) {
            return Err(QpError::BadAttr("port_num"));
        }
        if attr.pkey_index.is_some_and(|p| p != 0) {
            return Err(QpError::BadAttr("pkey_index"));
        }
        if let Some(q) = attr.qkey {
            // The GSI QP's Q_Key is fixed.
            if self.qpn != 1 {
                self.qkey = q;
            }
        }
        if let Some(p) = attr.pkey_index {
            self.pkey_index = p;
        }
        if let Some(p) = attr.port_num {
            self.port_num = p;
        }
        if let Some(p) = attr.sq_psn {
            self.sq_psn = Psn::new(p);
        }
        match next {
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
            }
            QpState::Err if cur != QpState::Err => self.flush(),
            _ => {}
        }
        self.state = next;
        Ok(())
    }

    /// `ibv_query_qp`: the attributes that apply to UD.
    pub fn query(&self) -> QpAttr {
        QpAttr {
            qp_state: Some(self.state),
            cur_qp_state: Some(self.state),
            qkey: Some(self.qkey),
            sq_psn: Some(self.sq_psn.value()),
            pkey_index: Some(self.pkey_index),
            port_num: Some(self.port_num),
            path_mtu: Some(self.mtu),
            ..QpAttr::default()
        }
    }

    fn push(&mut self, wc: Completion, extra: Option<(NetHeader, u8, u8)>) {
        let mut wc = wc;
        wc.qp_num = self.qpn;
        wc.grh = extra.map(|(h, hop_limit, traffic_class)| WcGrh {
            sgid: h.src_gid(),
            dgid: h.dst_gid(),
            hop_limit,
            traffic_class,
        });
        match wc.side {
            CqSide::Send => self.send_pending += 1,
            CqSide::Recv => self.recv_pending += 1,
        }
        let (grh, network_type, sgid, hop_limit, traffic_class) = match extra {
            Some((h, hop, tc)) => (true, Some(h.network_type()), h.src_gid(), hop, tc),
            None => (false, None, [0; 16], 0, 0),
        };
        self.cq.push_back(UdCompletion {
            wc,
            grh,
            network_type,
            sgid,
            hop_limit,
            traffic_class,
            pkey_index: self.pkey_index,
        });
    }

    fn flush(&mut self) {
        let sq = std::mem::take(&mut self.sq);
        for p in sq {
            let wc = send_wc(&p.wqe, WcStatus::WrFlushErr);
            self.push(wc, None);
        }
        let rq = std::mem::take(&mut self.rq);
        for w in rq {
            self.push(
                recv_wc(w.wr_id, WcStatus::WrFlushErr, 0, None, 0, false),
                None,
            );
        }
    }

    /// `ibv_post_send` with the UD destination of the work request. Only SEND and
    /// SEND_WITH_IMM exist on UD; the message must fit in one packet of the port MTU.
    pub fn post_send(&mut self, wqe: SendWqe, dest: UdDest) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(PostError::InvalidState(s)),
        }
        if !matches!(wqe.op, SendOp::Send | SendOp::SendWithImm { .. }) {
            return Err(PostError::UnsupportedOp);
        }
        check_send_lists(&wqe, &self.caps)?;
        let len = wqe.length();
        if len > self.mtu.bytes() as u64 {
            return Err(PostError::MessageTooLong(len));
        }
        if dest.remote_qpn > 0x00ff_ffff {
            return Err(PostError::UnsupportedOp);
        }
        if self.sq.len() + self.send_pending >= self.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        let signaled = wqe.flags.contains(SendFlags::SIGNALED) || self.sq_sig_all;
        if self.state == QpState::Err {
            let wc = send_wc(&wqe, WcStatus::WrFlushErr);
            self.push(wc, None);
            return Ok(());
        }
        self.sq.push_back(PendingSend {
            wqe,
            dest,
            signaled,
        });
        Ok(())
    }

    /// `ibv_post_recv`. Each buffer must leave room for the 40-byte GRH area before the payload.
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        let held = self.rq.len() + self.recv_pending;
        check_post_recv(&wqe, &self.caps, self.srq, self.state, held)?;
        if self.state == QpState::Err {
            self.push(
                recv_wc(wqe.wr_id, WcStatus::WrFlushErr, 0, None, 0, false),
                None,
            );
            return Ok(());
        }
        self.rq.push_back(wqe);
        Ok(())
    }

    /// A packet addressed to this QP, with the network header it arrived with (ICRC already
    /// verified by the driver). Anything that is not an acceptable UD SEND is dropped silently.
    /// A QP made by [`UdQp::with_srq`] takes [`UdQp::handle_packet_srq`] instead: given no SRQ
    /// here, it has no receive WQE (the packet is dropped).
    pub fn handle_packet(&mut self, pkt: &Packet<'_>, net: &NetHeader, mem: &dyn MemoryAccess) {
        if self.srq {
            self.on_packet(pkt, net, mem, Some(&mut Srq::default()));
        } else {
            self.on_packet(pkt, net, mem, None);
        }
    }

    /// [`UdQp::handle_packet`] for a QP made by [`UdQp::with_srq`], with the shared receive
    /// queue it takes receive WQEs from (on a QP with its own receive queue, `srq` is not
    /// touched). Collect [`Srq::take_limit_event`] afterwards.
    pub fn handle_packet_srq(
        &mut self,
        pkt: &Packet<'_>,
        net: &NetHeader,
        mem: &dyn MemoryAccess,
        srq: &mut Srq,
    ) {
        let srq = if self.srq { Some(srq) } else { None };
        self.on_packet(pkt, net, mem, srq);
    }

    fn on_packet(
        &mut self,
        pkt: &Packet<'_>,
        net: &NetHeader,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
    ) {
        // The receive side works in RTR, RTS and SQD (IBA 10.3.1).
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.drops.invalid += 1;
            return;
        }
        let ok_hdr = pkt.bth.dest_qpn == self.qpn
            && pkt.bth.pkey & 0x7fff == bth::DEFAULT_PKEY & 0x7fff
            && pkt
                .info()
                .is_some_and(|i| i.service == Service::Ud && i.kind == Kind::Send);
        let Some(deth) = pkt.deth.filter(|_| ok_hdr) else {
            self.drops.invalid += 1;
            return;
        };
        // Q_Key check: a mismatch drops the packet silently and counts a Q_Key violation
        // (IBA 10.2.4 and the packet header validation of 9.6; rxe's `check_keys`). The GSI QP
        // accepts only the GSI Q_Key.
        let expected = if self.qpn == 1 { GSI_QKEY } else { self.qkey };
        if deth.qkey != expected {
            self.drops.qkey += 1;
            return;
        }
        if pkt.payload.len() > self.mtu.bytes() {
            self.drops.too_long += 1;
            return;
        }
        // No receive WQE: dropped (UD has no RNR; class D).
        let wqe = match srq {
            Some(s) => s.take(),
            None => self.rq.pop_front(),
        };
        let Some(wqe) = wqe else {
            self.drops.no_wqe += 1;
            return;
        };
        let total = GRH_LEN + pkt.payload.len();
        let room: u64 = wqe.sg_list.iter().map(|s| s.length as u64).sum();
        let (hop, tc) = net.hop_and_class();
        if room < total as u64 {
            // The message does not fit: the WQE completes in error (IBA 11.6.2, local length
            // error). rdma_rxe drops the packet instead and keeps the WQE.
            self.push(
                recv_wc(wqe.wr_id, WcStatus::LocLenErr, 0, None, deth.src_qpn, false),
                None,
            );
            return;
        }
        let grh = net.grh_area();
        let written = scatter(&wqe.sg_list, 0, &grh, mem)
            .and_then(|()| scatter(&wqe.sg_list, GRH_LEN, pkt.payload, mem));
        if let Err(_e) = written {
            self.push(
                recv_wc(
                    wqe.wr_id,
                    WcStatus::LocProtErr,
                    0,
                    None,
                    deth.src_qpn,
                    false,
                ),
                None,
            );
            // A local protection error is fatal to the QP (IBA 10.3.1.x).
            self.state = QpState::Err;
            self.flush();
            return;
        }
        let wc = recv_wc(
            wqe.wr_id,
            WcStatus::Success,
            total as u32,
            pkt.immdt,
            deth.src_qpn,
            pkt.bth.solicited,
        );
        self.push(wc, Some((*net, hop, tc)));
    }

    /// The next packet to send, written into `buf` (BTH to ICRC, the ICRC field left zero for the
    /// driver), with its destination. `buf` must hold the port MTU + 64 bytes.
    pub fn poll_transmit(&mut self, mem: &dyn MemoryAccess, buf: &mut [u8]) -> Option<UdTransmit> {
        if self.state != QpState::Rts {
            return None;
        }
        let p = self.sq.pop_front()?;
        let len = p.wqe.length() as usize;
        // One payload buffer per QP, reused: no allocation per packet once it has grown.
        let mut payload = std::mem::take(&mut self.tx_payload);
        payload.clear();
        payload.resize(len, 0);
        let r = self.emit_send(&p, &mut payload, mem, buf);
        self.tx_payload = payload;
        let n = match r {
            Ok(n) => n,
            Err(EmitFail::Gather) => {
                let wc = send_wc(&p.wqe, WcStatus::LocProtErr);
                self.push(wc, None);
                self.state = QpState::Err;
                self.flush();
                return None;
            }
            Err(EmitFail::NoRoom) => {
                // The caller's buffer is too small: put the work back.
                self.sq.push_front(p);
                return None;
            }
        };
        if p.signaled {
            let wc = send_wc(&p.wqe, WcStatus::Success);
            self.push(wc, None);
        }
        Some(UdTransmit {
            len: n,
            av: p.dest.av,
            dest_qpn: p.dest.remote_qpn,
        })
    }

    /// Gather `p`'s payload into `payload` and write its packet into `buf`.
    fn emit_send(
        &mut self,
        p: &PendingSend,
        payload: &mut [u8],
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
    ) -> Result<usize, EmitFail> {
        let len = payload.len();
        if p.wqe.flags.contains(SendFlags::INLINE) {
            payload.copy_from_slice(&p.wqe.inline_data);
        } else if gather_all(&p.wqe.sg_list, payload, mem).is_err() {
            return Err(EmitFail::Gather);
        }
        let (opcode, imm) = match p.wqe.op {
            SendOp::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, Some(imm)),
            _ => (Opcode::UD_SEND_ONLY, None),
        };
        let mut b = Bth::new(opcode, p.dest.remote_qpn, self.sq_psn);
        b.solicited = p.wqe.flags.contains(SendFlags::SOLICITED);
        b.pad_count = Bth::pad_for(len);
        self.sq_psn = self.sq_psn.add(1);
        let qkey = if p.dest.remote_qkey & 0x8000_0000 != 0 {
            self.qkey
        } else {
            p.dest.remote_qkey
        };
        let mut pkt = Packet::new(b, payload);
        pkt.deth = Some(Deth {
            qkey,
            resv8: 0,
            src_qpn: self.qpn,
        });
        pkt.immdt = imm;
        pkt.emit(buf).map_err(|_| {
            self.sq_psn = self.sq_psn.sub(1);
            EmitFail::NoRoom
        })
    }

    /// The next completion for the send or receive CQ.
    pub fn poll_completion(&mut self) -> Option<UdCompletion> {
        let c = self.cq.pop_front()?;
        match c.wc.side {
            CqSide::Send => self.send_pending -= 1,
            CqSide::Recv => self.recv_pending -= 1,
        }
        Some(c)
    }
}

fn send_wc(w: &SendWqe, status: WcStatus) -> Completion {
    let byte_len = if status == WcStatus::Success {
        w.length() as u32
    } else {
        0
    };
    Completion::send(w.wr_id, status, WcOpcode::Send, byte_len)
}

fn recv_wc(
    wr_id: u64,
    status: WcStatus,
    byte_len: u32,
    imm: Option<u32>,
    src_qp: u32,
    solicited: bool,
) -> Completion {
    Completion::recv(
        wr_id,
        status,
        WcOpcode::Recv,
        byte_len,
        imm,
        src_qp,
        solicited,
    )
}

pub use crate::wire::gid::gid_to_ip;
