//! SIDR (Service ID Resolution) in the sans-IO CM: two `CmManager`s back to back on a fake clock,
//! as rdma_cm's UDP port space uses it.

use softrdma::cm::mad::{attr, MAD_LEN};
use softrdma::cm::manager::*;
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::sidr::status;
use softrdma::cm::sidr_manager::*;
use softrdma::cm::*;
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

struct Net {
    now: Instant,
    a: CmManager,
    b: CmManager,
}

impl Net {
    fn new() -> Self {
        Net {
            now: Instant::now(),
            a: mgr(A, 1),
            b: mgr(B, 2),
        }
    }

    /// Move MADs both ways until quiet; `lose(from_a, mad)` drops some. Returns what was
    /// delivered, as (from A?, MAD).
    fn pump_with(&mut self, mut lose: impl FnMut(bool, &CmMad) -> bool) -> Vec<(bool, CmMad)> {
        let mut log = Vec::new();
        for _ in 0..100 {
            let mut moved = false;
            while let Some((dst, m)) = self.a.poll_transmit() {
                assert_eq!(dst, MadAddr::gsi_v4(B));
                moved = true;
                let p = CmMad::parse(&m).unwrap();
                if lose(true, &p) {
                    continue;
                }
                log.push((true, p));
                self.b.handle_mad(self.now, MadAddr::gsi_v4(A), &m);
            }
            while let Some((dst, m)) = self.b.poll_transmit() {
                assert_eq!(dst, MadAddr::gsi_v4(A));
                moved = true;
                let p = CmMad::parse(&m).unwrap();
                if lose(false, &p) {
                    continue;
                }
                log.push((false, p));
                self.a.handle_mad(self.now, MadAddr::gsi_v4(B), &m);
            }
            if !moved {
                return log;
            }
        }
        panic!("MAD storm");
    }

    fn pump(&mut self) -> Vec<(bool, CmMad)> {
        self.pump_with(|_, _| false)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }
}

fn events(m: &mut CmManager) -> Vec<CmEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn params(private: &[u8]) -> SidrParams {
    SidrParams::rdma_cm_udp(
        MadAddr::gsi_v4(B),
        CmaHdr::v4(SocketAddrV4::new(A, 40000), B),
        PORT,
        private.to_vec(),
    )
}

fn sid() -> u64 {
    PortSpace::Udp.service_id(PORT)
}

