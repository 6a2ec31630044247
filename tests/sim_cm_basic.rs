//! The sans-IO CM connection state machine: two `CmManager`s back to back on a fake clock, and a
//! listener fed the REQ that rping sent on kernel rdma_rxe (rxe-basic.pcap).

use softrdma::cm::mad::{attr, linux_tid, MAD_LEN};
use softrdma::cm::manager::*;
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::*;
use softrdma::transport::Mtu;
use softrdma::wire::deth::GSI_QKEY;
use softrdma::wire::ipv4::Ipv4Udp;
use softrdma::wire::{Opcode, Packet, ROCE_V2_PORT};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const PORT: u16 = 7174;

fn mgr(ip: Ipv4Addr, seed: u64) -> CmManager {
    CmManager::new(CmConfig {
        local_gid: ipv4_to_gid(ip),
        local_ca_guid: 0x5054_00ff_fe00_0000 | ip.octets()[3] as u64,
        hi_tid: 2,
        seed,
    })
}

/// Two managers and a fake clock. `pump` moves MADs both ways until quiet; `drop` decides which
/// MADs the "network" loses.
struct Net {
    now: Instant,
    a: CmManager,
    b: CmManager,
    /// Every MAD delivered, as (from A?, bytes).
    log: Vec<(bool, [u8; MAD_LEN])>,
}

impl Net {
    fn new() -> Self {
        Net {
            now: Instant::now(),
            a: mgr(A, 1),
            b: mgr(B, 2),
            log: Vec::new(),
        }
    }

    fn pump_with(&mut self, mut lose: impl FnMut(bool, &CmMad) -> bool) {
        for _ in 0..100 {
            let mut moved = false;
            while let Some((dst, m)) = self.a.poll_transmit() {
                assert_eq!(dst, MadAddr::gsi_v4(B), "A sends to B's GSI QP");
                moved = true;
                let parsed = CmMad::parse(&m).expect("A's MAD parses");
                // Wrapped as a GSI packet it is what Linux expects on QP1.
                let pkt_bytes = gsi_packet(&dst, &m, 0);
                let pkt = Packet::parse(&pkt_bytes).unwrap();
                if lose(true, &parsed) {
                    continue;
                }
                self.log.push((true, m));
                assert!(self.b.handle_gsi_packet(self.now, ipv4_to_gid(A), &pkt));
            }
            while let Some((dst, m)) = self.b.poll_transmit() {
                assert_eq!(dst, MadAddr::gsi_v4(A));
                moved = true;
                let parsed = CmMad::parse(&m).expect("B's MAD parses");
                if lose(false, &parsed) {
                    continue;
                }
                self.log.push((false, m));
                self.a.handle_mad(self.now, MadAddr::gsi_v4(B), &m);
            }
            if !moved {
                return;
            }
        }
        panic!("MAD storm");
    }

    fn pump(&mut self) {
        self.pump_with(|_, _| false);
    }

    /// Advance the clock to the next deadline of either side and run its timers.
    fn tick(&mut self) -> bool {
        let t = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = t else { return false };
        if t > self.now {
            self.now = t;
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        true
    }

    fn names(&self) -> Vec<(bool, &'static str)> {
        self.log
            .iter()
            .map(|(a, m)| (*a, CmMad::parse(m).unwrap().name()))
            .collect()
    }
}

fn events(m: &mut CmManager) -> Vec<CmEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn params(private: &[u8]) -> ConnectParams {
    let mut p = ConnectParams::rdma_cm_tcp(
        SocketAddrV4::new(A, 0xace3),
        SocketAddrV4::new(B, PORT),
        0x11,
        0x22c97c,
    );
    p.private_data = private.to_vec();
    p
}

/// Connect A to B, B accepting. Returns (A's id, B's id).
fn establish(n: &mut Net) -> (CmId, CmId) {
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let ida = n.a.connect(n.now, &params(b"hello")).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!("{ev:?}")
    };
    let idb = req.id;
    let mut acc = AcceptParams::new(0x12, 0x2a3e9b);
    acc.private_data = b"welcome".to_vec();
    n.b.accept(n.now, idb, &acc).unwrap();
    n.pump();
    (ida, idb)
}

