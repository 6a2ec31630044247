//! The sans-IO CM under hostile traffic (issue 7): SIDR_REQ floods, REQs with maximal timer
//! fields, REQ floods at a port nobody listens on. Everything runs on a fake clock, so nothing
//! here depends on the machine's speed.

use softrdma::cm::mad::{attr, MadHdr, MAD_LEN};
use softrdma::cm::manager::*;
use softrdma::cm::ratelimit::*;
use softrdma::cm::req::transport;
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::sidr::status;
use softrdma::cm::sidr_manager::*;
use softrdma::cm::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const LEGIT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 7174;
/// A plain IB Service ID (no rdma_cm header expected).
const IB_SID: u64 = 0x0000_0000_1234_5678;

fn mgr(ip: Ipv4Addr, seed: u64) -> CmManager {
    CmManager::new(CmConfig {
        local_gid: ipv4_to_gid(ip),
        local_ca_guid: 0x5054_00ff_fe00_0000 | ip.octets()[3] as u64,
        hi_tid: 2,
        seed,
    })
}

fn events(m: &mut CmManager) -> Vec<CmEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn drain(m: &mut CmManager) -> Vec<(MadAddr, CmMad)> {
    std::iter::from_fn(|| m.poll_transmit())
        .map(|(d, b)| (d, CmMad::parse(&b).unwrap()))
        .collect()
}

/// The `i`-th forged source: 11.x.y.z, GSI QP.
fn forged_src(i: u32) -> MadAddr {
    let o = i.to_be_bytes();
    MadAddr::gsi_v4(Ipv4Addr::new(11, o[1], o[2], o[3]))
}

fn sidr_req(request_id: u32, service_id: u64) -> [u8; MAD_LEN] {
    let m = SidrRequest {
        hdr: MadHdr::cm(attr::SIDR_REQ, 0x77_0000_0000 | request_id as u64),
        request_id,
        pkey: 0xffff,
        service_id,
        ..Default::default()
    };
    let mut b = [0u8; MAD_LEN];
    m.emit(&mut b);
    b
}

/// What rdma_cm's UDP port space sends (no rdma_cm header: the CM does not need one).
fn udp_sid() -> u64 {
    PortSpace::Udp.service_id(PORT)
}

/// A legitimate requester's SIDR_REQ from `a` to `b`, delivered; returns its id.
fn legit_sidr(now: Instant, a: &mut CmManager, b: &mut CmManager) -> CmId {
    let p = SidrParams {
        service_id: udp_sid(),
        remote: MadAddr::gsi_v4(B),
        cma: None,
        private_data: b"legit".to_vec(),
        timeout: iba_time(20),
        max_retries: 15,
    };
    let id = a.sidr_request(now, &p).unwrap();
    deliver(now, a, LEGIT, b);
    id
}

/// Move what `from` (at `from_ip`) queued to `to`.
fn deliver(now: Instant, from: &mut CmManager, from_ip: Ipv4Addr, to: &mut CmManager) {
    while let Some((_, m)) = from.poll_transmit() {
        to.handle_mad(now, MadAddr::gsi_v4(from_ip), &m);
    }
}

/// Answer B's SIDR_REPs to the legitimate requester, drop those to forged sources; returns how
/// many went to forged sources.
fn route_b(now: Instant, b: &mut CmManager, a: &mut CmManager) -> usize {
    let mut forged = 0;
    while let Some((d, m)) = b.poll_transmit() {
        if d == MadAddr::gsi_v4(LEGIT) {
            a.handle_mad(now, MadAddr::gsi_v4(B), &m);
        } else {
            forged += 1;
        }
    }
    forged
}

