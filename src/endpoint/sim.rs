//! Whole devices in the seeded simulator: two [`Endpoint`]s — QPN demultiplexing, ICRC gate,
//! QP1 and the CM, CQs, memory tables — joined by the modelled [`Link`] of `transport::sim`
//! (loss, duplication, reordering, delay) on a fake clock. No sockets: what the endpoints send
//! gets its IPv4 header and ICRC as the driver would give it, crosses the link, and is fed to
//! the other endpoint as a datagram from the sender's address.

use crate::transport::SendFlags;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cq::CqShared;
use super::events::AsyncQueue;
use super::gids::{GidTable, Route};
use super::memory::{Backing, MrInner, MrTable};
use super::qp::{QpSlot, QpTransport};
use super::quota::Quota;
use super::receive::{Delivery, RxInfo};
use super::transmit::TxSink;
use super::Endpoint;
use crate::transport::sim::{Link, LinkConfig};
use crate::transport::{
    AccessFlags, AddressVector, Completion, Mtu, QpAttr, QpCaps, QpState, RcQp, RecvWqe, SendWqe,
};
use crate::wire::gid::gid_from_ip;
use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use crate::wire::{icrc, ROCE_V2_PORT};

/// One simulated device: its endpoint and the objects a context would hold.
pub(crate) struct SimDevice {
    pub ep: Endpoint,
    pub mrs: MrTable,
    pub events: Arc<AsyncQueue>,
    pub gids: GidTable,
    pub addr: SocketAddr,
    cqs: Arc<Quota>,
}

/// What an endpoint sent in one round: whole IPv4 datagrams' UDP payloads (BTH to ICRC), each
/// with its destination.
struct SimTx {
    buf: Vec<u8>,
    out: Vec<(SocketAddr, Vec<u8>)>,
    /// Packets without a route.
    dropped: u64,
}

impl TxSink for SimTx {
    fn buf(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn commit(&mut self, len: usize, route: Option<Route>) {
        let Some(Route {
            from: IpAddr::V4(src),
            to: SocketAddr::V4(to),
            ..
        }) = route
        else {
            self.dropped += 1;
            return;
        };
        let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
        // IP ID 0, as a softrdma peer sends a packet that is not part of a GSO run.
        Ipv4Udp::new(src, ROCE_V2_PORT, *to.ip(), ROCE_V2_PORT, len).emit(&mut hdr);
        let pkt = &mut self.buf[..len];
        icrc::fill_v4(&hdr, pkt);
        self.out.push((SocketAddr::V4(to), pkt.to_vec()));
    }
}

/// Two devices on one link.
pub(crate) struct DeviceSim {
    pub devs: [SimDevice; 2],
    pub link: Link,
    pub now: Instant,
    start: Instant,
}

impl DeviceSim {
    /// Devices 10.0.0.1 and 10.0.0.2 on a link with `cfg`'s impairments, seeded by `seed`.
    pub fn new(seed: u64, cfg: LinkConfig) -> Self {
        let dev = |k: u8| {
            let ip = Ipv4Addr::new(10, 0, 0, k + 1);
            let addr = SocketAddr::new(IpAddr::V4(ip), ROCE_V2_PORT);
            SimDevice {
                ep: Endpoint::new(ip, 0x0200_0000_0000_0000 | k as u64, 0),
                mrs: MrTable::default(),
                events: Arc::new(AsyncQueue::default()),
                gids: GidTable::new(&[addr]),
                addr,
                cqs: Quota::new(64, "max_cq"),
            }
        };
        let now = Instant::now();
        DeviceSim {
            devs: [dev(0), dev(1)],
            link: Link::new(seed, cfg),
            now,
            start: now,
        }
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    pub fn create_cq(&mut self, d: usize, cap: usize) -> Arc<CqShared> {
        let dev = &self.devs[d];
        let slot = dev.cqs.take().expect("a CQ slot");
        Arc::new(CqShared::new(slot, 1, cap, None, dev.events.clone()))
    }

    /// Register `len` bytes (owned, zeroed) in protection domain `pd`: `(key, address)`.
    pub fn register(&mut self, d: usize, pd: u32, len: usize, access: AccessFlags) -> (u32, u64) {
        let buf = vec![0u8; len].into_boxed_slice();
        let addr = buf.as_ptr() as u64;
        let mr = self.devs[d].mrs.insert(|key| MrInner {
            pd,
            key,
            access,
            addr,
            len,
            mem: Backing::Owned {
                buf: Mutex::new(buf),
                start: 0,
            },
        });
        (mr.key, addr)
    }

    /// An RC QP of protection domain `pd` completing into `cq`.
    pub fn create_rc(&mut self, d: usize, pd: u32, cq: &Arc<CqShared>) -> u32 {
        let ep = &mut self.devs[d].ep;
        let qpn = ep.alloc_qpn().expect("a QPN");
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            ..QpCaps::default()
        };
        ep.insert_qp(
            qpn,
            QpSlot {
                qp: QpTransport::Rc(RcQp::new(qpn, caps, false)),
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                pd,
                last_state: QpState::Reset,
                srq: None,
                last_wqe_reported: false,
            },
        );
        qpn
    }