#[test]
fn connect_accept_disconnect_back_to_back() {
    let mut n = Net::new();
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let ida = n.a.connect(n.now, &params(b"hello")).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(req.remote_comm_id, ida.0);
    assert_eq!((req.remote_qpn, req.remote_psn), (0x11, 0x22c97c));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.path_mtu, Some(Mtu::Mtu1024));
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.private_data.len(), 56);
    let cma = req.cma.unwrap();
    assert_eq!(
        (cma.src_port, cma.src_ip(), cma.dst_ip()),
        (0xace3, Some(A.into()), Some(B.into()))
    );
    assert_eq!(req.primary_path.flow_label, 0x50b83, "rdma_cm's port hash");
    assert!(events(&mut n.a).is_empty());
    let idb = req.id;
    let mut acc = AcceptParams::new(0x12, 0x2a3e9b);
    acc.private_data = b"welcome".to_vec();
    n.b.accept(n.now, idb, &acc).unwrap();
    n.pump();
    assert_eq!(
        n.names(),
        vec![(true, "REQ"), (false, "REP"), (true, "RTU")]
    );
    // TIDs and comm IDs as Linux pairs them.
    let tid = linux_tid(2, ida.0);
    for (_, m) in &n.log {
        assert_eq!(CmMad::parse(m).unwrap().hdr().tid, tid);
    }
    let ev = events(&mut n.a);
    let [CmEvent::Established { id, info }] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(*id, ida);
    assert_eq!(
        (info.remote_comm_id, info.remote_qpn, info.remote_psn),
        (idb.0, 0x12, 0x2a3e9b)
    );
    assert_eq!(&info.private_data[..7], b"welcome");
    let ev = events(&mut n.b);
    assert!(
        matches!(&ev[..], [CmEvent::Established { id, .. }] if *id == idb),
        "{ev:?}"
    );
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::Established);
    assert_eq!(n.b.conn_info(idb).unwrap().remote_qpn, 0x11);
    assert_eq!(
        n.a.poll_timeout(),
        None,
        "nothing outstanding once established"
    );

    // A disconnects; B is told, answers with its own disconnect (the DREP).
    n.a.disconnect(n.now, ida, b"bye").unwrap();
    n.pump();
    let ev = events(&mut n.b);
    assert!(
        matches!(&ev[..], [CmEvent::Disconnected { id, private_data }] if *id == idb && &private_data[..3] == b"bye"),
        "{ev:?}"
    );
    assert!(events(&mut n.a).is_empty(), "A waits for the DREP");
    n.b.disconnect(n.now, idb, &[]).unwrap();
    n.pump();
    let names = n.names();
    assert_eq!(&names[3..], &[(true, "DREQ"), (false, "DREP")]);
    let (_, dreq) = n.log[3];
    let (_, drep) = n.log[4];
    let CmMad::Dreq(d) = CmMad::parse(&dreq).unwrap() else {
        panic!()
    };
    assert_eq!(
        (
            d.hdr.tid,
            d.local_comm_id,
            d.remote_comm_id,
            d.remote_qpn_eecn
        ),
        (tid, ida.0, idb.0, 0x12)
    );
    let CmMad::Drep(d) = CmMad::parse(&drep).unwrap() else {
        panic!()
    };
    assert_eq!(
        (d.hdr.tid, d.local_comm_id, d.remote_comm_id),
        (tid, idb.0, ida.0)
    );
    assert!(matches!(&events(&mut n.a)[..], [CmEvent::Disconnected { id, .. }] if *id == ida));
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::TimeWait);
    assert_eq!(n.b.conn_info(idb).unwrap().state, ConnState::TimeWait);
    // A duplicate DREQ in timewait gets the DREP again.
    n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &dreq);
    assert_eq!(n.b.poll_transmit().unwrap().1, drep);
    // Timewait ends on both sides (2^(19-8) ms for rdma_cm's packet lifetime 18).
    let t0 = n.now;
    while n.tick() {}
    assert_eq!(n.now - t0, Duration::from_millis(2048));
    assert_eq!(events(&mut n.a), vec![CmEvent::TimewaitExit { id: ida }]);
    assert_eq!(events(&mut n.b), vec![CmEvent::TimewaitExit { id: idb }]);
    assert!(n.a.is_empty() && n.b.is_empty());
}

