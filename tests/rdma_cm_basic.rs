//! rdma_cm over the user-space transport in one process: a listener and a client on the
//! loopback device, through the whole life of a connection.

mod cm_util;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, QpState, SendOp, WcOpcode, WcStatus};
use softrdma::verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
};
use verbs_util::{sge, wait_cq, ALL, WAIT};

const T: Duration = Duration::from_secs(30);

fn any(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
}

fn lo(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), port))
}

struct Res {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn resources(id: &CmId) -> Res {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let attr = |qp_type| QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCaps::default(),
        qp_type,
        sq_sig_all: false,
        srq: None,
    };
    // A TCP-port-space id takes an RC QP only (the CM connects it with RC's attributes).
    for t in [QpType::Uc, QpType::Ud] {
        assert!(id.create_qp(&pd, &attr(t)).is_err(), "{t:?}");
    }
    let qp = id.create_qp(&pd, &attr(QpType::Rc)).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    Res {
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn listener(ch: &EventChannel) -> (CmId, u16) {
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.bind_addr(any(0)).unwrap();
    let port = id.local_addr().unwrap().port();
    assert_ne!(port, 0, "an ephemeral port was picked");
    id.listen(16).unwrap();
    (id, port)
}

/// Client side up to ROUTE_RESOLVED.
fn resolved_client(ch: &EventChannel, port: u16) -> CmId {
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, lo(port), T).unwrap();
    let ev = ch.wait_event(EventType::AddrResolved, T).unwrap();
    assert_eq!(ev.status(), 0);
    assert_eq!(ev.id(), &id);
    ev.ack();
    id.resolve_route(T).unwrap();
    ch.wait_event(EventType::RouteResolved, T).unwrap().ack();
    id
}

#[test]
fn connect_send_disconnect() {
    let sch = EventChannel::new().unwrap();
    let (lid, port) = listener(&sch);

    let client = std::thread::spawn(move || {
        let ch = EventChannel::new().unwrap();
        let id = resolved_client(&ch, port);
        let r = resources(&id);
        r.qp.post_recv(&[softrdma::verbs::RecvWr {
            wr_id: 7,
            sg_list: &[sge(&r.mr, 0, 64)],
        }])
        .unwrap();
        let param = ConnParam {
            private_data: b"hello from the client".to_vec(),
            ..Default::default()
        };
        id.connect(&param).unwrap();
        let ev = ch.wait_event(EventType::Established, T).unwrap();
        assert_eq!(&ev.private_data()[..5], b"howdy");
        ev.ack();
        assert_eq!(r.qp.state().unwrap(), QpState::Rts);
        // The server sends first.
        let wc = wait_cq(&r.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (7, WcStatus::Success, WcOpcode::Recv)
        );
        let mut got = [0u8; 4];
        r.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"ping");
        // Reply, then wait for the server's disconnect.
        r.mr.write(100, b"pong").unwrap();
        r.qp.post_send(&[softrdma::verbs::SendWr {
            wr_id: 8,
            op: SendOp::Send,
            sg_list: &[sge(&r.mr, 100, 4)],
            flags: softrdma::transport::SendFlags::SIGNALED,
        }])
        .unwrap();
        assert_eq!(wait_cq(&r.cq).status, WcStatus::Success);
        let ev = ch.wait_event(EventType::Disconnected, T).unwrap();
        ev.ack();
        assert_eq!(r.qp.state().unwrap(), QpState::Err);
        id.disconnect().unwrap();
        id.destroy();
    });

    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert_eq!(ev.listen_id(), Some(&lid));
    assert_eq!(&ev.private_data()[..21], b"hello from the client");
    let p = ev.conn_param().unwrap().clone();
    assert_eq!((p.responder_resources, p.initiator_depth), (1, 1));
    let cid = ev.id().clone();
    ev.ack();
    assert_eq!(cid.local_addr().unwrap().port(), port);
    assert!(cid.peer_addr().unwrap().ip().is_loopback());
    let r = resources(&cid);
    r.qp.post_recv(&[softrdma::verbs::RecvWr {
        wr_id: 1,
        sg_list: &[sge(&r.mr, 0, 64)],
    }])
    .unwrap();
    cid.accept(&ConnParam {
        private_data: b"howdy".to_vec(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(r.qp.state().unwrap(), QpState::Rts);
    let ev = sch.wait_event(EventType::Established, T).unwrap();
    assert_eq!(ev.id(), &cid);
    ev.ack();
    r.mr.write(200, b"ping").unwrap();
    r.qp.post_send(&[softrdma::verbs::SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &[sge(&r.mr, 200, 4)],
        flags: softrdma::transport::SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut seen_send = false;
    let mut seen_recv = false;
    while !(seen_send && seen_recv) {
        let wc = wait_cq(&r.cq);
        assert_eq!(wc.status, WcStatus::Success);
        match wc.wr_id {
            2 => seen_send = true,
            1 => seen_recv = true,
            x => panic!("unexpected wr_id {x}"),
        }
    }
    let mut got = [0u8; 4];
    r.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"pong");
    cid.disconnect().unwrap();
    let ev = sch.wait_event(EventType::Disconnected, T).unwrap();
    assert_eq!(ev.id(), &cid);
    ev.ack();
    client.join().unwrap();
    let _ = WAIT;
}

#[test]
fn connect_to_port_nobody_listens_on_is_rejected() {
    let ch = EventChannel::new().unwrap();
    // A port bound but not listened on: nobody listens there.
    let other = ch.create_id(PortSpace::Tcp).unwrap();
    other.bind_addr(any(0)).unwrap();
    let port = other.local_addr().unwrap().port();
    let id = resolved_client(&ch, port);
    let _r = resources(&id);
    let t0 = std::time::Instant::now();
    id.connect(&ConnParam::default()).unwrap();
    let ev = ch.wait_event(EventType::Rejected, T).unwrap();
    assert_eq!(ev.status(), 8, "IB reject reason 8: invalid service ID");
    // The REQ waited for a listener first (UNCLAIMED_REQ_WAIT), then was rejected.
    assert!(
        t0.elapsed() >= softrdma::rdma_cm::UNCLAIMED_REQ_WAIT,
        "{:?}",
        t0.elapsed()
    );
}

/// A client's REQ that arrives before the server's rdma_listen (a server that syncs with its
/// client out of band and listens afterwards, as perftest -R does) is delivered once it listens.
#[test]
fn req_that_beats_the_listen_is_accepted_once_the_server_listens() {
    let sch = EventChannel::new().unwrap();
    let lid = sch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(any(0)).unwrap();
    let port = lid.local_addr().unwrap().port();
    let ch = EventChannel::new().unwrap();
    let id = resolved_client(&ch, port);
    let r = resources(&id);
    id.connect(&ConnParam::default()).unwrap();
    // The REQ is on its way (or here) and nobody listens yet.
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        ch.get_cm_event_timeout(Duration::ZERO).is_none(),
        "no answer to the REQ yet"
    );
    lid.listen(4).unwrap();
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    let sid = ev.id().clone();
    ev.ack();
    let s = resources(&sid);
    sid.accept(&ConnParam::default()).unwrap();
    ch.wait_event(EventType::Established, T).unwrap().ack();
    sch.wait_event(EventType::Established, T).unwrap().ack();
    assert_eq!(r.qp.state().unwrap(), QpState::Rts);
    assert_eq!(s.qp.state().unwrap(), QpState::Rts);
}

#[test]
fn consumer_reject_carries_private_data() {
    let sch = EventChannel::new().unwrap();
    let (_lid, port) = listener(&sch);
    let ch = EventChannel::new().unwrap();
    let id = resolved_client(&ch, port);
    let _r = resources(&id);
    id.connect(&ConnParam::default()).unwrap();
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    let too_long = vec![0u8; 149];
    assert_eq!(ev.id().reject(&too_long).unwrap_err().errno(), libc::EINVAL);
    ev.id().reject(b"go away").unwrap();
    drop(ev);
    let ev = ch.wait_event(EventType::Rejected, T).unwrap();
    assert_eq!(ev.status(), 28, "consumer defined");
    assert_eq!(&ev.private_data()[..7], b"go away");
}

#[test]
fn bad_calls_fail_at_the_call() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    // Listen before bind, connect before resolve.
    assert!(id.listen(1).is_err());
    assert!(id.connect(&ConnParam::default()).is_err());
    assert!(id.resolve_route(T).is_err());
    let (lid, port) = listener(&ch);
    // The port is taken.
    let again = ch.create_id(PortSpace::Tcp).unwrap();
    assert_eq!(
        again.bind_addr(any(port)).unwrap_err().errno(),
        libc::EADDRINUSE
    );
    drop(lid);
    let c = resolved_client(&ch, port);
    let _r = resources(&c);
    let long = ConnParam {
        private_data: vec![1; 57],
        ..Default::default()
    };
    assert_eq!(c.connect(&long).unwrap_err().errno(), libc::EINVAL);
    // Non-blocking channel with nothing queued.
    ch.set_nonblocking(true).unwrap();
    assert_eq!(ch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    // The IB port space (AF_IB addressing) is not supported.
    assert_eq!(
        ch.create_id(PortSpace::Ib).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn destroy_waits_for_unacked_events() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, lo(9), T).unwrap();
    let ev = ch.get_cm_event().unwrap();
    assert_eq!(ev.event(), EventType::AddrResolved);
    let (err, id) = id.clone().try_destroy().unwrap_err();
    assert_eq!(err.errno(), libc::EBUSY);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        ev.ack();
    });
    id.destroy();
    t.join().unwrap();
}

#[test]
fn connection_parameters_reach_the_peer_and_both_qps() {
    let sch = EventChannel::new().unwrap();
    let (_lid, port) = listener(&sch);
    let ch = EventChannel::new().unwrap();
    let id = resolved_client(&ch, port);
    let cr = resources(&id);
    id.connect(&ConnParam {
        responder_resources: 3,
        initiator_depth: 2,
        retry_count: 5,
        rnr_retry_count: 6,
        ..Default::default()
    })
    .unwrap();
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    let p = ev.conn_param().unwrap().clone();
    // From the server's side: it should accept 2 READs (the client's initiator depth) and may
    // issue 3 (the client's responder resources).
    assert_eq!((p.responder_resources, p.initiator_depth), (2, 3));
    assert_eq!((p.retry_count, p.rnr_retry_count), (5, 6));
    assert_eq!(p.qp_num, cr.qp.qp_num());
    let sid = ev.id().clone();
    drop(ev);
    let sr = resources(&sid);
    sid.accept(&ConnParam {
        responder_resources: 2,
        initiator_depth: 3,
        rnr_retry_count: 4,
        ..Default::default()
    })
    .unwrap();
    let ev = ch.wait_event(EventType::Established, T).unwrap();
    assert_eq!(ev.conn_param().unwrap().qp_num, sr.qp.qp_num());
    drop(ev);
    sch.wait_event(EventType::Established, T).unwrap();
    let (c, s) = (cr.qp.query().unwrap(), sr.qp.query().unwrap());
    assert_eq!(c.qp_state, Some(QpState::Rts));
    assert_eq!(s.qp_state, Some(QpState::Rts));
    assert_eq!(
        (c.dest_qp_num, s.dest_qp_num),
        (Some(sr.qp.qp_num()), Some(cr.qp.qp_num()))
    );
    // Each side's first send PSN is what the other expects first.
    assert_eq!(c.sq_psn, s.rq_psn);
    assert_eq!(s.sq_psn, c.rq_psn);
    assert_eq!((c.max_rd_atomic, c.max_dest_rd_atomic), (Some(2), Some(3)));
    assert_eq!((s.max_rd_atomic, s.max_dest_rd_atomic), (Some(3), Some(2)));
    // Retries: the client's retry count for both; RNR retry: each side's from the other.
    assert_eq!((c.retry_cnt, s.retry_cnt), (Some(5), Some(5)));
    assert_eq!((c.rnr_retry, s.rnr_retry), (Some(4), Some(6)));
}

#[test]
fn backlog_limits_pending_connect_requests() {
    let sch = EventChannel::new().unwrap();
    let lid = sch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(any(0)).unwrap();
    lid.listen(2).unwrap();
    let port = lid.local_addr().unwrap().port();
    let ch = EventChannel::new().unwrap();
    let ids: Vec<CmId> = (0..4).map(|_| resolved_client(&ch, port)).collect();
    let _qps: Vec<Res> = ids.iter().map(resources).collect();
    for id in &ids {
        id.connect(&ConnParam::default()).unwrap();
    }
    // Two requests wait for the application (unanswered); the other two are refused.
    let mut rejected = 0;
    for _ in 0..2 {
        let ev = ch.wait_event(EventType::Rejected, T).unwrap();
        assert_eq!(ev.status(), 28);
        rejected += 1;
    }
    assert_eq!(rejected, 2);
    let mut pending = Vec::new();
    while let Some(ev) = sch.get_cm_event_timeout(Duration::from_millis(300)) {
        assert_eq!(ev.event(), EventType::ConnectRequest);
        pending.push(ev);
    }
    assert_eq!(pending.len(), 2);
}

/// Only a context on the same address (UDP port 4791 of it, which only this user's contexts
/// hold) may hand over a CM MAD (`driver/forward.rs`): the same envelope from any other port,
/// carrying a valid REQ for a listened port, is dropped.
#[test]
fn a_forged_hand_over_envelope_is_ignored() {
    use softrdma::cm::manager::{CmConfig, CmManager, ConnectParams};
    let sch = EventChannel::new().unwrap();
    let lid = sch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(lo(0)).unwrap();
    let port = lid.local_addr().unwrap().port();
    lid.listen(4).unwrap();
    let ctx = lid.context().expect("bound to the loopback device");
    let before = ctx.stats().unwrap();
    let forger = std::net::UdpSocket::bind((cm_util::loopback(), 0)).unwrap();
    let src = match forger.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let mut cm = CmManager::new(CmConfig {
        local_gid: softrdma::cm::ipv4_to_gid(*src.ip()),
        local_ca_guid: 1,
        hi_tid: 1,
        seed: 1,
    });
    let dst = SocketAddrV4::new(cm_util::loopback(), port);
    cm.connect(
        std::time::Instant::now(),
        &ConnectParams::rdma_cm_tcp(src, dst, 0x11, 1),
    )
    .unwrap();
    let (_, req) = cm.poll_transmit().unwrap();
    let mut env = vec![0xff, b'S', b'R', b'P', 0, 0, 1, 0];
    env.extend_from_slice(&softrdma::cm::ipv4_to_gid(*src.ip()));
    env.extend_from_slice(&1u32.to_be_bytes());
    env.extend_from_slice(&req);
    for _ in 0..3 {
        forger.send_to(&env, (cm_util::loopback(), 4791)).unwrap();
    }
    assert!(
        sch.get_cm_event_timeout(Duration::from_millis(200))
            .is_none(),
        "no CONNECT_REQUEST from a forged envelope"
    );
    assert_eq!(ctx.stats().unwrap().rx_forwarded, before.rx_forwarded);
}