    /// Connect QP `qa` of device 0 and QP `qb` of device 1 (RESET -> INIT -> RTR -> RTS), as
    /// an application does after exchanging QPNs and GIDs out of band.
    pub fn connect_rc(&mut self, qa: u32, qb: u32) {
        let now = self.now;
        let gids = [
            gid_from_ip(self.devs[0].addr.ip()),
            gid_from_ip(self.devs[1].addr.ip()),
        ];
        for (d, (me, peer)) in [(qa, qb), (qb, qa)].into_iter().enumerate() {
            let Some(QpTransport::Rc(qp)) = self.devs[d].ep.qp_mut(me).map(|s| &mut s.qp) else {
                panic!("no RC QP {me:#x}");
            };
            let steps = [
                QpAttr {
                    qp_state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port_num: Some(1),
                    qp_access_flags: Some(AccessFlags::all()),
                    ..Default::default()
                },
                QpAttr {
                    qp_state: Some(QpState::Rtr),
                    ah_attr: Some(AddressVector {
                        dgid: gids[1 - d],
                        port_num: 1,
                        hop_limit: 64,
                        ..Default::default()
                    }),
                    path_mtu: Some(Mtu::Mtu1024),
                    dest_qp_num: Some(peer),
                    rq_psn: Some(0x100),
                    max_dest_rd_atomic: Some(16),
                    min_rnr_timer: Some(1),
                    ..Default::default()
                },
                QpAttr {
                    qp_state: Some(QpState::Rts),
                    sq_psn: Some(0x100),
                    timeout: Some(10),
                    retry_cnt: Some(7),
                    rnr_retry: Some(7),
                    max_rd_atomic: Some(16),
                    ..Default::default()
                },
            ];
            for a in &steps {
                qp.modify(a, now).expect("QP transition");
            }
        }
    }

    fn rc(&mut self, d: usize, qpn: u32) -> &mut RcQp {
        match self.devs[d].ep.qp_mut(qpn).map(|s| &mut s.qp) {
            Some(QpTransport::Rc(q)) => q,
            _ => panic!("no RC QP {qpn:#x}"),
        }
    }

    /// Post a send WR on QP `qpn` of device `d` and let it transmit.
    pub fn post_send(&mut self, d: usize, qpn: u32, wqe: SendWqe) {
        self.rc(d, qpn).post_send(wqe).expect("post_send");
        self.flush_qp(d, qpn);
    }

    pub fn post_recv(&mut self, d: usize, qpn: u32, wqe: RecvWqe) {
        self.rc(d, qpn).post_recv(wqe).expect("post_recv");
    }

    /// Copy `len` bytes at `addr` of device `d`'s memory (key `key`, PD `pd`).
    pub fn read(&self, d: usize, pd: u32, key: u32, addr: u64, len: usize) -> Vec<u8> {
        use crate::transport::MemoryAccess;
        let mut v = vec![0u8; len];
        self.devs[d]
            .mrs
            .for_pd(pd)
            .local_read(key, addr, &mut v)
            .expect("readable");
        v
    }