#[test]
fn crossing_dreqs_both_answered() {
    let mut n = Net::new();
    let (ida, idb) = establish(&mut n);
    events(&mut n.a);
    events(&mut n.b);
    n.a.disconnect(n.now, ida, &[]).unwrap();
    n.b.disconnect(n.now, idb, &[]).unwrap();
    n.pump();
    // Each got the other's DREQ: both report DISCONNECTED and answer with a DREP.
    assert!(matches!(
        &events(&mut n.a)[..],
        [CmEvent::Disconnected { .. }]
    ));
    assert!(matches!(
        &events(&mut n.b)[..],
        [CmEvent::Disconnected { .. }]
    ));
    n.a.disconnect(n.now, ida, &[]).unwrap();
    n.b.disconnect(n.now, idb, &[]).unwrap();
    n.pump();
    let names = n.names();
    assert_eq!(names.iter().filter(|x| x.1 == "DREQ").count(), 2);
    assert_eq!(names.iter().filter(|x| x.1 == "DREP").count(), 2);
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::TimeWait);
    assert_eq!(n.b.conn_info(idb).unwrap().state, ConnState::TimeWait);
}

#[test]
fn reject_with_private_data() {
    let mut n = Net::new();
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let ida = n.a.connect(n.now, &params(&[])).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!()
    };
    assert!(
        n.b.reject(req.id, &[0x55; 149]).is_err(),
        "REJ private data is 148 bytes"
    );
    n.b.reject(req.id, b"go away").unwrap();
    n.pump();
    let ev = events(&mut n.a);
    let [CmEvent::Rejected {
        id,
        reason,
        private_data,
    }] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!((*id, *reason), (ida, RejReason::ConsumerDefined));
    assert_eq!(&private_data[..7], b"go away");
    let CmMad::Rej(r) = CmMad::parse(&n.log[1].1).unwrap() else {
        panic!()
    };
    assert_eq!(
        (r.hdr.tid, r.remote_comm_id, r.message_rejected),
        (linux_tid(2, ida.0), ida.0, 0)
    );
    assert!(n.a.is_empty() && n.b.is_empty());
    assert_eq!(n.a.poll_timeout(), None);
}

#[test]
fn nobody_listening_gets_invalid_service_id() {
    let mut n = Net::new();
    let ida = n.a.connect(n.now, &params(&[])).unwrap();
    n.pump();
    let ev = events(&mut n.a);
    assert_eq!(
        ev,
        vec![CmEvent::Rejected {
            id: ida,
            reason: RejReason::InvalidServiceId,
            private_data: vec![0; 148]
        }]
    );
    let CmMad::Rej(r) = CmMad::parse(&n.log[1].1).unwrap() else {
        panic!()
    };
    assert_eq!(
        (r.hdr.tid, r.local_comm_id, r.remote_comm_id),
        (linux_tid(2, ida.0), 0, ida.0)
    );
    assert!(events(&mut n.b).is_empty());
    assert!(n.a.is_empty() && n.b.is_empty());
}

