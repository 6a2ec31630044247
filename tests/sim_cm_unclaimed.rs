//! The sans-IO CM's REQs that arrive before anybody listens (`cm/manager/unclaimed.rs`): they
//! wait for a listener, are handed over when another process listens, and are rejected with
//! reason 8 when the wait is over; repeats and floods cost nothing.

use softrdma::cm::manager::*;
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::*;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const PORT: u16 = 7174;
const WAIT: Duration = Duration::from_millis(250);

fn mgr(ip: Ipv4Addr, seed: u64) -> CmManager {
    CmManager::new(CmConfig {
        local_gid: ipv4_to_gid(ip),
        local_ca_guid: 0x5054_00ff_fe00_0000 | ip.octets()[3] as u64,
        hi_tid: 2,
        seed,
    })
}

fn params() -> ConnectParams {
    ConnectParams::rdma_cm_tcp(
        SocketAddrV4::new(A, 0xace3),
        SocketAddrV4::new(B, PORT),
        0x11,
        0x22c97c,
    )
}

fn sid() -> u64 {
    PortSpace::Tcp.service_id(PORT)
}

/// A connects; B (waiting `WAIT` for listeners) gets the REQ. Returns A, B and the REQ.
fn req_sent(now: Instant) -> (CmManager, CmManager, [u8; 256]) {
    let mut a = mgr(A, 1);
    let mut b = mgr(B, 2);
    b.set_unclaimed_wait(WAIT);
    a.connect(now, &params()).unwrap();
    let (_, req) = a.poll_transmit().expect("REQ");
    b.handle_mad(now, MadAddr::gsi_v4(A), &req);
    (a, b, req)
}

fn rej_reason(m: &[u8; 256]) -> Option<RejReason> {
    match CmMad::parse(m).ok()? {
        CmMad::Rej(r) => Some(r.reason),
        _ => None,
    }
}

#[test]
fn a_req_waits_for_a_listener_and_is_delivered_when_one_comes() {
    let t0 = Instant::now();
    let (_a, mut b, _) = req_sent(t0);
    assert!(b.poll_transmit().is_none(), "no REJ at once");
    assert!(b.poll_event().is_none());
    assert_eq!(b.unclaimed_len(), 1);
    assert_eq!(b.poll_timeout(), Some(t0 + WAIT));
    let t1 = t0 + Duration::from_millis(40);
    b.listen(sid()).unwrap();
    // Deliverable now.
    assert!(b.poll_timeout().is_some_and(|t| t <= t1));
    b.handle_timeout(t1);
    assert!(matches!(b.poll_event(), Some(CmEvent::ConnectRequest(_))));
    assert_eq!(b.unclaimed_len(), 0);
    assert!(b.poll_transmit().is_none(), "no REJ");
}

#[test]
fn a_req_nobody_listens_for_is_rejected_after_the_wait() {
    let t0 = Instant::now();
    let (mut a, mut b, req) = req_sent(t0);
    // A repeat of the same REQ is not kept twice.
    b.handle_mad(t0 + Duration::from_millis(1), MadAddr::gsi_v4(A), &req);
    assert_eq!(b.unclaimed_len(), 1);
    b.handle_timeout(t0 + WAIT - Duration::from_millis(1));
    assert!(b.poll_transmit().is_none(), "not before the wait is over");
    b.handle_timeout(t0 + WAIT);
    let (to, rej) = b.poll_transmit().expect("REJ");
    assert_eq!(to, MadAddr::gsi_v4(A));
    assert_eq!(rej_reason(&rej), Some(RejReason::InvalidServiceId));
    assert!(b.poll_transmit().is_none(), "one REJ");
    assert_eq!((b.unclaimed_len(), b.stats.unclaimed_rejected), (0, 1));
    a.handle_mad(t0 + WAIT, MadAddr::gsi_v4(B), &rej);
    assert!(matches!(
        a.poll_event(),
        Some(CmEvent::Rejected {
            reason: RejReason::InvalidServiceId,
            ..
        })
    ));
}

#[test]
fn without_a_wait_the_req_is_rejected_at_once_as_linux_does() {
    let now = Instant::now();
    let mut a = mgr(A, 1);
    let mut b = mgr(B, 2);
    a.connect(now, &params()).unwrap();
    let (_, req) = a.poll_transmit().unwrap();
    b.handle_mad(now, MadAddr::gsi_v4(A), &req);
    let (_, rej) = b.poll_transmit().expect("REJ at once");
    assert_eq!(rej_reason(&rej), Some(RejReason::InvalidServiceId));
    assert_eq!(b.unclaimed_len(), 0);
}

#[test]
fn a_flood_of_reqs_to_closed_ports_is_capped() {
    let now = Instant::now();
    let mut b = mgr(B, 2);
    b.set_unclaimed_wait(WAIT);
    let mut a = mgr(A, 1);
    for _ in 0..MAX_UNCLAIMED + 10 {
        a.connect(now, &params()).unwrap();
    }
    let mut rejected_at_once = 0;
    while let Some((_, req)) = a.poll_transmit() {
        b.handle_mad(now, MadAddr::gsi_v4(A), &req);
        while let Some((_, m)) = b.poll_transmit() {
            assert_eq!(rej_reason(&m), Some(RejReason::InvalidServiceId));
            rejected_at_once += 1;
        }
    }
    assert_eq!(b.unclaimed_len(), MAX_UNCLAIMED);
    assert_eq!(rejected_at_once, 10);
}