    pub fn write(&self, d: usize, pd: u32, key: u32, addr: u64, data: &[u8]) {
        use crate::transport::MemoryAccess;
        self.devs[d]
            .mrs
            .for_pd(pd)
            .local_write(key, addr, data)
            .expect("writable");
    }

    fn sink() -> SimTx {
        SimTx {
            buf: vec![0u8; 65536],
            out: Vec::new(),
            dropped: 0,
        }
    }

    /// Put what a round of device `d` sent on the link.
    fn send(&mut self, d: usize, tx: SimTx) {
        self.devs[d].ep.stats.tx_dropped += tx.dropped;
        for (to, data) in tx.out {
            self.devs[d].ep.stats.tx_packets += 1;
            let peer = 1 - d;
            if to == self.devs[peer].addr {
                self.link.send(self.now, peer, &data);
            } else {
                self.devs[d].ep.stats.tx_dropped += 1;
            }
        }
    }

    fn flush_qp(&mut self, d: usize, qpn: u32) {
        let mut tx = Self::sink();
        let dev = &mut self.devs[d];
        dev.ep
            .transmit_qp(qpn, &dev.gids, &dev.mrs, self.now, &mut tx);
        self.send(d, tx);
    }

    /// Run device `d`'s round as the driver does after receiving: timers, the CM, every QP
    /// that has something to do.
    fn round(&mut self, d: usize) {
        let now = self.now;
        let mut tx = Self::sink();
        let dev = &mut self.devs[d];
        if dev.ep.handle_timeout(now) {
            // No other process shares the address: REQs nobody listens for end in a REJ.
            let _ = dev
                .ep
                .cm_endpoint()
                .forward_unclaimed(now, |_, _, _| None::<()>);
        }
        if dev.ep.gsi_due() {
            dev.ep.transmit_gsi(&dev.gids, now, &mut tx);
        }
        dev.ep
            .transmit_dirty(&dev.gids, &dev.mrs, &dev.events, now, &mut tx);
        self.send(d, tx);
    }

    /// One step: deliver the datagrams due now and run both devices' rounds; if nothing was
    /// due, move the clock to the next delivery or timer. False when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        let mut delivered = false;
        while let Some((to, data)) = self.link.pop_due(self.now) {
            delivered = true;
            let from = self.devs[1 - to].addr;
            let dev = &mut self.devs[to];
            let r = dev.ep.handle_datagram(
                self.now,
                dev.addr,
                from,
                RxInfo::default(),
                &data,
                &dev.mrs,
                None,
            );
            assert!(matches!(r, Delivery::Done), "one context per address");
        }
        self.round(0);
        self.round(1);
        if delivered {
            return true;
        }
        let next = [
            self.link.next_delivery(),
            self.devs[0].ep.next_deadline(),
            self.devs[1].ep.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Step until `done` or `max_steps`; true if `done` held.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        false
    }
}

/// Every completion waiting in `cq`.
pub(crate) fn drain(cq: &CqShared) -> Vec<Completion> {
    let mut out = vec![Completion::default(); cq.len()];
    let n = cq.pop_into(&mut out).expect("no overrun");
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use super::*;
    use crate::cm::endpoint::{CmEndpoint, GsiAgent, ModifyQp};
    use crate::cm::manager::{CmEvent, ConnectParams};
    use crate::cm::RejReason;
    use crate::transport::sim::{pattern, recv_wr, send_wr};
    use crate::transport::{SendOp, Sge, WcOpcode, WcStatus};

    const PD: u32 = 1;

    fn sge(key: u32, addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            length: len,
            lkey: key,
        }
    }

