//! rdma_cm when the peer misbehaves: a host that never answers, a peer that vanishes in the
//! middle of the handshake or of the connection, and hostile MADs. The misbehaving peer is a
//! plain UDP socket on another loopback address driven by a sans-IO `CmManager`, so it can stop
//! answering at any point.

mod cm_util;

use cm_util::qp_on;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use softrdma::cm::mad::MAD_LEN;
use softrdma::cm::manager::{
    gsi_packet, CmConfig, CmEvent as IbEvent, CmManager, ConnectParams, MadAddr,
};
use softrdma::rdma_cm::{CmId, CmTimeouts, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, QpState};
use softrdma::verbs::{gid_from_ipv4, QpType};
use softrdma::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use softrdma::wire::{icrc, Packet, ROCE_V2_PORT};

const T: Duration = Duration::from_secs(30);

/// Short CM timeouts: 1 ms packet lifetime, 16 ms response timeout, 2 retries.
const SHORT: CmTimeouts = CmTimeouts {
    packet_life_time: 8,
    cm_response_timeout: 12,
    max_cm_retries: 2,
};

/// A RoCE "host" on its own loopback address that speaks CM only when told to.
struct FakePeer {
    sock: UdpSocket,
    ip: Ipv4Addr,
    cm: CmManager,
    psn: u32,
}

impl FakePeer {
    fn new() -> FakePeer {
        for last in (200..=250u8).rev() {
            let ip = Ipv4Addr::new(127, 0, 0, last);
            if let Ok(sock) = UdpSocket::bind(SocketAddrV4::new(ip, ROCE_V2_PORT)) {
                sock.set_read_timeout(Some(Duration::from_millis(20)))
                    .unwrap();
                let cm = CmManager::new(CmConfig {
                    local_gid: gid_from_ipv4(ip),
                    local_ca_guid: 0x1234,
                    hi_tid: 7,
                    seed: last as u64,
                });
                return FakePeer {
                    sock,
                    ip,
                    cm,
                    psn: 0,
                };
            }
        }
        panic!("no free loopback address for the fake peer");
    }

    /// Send a raw transport packet (ICRC filled in) to `dst`.
    fn send_raw(&self, dst: Ipv4Addr, pkt: &mut [u8]) {
        let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
        Ipv4Udp::new(self.ip, ROCE_V2_PORT, dst, ROCE_V2_PORT, pkt.len()).emit(&mut hdr);
        icrc::fill_v4(&hdr, pkt);
        self.sock
            .send_to(pkt, SocketAddrV4::new(dst, ROCE_V2_PORT))
            .unwrap();
    }

    /// Send what the CM has queued.
    fn flush(&mut self) {
        while let Some((dest, mad)) = self.cm.poll_transmit() {
            let mut p = gsi_packet(&dest, &mad, self.psn);
            self.psn += 1;
            let ip = softrdma::verbs::ipv4_from_gid(&dest.gid).unwrap();
            self.send_raw(ip, &mut p);
        }
    }

    /// Receive for `d`: MADs go to the CM when `answer`, else are only collected. Returns the
    /// MADs received (attribute IDs).
    fn pump(&mut self, d: Duration, answer: bool) -> Vec<u16> {
        let end = Instant::now() + d;
        let mut attrs = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            if let Ok((n, SocketAddr::V4(from))) = self.sock.recv_from(&mut buf) {
                if let Ok(p) = Packet::parse(&buf[..n]) {
                    if p.bth.dest_qpn == 1 && p.payload.len() == MAD_LEN {
                        attrs.push(u16::from_be_bytes([p.payload[16], p.payload[17]]));
                        if answer {
                            self.cm.handle_gsi_packet(
                                Instant::now(),
                                gid_from_ipv4(*from.ip()),
                                &p,
                            );
                        }
                    }
                }
            }
            if answer {
                self.cm.handle_timeout(Instant::now());
                self.flush();
            }
        }
        attrs
    }
}

const REQ: u16 = 0x0010;
const REP: u16 = 0x0013;
const DREQ: u16 = 0x0015;

fn listener(ch: &EventChannel) -> (CmId, SocketAddrV4) {
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), 0)))
        .unwrap();
    id.listen(4).unwrap();
    let a = id.local_addr().unwrap();
    (id, a)
}

#[test]
fn connect_to_a_host_that_never_answers_is_unreachable() {
    let mut fake = FakePeer::new();
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.set_cm_timeouts(SHORT).unwrap();
    id.resolve_addr(None, SocketAddr::V4(SocketAddrV4::new(fake.ip, 7000)), T)
        .unwrap();
    ch.wait_event(EventType::AddrResolved, T).unwrap();
    id.resolve_route(T).unwrap();
    ch.wait_event(EventType::RouteResolved, T).unwrap();
    let _qp = qp_on(&id, QpType::Rc, QpCaps::default());
    id.connect(&ConnParam::default()).unwrap();
    let ev = ch
        .get_cm_event_timeout(T)
        .expect("an event in bounded time");
    assert_eq!(ev.event(), EventType::Unreachable);
    assert_eq!(ev.status(), -libc::ETIMEDOUT);
    // The REQ went out once and was retried twice.
    let attrs = fake.pump(Duration::from_millis(100), false);
    assert_eq!(attrs, vec![REQ, REQ, REQ]);
}