#[test]
fn lost_rep_recovers_through_retransmission_once() {
    let mut n = Net::new();
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let ida = n.a.connect(n.now, &params(&[])).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!()
    };
    let idb = req.id;
    n.b.accept(n.now, idb, &AcceptParams::new(0x12, 7)).unwrap();
    // The first REP is lost.
    let mut lost = 0;
    n.pump_with(|from_a, m| {
        let l = !from_a && m.name() == "REP" && lost == 0;
        lost += l as usize;
        l
    });
    assert!(events(&mut n.a).is_empty());
    // A's REQ times out (2 * 2^10 + 2^12 ms) and goes again; B sees a duplicate REQ and sends the
    // REP again; A accepts it and sends the RTU. Then B's own REP retry is answered by an RTU again.
    let t0 = n.now;
    n.tick();
    assert!(n.now - t0 <= Duration::from_millis(6144));
    n.pump();
    let ea = events(&mut n.a);
    let eb = events(&mut n.b);
    assert_eq!(
        ea.iter()
            .filter(|e| matches!(e, CmEvent::Established { .. }))
            .count(),
        1,
        "{ea:?}"
    );
    assert_eq!(
        eb.iter()
            .filter(|e| matches!(e, CmEvent::Established { .. }))
            .count(),
        1,
        "{eb:?}"
    );
    assert!(
        eb.iter().all(|e| !matches!(e, CmEvent::ConnectRequest(_))),
        "duplicate REQ is not a new request"
    );
    assert_eq!(n.b.len(), 1);
    // Let every remaining timer run: nothing more happens.
    while n.tick() {
        n.pump();
    }
    assert!(events(&mut n.a).is_empty() && events(&mut n.b).is_empty());
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::Established);
    assert_eq!(n.b.conn_info(idb).unwrap().state, ConnState::Established);
}

#[test]
fn duplicate_req_before_accept_gets_an_mra_and_stretches_the_timeout() {
    let mut n = Net::new();
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let ida = n.a.connect(n.now, &params(&[])).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!()
    };
    // The consumer is slow: A's REQ times out and goes again; B answers the duplicate with MRA.
    n.tick();
    n.pump();
    let names = n.names();
    assert_eq!(names, vec![(true, "REQ"), (true, "REQ"), (false, "MRA")]);
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::MraReqRcvd);
    // The REQ now waits 2^(24-8) + 2^(19-8) ms.
    let dl = n.a.poll_timeout().unwrap();
    assert_eq!(dl - n.now, Duration::from_millis(65536 + 2048));
    n.b.accept(n.now, req.id, &AcceptParams::new(0x12, 1))
        .unwrap();
    n.pump();
    assert!(matches!(
        &events(&mut n.a)[..],
        [CmEvent::Established { .. }]
    ));
}