#[test]
fn a_waiting_req_is_handed_over_once_and_never_handed_on() {
    let t0 = Instant::now();
    let (_a, mut b, _) = req_sent(t0);
    // Nobody elsewhere yet: asked, kept.
    let mut asked = 0;
    let out = b.forward_unclaimed(t0, |s, _| {
        asked += 1;
        assert_eq!(s, sid());
        None::<u32>
    });
    assert!(out.is_empty());
    assert_eq!(asked, 1);
    // Not asked again before UNCLAIMED_RECHECK.
    assert!(b.forward_unclaimed(t0, |_, _| Some(0u32)).is_empty());
    assert_eq!(b.unclaimed_check_at(), Some(t0 + UNCLAIMED_RECHECK));
    let t1 = t0 + UNCLAIMED_RECHECK;
    let out = b.forward_unclaimed(t1, |_, _| Some(7u32));
    assert_eq!(out.len(), 1);
    let (target, src, mad) = out[0];
    assert_eq!((target, src), (7, MadAddr::gsi_v4(A)));
    assert_eq!((b.unclaimed_len(), b.stats.unclaimed_forwarded), (0, 1));
    // The process it went to: nobody listens there either (it stopped): it waits there, is
    // never handed on again, and is rejected in the end.
    let mut c = mgr(B, 3);
    c.set_unclaimed_wait(WAIT);
    c.handle_forwarded_mad(t1, src, &mad);
    assert_eq!(c.unclaimed_len(), 1);
    assert_eq!(c.unclaimed_check_at(), None);
    assert!(c.forward_unclaimed(t1 + WAIT, |_, _| Some(1u32)).is_empty());
    c.handle_timeout(t1 + WAIT);
    let (_, rej) = c.poll_transmit().expect("REJ");
    assert_eq!(rej_reason(&rej), Some(RejReason::InvalidServiceId));
}

/// The active side waits too, for a peer that rejects at once (Linux): a REJ "invalid Service
/// ID" within the wait sends the REQ again shortly, and the connection is made once the peer
/// listens; after the wait the REJ ends the attempt.
#[test]
fn the_active_side_asks_again_a_peer_that_rejects_at_once() {
    let t0 = Instant::now();
    let mut a = mgr(A, 1);
    a.set_unclaimed_wait(WAIT);
    let mut b = mgr(B, 2); // rejects at once, as Linux
    let ida = a.connect(t0, &params()).unwrap();
    let (_, req) = a.poll_transmit().unwrap();
    b.handle_mad(t0, MadAddr::gsi_v4(A), &req);
    let (_, rej) = b.poll_transmit().expect("REJ at once");
    a.handle_mad(t0, MadAddr::gsi_v4(B), &rej);
    assert!(a.poll_event().is_none(), "not REJECTED within the wait");
    assert_eq!(a.stats.req_resent_after_rej, 1);
    assert_eq!(a.poll_timeout(), Some(t0 + UNCLAIMED_REQ_RESEND));
    // B listens now; A's REQ goes again and the connection is made.
    b.listen(sid()).unwrap();
    let t1 = t0 + UNCLAIMED_REQ_RESEND;
    a.handle_timeout(t1);
    let (_, again) = a.poll_transmit().expect("the REQ again");
    assert_eq!(again, req);
    b.handle_mad(t1, MadAddr::gsi_v4(A), &again);
    let Some(CmEvent::ConnectRequest(info)) = b.poll_event() else {
        panic!("B gets the request")
    };
    b.accept(t1, info.id, &AcceptParams::new(0x12, 0x2a3e9b))
        .unwrap();
    let (_, rep) = b.poll_transmit().expect("REP");
    a.handle_mad(t1, MadAddr::gsi_v4(B), &rep);
    assert!(matches!(a.poll_event(), Some(CmEvent::Established { id, .. }) if id == ida));
}

#[test]
fn the_active_side_reports_rejected_after_the_wait() {
    let t0 = Instant::now();
    let mut a = mgr(A, 1);
    a.set_unclaimed_wait(WAIT);
    let mut b = mgr(B, 2);
    a.connect(t0, &params()).unwrap();
    let mut now = t0;
    let mut rejected = None;
    for _ in 0..100 {
        while let Some((_, m)) = a.poll_transmit() {
            b.handle_mad(now, MadAddr::gsi_v4(A), &m);
        }
        while let Some((_, m)) = b.poll_transmit() {
            a.handle_mad(now, MadAddr::gsi_v4(B), &m);
        }
        if let Some(ev) = a.poll_event() {
            rejected = Some((ev, now));
            break;
        }
        now = a.poll_timeout().expect("a REQ resend pending");
        a.handle_timeout(now);
    }
    let (ev, at) = rejected.expect("REJECTED in the end");
    assert!(matches!(
        ev,
        CmEvent::Rejected {
            reason: RejReason::InvalidServiceId,
            ..
        }
    ));
    assert_eq!(at, t0 + WAIT, "the last REQ goes when the wait ends");
    // Again at 10, 20, 40, 80, 160 ms and when the wait ends: 7 REQs in all, within a
    // peer's REJ rate limit (10 at once).
    assert_eq!(a.stats.req_resent_after_rej, 6);
}