    /// RC SEND, WRITE and READ between two whole devices over a link that drops, duplicates
    /// and reorders: every datagram crosses the ICRC gate and the QPN demultiplexing of the
    /// receiving endpoint, and every message lands whole, in order, with success completions.
    #[test]
    fn rc_between_two_devices_over_a_lossy_link() {
        let mut lost = 0;
        for seed in 1..=4u64 {
            let mut sim = DeviceSim::new(seed, LinkConfig::lossy(0.05, 0.02, 0.05));
            let cq = [sim.create_cq(0, 1024), sim.create_cq(1, 1024)];
            let (qa, qb) = (sim.create_rc(0, PD, &cq[0]), sim.create_rc(1, PD, &cq[1]));
            sim.connect_rc(qa, qb);
            let len = 64 << 10;
            let all = AccessFlags::all();
            let (ka, aa) = sim.register(0, PD, len, all);
            let (kb, ab) = sim.register(1, PD, len, all);
            let data = pattern(seed, 3000);
            sim.write(0, PD, ka, aa, &data);
            // Device 1: two receives for the SENDs.
            for i in 0..2u64 {
                sim.post_recv(
                    1,
                    qb,
                    recv_wr(100 + i, vec![sge(kb, ab + 8192 * (i + 1), 4096)]),
                );
            }
            sim.post_send(0, qa, send_wr(1, SendOp::Send, vec![sge(ka, aa, 3000)]));
            let write = SendOp::RdmaWrite {
                remote_addr: ab + 40_000,
                rkey: kb,
            };
            sim.post_send(0, qa, send_wr(2, write, vec![sge(ka, aa, 3000)]));
            let read = SendOp::RdmaRead {
                remote_addr: ab + 40_000,
                rkey: kb,
            };
            sim.post_send(0, qa, send_wr(3, read, vec![sge(ka, aa + 20_000, 3000)]));
            // Fenced: it sends what the READ brought back (IBA 10.8.3.3).
            let mut fenced = send_wr(4, SendOp::Send, vec![sge(ka, aa + 20_000, 3000)]);
            fenced.flags.insert(SendFlags::FENCE);
            sim.post_send(0, qa, fenced);
            let mut got = [Vec::new(), Vec::new()];
            let done = sim.run_until(200_000, |s| {
                got[0].extend(drain(&cq[0]));
                got[1].extend(drain(&cq[1]));
                let _ = s;
                got[0].len() == 4 && got[1].len() == 2
            });
            assert!(done, "seed {seed}: {got:?} after {:?}", sim.elapsed());
            let ids: Vec<u64> = got[0].iter().map(|c| c.wr_id).collect();
            assert_eq!(ids, [1, 2, 3, 4], "seed {seed}: send completions in order");
            assert!(got.iter().flatten().all(|c| c.status == WcStatus::Success));
            assert_eq!(got[0][2].opcode, WcOpcode::RdmaRead);
            let recv: Vec<(u64, u32)> = got[1].iter().map(|c| (c.wr_id, c.byte_len)).collect();
            assert_eq!(recv, [(100, 3000), (101, 3000)]);
            // Both SENDs, the WRITE and the READ back moved the same bytes.
            for (what, at) in [
                ("SEND", ab + 8192),
                ("SEND", ab + 16384),
                ("WRITE", ab + 40_000),
            ] {
                let got = sim.read(1, PD, kb, at, 3000);
                assert!(got == data, "seed {seed}: {what} at +{}", at - ab);
            }
            assert_eq!(sim.read(0, PD, ka, aa + 20_000, 3000), data);
            for d in &sim.devs {
                let s = d.ep.stats;
                assert_eq!((s.rx_bad_icrc, s.rx_malformed, s.rx_unknown_qp), (0, 0, 0));
                assert!(s.rx_icrc_id0 > 0 && s.tx_dropped == 0, "{s:?}");
            }
            lost += sim.link.stats.dropped;
        }
        assert!(
            lost > 0,
            "the link lost nothing: the test proves nothing about loss"
        );
    }