#[test]
fn vanished_peer_times_out() {
    // Nobody answers the REQ: 1 + 15 sends, then UNREACHABLE.
    let mut n = Net::new();
    let ida = n.a.connect(n.now, &params(&[])).unwrap();
    let t0 = n.now;
    let mut sent = 0;
    loop {
        while n.a.poll_transmit().is_some() {
            sent += 1;
        }
        let ev = events(&mut n.a);
        if !ev.is_empty() {
            assert_eq!(ev, vec![CmEvent::Unreachable { id: ida }]);
            break;
        }
        assert!(n.tick(), "a timer is always armed until the end");
    }
    assert_eq!(sent, 16);
    assert_eq!(n.now - t0, Duration::from_millis(6144 * 16));
    assert!(n.a.is_empty());

    // The active side vanishes after the REP: B gives up on the REP.
    let mut n = Net::new();
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    n.a.connect(n.now, &params(&[])).unwrap();
    n.pump();
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!()
    };
    let idb = req.id;
    n.b.accept(n.now, idb, &AcceptParams::new(0x12, 1)).unwrap();
    let mut reps = 0;
    loop {
        while n.b.poll_transmit().is_some() {
            reps += 1;
        }
        let ev = events(&mut n.b);
        if !ev.is_empty() {
            assert_eq!(ev, vec![CmEvent::Unreachable { id: idb }]);
            break;
        }
        n.now = n.b.poll_timeout().unwrap();
        n.b.handle_timeout(n.now);
    }
    // Linux sends it 16 times over 66 s; the retries a REQ asks for are clamped so that all
    // sends fit in PEER_HOLD_MAX (7 sends of 4.1 s).
    let (_, retries) = peer_rep_timers(20, 15);
    assert_eq!(reps, 1 + retries as usize);
    assert_eq!(reps, 7);

    // The peer vanishes while connected: our DREQ is never answered, DISCONNECTED after the
    // retries, then timewait.
    let mut n = Net::new();
    let (ida, _) = establish(&mut n);
    events(&mut n.a);
    n.a.disconnect(n.now, ida, &[]).unwrap();
    loop {
        while n.a.poll_transmit().is_some() {}
        let ev = events(&mut n.a);
        if !ev.is_empty() {
            assert!(matches!(&ev[..], [CmEvent::Disconnected { .. }]));
            break;
        }
        n.now = n.a.poll_timeout().unwrap();
        n.a.handle_timeout(n.now);
    }
    assert_eq!(n.a.conn_info(ida).unwrap().state, ConnState::TimeWait);
}

#[test]
fn malformed_and_unexpected_mads_are_dropped() {
    let mut n = Net::new();
    let (ida, idb) = establish(&mut n);
    events(&mut n.a);
    events(&mut n.b);
    let from = MadAddr::gsi_v4(A);
    let good = n.log[0].1; // the REQ
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in 0..20_000 {
        let mut b = [0u8; MAD_LEN];
        if i % 2 == 0 {
            b = n.log[i % n.log.len()].1;
            for _ in 0..1 + next() % 6 {
                let bit = (next() % (MAD_LEN as u64 * 8)) as usize;
                b[bit / 8] ^= 1 << (bit % 8);
            }
        } else {
            b.iter_mut().for_each(|x| *x = next() as u8);
            b[0] = 1;
            b[1] = 7;
            b[2] = 2;
            b[3] = 3;
            b[16] = 0;
            b[17] = [0x10u8, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18][(next() % 9) as usize];
        }
        let len = if i % 7 == 0 {
            (next() % 300) as usize
        } else {
            MAD_LEN
        };
        let len = len.min(MAD_LEN);
        n.b.handle_mad(n.now, from, &b[..len]);
        n.a.handle_mad(n.now, MadAddr::gsi_v4(B), &b[..len]);
        while n.a.poll_transmit().is_some() {}
        while n.b.poll_transmit().is_some() {}
        n.a.handle_timeout(n.now);
        n.b.handle_timeout(n.now);
    }
    // Events may have been produced by lucky garbage (e.g. a fresh REQ), but nothing panicked,
    // and the good REQ is still recognised as a duplicate or stale.
    n.b.handle_mad(n.now, from, &good);
    let _ = (ida, idb);
    assert!(n.a.dropped > 0 && n.b.dropped > 0);
    // Non-GSI packets are refused by handle_gsi_packet.
    let mut pkt = gsi_packet(&MadAddr::gsi_v4(B), &good, 0);
    pkt[12..16].copy_from_slice(&0x1111_1111u32.to_be_bytes()); // wrong Q_Key
    assert!(!n
        .b
        .handle_gsi_packet(n.now, ipv4_to_gid(A), &Packet::parse(&pkt).unwrap()));
}

