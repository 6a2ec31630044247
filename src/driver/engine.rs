//! The engine: moves datagrams between the socket and the sans-IO queue pairs, fires their
//! timers, and hands their completions to the CQs. Buffers are reused: no allocation per packet.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::batch::{RxBatch, RxInfo, TxBatch};
use super::capture::Capture;
use super::cq::CqShared;
use super::error::DriverError;
use super::events::{AsyncEvent, AsyncQueue};
use super::memory::MrTable;
use super::socket::Io;
use super::srq::SrqShared;
use super::tx::Tx;
use super::{forward, probe};
use crate::cm::endpoint::{CmEndpoint, GsiAgent, ModifyQp};
use crate::transport::ud::{net_header_v4, NetHeader, UdQp};
use crate::transport::{AddressVector, CqSide, QpAttr, QpState, RcQp, UcQp};
use crate::wire::gid::{gid_from_ip, gid_to_ip};
use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use crate::wire::ipv6::{Ipv6Udp, IPV6_LEN};
use crate::wire::packet::possible_len;
use crate::wire::{icrc, Packet, ROCE_V2_PORT};

/// Datagrams handled per receive burst before timers and transmission get a turn.
const RX_BURST: usize = 64;
/// At most this many datagrams that emptied the socket's queue end its receive at once.
const LATENCY_BURST: usize = 2;
/// First QPN handed out within a slot's range, as rxe's first (0 and 1 are the special QPs).
const FIRST_QPN: u32 = 0x11;
/// QPNs of one slot: the low 16 bits (the top 8 are the slot, see `driver::share`).
const QPN_MASK: u32 = 0xffff;

/// Where a context starts numbering its QPs: at random, so that a slot freed by one context
/// and taken by another does not hand out the QPN whose old peer may still be retransmitting
/// to it (rdma_rxe avoids reuse the same way, by counting up across the whole 24 bits).
fn first_qpn() -> u32 {
    let mut b = [0u8; 2];
    let _ = getrandom::getrandom(&mut b);
    (u16::from_ne_bytes(b) as u32).max(FIRST_QPN)
}
/// The GSI QP (QP1): CM MADs. Never an application UD QP.
const GSI_QPN: u32 = 1;

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Datagrams whose ICRC no IP ID explains (see [`icrc::IcrcGate`]).
    pub rx_bad_icrc: u64,
    /// Datagrams of a length no RoCEv2 sender produces (below BTH + ICRC, above
    /// [`crate::wire::packet::MAX_PACKET_LEN`], or not a multiple of 4): dropped before any CRC.
    pub rx_bad_length: u64,
    /// Datagrams accepted with IP ID 0 (softrdma peers).
    pub rx_icrc_id0: u64,
    /// Datagrams accepted with an IP ID just after the source's last one (rdma_rxe peers).
    pub rx_icrc_predicted: u64,
    /// Datagrams accepted with any other IP ID: a source's first packet or a jump after a pause;
    /// a steady stream of these is corruption or forgery getting through at 2^-16.
    pub rx_icrc_solved: u64,
    /// Datagrams over IPv6 whose ICRC matched (IPv6 has no IP ID: nothing is guessed).
    pub rx_icrc_v6: u64,
    pub rx_malformed: u64,
    pub rx_unknown_qp: u64,
    /// Packets to the GSI QP1 (connection management), handed to the rdma_cm core.
    pub rx_gsi: u64,
    /// RC and UC packets dropped because they did not come from the QP's peer (its address
    /// vector's IP address) or arrived before the QP had one: forged or stray traffic (IBA
    /// C9-43, rdma_rxe's `check_addr`).
    pub rx_bad_source: u64,
    pub tx_dropped: u64,
    /// REQs nobody here listened for, handed to another process on the same address that
    /// listens for them now (`driver::forward`).
    pub tx_forwarded: u64,
    /// CM MADs another process on the same address handed to this one.
    pub rx_forwarded: u64,
}

/// The transport of one QP.
// Slots stay in the map: boxing the RC QP would only add an indirection on the hot path.
#[allow(clippy::large_enum_variant)]
pub(crate) enum QpTransport {
    Rc(RcQp),
    Uc(UcQp),
    Ud(UdQp),
}