#[test]
fn sidr_success_with_private_data_both_ways_and_cma_header() {
    let mut n = Net::new();
    n.b.listen(sid()).unwrap();
    let id = n.a.sidr_request(n.now, &params(b"hello udp")).unwrap();
    let log = n.pump();
    assert_eq!(log.len(), 1);
    let CmMad::SidrReq(req) = &log[0].1 else {
        panic!("SIDR_REQ expected")
    };
    assert_eq!(req.request_id, id.0);
    assert_eq!(req.hdr.tid, mad::linux_tid(2, id.0));
    assert_eq!(req.service_id, 0x0000_0000_0111_0000 | PORT as u64);
    let ev = events(&mut n.b);
    let [CmEvent::SidrRequest(info)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(info.service_id, sid());
    assert_eq!(info.request_id, id.0);
    assert_eq!(info.peer, MadAddr::gsi_v4(A));
    assert_eq!(info.pkey, 0xffff);
    let cma = info.cma.expect("rdma_cm header");
    assert_eq!(cma.src_ip(), Some(A.into()));
    assert_eq!(cma.dst_ip(), Some(B.into()));
    assert_eq!(&info.private_data[..9], b"hello udp");
    assert!(info.private_data[9..].iter().all(|&b| b == 0));

    n.b.sidr_reply(
        n.now,
        info.id,
        SidrStatus::Ok,
        0x1234,
        RDMA_UDP_QKEY,
        b"welcome",
    )
    .unwrap();
    let log = n.pump();
    let CmMad::SidrRep(rep) = &log[0].1 else {
        panic!("SIDR_REP expected")
    };
    assert_eq!(rep.hdr.tid, req.hdr.tid, "TID echoed");
    assert_eq!(rep.service_id, sid());
    let ev = events(&mut n.a);
    let [CmEvent::SidrReply {
        id: rid,
        status,
        qpn,
        qkey,
        private_data,
    }] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(*rid, id);
    assert_eq!(*status, SidrStatus::Ok);
    assert_eq!(*qpn, 0x1234);
    assert_eq!(*qkey, RDMA_UDP_QKEY);
    assert_eq!(&private_data[..7], b"welcome");
    // Finished: no retries, nothing pending on A.
    assert_eq!(n.a.poll_timeout(), None);
    n.advance(Duration::from_secs(100));
    assert!(n.pump().is_empty());
    assert!(events(&mut n.a).is_empty());
    // Answering twice is refused.
    assert!(n
        .b
        .sidr_reply(n.now, info.id, SidrStatus::Ok, 1, 1, &[])
        .is_err());
}

#[test]
fn unlistened_service_id_gets_unsupported() {
    let mut n = Net::new();
    let id = n.a.sidr_request(n.now, &params(&[])).unwrap();
    let log = n.pump();
    assert_eq!(log.len(), 2);
    let CmMad::SidrRep(rep) = &log[1].1 else {
        panic!()
    };
    assert_eq!(rep.status, status::UNSUPPORTED);
    assert!(events(&mut n.b).is_empty());
    let ev = events(&mut n.a);
    assert!(matches!(
        &ev[..],
        [CmEvent::SidrReply { id: r, status: SidrStatus::Unsupported, .. }] if *r == id
    ));
}

#[test]
fn lost_sidr_req_is_retransmitted_and_answered() {
    let mut n = Net::new();
    n.b.listen(sid()).unwrap();
    let p = params(&[]);
    let id = n.a.sidr_request(n.now, &p).unwrap();
    let log = n.pump_with(|from_a, _| from_a);
    assert!(log.is_empty());
    assert_eq!(n.a.poll_timeout(), Some(n.now + p.timeout));
    n.advance(p.timeout);
    let log = n.pump();
    assert_eq!(log.len(), 1);
    let [CmEvent::SidrRequest(info)] = &events(&mut n.b)[..] else {
        panic!()
    };
    n.b.sidr_reply(n.now, info.id, SidrStatus::Ok, 77, RDMA_UDP_QKEY, &[])
        .unwrap();
    n.pump();
    let ev = events(&mut n.a);
    assert!(matches!(&ev[..], [CmEvent::SidrReply { id: r, qpn: 77, .. }] if *r == id));
}

#[test]
fn all_retries_lost_is_sidr_timeout() {
    let mut n = Net::new();
    let mut p = params(&[]);
    p.max_retries = 3;
    let start = n.now;
    let id = n.a.sidr_request(n.now, &p).unwrap();
    let mut sent = 0;
    let mut count = |n: &mut Net| {
        n.pump_with(|from_a, _| {
            if from_a {
                sent += 1;
            }
            true
        });
    };
    count(&mut n);
    while let Some(t) = n.a.poll_timeout() {
        n.advance(t - n.now);
        count(&mut n);
    }
    assert_eq!(sent, 4, "first send and 3 retries");
    assert_eq!(n.now - start, p.timeout * 4);
    assert_eq!(events(&mut n.a), vec![CmEvent::SidrTimeout { id }]);
}

#[test]
fn duplicate_sidr_req_is_ignored_then_answered_with_the_same_reply() {
    let mut n = Net::new();
    n.b.listen(sid()).unwrap();
    let mut raw = None;
    n.a.sidr_request(n.now, &params(b"x")).unwrap();
    // Keep the SIDR_REQ bytes to replay them.
    let (_, m) = n.a.poll_transmit().unwrap();
    raw.replace(m);
    let raw = raw.unwrap();
    n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &raw);
    let [CmEvent::SidrRequest(info)] = &events(&mut n.b)[..] else {
        panic!()
    };
    // Duplicate while the consumer decides: nothing.
    n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &raw);
    assert!(n.b.poll_transmit().is_none());
    assert!(events(&mut n.b).is_empty());
    n.b.sidr_reply(n.now, info.id, SidrStatus::Reject, 5, 6, b"no")
        .unwrap();
    let (_, first) = n.b.poll_transmit().unwrap();
    let rep = SidrReply::parse(&first).unwrap();
    assert_eq!(rep.status, status::REJECT);
    assert_eq!((rep.qpn, rep.qkey), (0, 0), "no QPN/Q_Key unless status OK");
    n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &raw);
    let (_, again) = n.b.poll_transmit().unwrap();
    assert_eq!(first, again);
    assert!(events(&mut n.b).is_empty());
    // After the linger time the reply is forgotten: a late duplicate is a new request.
    n.advance(SIDR_REPLY_LINGER);
    n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &raw);
    assert!(n.b.poll_transmit().is_none());
    assert!(matches!(&events(&mut n.b)[..], [CmEvent::SidrRequest(_)]));
}