#[test]
fn oversized_private_data_is_an_error_at_the_call() {
    let mut n = Net::new();
    assert_eq!(
        n.a.connect(n.now, &params(&[1; 57])),
        Err(CmError::PrivateDataTooLong { len: 57, max: 56 })
    );
    let mut raw = params(&[1; 92]);
    raw.cma = None;
    raw.service_id = 0x1234;
    assert!(
        n.a.connect(n.now, &raw).is_ok(),
        "92 bytes without the rdma_cm header"
    );
    raw.private_data.push(0);
    assert!(n.a.connect(n.now, &raw).is_err());
    n.b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    n.a.connect(n.now, &params(&[1; 56])).unwrap();
    n.pump_with(|_, m| m.name() == "REQ" && matches!(m, CmMad::Req(r) if r.service_id == 0x1234));
    let ev = events(&mut n.b);
    let [CmEvent::ConnectRequest(req)] = &ev[..] else {
        panic!("{ev:?}")
    };
    let mut acc = AcceptParams::new(0x12, 1);
    acc.private_data = vec![0; 197];
    assert_eq!(
        n.b.accept(n.now, req.id, &acc),
        Err(CmError::PrivateDataTooLong { len: 197, max: 196 })
    );
    assert_eq!(
        n.b.conn_info(req.id).unwrap().state,
        ConnState::ReqRcvd,
        "nothing changed"
    );
    assert_eq!(
        n.b.disconnect(n.now, req.id, &[]),
        Err(CmError::InvalidState(ConnState::ReqRcvd))
    );
    assert!(n.b.listen(PortSpace::Tcp.service_id(PORT)).is_err());
}

// ---------------------------------------------------------------------------------------------
// The REQ rping sent on kernel rdma_rxe, fed to a softrdma listener.

/// The first MAD with attribute `attr_id` in rxe-basic.pcap: sender, MAD bytes, UDP payload.
fn captured(attr_id: u16) -> (Ipv4Addr, [u8; MAD_LEN], Vec<u8>) {
    let raw = std::fs::read("tests/data/rxe-basic.pcap").unwrap();
    let mut at = 24;
    while at + 16 <= raw.len() {
        let incl = u32::from_le_bytes(raw[at + 8..at + 12].try_into().unwrap()) as usize;
        let rec = &raw[at + 16..(at + 16 + incl).min(raw.len())];
        at += 16 + incl;
        if rec.len() < 42 || rec[12..14] != [0x08, 0x00] {
            continue;
        }
        let Ok((ip, _, udp)) = Ipv4Udp::parse(&rec[14..]) else {
            continue;
        };
        if ip.dst_port != ROCE_V2_PORT {
            continue;
        }
        let Ok(pkt) = Packet::parse(udp) else {
            continue;
        };
        if pkt.bth.dest_qpn == 1 && pkt.payload.len() == MAD_LEN && pkt.payload[17] == attr_id as u8
        {
            return (ip.src, pkt.payload.try_into().unwrap(), udp.to_vec());
        }
    }
    panic!("no attribute {attr_id:#x} in the capture");
}