    /// A corrupted datagram (one payload bit flipped in flight) fails the ICRC gate and
    /// reaches no QP; the retransmission delivers the message.
    #[test]
    fn a_corrupted_datagram_is_counted_and_dropped_before_any_qp() {
        let mut sim = DeviceSim::new(7, LinkConfig::default());
        let cq = [sim.create_cq(0, 64), sim.create_cq(1, 64)];
        let (qa, qb) = (sim.create_rc(0, PD, &cq[0]), sim.create_rc(1, PD, &cq[1]));
        sim.connect_rc(qa, qb);
        let (ka, aa) = sim.register(0, PD, 4096, AccessFlags::all());
        let (kb, ab) = sim.register(1, PD, 4096, AccessFlags::all());
        sim.write(0, PD, ka, aa, &[0x5a; 512]);
        sim.post_recv(1, qb, recv_wr(9, vec![sge(kb, ab, 4096)]));
        // Take the SEND off the link and deliver it with one payload bit flipped.
        sim.post_send(0, qa, send_wr(1, SendOp::Send, vec![sge(ka, aa, 512)]));
        let (to, mut pkt) = sim
            .link
            .pop_due(sim.now + Duration::from_secs(1))
            .expect("the SEND");
        assert_eq!(to, 1);
        pkt[20] ^= 1;
        let from = sim.devs[0].addr;
        let dev = &mut sim.devs[1];
        let r = dev.ep.handle_datagram(
            sim.now,
            dev.addr,
            from,
            RxInfo::default(),
            &pkt,
            &dev.mrs,
            None,
        );
        assert!(matches!(r, Delivery::Done));
        assert_eq!(dev.ep.stats.rx_bad_icrc, 1);
        assert!(drain(&cq[1]).is_empty());
        // The requester's timer sends it again, intact.
        let done = sim.run_until(10_000, |_| cq[1].len() == 1);
        assert!(done, "retransmitted after {:?}", sim.elapsed());
        let c = drain(&cq[1]);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].byte_len),
            (9, WcStatus::Success, 512)
        );
        assert_eq!(sim.read(1, PD, kb, ab, 512), vec![0x5a; 512]);
    }

    /// A GSI agent that keeps the CM's events, as rdma_cm's core takes them.
    struct Recorder {
        ep: CmEndpoint,
        events: Vec<CmEvent>,
    }

    impl GsiAgent for Recorder {
        fn endpoint(&self) -> &CmEndpoint {
            &self.ep
        }
        fn endpoint_mut(&mut self) -> &mut CmEndpoint {
            &mut self.ep
        }
        fn process(&mut self, _now: Instant, _modify: ModifyQp<'_>) {
            while let Some(e) = self.ep.cm.poll_event() {
                self.events.push(e);
            }
        }
        fn work_pending(&self) -> bool {
            false
        }
        fn into_endpoint(self: Box<Self>) -> CmEndpoint {
            self.ep
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// QP1 end to end in simulated time: a REQ to a port nobody on device 1 listens on waits
    /// there for a listener (`UNCLAIMED_REQ_WAIT`), then is rejected with reason 8 (invalid
    /// Service ID), while the link drops a tenth of the MADs (the CM retransmits).
    #[test]
    fn a_req_nobody_listens_for_is_rejected_after_the_wait_in_simulated_time() {
        let mut sim = DeviceSim::new(3, LinkConfig::lossy(0.1, 0.0, 0.0));
        let start = sim.now;
        let (a, b) = (sim.devs[0].addr, sim.devs[1].addr);
        let p = ConnectParams::rdma_cm_tcp_ip(
            SocketAddr::new(a.ip(), 40000),
            SocketAddr::new(b.ip(), 7471),
            0x11,
            0x100,
        );
        let id = sim.devs[0].ep.with_gsi(
            start,
            |ep| Recorder {
                ep,
                events: Vec::new(),
            },
            |r, _, now| r.ep.cm.connect(now, &p).expect("REQ"),
        );
        sim.devs[0].ep.gsi_pending = true;
        let rejected = |s: &mut DeviceSim| {
            s.devs[0].ep.with_gsi(
                s.now,
                |_| unreachable!("already a recorder"),
                |r: &mut Recorder, _, _| {
                    r.events.iter().any(|e| {
                        matches!(e, CmEvent::Rejected { id: i, reason, .. }
                            if *i == id && *reason == RejReason::InvalidServiceId)
                    })
                },
            )
        };
        assert!(
            sim.run_until(100_000, rejected),
            "REJ after {:?}",
            sim.elapsed()
        );
        let waited = sim.now - start;
        assert!(
            waited >= crate::cm::endpoint::UNCLAIMED_REQ_WAIT,
            "rejected after {waited:?}, before the wait"
        );
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert!(sim.devs[1].ep.stats.rx_gsi > 0);
    }
}