#[test]
fn unmatched_and_duplicate_sidr_rep_are_dropped() {
    let mut n = Net::new();
    n.b.listen(sid()).unwrap();
    n.a.sidr_request(n.now, &params(&[])).unwrap();
    n.pump();
    let [CmEvent::SidrRequest(info)] = &events(&mut n.b)[..] else {
        panic!()
    };
    n.b.sidr_reply(n.now, info.id, SidrStatus::Ok, 9, RDMA_UDP_QKEY, &[])
        .unwrap();
    let (_, rep) = n.b.poll_transmit().unwrap();
    n.a.handle_mad(n.now, MadAddr::gsi_v4(B), &rep);
    assert_eq!(events(&mut n.a).len(), 1);
    let before = n.a.dropped;
    n.a.handle_mad(n.now, MadAddr::gsi_v4(B), &rep);
    assert_eq!(n.a.dropped, before + 1);
    // Same request ID, wrong TID.
    let mut r = SidrReply::parse(&rep).unwrap();
    r.hdr.tid ^= 1;
    let mut b = [0u8; MAD_LEN];
    r.emit(&mut b);
    n.a.handle_mad(n.now, MadAddr::gsi_v4(B), &b);
    assert_eq!(n.a.dropped, before + 2);
    assert!(events(&mut n.a).is_empty());
}

#[test]
fn oversized_private_data_is_an_error_at_the_call() {
    let mut n = Net::new();
    let p = params(&[0u8; 216 - 36 + 1]);
    assert!(matches!(
        n.a.sidr_request(n.now, &p),
        Err(CmError::PrivateDataTooLong { len: 181, max: 180 })
    ));
    let mut p = params(&[0u8; 216]);
    p.cma = None;
    assert!(n.a.sidr_request(n.now, &p).is_ok());
    n.a.poll_transmit();
    p.private_data.push(0);
    assert!(n.a.sidr_request(n.now, &p).is_err());
    n.b.listen(sid()).unwrap();
    n.a.sidr_request(n.now, &params(&[0u8; 180])).unwrap();
    n.pump();
    let [CmEvent::SidrRequest(info)] = &events(&mut n.b)[..] else {
        panic!()
    };
    assert!(matches!(
        n.b.sidr_reply(n.now, info.id, SidrStatus::Ok, 1, 1, &[0u8; 137]),
        Err(CmError::PrivateDataTooLong { len: 137, max: 136 })
    ));
    assert!(n
        .b
        .sidr_reply(n.now, info.id, SidrStatus::Ok, 1, 1, &[0u8; 136])
        .is_ok());
    assert_eq!(
        n.b.sidr_reply(n.now, CmId(12345), SidrStatus::Ok, 1, 1, &[]),
        Err(CmError::UnknownId)
    );
}

#[test]
fn garbage_sidr_mads_never_panic() {
    let mut n = Net::new();
    n.b.listen(sid()).unwrap();
    n.a.sidr_request(n.now, &params(&[])).unwrap();
    let (_, req) = n.a.poll_transmit().unwrap();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..3000 {
        let mut m = req;
        if round % 2 == 1 {
            m[16..18].copy_from_slice(&attr::SIDR_REP.to_be_bytes());
        }
        for _ in 0..(1 + rnd() % 8) {
            let at = (rnd() % MAD_LEN as u64) as usize;
            m[at] = rnd() as u8;
        }
        let len = if round % 97 == 0 {
            (rnd() % 300) as usize
        } else {
            MAD_LEN
        };
        let mut v = m.to_vec();
        v.resize(len, 0);
        n.a.handle_mad(n.now, MadAddr::gsi_v4(B), &v);
        n.b.handle_mad(n.now, MadAddr::gsi_v4(A), &v);
        while n.a.poll_transmit().is_some() {}
        while n.b.poll_transmit().is_some() {}
        while let Some(e) = n.b.poll_event() {
            if let CmEvent::SidrRequest(i) = e {
                n.b.sidr_reply(n.now, i.id, SidrStatus::Ok, 1, 1, &[])
                    .unwrap();
            }
        }
        while n.a.poll_event().is_some() {}
    }
    assert!(n.a.dropped > 0 && n.b.dropped > 0);
}
