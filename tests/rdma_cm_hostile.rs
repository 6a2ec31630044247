//! rdma_cm's UDP port space under a forged SIDR_REQ flood through the real socket path: a
//! plain UDP socket on another 127.0.0.x address sends SIDR_REQs with valid ICRCs at a
//! listener while a legitimate client resolves; the client is served during and after the
//! flood, and what the server sends back to the forged address is bounded.

mod cm_util;

use cm_util::qp_on;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softrdma::cm::mad::{attr, MadHdr, MAD_LEN};
use softrdma::cm::manager::{gsi_packet, MadAddr};
use softrdma::cm::ratelimit::{
    REFUSAL_BURST_GLOBAL, REFUSAL_BURST_PER_DEST, REFUSAL_RATE_PER_DEST,
};
use softrdma::cm::SidrRequest;
use softrdma::rdma_cm::{CmTimeouts, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::QpCaps;
use softrdma::verbs::QpType;
use softrdma::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use softrdma::wire::{icrc, Packet, ROCE_V2_PORT};

const T: Duration = Duration::from_secs(30);
const FLOOD: u32 = 5000;

/// Short SIDR timeouts for the client: 262 ms between SIDR_REQs, 15 retries.
const SHORT: CmTimeouts = CmTimeouts {
    packet_life_time: 8,
    cm_response_timeout: 16,
    max_cm_retries: 15,
};

/// A plain UDP socket on a free 127.0.0.x, RoCE port.
fn forger() -> (UdpSocket, Ipv4Addr) {
    for last in (200..=250u8).rev() {
        let ip = Ipv4Addr::new(127, 0, 0, last);
        if let Ok(s) = UdpSocket::bind(SocketAddrV4::new(ip, ROCE_V2_PORT)) {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            return (s, ip);
        }
    }
    panic!("no free loopback address for the forger");
}

fn forged_sidr_req(src: Ipv4Addr, dst: Ipv4Addr, port: u16, i: u32) -> Vec<u8> {
    let m = SidrRequest {
        hdr: MadHdr::cm(attr::SIDR_REQ, 0xf0_0000_0000 | i as u64),
        request_id: i,
        pkey: 0xffff,
        service_id: PortSpace::Udp.service_id(port),
        ..Default::default()
    };
    let mut mad = [0u8; MAD_LEN];
    m.emit(&mut mad);
    let mut p = gsi_packet(&MadAddr::gsi_v4(dst), &mad, i & 0x00ff_ffff);
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    Ipv4Udp::new(src, ROCE_V2_PORT, dst, ROCE_V2_PORT, p.len()).emit(&mut hdr);
    icrc::fill_v4(&hdr, &mut p);
    p
}

/// Resolve and connect a UDP-port-space client until it is served; returns the attempts.
fn served(port: u16, max_attempts: usize) -> usize {
    for attempt in 1..=max_attempts {
        let ch = EventChannel::new().unwrap();
        let c = ch.create_id(PortSpace::Udp).unwrap();
        c.resolve_addr(
            None,
            SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), port)),
            T,
        )
        .unwrap();
        ch.wait_event(EventType::AddrResolved, T).unwrap();
        c.resolve_route(T).unwrap();
        ch.wait_event(EventType::RouteResolved, T).unwrap();
        c.set_cm_timeouts(SHORT).unwrap();
        let _qp = qp_on(&c, QpType::Ud, QpCaps::default());
        c.connect(&ConnParam {
            private_data: b"legit".to_vec(),
            ..Default::default()
        })
        .unwrap();
        let ev = ch.get_cm_event_timeout(T).expect("an answer or a timeout");
        match ev.event() {
            EventType::Established => {
                assert!(ev.ud_param().unwrap().private_data.starts_with(b"served"));
                return attempt;
            }
            // Refused over the backlog (SIDR status 2) or timed out: try again.
            EventType::Unreachable => continue,
            e => panic!("unexpected {e:?}"),
        }
    }
    panic!("not served in {max_attempts} attempts");
}