#[test]
fn active_peer_vanishing_after_req_makes_the_passive_side_unreachable() {
    let mut fake = FakePeer::new();
    let ch = EventChannel::new().unwrap();
    let (_l, laddr) = listener(&ch);
    let mut p = ConnectParams::rdma_cm_tcp(SocketAddrV4::new(fake.ip, 5555), laddr, 0x99, 0x1000);
    p.packet_life_time = SHORT.packet_life_time;
    p.cm_response_timeout = SHORT.cm_response_timeout;
    p.max_cm_retries = SHORT.max_cm_retries;
    fake.cm.connect(Instant::now(), &p).unwrap();
    fake.flush();
    let ev = ch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert_eq!(ev.conn_param().unwrap().qp_num, 0x99);
    let id = ev.id().clone();
    drop(ev);
    let qp = qp_on(&id, QpType::Rc, QpCaps::default());
    id.accept(&ConnParam::default()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    // The fake peer is gone: no RTU ever comes.
    let ev = ch
        .get_cm_event_timeout(T)
        .expect("an event in bounded time");
    assert_eq!(ev.event(), EventType::Unreachable);
    assert_eq!(ev.id(), &id);
    let attrs = fake.pump(Duration::from_millis(100), false);
    assert_eq!(attrs, vec![REP, REP, REP]);
}

#[test]
fn peer_vanishing_mid_connection_still_ends_in_disconnected() {
    let mut fake = FakePeer::new();
    let ch = EventChannel::new().unwrap();
    let (_l, laddr) = listener(&ch);
    let mut p = ConnectParams::rdma_cm_tcp(SocketAddrV4::new(fake.ip, 5556), laddr, 0x77, 0x2000);
    p.packet_life_time = SHORT.packet_life_time;
    p.cm_response_timeout = SHORT.cm_response_timeout;
    p.max_cm_retries = SHORT.max_cm_retries;
    let fid = fake.cm.connect(Instant::now(), &p).unwrap();
    fake.flush();
    let ev = ch.wait_event(EventType::ConnectRequest, T).unwrap();
    let id = ev.id().clone();
    drop(ev);
    let qp = qp_on(&id, QpType::Rc, QpCaps::default());
    id.accept(&ConnParam::default()).unwrap();
    // The fake peer answers the REP with an RTU, then goes silent.
    let t0 = Instant::now();
    while !matches!(fake.cm.poll_event(), Some(IbEvent::Established { id, .. }) if id == fid) {
        assert!(t0.elapsed() < T, "the fake peer never got the REP");
        fake.pump(Duration::from_millis(10), true);
    }
    ch.wait_event(EventType::Established, T).unwrap();
    id.disconnect().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Err);
    let ev = ch
        .get_cm_event_timeout(T)
        .expect("an event in bounded time");
    assert_eq!(ev.event(), EventType::Disconnected);
    let attrs = fake.pump(Duration::from_millis(100), false);
    assert!(
        attrs.iter().all(|&a| a == DREQ) && attrs.len() == 3,
        "{attrs:x?}"
    );
}

#[test]
fn hostile_gsi_packets_are_dropped_and_the_listener_keeps_working() {
    let fake = FakePeer::new();
    let ch = EventChannel::new().unwrap();
    let (_l, laddr) = listener(&ch);
    let dst = *laddr.ip();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let gsi = MadAddr::gsi_v4(dst);
    for i in 0..2000u32 {
        let mut mad = [0u8; MAD_LEN];
        for b in mad.iter_mut() {
            *b = next() as u8;
        }
        // Keep a CM class header half the time, so the parsers get past the first checks.
        if i % 2 == 0 {
            mad[0] = 1; // base version
            mad[1] = 7; // CM class
            mad[2] = 2; // class version
            mad[3] = 3; // Send
            mad[16] = 0;
            mad[17] = [0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19][i as usize % 10];
        }
        let mut p = gsi_packet(&gsi, &mad, i);
        // Now and then truncate the packet or corrupt its ICRC.
        match i % 7 {
            0 => {
                let n = (next() as usize) % p.len();
                fake.send_raw(dst, &mut p[..n].to_vec());
            }
            1 => {
                let mut q = p.clone();
                let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
                Ipv4Udp::new(fake.ip, ROCE_V2_PORT, dst, ROCE_V2_PORT, q.len()).emit(&mut hdr);
                icrc::fill_v4(&hdr, &mut q);
                let l = q.len();
                q[l - 1] ^= 0xff;
                fake.sock
                    .send_to(&q, SocketAddrV4::new(dst, ROCE_V2_PORT))
                    .unwrap();
            }
            _ => fake.send_raw(dst, &mut p),
        }
    }
    // Whatever those did (a random REQ may even have been taken for a connection request), a
    // real client still connects.
    let cch = EventChannel::new().unwrap();
    let c = cch.create_id(PortSpace::Tcp).unwrap();
    c.resolve_addr(None, SocketAddr::V4(laddr), T).unwrap();
    cch.wait_event(EventType::AddrResolved, T).unwrap();
    c.resolve_route(T).unwrap();
    cch.wait_event(EventType::RouteResolved, T).unwrap();
    let _cqp = qp_on(&c, QpType::Rc, QpCaps::default());
    c.connect(&ConnParam {
        private_data: b"real".to_vec(),
        ..Default::default()
    })
    .unwrap();
    let t0 = Instant::now();
    loop {
        let ev = ch
            .get_cm_event_timeout(T)
            .expect("the real request arrives");
        if ev.event() == EventType::ConnectRequest && ev.private_data().starts_with(b"real") {
            let id = ev.id().clone();
            drop(ev);
            let _qp = qp_on(&id, QpType::Rc, QpCaps::default());
            id.accept(&ConnParam::default()).unwrap();
            break;
        }
        // Random REQs that parsed: refuse them.
        if ev.event() == EventType::ConnectRequest {
            let _ = ev.id().reject(&[]);
        }
        assert!(t0.elapsed() < T);
    }
    cch.wait_event(EventType::Established, T).unwrap();
}