#[test]
fn sidr_flood_stays_within_the_backlog_expires_and_a_legit_request_is_served_after() {
    const BACKLOG: usize = 64;
    const FLOOD: u32 = 100_000;
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    let mut a = mgr(LEGIT, 1);
    b.listen_with_backlog(udp_sid(), BACKLOG).unwrap();
    // 100,000 distinct forged requests over 10 s (one per 100 µs); the consumer never answers.
    let mut now = t0;
    let mut reported = 0usize;
    let mut reps_to_forged = 0usize;
    for i in 0..FLOOD {
        now = t0 + Duration::from_micros(100 * i as u64);
        b.handle_timeout(now);
        b.handle_mad(now, forged_src(i), &sidr_req(i ^ 0x5a5a_0000, udp_sid()));
        assert!(b.sidr_pending_len() <= BACKLOG);
        if i % 1000 == 0 {
            reported += events(&mut b)
                .iter()
                .filter(|e| matches!(e, CmEvent::SidrRequest(_)))
                .count();
            reps_to_forged += route_b(now, &mut b, &mut a);
        }
    }
    reported += events(&mut b)
        .iter()
        .filter(|e| matches!(e, CmEvent::SidrRequest(_)))
        .count();
    reps_to_forged += route_b(now, &mut b, &mut a);
    let flood_end = now;
    // Only the backlog's worth was ever reported per lifetime (10 s < 16 s: exactly one).
    assert_eq!(reported, BACKLOG);
    assert_eq!(b.sidr_pending_len(), BACKLOG);
    assert_eq!(b.stats.sidr_over_backlog, (FLOOD as usize - BACKLOG) as u64);
    // The SIDR_REP "reject"s to forged sources obey the global rate limit.
    let budget = REFUSAL_BURST_GLOBAL as usize + REFUSAL_RATE_GLOBAL as usize * 10;
    assert!(reps_to_forged <= budget, "{reps_to_forged} > {budget}");
    assert_eq!(
        reps_to_forged as u64 + b.stats.answers_suppressed,
        FLOOD as u64 - BACKLOG as u64
    );
    assert!(b.rate_limited_dests() <= REFUSAL_DESTS_MAX);

    // While the backlog is full of requests the consumer ignores, a legitimate one is refused
    // (SIDR_REP reject) once the rate limit has room again (during the flood itself the
    // global budget is spent and the requester is left to its retries).
    let t = flood_end + Duration::from_secs(2);
    b.handle_timeout(t);
    let id = legit_sidr(t, &mut a, &mut b);
    assert!(events(&mut b).is_empty());
    route_b(t, &mut b, &mut a);
    assert!(matches!(
        &events(&mut a)[..],
        [CmEvent::SidrReply { id: r, status: SidrStatus::Reject, .. }] if *r == id
    ));
    // SIDR_REQUEST_LIFETIME after the flood every forged entry is gone, with an event each.
    let t_exp = flood_end + SIDR_REQUEST_LIFETIME;
    b.handle_timeout(t_exp);
    assert_eq!(b.sidr_pending_len(), 0);
    assert_eq!(b.poll_timeout(), None, "nothing left to time out");
    let expired = events(&mut b)
        .iter()
        .filter(|e| matches!(e, CmEvent::SidrRequestExpired { .. }))
        .count();
    assert_eq!(expired, BACKLOG);
    assert_eq!(b.stats.sidr_expired, BACKLOG as u64);

    // Afterwards a legitimate request is reported and served at once.
    let now = t_exp;
    let id = legit_sidr(now, &mut a, &mut b);
    let ev = events(&mut b);
    let [CmEvent::SidrRequest(info)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(info.private_data[..5], *b"legit");
    b.sidr_reply(now, info.id, SidrStatus::Ok, 0x42, RDMA_UDP_QKEY, &[])
        .unwrap();
    route_b(now, &mut b, &mut a);
    assert!(matches!(
        &events(&mut a)[..],
        [CmEvent::SidrReply { id: r, status: SidrStatus::Ok, qpn: 0x42, .. }] if *r == id
    ));
}

#[test]
fn legit_sidr_request_is_served_during_a_flood_the_consumer_keeps_up_with() {
    // The consumer answers (rejects) what it is shown every 20 forged requests, faster than the
    // flood fills its backlog of 32; the legitimate requester (trying again whenever it is
    // refused) gets through while the flood still runs. Every answer lingers, so the linger
    // list fills up and stays bounded.
    const BACKLOG: usize = 32;
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    let mut a = mgr(LEGIT, 1);
    b.listen_with_backlog(udp_sid(), BACKLOG).unwrap();
    let mut served_at = None;
    let mut attempts = 0;
    let mut legit: Option<CmId> = None;
    for i in 0..100_000u32 {
        let now = t0 + Duration::from_micros(100 * i as u64);
        a.handle_timeout(now);
        b.handle_timeout(now);
        b.handle_mad(now, forged_src(i), &sidr_req(i, udp_sid()));
        assert!(b.sidr_pending_len() <= BACKLOG);
        if i % 500 == 250 && served_at.is_none() {
            if legit.is_none() {
                attempts += 1;
                legit = Some(legit_sidr(now, &mut a, &mut b));
            }
            deliver(now, &mut a, LEGIT, &mut b);
        }
        if i % 20 == 19 {
            for e in events(&mut b) {
                match e {
                    CmEvent::SidrRequest(r) if r.peer == MadAddr::gsi_v4(LEGIT) => {
                        b.sidr_reply(now, r.id, SidrStatus::Ok, 0x42, RDMA_UDP_QKEY, &[])
                            .unwrap();
                    }
                    CmEvent::SidrRequest(r) => {
                        b.sidr_reply(now, r.id, SidrStatus::Reject, 0, 0, &[])
                            .unwrap();
                    }
                    _ => {}
                }
            }
            assert!(b.sidr_lingering_len() <= SIDR_LINGER_MAX);
            route_b(now, &mut b, &mut a);
            for e in events(&mut a) {
                match e {
                    CmEvent::SidrReply {
                        status: SidrStatus::Ok,
                        ..
                    } => served_at = Some(i),
                    CmEvent::SidrReply { .. } | CmEvent::SidrTimeout { .. } => legit = None,
                    _ => {}
                }
            }
        }
    }
    let at = served_at.expect("the legitimate requester was served during the flood");
    assert!(at < 99_000, "served at {at} after {attempts} attempts");
    assert!(b.sidr_lingering_len() <= SIDR_LINGER_MAX);
    assert!(b.stats.sidr_linger_evicted > 0, "the linger list filled up");
}

#[test]
fn sidr_duplicates_are_found_and_an_expired_request_cannot_be_answered() {
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    b.listen_with_backlog(udp_sid(), 8).unwrap();
    // Many requests from one forged peer with distinct request IDs, then each again.
    for i in 0..8u32 {
        b.handle_mad(t0, forged_src(1), &sidr_req(i, udp_sid()));
    }
    let ids: Vec<CmId> = events(&mut b)
        .into_iter()
        .map(|e| match e {
            CmEvent::SidrRequest(r) => r.id,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 8);
    for i in 0..8u32 {
        b.handle_mad(t0, forged_src(1), &sidr_req(i, udp_sid()));
    }
    assert_eq!(b.stats.sidr_duplicates, 8);
    assert!(
        events(&mut b).is_empty(),
        "duplicates are not reported again"
    );
    assert!(drain(&mut b).is_empty(), "nothing answered yet");
    // Answer the first: its duplicates get the same SIDR_REP again.
    b.sidr_reply(t0, ids[0], SidrStatus::Ok, 7, RDMA_UDP_QKEY, &[])
        .unwrap();
    assert_eq!(drain(&mut b).len(), 1);
    b.handle_mad(t0, forged_src(1), &sidr_req(0, udp_sid()));
    let again = drain(&mut b);
    assert!(matches!(&again[..], [(_, CmMad::SidrRep(r))] if r.qpn == 7));
    // The others expire; answering one later fails cleanly.
    let later = t0 + SIDR_REQUEST_LIFETIME;
    b.handle_timeout(later);
    assert_eq!(b.sidr_pending_len(), 0);
    assert_eq!(
        b.sidr_reply(later, ids[1], SidrStatus::Ok, 7, RDMA_UDP_QKEY, &[]),
        Err(CmError::UnknownId)
    );
    // A request from another peer with the same request ID is not a duplicate.
    b.handle_mad(later, forged_src(2), &sidr_req(1, udp_sid()));
    assert!(matches!(&events(&mut b)[..], [.., CmEvent::SidrRequest(_)]));
}

/// A forged REQ from `src` with the given timer fields.
fn forged_req(src_comm_id: u32, cm_timeout: u8, retries: u8, ack: u8, sid: u64) -> [u8; MAD_LEN] {
    let m = ConnectRequest {
        hdr: MadHdr::cm(attr::REQ, 0x99_0000_0000 | src_comm_id as u64),
        local_comm_id: src_comm_id,
        service_id: sid,
        local_ca_guid: 0xbad0_0000 | src_comm_id as u64,
        local_qpn: 0x1234,
        transport_service_type: transport::RC,
        remote_cm_response_timeout: cm_timeout,
        local_cm_response_timeout: cm_timeout,
        max_cm_retries: retries,
        path_mtu: 3,
        primary_path: PathInfo {
            local_ack_timeout: ack,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut b = [0u8; MAD_LEN];
    m.emit(&mut b);
    b
}

/// A forged REQ is accepted at once (as `rping -P` does) and its REP never answered (a stream
/// of forged MRAs, if `mras`). Returns (REPs sent, how long the connection was held).
fn unanswered_rep(cm_timeout: u8, retries: u8, mras: bool) -> (usize, Duration) {
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    b.listen(IB_SID).unwrap();
    let src = forged_src(9);
    b.handle_mad(
        t0,
        src,
        &forged_req(0x4242, cm_timeout, retries, 31, IB_SID),
    );
    let ev = events(&mut b);
    let [CmEvent::ConnectRequest(r)] = &ev[..] else {
        panic!("{ev:?}")
    };
    let id = r.id;
    b.accept(t0, id, &AcceptParams::new(0x99, 1)).unwrap();
    let mut now = t0;
    let mut reps = 0;
    loop {
        for (_, m) in drain(&mut b) {
            assert!(matches!(m, CmMad::Rep(_)));
            reps += 1;
        }
        if mras {
            // The peer keeps asking for the longest service timeout there is.
            let m = MessageReceiptAck {
                hdr: MadHdr::cm(attr::MRA, 0x99_0000_4242),
                local_comm_id: 0x4242,
                remote_comm_id: id.0,
                message_mraed: mra::mraed::REP,
                service_timeout: 31,
                ..Default::default()
            };
            let mut buf = [0u8; MAD_LEN];
            m.emit(&mut buf);
            b.handle_mad(now, src, &buf);
        }
        let ev = events(&mut b);
        if !ev.is_empty() {
            assert_eq!(ev, vec![CmEvent::Unreachable { id }]);
            break;
        }
        // Step in at most 1 s so the MRAs keep coming.
        let next = b
            .poll_timeout()
            .expect("a timer is armed while the REP is out");
        now = next.min(now + Duration::from_secs(1));
        b.handle_timeout(now);
        assert!(now - t0 <= PEER_HOLD_MAX, "held past PEER_HOLD_MAX");
    }
    assert_eq!(b.len(), 0, "all state released");
    assert_eq!(b.poll_timeout(), None);
    (reps, now - t0)
}

#[test]
fn a_forged_req_with_maximal_timers_is_released_within_the_bound() {
    // cm response timeout 31 (2.3 h per REP in Linux), 15 retries, ACK timeout 31.
    let (reps, held) = unanswered_rep(31, 15, false);
    let (_, retries) = peer_rep_timers(31, 15);
    assert_eq!(reps, 1 + retries as usize);
    assert!(reps <= 16);
    assert!(held <= PEER_HOLD_MAX);
    // The REP waits at most PEER_CM_RESPONSE_TIMEOUT_MAX between sends.
    assert_eq!(held, iba_time(PEER_CM_RESPONSE_TIMEOUT_MAX) * reps as u32);
}

#[test]
fn a_forged_req_with_default_fields_is_released_within_the_bound() {
    // rdma_cm's own values (20, 15): Linux holds the REP for 16 × 4.1 s = 66 s.
    let (reps, held) = unanswered_rep(20, 15, false);
    assert_eq!(reps, 7);
    assert_eq!(held, iba_time(20) * 7);
    assert!(held <= PEER_HOLD_MAX);
}

#[test]
fn forged_mras_cannot_extend_the_hold() {
    let (reps, held) = unanswered_rep(20, 15, true);
    assert!(reps >= 1);
    assert!(held <= PEER_HOLD_MAX, "{held:?}");
}

#[test]
fn timewait_from_a_forged_req_is_clamped() {
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    b.listen(IB_SID).unwrap();
    let src = forged_src(3);
    b.handle_mad(t0, src, &forged_req(0x77, 20, 15, 31, IB_SID));
    let ev = events(&mut b);
    let [CmEvent::ConnectRequest(r)] = &ev[..] else {
        panic!()
    };
    let id = r.id;
    b.accept(t0, id, &AcceptParams::new(0x99, 1)).unwrap();
    drain(&mut b);
    // The forger completes the handshake, then disconnects.
    let mut buf = [0u8; MAD_LEN];
    ReadyToUse {
        hdr: MadHdr::cm(attr::RTU, 0x99_0000_0077),
        local_comm_id: 0x77,
        remote_comm_id: id.0,
        ..Default::default()
    }
    .emit(&mut buf);
    b.handle_mad(t0, src, &buf);
    DisconnectRequest {
        hdr: MadHdr::cm(attr::DREQ, 0x99_0000_0078),
        local_comm_id: 0x77,
        remote_comm_id: id.0,
        remote_qpn_eecn: 0x99,
        ..Default::default()
    }
    .emit(&mut buf);
    b.handle_mad(t0, src, &buf);
    events(&mut b);
    b.disconnect(t0, id, &[]).unwrap();
    assert_eq!(b.conn_info(id).unwrap().state, ConnState::TimeWait);
    let until = b.poll_timeout().unwrap();
    assert_eq!(until - t0, iba_time(PEER_ACK_TIMEOUT_MAX));
    b.handle_timeout(until);
    assert_eq!(b.len(), 0);
}

#[test]
fn rej_flood_from_one_source_is_rate_limited() {
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    let src = forged_src(5);
    // 10,000 REQs for a Service ID nobody listens on, all at once.
    for i in 0..10_000u32 {
        b.handle_mad(t0, src, &forged_req(i + 1, 20, 15, 19, IB_SID));
    }
    let rejs = drain(&mut b)
        .iter()
        .filter(|(d, m)| {
            *d == src && matches!(m, CmMad::Rej(r) if r.reason == RejReason::InvalidServiceId)
        })
        .count();
    assert_eq!(rejs, REFUSAL_BURST_PER_DEST as usize);
    assert_eq!(b.stats.rej_suppressed, 10_000 - rejs as u64);
    assert_eq!(b.len(), 0);

    // 10,000 more, one per millisecond over 10 s: the per-source rate.
    let mut b = mgr(B, 2);
    for i in 0..10_000u32 {
        let now = t0 + Duration::from_millis(i as u64);
        b.handle_mad(now, src, &forged_req(i + 1, 20, 15, 19, IB_SID));
    }
    let rejs = drain(&mut b).len();
    let max = REFUSAL_BURST_PER_DEST as usize + REFUSAL_RATE_PER_DEST as usize * 10;
    assert!(rejs <= max, "{rejs} > {max}");
    assert!(rejs >= REFUSAL_RATE_PER_DEST as usize * 9);
    assert_eq!(b.stats.rej_suppressed, 10_000 - rejs as u64);

    // From 10,000 distinct forged sources: the endpoint's rate.
    let mut b = mgr(B, 2);
    for i in 0..10_000u32 {
        b.handle_mad(t0, forged_src(i), &forged_req(i + 1, 20, 15, 19, IB_SID));
    }
    assert_eq!(drain(&mut b).len(), REFUSAL_BURST_GLOBAL as usize);
    assert!(b.rate_limited_dests() <= REFUSAL_DESTS_MAX);
    // A legitimate peer a second later still gets its REJ.
    let later = t0 + Duration::from_secs(1);
    b.handle_mad(
        later,
        MadAddr::gsi_v4(LEGIT),
        &forged_req(0x1_0000, 20, 15, 19, IB_SID),
    );
    let out = drain(&mut b);
    assert!(matches!(&out[..], [(d, CmMad::Rej(_))] if *d == MadAddr::gsi_v4(LEGIT)));
}

#[test]
fn sidr_unsupported_answers_are_rate_limited_too() {
    let t0 = Instant::now();
    let mut b = mgr(B, 2);
    for i in 0..10_000u32 {
        b.handle_mad(t0, forged_src(5), &sidr_req(i, udp_sid()));
    }
    let out = drain(&mut b);
    assert_eq!(out.len(), REFUSAL_BURST_PER_DEST as usize);
    assert!(out
        .iter()
        .all(|(_, m)| matches!(m, CmMad::SidrRep(r) if r.status == status::UNSUPPORTED)));
    assert_eq!(b.stats.answers_suppressed, 10_000 - out.len() as u64);
    assert_eq!(b.sidr_pending_len(), 0);
}

#[test]
fn peer_timer_clamps_are_what_the_docs_say() {
    // 31 → 4.1 s, 6 retries: 7 sends fit in 30 s.
    assert_eq!(peer_rep_timers(31, 15), (iba_time(20), 6));
    assert_eq!(peer_rep_timers(20, 15), (iba_time(20), 6));
    // Short timeouts keep the peer's retry count.
    assert_eq!(peer_rep_timers(16, 15), (iba_time(16), 15));
    assert_eq!(peer_rep_timers(0, 3), (iba_time(0), 3));
    for t in 0..32u8 {
        for r in 0..16u8 {
            let (to, n) = peer_rep_timers(t, r);
            assert!(to * (n as u32 + 1) <= PEER_HOLD_MAX);
        }
    }
}