#[test]
fn forged_sidr_flood_does_not_keep_a_legit_client_out() {
    let sch = EventChannel::new().unwrap();
    let listen = sch.create_id(PortSpace::Udp).unwrap();
    listen
        .bind_addr(SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), 0)))
        .unwrap();
    listen.listen(8).unwrap();
    let port = listen.local_addr().unwrap().port();
    let dst = cm_util::loopback();

    // The server: accepts the legitimate client, rejects everything else as it comes.
    let stop = Arc::new(AtomicBool::new(false));
    let (forged_seen, legit_seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = {
        let (stop, forged_seen, legit_seen) =
            (stop.clone(), forged_seen.clone(), legit_seen.clone());
        std::thread::spawn(move || {
            let mut keep = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let Some(ev) = sch.get_cm_event_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                if ev.event() != EventType::ConnectRequest {
                    continue;
                }
                let id = ev.id().clone();
                let legit = ev.private_data().starts_with(b"legit");
                drop(ev);
                if legit {
                    legit_seen.fetch_add(1, Ordering::Relaxed);
                    let qp = qp_on(&id, QpType::Ud, QpCaps::default());
                    id.accept(&ConnParam {
                        private_data: b"served".to_vec(),
                        ..Default::default()
                    })
                    .unwrap();
                    keep.push((id, qp));
                } else {
                    forged_seen.fetch_add(1, Ordering::Relaxed);
                    // May fail if the request already expired; either way it is answered.
                    let _ = id.reject(&[]);
                }
            }
            drop(listen);
            keep.len()
        })
    };

    // The flood, from another thread, bounded in count.
    let (sock, src) = forger();
    let flood = {
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            for i in 0..FLOOD {
                let p = forged_sidr_req(src, dst, port, 0x1000_0000 | i);
                let _ = sock.send_to(&p, SocketAddrV4::new(dst, ROCE_V2_PORT));
                if i % 256 == 255 {
                    std::thread::yield_now();
                }
            }
        })
    };
    // What comes back to the forged address, read as it comes (the socket buffer is small).
    let reader = {
        let (sock, stop) = (sock.try_clone().unwrap(), stop.clone());
        std::thread::spawn(move || {
            let (mut back, mut other) = (0usize, 0usize);
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::Acquire) {
                if let Ok((n, _)) = sock.recv_from(&mut buf) {
                    match Packet::parse(&buf[..n]) {
                        Ok(p)
                            if u16::from_be_bytes([p.payload[16], p.payload[17]])
                                == attr::SIDR_REP =>
                        {
                            back += 1
                        }
                        _ => other += 1,
                    }
                }
            }
            (back, other)
        })
    };
    let during = served(port, 50);
    flood.join().unwrap();

    // After the flood, served again.
    let after = served(port, 50);
    stop.store(true, Ordering::Release);
    let kept = server.join().unwrap();
    let (back, other) = reader.join().unwrap();
    let forged = forged_seen.load(Ordering::Relaxed);
    assert_eq!(other, 0, "only SIDR_REPs go to the forger");
    // Every SIDR_REP to the forger answers a request the consumer saw (and rejected), or is
    // one of the rate-limited refusals over the backlog; never one per forged packet.
    let limit = forged
        + REFUSAL_BURST_GLOBAL.max(REFUSAL_BURST_PER_DEST) as usize
        + 60 * REFUSAL_RATE_PER_DEST as usize;
    assert!(
        back <= limit,
        "{back} SIDR_REPs back for {forged} shown to the consumer"
    );
    assert_eq!(kept, 2);
    assert_eq!(legit_seen.load(Ordering::Relaxed), 2);
    eprintln!(
        "flood {FLOOD}: consumer saw {forged} forged, {back} SIDR_REPs to the forger; \
         legit served after {during} attempt(s) during, {after} after"
    );
}