#[test]
fn rping_req_from_the_capture_is_accepted_with_a_linux_shaped_rep() {
    let (src, req_bytes, udp) = captured(attr::REQ);
    assert_eq!(src, A);
    let mut b = mgr(B, 7);
    b.listen(PortSpace::Tcp.service_id(PORT)).unwrap();
    let now = Instant::now();
    let pkt = Packet::parse(&udp).unwrap();
    assert_eq!(pkt.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(pkt.deth.unwrap().qkey, GSI_QKEY);
    assert!(b.handle_gsi_packet(now, ipv4_to_gid(src), &pkt));
    let ev = events(&mut b);
    let [CmEvent::ConnectRequest(r)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(r.peer, MadAddr::gsi_v4(A));
    assert_eq!(r.remote_comm_id, 0x9d88_1861);
    assert_eq!(r.remote_ca_guid, 0x5054_00ff_fe00_000a);
    assert_eq!((r.remote_qpn, r.remote_psn), (0x11, 0x22c97c));
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!((r.retry_count, r.rnr_retry_count), (7, 7));
    assert_eq!(r.path_mtu, Some(Mtu::Mtu1024));
    assert!(!r.srq);
    let cma = r.cma.unwrap();
    assert_eq!(
        (cma.src_port, cma.src_ip(), cma.dst_ip()),
        (0xace3, Some(A.into()), Some(B.into()))
    );
    assert_eq!(r.private_data, vec![0; 56], "rping sends no private data");
    assert_eq!(r.primary_path.local_ack_timeout, 0x13);

    // Our own REQ for the same connection is byte-identical to the kernel's, comm ID aside.
    let mut a = mgr(A, 3);
    a.connect(now, &params(&[])).unwrap();
    let (_, mine) = a.poll_transmit().unwrap();
    let CmMad::Req(mut m) = CmMad::parse(&mine).unwrap() else {
        panic!()
    };
    m.local_comm_id = 0x9d88_1861;
    m.local_ca_guid = 0x5054_00ff_fe00_000a;
    m.hdr.tid = linux_tid(2, m.local_comm_id);
    let mut again = [0u8; MAD_LEN];
    m.emit(&mut again);
    assert_eq!(
        again[..],
        req_bytes[..],
        "REQ layout as Linux rdma_cm sends it"
    );

    b.accept(now, r.id, &AcceptParams::new(0x11, 0x2a3e9b))
        .unwrap();
    let (dst, rep) = b.poll_transmit().unwrap();
    assert_eq!(dst, MadAddr::gsi_v4(A));
    let CmMad::Rep(p) = CmMad::parse(&rep).unwrap() else {
        panic!()
    };
    assert_eq!(
        p.hdr.tid, 0x0000_0002_6118_889d,
        "the REP echoes the REQ's TID"
    );
    assert_eq!(p.remote_comm_id, 0x9d88_1861);
    assert_eq!(p.local_comm_id, r.id.0);
    assert_eq!((p.local_qpn, p.starting_psn), (0x11, 0x2a3e9b));
    assert_eq!(
        (p.responder_resources, p.initiator_depth, p.rnr_retry_count),
        (1, 1, 7)
    );
    assert_eq!(
        (p.target_ack_delay, p.failover_accepted, p.local_qkey),
        (15, 0, 0)
    );
    assert_eq!(p.local_ca_guid, 0x5054_00ff_fe00_0003);
    // Apart from the comm ID and the GUID it is byte for byte the REP the kernel sent.
    let (_, kernel_rep, _) = captured(attr::REP);
    let mut x = p;
    x.local_comm_id = 0x021d_e2f5;
    x.local_ca_guid = 0x5054_00ff_fe00_000b;
    let mut o = [0u8; MAD_LEN];
    x.emit(&mut o);
    assert_eq!(o[..], kernel_rep[..], "REP layout as Linux sends it");
    // Wrapped for the wire: UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key.
    let w = gsi_packet(&dst, &rep, 5);
    let wp = Packet::parse(&w).unwrap();
    assert_eq!(
        (
            wp.bth.dest_qpn,
            wp.deth.unwrap().src_qpn,
            wp.deth.unwrap().qkey
        ),
        (1, 1, GSI_QKEY)
    );
    assert_eq!(wp.payload, &rep[..]);
    // The RTU rping sent completes the connection.
    let rtu = ReadyToUse {
        hdr: MadHdr::cm(attr::RTU, 0x0000_0002_6118_889d),
        local_comm_id: 0x9d88_1861,
        remote_comm_id: r.id.0,
        ..Default::default()
    };
    let mut rb = [0u8; MAD_LEN];
    rtu.emit(&mut rb);
    b.handle_mad(now, MadAddr::gsi_v4(A), &rb);
    assert!(matches!(&events(&mut b)[..], [CmEvent::Established { .. }]));
    // The duplicate REQ, in ESTABLISHED, is ignored.
    b.handle_mad(now, MadAddr::gsi_v4(A), &req_bytes);
    assert!(b.poll_transmit().is_none() && events(&mut b).is_empty());
}