impl QpTransport {
    pub fn state(&self) -> QpState {
        match self {
            QpTransport::Rc(q) => q.state(),
            QpTransport::Uc(q) => q.state(),
            QpTransport::Ud(q) => q.state(),
        }
    }

    /// The next timer (UC and UD have none).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self {
            QpTransport::Rc(q) => q.poll_timeout(),
            QpTransport::Uc(_) | QpTransport::Ud(_) => None,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let QpTransport::Rc(q) = self {
            q.handle_timeout(now);
        }
    }
}

pub(crate) struct QpSlot {
    pub qp: QpTransport,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub pd: u32,
    /// The state after the last verb or drive: a change to ERR in between is the transport's
    /// doing, reported as `IBV_EVENT_QP_FATAL`.
    pub last_state: QpState,
    /// The shared receive queue the QP takes its receive WQEs from, lent to the transport
    /// with each packet it is fed (as the memory is).
    pub srq: Option<Arc<SrqShared>>,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` was raised for the QP's current stay in ERR.
    pub last_wqe_reported: bool,
}

impl QpSlot {
    /// A QP on an SRQ raises `IBV_EVENT_QP_LAST_WQE_REACHED` once each time it enters ERR (by
    /// a verb, the CM or the transport): it takes no more WQEs from the SRQ. Called after
    /// every verb and drive.
    pub fn check_last_wqe(&mut self, qpn: u32, events: &AsyncQueue) {
        if self.srq.is_none() {
            return;
        }
        let err = self.qp.state() == QpState::Err;
        if err && !self.last_wqe_reported {
            events.push(AsyncEvent::QpLastWqeReached { qp_num: qpn });
        }
        self.last_wqe_reported = err;
    }
}

pub(crate) struct Engine {
    qps: HashMap<u32, QpSlot>,
    /// This endpoint's slot on its (shared) address: the top byte of its QPNs.
    slot: u8,
    next_qpn: u32,
    rx: RxBatch,
    tx: TxBatch,
    dirty: Vec<u32>,
    capture: Option<Capture>,
    pub stats: Stats,
    /// The length and ICRC check of received datagrams, with the last IP ID of each source.
    icrc_gate: icrc::IcrcGate,
    /// The CM endpoint of the device's GSI QP1 and what uses it (rdma_cm's core, once a
    /// process uses rdma_cm on the device): see [`Engine::with_gsi`].
    gsi: Box<dyn GsiAgent>,
    /// A GSI packet or a CM timer made work for `flush_gsi`.
    gsi_pending: bool,
    /// Answers to probes of the shared addresses' layout, sent after the receive burst out of
    /// the socket that got the probe.
    probe_answers: Vec<(usize, SocketAddr, [u8; probe::PROBE_LEN])>,
    /// Datagrams for another context's QPN arrived on these sockets (bit `k`: socket `k`):
    /// their steering is stale.
    misrouted: u32,
    /// Room for polling the sockets (see [`readable`]).
    pollfds: Vec<libc::pollfd>,
    /// The application drives this round (its CQ poll, busy): see [`Engine::ready_sockets`].
    pub app_driving: bool,
    /// The socket that last had something to read, and when all of them are next polled.
    hot: usize,
    next_full_poll: Instant,
    /// Datagrams for other contexts, to hand over after the receive burst: (socket, owner's
    /// slot, envelope); and envelopes' buffers for reuse.
    handed: Vec<(usize, u8, Vec<u8>)>,
    handed_spare: Vec<Vec<u8>>,
    /// When [`Engine::drain_forwarded`] is next due, and its receive buffer.
    next_fwd_check: Instant,
    fwd_buf: Vec<u8>,
}

/// Datagrams handed over per receive burst, at most (beyond: dropped, as the kernel would).
const MAX_HANDED: usize = 64;
/// How often an engine driven by a busy-polling application polls all its sockets (see
/// [`Engine::ready_sockets`]).
const FULL_POLL_EVERY: std::time::Duration = std::time::Duration::from_micros(50);
/// How often a busy engine reads its forward sockets by itself (the progress thread reads them
/// as soon as something arrives).
const FWD_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

impl Engine {
    /// The engine of the endpoint `io` (its addresses, slot and GSO support).
    pub fn new(capture: Option<PathBuf>, io: &Io, node_guid: u64) -> Result<Engine, DriverError> {
        let locals: Vec<IpAddr> = io.socks.iter().map(|s| s.local.ip()).collect();
        let capture = match capture {
            Some(p) => Some(Capture::open(&p, &locals)?),
            None => None,
        };
        let v4 = io.local_v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        Ok(Engine {
            qps: HashMap::new(),
            slot: io.slot(),
            next_qpn: first_qpn(),
            rx: RxBatch::new(),
            tx: TxBatch::new(io.gso, v4),
            dirty: Vec::with_capacity(64),
            capture,
            stats: Stats::default(),
            icrc_gate: icrc::IcrcGate::new(),
            gsi: Box::new(CmEndpoint::new(v4, node_guid, io.slot())),
            gsi_pending: false,
            probe_answers: Vec::with_capacity(8),
            misrouted: 0,
            pollfds: Vec::with_capacity(io.fds.len()),
            app_driving: false,
            hot: 0,
            next_full_poll: Instant::now(),
            handed: Vec::new(),
            handed_spare: Vec::new(),
            next_fwd_check: Instant::now(),
            fwd_buf: Vec::new(),
        })
    }

    /// A free QPN of this endpoint's slot: `slot << 16 | n`.
    pub fn alloc_qpn(&mut self) -> Result<u32, DriverError> {
        for _ in 0..=QPN_MASK {
            let n = self.next_qpn;
            self.next_qpn = if n >= QPN_MASK { 0 } else { n + 1 };
            let q = (self.slot as u32) << 16 | n;
            if !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
        Err(DriverError::NoResources("no free QP number"))
    }

    pub fn insert_qp(&mut self, qpn: u32, slot: QpSlot) {
        self.qps.insert(qpn, slot);
    }

    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    pub fn remove_qp(&mut self, qpn: u32) {
        if let Some(slot) = self.qps.remove(&qpn) {
            // SOFTRDMA_RC_STATS=1: an RC QP's loss-recovery counters on stderr when it goes.
            if let QpTransport::Rc(q) = &slot.qp {
                if std::env::var_os("SOFTRDMA_RC_STATS").is_some() {
                    eprintln!("softrdma: QP {qpn:#x}: {:?}", q.stats());
                }
            }
        }
    }

    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut QpSlot> {
        self.qps.get_mut(&qpn)
    }

    /// The earliest timer of any QP.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.qps
            .values()
            .filter_map(|s| s.qp.poll_timeout())
            .chain(self.gsi.endpoint().poll_timeout())
            .chain(self.gsi.endpoint().cm.unclaimed_check_at())
            .min()
    }

    /// One round: receive what is waiting, fire due timers, transmit and complete.
    pub fn drive(&mut self, io: &Io, mrs: &MrTable, events: &AsyncQueue, now: Instant) {
        self.dirty.clear();
        let ready = self.ready_sockets(io, now);
        for (k, sock) in io.socks.iter().enumerate() {
            if ready & (1 << k.min(31)) == 0 {
                continue;
            }
            let fd = sock.socket.as_raw_fd();
            let mut received = 0;
            while received < RX_BURST {
                // Errors (ICMP port unreachable surfaces here) end the burst; the transport's
                // timers handle what was lost.
                let n = match self.rx.recv(fd) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                self.hot = k;
                let bufs = self.rx.take_bufs();
                for i in 0..n {
                    self.on_datagram(&bufs, i, k, sock.local, mrs, now);
                }
                self.rx.put_bufs(bufs);
                received += n;
                // A datagram or two that emptied the queue is a ping-pong's: answer now rather
                // than pay a receive that would find nothing. (A stream is read until the queue
                // stays empty, so that its ACKs coalesce.)
                if self.rx.drained() && received <= LATENCY_BURST {
                    break;
                }
            }
        }
        for (k, to, a) in self.probe_answers.drain(..) {
            let _ = io.socks[k].socket.send_to(&a, to);
        }
        self.send_handed_over(io);
        if now >= self.next_fwd_check {
            self.drain_forwarded(io, mrs, now);
        }
        let misrouted = std::mem::take(&mut self.misrouted);
        if misrouted != 0 {
            io.misrouted
                .fetch_or(misrouted, std::sync::atomic::Ordering::AcqRel);
            io.wake();
        }
        for (qpn, slot) in self.qps.iter_mut() {
            if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                slot.qp.handle_timeout(now);
                if !self.dirty.contains(qpn) {
                    self.dirty.push(*qpn);
                }
            }
        }
        let ep = self.gsi.endpoint_mut();
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.cm.handle_timeout(now);
            self.gsi_pending = true;
        }
        if ep.cm.unclaimed_check_at().is_some_and(|t| t <= now) {
            self.forward_unclaimed(io, now);
        }
        if self.gsi_pending || self.gsi.work_pending() {
            self.gsi_pending = false;
            self.flush_gsi(io, now);
        }
        self.flush_dirty(io, mrs, events, now);
    }

    /// Flush every QP that received, timed out or changed state; report a QP the transport
    /// moved to ERR as `IBV_EVENT_QP_FATAL`.
    pub fn flush_dirty(&mut self, io: &Io, mrs: &MrTable, events: &AsyncQueue, now: Instant) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &qpn in &dirty {
            self.flush_qp(qpn, io, mrs, now);
            if let Some(slot) = self.qps.get_mut(&qpn) {
                let st = slot.qp.state();
                if st == QpState::Err && slot.last_state != QpState::Err {
                    events.push(AsyncEvent::QpFatal { qp_num: qpn });
                }
                slot.last_state = st;
                slot.check_last_wqe(qpn, events);
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Datagram `i` of the last receive batch (its buffer `bufs`), from socket `k` (bound to
    /// `local`).
    fn on_datagram(
        &mut self,
        bufs: &[u8],
        i: usize,
        k: usize,
        local: SocketAddr,
        mrs: &MrTable,
        now: Instant,
    ) {
        self.stats.rx_packets += 1;
        let (data, from, info) = self.rx.get_in(bufs, i);
        let Some(from) = from else {
            self.stats.rx_malformed += 1;
            return;
        };
        let n = data.len();
        // A probe of the shared address's layout (`driver::probe`), from a context on it.
        if let Some((index, nonce)) = probe::parse(data) {
            if from.ip() == local.ip() && self.probe_answers.len() < self.probe_answers.capacity() {
                self.probe_answers
                    .push((k, from, probe::answer(index, self.slot, nonce)));
            }
            return;
        }
        // Lengths no RoCEv2 sender produces are dropped before any CRC (or capture).
        if !possible_len(n) {
            self.stats.rx_bad_length += 1;
            return;
        }
        // The network header as it arrived, as far as the ICRC covers it (and the UD GRH shows
        // it): the IPv4 ID, which the socket hides, is recovered by the ICRC check.
        let net = match (from, local) {
            (SocketAddr::V4(f), SocketAddr::V4(l)) => {
                let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
                Ipv4Udp::new(*f.ip(), f.port(), *l.ip(), ROCE_V2_PORT, n).emit(&mut hdr);
                let icrc = self.icrc_gate.check_v4(&mut hdr, data);
                if let Some(c) = &mut self.capture {
                    c.record(&hdr, data, true);
                }
                match icrc {
                    Ok((_, icrc::Accepted::Id0)) => self.stats.rx_icrc_id0 += 1,
                    Ok((_, icrc::Accepted::Predicted)) => self.stats.rx_icrc_predicted += 1,
                    Ok((_, icrc::Accepted::Solved)) => self.stats.rx_icrc_solved += 1,
                    Err(icrc::Rejected::Length) => {
                        self.stats.rx_bad_length += 1;
                        return;
                    }
                    Err(icrc::Rejected::Icrc) => {
                        self.stats.rx_bad_icrc += 1;
                        return;
                    }
                }
                net_header_v4(&hdr)
            }
            (SocketAddr::V6(f), SocketAddr::V6(l)) => {
                let hdr = v6_header(*f.ip(), f.port(), *l.ip(), n, info);
                if let Some(c) = &mut self.capture {
                    c.record_v6(&hdr, data, true);
                }
                if icrc::verify_v6(&hdr, data).is_err() {
                    self.stats.rx_bad_icrc += 1;
                    return;
                }
                self.stats.rx_icrc_v6 += 1;
                let mut h = [0u8; IPV6_LEN];
                h.copy_from_slice(&hdr[..IPV6_LEN]);
                Some(NetHeader::V6(h))
            }
            // A socket gets datagrams of its own family only (IPv6 ones are IPv6-only).
            _ => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        self.dispatch(data, from, local, k, net, mrs, now, false);
    }

    /// A datagram whose ICRC was checked (here, or by the context that handed it over:
    /// `handed_over`), from `from` to socket `k` (bound to `local`): to the rdma_cm core or to
    /// its QP; one for another context is handed to it (see [`forward`]).
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        local: SocketAddr,
        k: usize,
        net: Option<NetHeader>,
        mrs: &MrTable,
        now: Instant,
        handed_over: bool,
    ) {
        let pkt = match Packet::parse(data) {
            Ok(p) => p,
            Err(_) => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        let qpn = pkt.bth.dest_qpn;
        if qpn == GSI_QPN {
            // A CM reply for another context (its slot in the comm ID's top byte).
            let owner = forward::mad_owner(pkt.payload);
            if let Some(owner) = owner.filter(|o| *o != 0 && *o != self.slot) {
                if !handed_over {
                    self.misrouted |= 1 << k.min(31);
                    self.hand_over(k, owner, from, net, data);
                }
                return;
            }
            // GSI: connection management MADs go to the rdma_cm core, never to an app QP.
            self.stats.rx_gsi += 1;
            self.gsi.endpoint_mut().on_gsi_packet(
                now,
                gid_from_ip(from.ip()),
                gid_from_ip(local.ip()),
                &pkt,
            );
            self.gsi_pending = true;
            return;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.stats.rx_unknown_qp += 1;
            // Another context's QPN (its slot in the top byte) reached this socket: hand it
            // over, and have the steering read again.
            let owner = (qpn >> 16) as u8;
            if owner != 0 && owner != self.slot && !handed_over {
                self.misrouted |= 1 << k.min(31);
                self.hand_over(k, owner, from, net, data);
            }
            return;
        };
        let mem = mrs.for_pd(slot.pd);
        // A QP on a shared receive queue is lent it, locked, for this packet.
        let mut srq = slot.srq.as_deref().map(|s| (s, s.lock()));
        match &mut slot.qp {
            QpTransport::Rc(rc) => {
                // A connected QP takes packets from its peer only: anyone can send to UDP 4791,
                // and a forged packet must neither land in memory nor disturb the PSN sequence.
                if !from_peer(rc.destination(), from.ip()) {
                    self.stats.rx_bad_source += 1;
                    return;
                }
                match &mut srq {
                    Some((_, q)) => rc.handle_packet_srq(now, &pkt, &mem, q),
                    None => rc.handle_packet(now, &pkt, &mem),
                }
            }
            QpTransport::Uc(uc) => {
                // Connected too: the same rule as RC (rxe's `check_addr` covers RC and UC).
                if !from_peer(uc.destination(), from.ip()) {
                    self.stats.rx_bad_source += 1;
                    return;
                }
                match &mut srq {
                    Some((_, q)) => uc.handle_packet_srq(&pkt, &mem, q),
                    None => uc.handle_packet(&pkt, &mem),
                }
            }
            QpTransport::Ud(ud) => {
                // The network header as it arrived, for the GRH area.
                let Some(net) = net else {
                    self.stats.rx_malformed += 1;
                    return;
                };
                match &mut srq {
                    Some((_, q)) => ud.handle_packet_srq(&pkt, &net, &mem, q),
                    None => ud.handle_packet(&pkt, &net, &mem),
                }
            }
        }
        if let Some((s, mut q)) = srq {
            s.raise_events(&mut q);
        }
        if !self.dirty.contains(&qpn) {
            self.dirty.push(qpn);
        }
    }

    /// Queue `data` (from `from`, network header `net`) for the context with `owner`'s slot,
    /// sent after the receive burst ([`Engine::send_handed_over`]).
    fn hand_over(
        &mut self,
        k: usize,
        owner: u8,
        from: SocketAddr,
        net: Option<NetHeader>,
        data: &[u8],
    ) {
        if self.handed.len() >= MAX_HANDED {
            self.stats.tx_dropped += 1;
            return;
        }
        let mut env = self.handed_spare.pop().unwrap_or_default();
        forward::datagram_envelope(from, net_header_bytes(net.as_ref()), data, &mut env);
        self.handed.push((k, owner, env));
    }

    /// Send the datagrams handed over to other contexts: to the owner's forward socket on the
    /// address they came to (registry), from the socket they reached (port 4791, which the
    /// owner checks).
    fn send_handed_over(&mut self, io: &Io) {
        for (k, owner, env) in self.handed.drain(..) {
            match io.forward_to_slot(k, owner) {
                Some(to) => {
                    self.stats.tx_forwarded += 1;
                    let _ = io.socks[k].socket.send_to(&env, to);
                }
                None => self.stats.tx_dropped += 1,
            }
            if self.handed_spare.len() < MAX_HANDED {
                self.handed_spare.push(env);
            }
        }
    }

    /// Have the next [`Engine::drive`] read the forward sockets.
    pub fn force_fwd_check(&mut self) {
        self.next_fwd_check = Instant::now();
    }

    /// Read what other contexts handed to this one on its forward sockets (see [`forward`]).
    /// The engine does it at most every [`FWD_CHECK`] on its own, and whenever the progress
    /// thread saw a forward socket readable.
    pub fn drain_forwarded(&mut self, io: &Io, mrs: &MrTable, now: Instant) {
        self.next_fwd_check = now + FWD_CHECK;
        let mut buf = std::mem::take(&mut self.fwd_buf);
        if buf.is_empty() {
            buf = vec![0u8; 65536];
        }
        for (k, sock) in io.socks.iter().enumerate() {
            let Some(f) = &sock.fwd else { continue };
            for _ in 0..RX_BURST {
                let Ok((n, src)) = f.recv_from(&mut buf) else {
                    break;
                };
                // Only a context on this address (its port 4791) hands datagrams over.
                if src.ip() != sock.local.ip() || src.port() != ROCE_V2_PORT {
                    self.stats.rx_malformed += 1;
                    continue;
                }
                let env = &buf[..n];
                if let Some((msrc, mad)) = forward::parse(env) {
                    self.stats.rx_forwarded += 1;
                    self.gsi.endpoint_mut().on_forwarded_mad(
                        now,
                        msrc,
                        gid_from_ip(sock.local.ip()),
                        mad,
                    );
                    self.gsi_pending = true;
                    continue;
                }
                let Some((from, hdr, data)) = forward::parse_datagram(env, sock.local.is_ipv4())
                else {
                    self.stats.rx_malformed += 1;
                    continue;
                };
                self.stats.rx_forwarded += 1;
                let net = net_header_from_bytes(hdr);
                self.dispatch(data, from, sock.local, k, net, mrs, now, true);
            }
        }
        self.fwd_buf = buf;
    }

    /// Send everything the QP has to send, and move its completions to the CQs.
    pub fn flush_qp(&mut self, qpn: u32, io: &Io, mrs: &MrTable, now: Instant) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        let mem = mrs.for_pd(slot.pd);
        let mut out = Tx {
            fds: &io.fds,
            capture: &mut self.capture,
            stats: &mut self.stats,
            batch: &mut self.tx,
        };
        match &mut slot.qp {
            QpTransport::Rc(rc) => {
                let dst = rc.destination().and_then(|av| io.gids.route(&av));
                while let Some(len) = rc.poll_transmit(now, &mem, out.buf()) {
                    out.commit(len, dst);
                }
                while let Some(c) = rc.poll_completion() {
                    match c.side {
                        CqSide::Send => slot.send_cq.push(c),
                        CqSide::Recv => slot.recv_cq.push(c),
                    }
                }
            }
            QpTransport::Uc(uc) => {
                let dst = uc.destination().and_then(|av| io.gids.route(&av));
                while let Some(len) = uc.poll_transmit(&mem, out.buf()) {
                    out.commit(len, dst);
                }
                while let Some(c) = uc.poll_completion() {
                    match c.side {
                        CqSide::Send => slot.send_cq.push(c),
                        CqSide::Recv => slot.recv_cq.push(c),
                    }
                }
            }
            QpTransport::Ud(ud) => {
                // Each UD packet goes to the address of its own work request's AH.
                while let Some(t) = ud.poll_transmit(&mem, out.buf()) {
                    out.commit(t.len, io.gids.route(&t.av));
                }
                while let Some(c) = ud.poll_completion() {
                    match c.wc.side {
                        CqSide::Send => slot.send_cq.push(c.wc),
                        CqSide::Recv => slot.recv_cq.push(c.wc),
                    }
                }
            }
        }
        out.flush();
    }
}

impl Engine {
    /// The device's CM endpoint (QP1).
    pub fn cm_endpoint(&mut self) -> &mut CmEndpoint {
        self.gsi.endpoint_mut()
    }

    /// Run `f` on the device's GSI agent of type `A` — made by `adopt` from the CM endpoint the
    /// first time (rdma_cm's core) — with a way to change QP states (the changed QPs are
    /// flushed by the next [`Engine::flush_gsi`]).
    pub fn with_gsi<A: GsiAgent + 'static, R>(
        &mut self,
        now: Instant,
        adopt: impl FnOnce(CmEndpoint) -> A,
        f: impl FnOnce(&mut A, ModifyQp<'_>, Instant) -> R,
    ) -> R {
        if self.gsi.as_any_mut().downcast_mut::<A>().is_none() {
            let vacant = Box::new(CmEndpoint::new(Ipv4Addr::UNSPECIFIED, 0, self.slot));
            let ep = std::mem::replace(&mut self.gsi, vacant).into_endpoint();
            self.gsi = Box::new(adopt(ep));
        }
        let Engine {
            gsi, qps, dirty, ..
        } = self;
        let agent = gsi
            .as_any_mut()
            .downcast_mut::<A>()
            .expect("the agent was made an A above");
        let mut modify = |qpn: u32, a: &QpAttr| modify_qp(qps, dirty, qpn, a, now);
        f(agent, &mut modify, now)
    }

    /// Which sockets to read this round (bit `k`: socket `k`). An application that busy-polls
    /// its CQ drives the engine back to back, and an endpoint has a socket per address (IPv4 and
    /// `::1` on loopback): polling them all each time costs a `poll(2)` per round on top of the
    /// receive, about 0.45 µs of each hop of a ping-pong here. So such a round reads only the
    /// socket that last had traffic, and polls all of them every [`FULL_POLL_EVERY`]; a round
    /// of the progress thread (woken by any socket) polls all.
    fn ready_sockets(&mut self, io: &Io, now: Instant) -> u32 {
        if io.fds.len() <= 1 {
            return u32::MAX;
        }
        if self.app_driving && now < self.next_full_poll {
            return 1 << self.hot.min(31);
        }
        self.next_full_poll = now + FULL_POLL_EVERY;
        readable(&io.fds, &mut self.pollfds)
    }

    /// Hand REQs nobody here listens for to the context (another process on the same address)
    /// that listens for them now.
    fn forward_unclaimed(&mut self, io: &Io, now: Instant) {
        let out = self
            .gsi
            .endpoint_mut()
            .forward_unclaimed(now, |port, local, src| {
                io.forward_target(port, local.map(|g| gid_to_ip(&g)), gid_to_ip(&src.gid))
            });
        for ((k, to), src, mad) in out {
            self.stats.tx_forwarded += 1;
            let _ = io.socks[k]
                .socket
                .send_to(&forward::envelope(&src, &mad), to);
        }
    }

    /// Deliver the CM's events (moving QPs as they say) and send its MADs.
    pub fn flush_gsi(&mut self, io: &Io, now: Instant) {
        {
            let Engine {
                gsi, qps, dirty, ..
            } = self;
            let mut modify = |qpn: u32, a: &QpAttr| modify_qp(qps, dirty, qpn, a, now);
            gsi.process(now, &mut modify);
        }
        let mut out = Tx {
            fds: &io.fds,
            capture: &mut self.capture,
            stats: &mut self.stats,
            batch: &mut self.tx,
        };
        while let Some(g) = self.gsi.endpoint_mut().poll_transmit() {
            let Some(buf) = out.buf().get_mut(..g.packet.len()) else {
                continue;
            };
            buf.copy_from_slice(&g.packet);
            // From the address the peer talks to, else the first of its family.
            let sgid = g.from.and_then(|f| io.gids.index_of(&f)).unwrap_or(0);
            out.commit(g.packet.len(), io.gids.route_gid(&g.to, sgid as u8));
        }
        out.flush();
    }
}

/// Which of the sockets `fds` have something to read (bit `k`: `fds[k]`; a socket past 31
/// shares bit 31), without waiting. One socket is simply read (a receive that finds nothing
/// costs what this check would); several are checked with one `poll`, so an endpoint with
/// IPv4 and IPv6 sockets pays one system call, not one per socket, when nothing came.
fn readable(fds: &[RawFd], pollfds: &mut Vec<libc::pollfd>) -> u32 {
    if fds.len() <= 1 {
        return u32::MAX;
    }
    pollfds.clear();
    pollfds.extend(fds.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    // SAFETY: `pollfds` is a live array of `pollfds.len()` pollfd structures.
    let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, 0) };
    if n < 0 {
        // Interrupted, say: read them all.
        return u32::MAX;
    }
    pollfds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |m, (k, _)| m | 1 << k.min(31))
}

/// A QP state change the CM asked for (see [`ModifyQp`]); the QP is flushed by the next
/// [`Engine::flush_dirty`].
fn modify_qp(
    qps: &mut HashMap<u32, QpSlot>,
    dirty: &mut Vec<u32>,
    qpn: u32,
    a: &QpAttr,
    now: Instant,
) -> bool {
    let Some(s) = qps.get_mut(&qpn) else {
        return false;
    };
    let ok = match &mut s.qp {
        QpTransport::Rc(q) => q.modify(a, now).is_ok(),
        QpTransport::Uc(q) => q.modify(a).is_ok(),
        QpTransport::Ud(q) => q.modify(a).is_ok(),
    };
    // A change the CM asked for is not a fatal error of the transport.
    s.last_state = s.qp.state();
    if !dirty.contains(&qpn) {
        dirty.push(qpn);
    }
    ok
}

/// Whether `src` is the IP address of a connected (RC or UC) QP's peer, given the QP's
/// address vector (no peer before RTR: nothing is).
fn from_peer(dest: Option<AddressVector>, src: IpAddr) -> bool {
    dest.is_some_and(|av| gid_to_ip(&av.dgid) == src)
}

/// The IPv6 and UDP headers of a datagram received from `src`:`src_port` on `local`, `len`
/// bytes of UDP payload, with the traffic class, flow label and hop limit the kernel reported
/// (the ICRC masks those three, and the UDP checksum, which the socket hides: 0 here).
fn v6_header(
    src: std::net::Ipv6Addr,
    src_port: u16,
    local: std::net::Ipv6Addr,
    len: usize,
    info: RxInfo,
) -> [u8; IPV6_LEN + UDP_LEN] {
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    Ipv6Udp {
        traffic_class: info.traffic_class,
        flow_label: info.flow_label,
        hop_limit: if info.hop_limit == 0 {
            64
        } else {
            info.hop_limit
        },
        ..Ipv6Udp::new(src, src_port, local, ROCE_V2_PORT, len)
    }
    .emit(&mut hdr);
    hdr
}

/// The IP header a handed-over datagram arrived with (for a UD GRH), as bytes: 20 (IPv4),
/// 40 (IPv6) or none.
fn net_header_bytes(net: Option<&NetHeader>) -> &[u8] {
    match net {
        Some(NetHeader::V4(ip)) => ip,
        Some(NetHeader::V6(ip)) => ip,
        None => &[],
    }
}

/// The IP header of a handed-over datagram (see [`net_header_bytes`]).
fn net_header_from_bytes(h: &[u8]) -> Option<NetHeader> {
    match h.len() {
        IPV4_LEN => Some(NetHeader::V4(h.try_into().ok()?)),
        IPV6_LEN => Some(NetHeader::V6(h.try_into().ok()?)),
        _ => None,
    }
}
