//! rdma_cm over IPv6 on the loopback device, in one process: an rping-like connection to `::1`
//! (private data both ways, SEND / WRITE / READ over RoCEv2 over IPv6, the ids' addresses), an
//! id bound to `[::]` taking IPv4 and IPv6 clients as Linux's does, one bound to `0.0.0.0`
//! refusing IPv6 ones, one port bound per family, and the UDP port space (SIDR) over IPv6.
//! Each test returns early (with a note) where the host has IPv6 disabled.

mod cm_util;
mod verbs_util;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, SendFlags, SendOp, WcStatus};
use softrdma::verbs::{RecvWr, SendWr, UdSendWr, GRH_LEN};
use verbs_util::{sge, wait_cq, ALL};

const T: Duration = Duration::from_secs(30);
const V6_LOOPBACK: [u8; 16] = Ipv6Addr::LOCALHOST.octets();

/// Whether the loopback device has `::1` (else the test says so and returns).
fn have_v6() -> bool {
    let off = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map_or(true, |s| s.trim() == "1");
    let lo = softrdma::devices()
        .ok()
        .and_then(|d| d.into_iter().find(|d| d.is_loopback()));
    let ok = !off
        && lo.is_some_and(|d| {
            d.open()
                .is_ok_and(|c| c.ip_addrs().contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)))
        });
    if !ok {
        eprintln!("no IPv6 on the loopback device: skipped");
    }
    ok
}

fn v6(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv6Addr::LOCALHOST, port))
}

fn v4(port: u16) -> SocketAddr {
    SocketAddr::from((cm_util::loopback(), port))
}

/// A listening id of `ps` bound to `addr` (port 0: ephemeral); its port.
fn listener(ch: &EventChannel, ps: PortSpace, addr: SocketAddr) -> (CmId, u16) {
    let id = ch.create_id(ps).unwrap();
    id.bind_addr(addr).unwrap();
    let port = id.local_socket_addr().unwrap().port();
    id.listen(16).unwrap();
    (id, port)
}

/// A client id of `ps` resolved toward `dst`, with an RC (TCP) or UD (UDP) QP, CQ and MR.
struct Client {
    ch: EventChannel,
    id: CmId,
    r: Res,
}

struct Res {
    pd: softrdma::verbs::ProtectionDomain,
    cq: softrdma::verbs::CompletionQueue,
    qp: softrdma::verbs::QueuePair,
    mr: softrdma::verbs::MemoryRegion,
}

fn res(id: &CmId) -> Res {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32, None).unwrap();
    let qp_type = match id.port_space() {
        PortSpace::Udp => softrdma::verbs::QpType::Ud,
        _ => softrdma::verbs::QpType::Rc,
    };
    let qp = id
        .create_qp(
            &pd,
            &softrdma::verbs::QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps::default(),
                qp_type,
                sq_sig_all: true,
                srq: None,
            },
        )
        .unwrap();
    let mr = pd.alloc_mr(8192, ALL).unwrap();
    Res { pd, cq, qp, mr }
}

fn client(ps: PortSpace, dst: SocketAddr) -> Client {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(ps).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    let ev = ch.wait_event(EventType::AddrResolved, T).unwrap();
    assert_eq!(ev.status(), 0);
    ev.ack();
    id.resolve_route(T).unwrap();
    ch.wait_event(EventType::RouteResolved, T).unwrap().ack();
    let r = res(&id);
    Client { ch, id, r }
}

fn conn(data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

fn send(r: &Res, off: usize, len: usize) {
    r.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[sge(&r.mr, off, len)],
        flags: SendFlags::default(),
    }])
    .unwrap();
}

fn recv(r: &Res, off: usize, len: usize) {
    r.qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[sge(&r.mr, off, len)],
    }])
    .unwrap();
}

/// Accept the next CONNECT_REQUEST on `sch` (checking it came for `listen`), with private data
/// `data`; the new id and its resources.
fn accept(sch: &EventChannel, listen: &CmId, data: &[u8]) -> (CmId, Res, Vec<u8>) {
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert_eq!(ev.listen_id(), Some(listen));
    let got = ev.private_data().to_vec();
    let id = ev.id().clone();
    drop(ev);
    let r = res(&id);
    id.accept(&conn(data)).unwrap();
    (id, r, got)
}

#[test]
fn rping_like_connection_over_ipv6() {
    if !have_v6() {
        return;
    }
    let sch = EventChannel::new().unwrap();
    let (lid, port) = listener(&sch, PortSpace::Tcp, v6(0));
    assert_eq!(lid.local_socket_addr(), Some(v6(port)));
    // The IPv4 view of an IPv6 id has nothing to show.
    assert_eq!(lid.local_addr(), None);

    let c = client(PortSpace::Tcp, v6(port));
    let cport = c.id.local_socket_addr().unwrap().port();
    assert_eq!(c.id.local_socket_addr(), Some(v6(cport)));
    assert_eq!(c.id.peer_socket_addr(), Some(v6(port)));
    recv(&c.r, 0, 64);
    c.id.connect(&conn(b"rping over IPv6")).unwrap();

    let (sid, sr, got) = accept(&sch, &lid, b"accepted over IPv6");
    assert!(got.starts_with(b"rping over IPv6"), "{got:?}");
    assert_eq!(sid.local_socket_addr(), Some(v6(port)));
    assert_eq!(sid.peer_socket_addr(), Some(v6(cport)));
    let ev = c.ch.wait_event(EventType::Established, T).unwrap();
    assert!(ev.private_data().starts_with(b"accepted over IPv6"));
    ev.ack();
    sch.wait_event(EventType::Established, T).unwrap().ack();

    // The CM set both QPs' paths to ::1, from the loopback device's ::1 GID.
    for qp in [&c.r.qp, &sr.qp] {
        let av = qp.query().unwrap().ah_attr.unwrap();
        assert_eq!(av.dgid, V6_LOOPBACK);
        let ctx = sid.context().unwrap();
        assert_eq!(ctx.query_gid(1, av.sgid_index).unwrap(), V6_LOOPBACK);
    }
    let before = sid.context().unwrap().stats().unwrap().rx_icrc_v6;

    // SEND server -> client, then the client WRITEs into and READs from the server's buffer
    // (the rping exchange's shape).
    sr.mr.write(0, b"server buffer").unwrap();
    send(&sr, 0, 13);
    assert_eq!(wait_cq(&sr.cq).status, WcStatus::Success);
    assert_eq!(wait_cq(&c.r.cq).byte_len, 13);
    c.r.mr.write(1000, b"written by the client").unwrap();
    c.r.qp
        .post_send(&[SendWr {
            wr_id: 3,
            op: SendOp::RdmaWrite {
                remote_addr: sr.mr.addr() + 4000,
                rkey: sr.mr.rkey(),
            },
            sg_list: &[sge(&c.r.mr, 1000, 21)],
            flags: SendFlags::default(),
        }])
        .unwrap();
    assert_eq!(wait_cq(&c.r.cq).status, WcStatus::Success);
    c.r.qp
        .post_send(&[SendWr {
            wr_id: 4,
            op: SendOp::RdmaRead {
                remote_addr: sr.mr.addr() + 4000,
                rkey: sr.mr.rkey(),
            },
            sg_list: &[sge(&c.r.mr, 2000, 21)],
            flags: SendFlags::default(),
        }])
        .unwrap();
    assert_eq!(wait_cq(&c.r.cq).status, WcStatus::Success);
    assert_eq!(
        &c.r.mr.lock().unwrap()[2000..2021],
        b"written by the client"
    );
    assert!(sid.context().unwrap().stats().unwrap().rx_icrc_v6 > before);

    c.id.disconnect().unwrap();
    sch.wait_event(EventType::Disconnected, T).unwrap().ack();
    sid.disconnect().unwrap();
    c.ch.wait_event(EventType::Disconnected, T).unwrap().ack();
    drop(sr);
    sid.destroy();
    c.id.destroy();
    lid.destroy();
}

#[test]
fn an_id_bound_to_the_ipv6_wildcard_takes_ipv4_and_ipv6_clients() {
    if !have_v6() {
        return;
    }
    let sch = EventChannel::new().unwrap();
    let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
    let (lid, port) = listener(&sch, PortSpace::Tcp, any6);
    assert_eq!(
        lid.local_socket_addr(),
        Some(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
    );
    // The IPv4 view of `[::]` is `0.0.0.0`.
    assert_eq!(
        lid.local_addr().map(|a| *a.ip()),
        Some(Ipv4Addr::UNSPECIFIED)
    );

    for dst in [v4(port), v6(port)] {
        let c = client(PortSpace::Tcp, dst);
        recv(&c.r, 0, 64);
        c.id.connect(&conn(b"hello")).unwrap();
        let (sid, sr, _) = accept(&sch, &lid, b"");
        // The new id has the address the client connected to: IPv4 for an IPv4 client.
        assert_eq!(sid.local_socket_addr(), Some(dst), "{dst}");
        let peer = sid.peer_socket_addr().unwrap();
        assert_eq!(peer.is_ipv4(), dst.is_ipv4());
        assert_eq!(peer, c.id.local_socket_addr().unwrap());
        c.ch.wait_event(EventType::Established, T).unwrap().ack();
        sch.wait_event(EventType::Established, T).unwrap().ack();
        sr.mr.write(0, b"over the wildcard").unwrap();
        send(&sr, 0, 17);
        assert_eq!(wait_cq(&sr.cq).status, WcStatus::Success);
        let wc = wait_cq(&c.r.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 17));
        assert_eq!(&c.r.mr.lock().unwrap()[..17], b"over the wildcard");
        let av = sr.qp.query().unwrap().ah_attr.unwrap();
        assert_eq!(
            softrdma::wire::gid::gid_to_ip(&av.dgid),
            peer.ip(),
            "the server's QP goes back over the client's family"
        );
        c.id.disconnect().unwrap();
        sch.wait_event(EventType::Disconnected, T).unwrap().ack();
        sid.disconnect().unwrap();
        c.ch.wait_event(EventType::Disconnected, T).unwrap().ack();
        drop(sr);
        sid.destroy();
        c.id.destroy();
    }
    lid.destroy();
}

#[test]
fn an_id_bound_to_the_ipv4_wildcard_refuses_ipv6_clients() {
    if !have_v6() {
        return;
    }
    let sch = EventChannel::new().unwrap();
    let (lid, port) = listener(
        &sch,
        PortSpace::Tcp,
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
    );
    let c = client(PortSpace::Tcp, v6(port));
    c.id.connect(&conn(b"")).unwrap();
    let ev = c.ch.wait_event(EventType::Rejected, T).unwrap();
    drop(ev);
    // No CONNECT_REQUEST reached the listener.
    assert!(sch.get_cm_event_timeout(Duration::ZERO).is_none());
    c.id.destroy();
    lid.destroy();
}

#[test]
fn one_port_per_family_as_linux() {
    if !have_v6() {
        return;
    }
    let sch = EventChannel::new().unwrap();
    let (l4, port) = listener(&sch, PortSpace::Tcp, v4(0));
    // The same port on ::1: another address, so allowed; a wildcard of either family is not.
    let (l6, _) = listener(&sch, PortSpace::Tcp, v6(port));
    for any in [
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
    ] {
        let id = sch.create_id(PortSpace::Tcp).unwrap();
        assert!(id.bind_addr(any).is_err(), "{any}");
        id.destroy();
    }
    // Each takes its own family's clients.
    for (dst, want) in [(v4(port), &l4), (v6(port), &l6)] {
        let c = client(PortSpace::Tcp, dst);
        c.id.connect(&conn(b"")).unwrap();
        let (sid, sr, _) = accept(&sch, want, b"");
        assert_eq!(sid.local_socket_addr(), Some(dst));
        c.ch.wait_event(EventType::Established, T).unwrap().ack();
        sch.wait_event(EventType::Established, T).unwrap().ack();
        c.id.disconnect().unwrap();
        sch.wait_event(EventType::Disconnected, T).unwrap().ack();
        sid.disconnect().unwrap();
        c.ch.wait_event(EventType::Disconnected, T).unwrap().ack();
        drop(sr);
        sid.destroy();
        c.id.destroy();
    }
    l4.destroy();
    l6.destroy();
}

#[test]
fn udp_port_space_over_ipv6() {
    if !have_v6() {
        return;
    }
    let sch = EventChannel::new().unwrap();
    let (lid, port) = listener(&sch, PortSpace::Udp, v6(0));
    let c = client(PortSpace::Udp, v6(port));
    c.id.connect(&conn(b"who are you")).unwrap();
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert_eq!(ev.listen_id(), Some(&lid));
    assert!(ev.private_data().starts_with(b"who are you"));
    let sid = ev.id().clone();
    drop(ev);
    let sr = res(&sid);
    sr.qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &[sge(&sr.mr, 0, GRH_LEN + 64)],
        }])
        .unwrap();
    sid.accept(&conn(b"the server")).unwrap();
    let ev = c.ch.wait_event(EventType::Established, T).unwrap();
    let ud = ev.ud_param().unwrap().clone();
    drop(ev);
    assert_eq!(ud.qp_num, sr.qp.qp_num());
    // The address vector toward the server: ::1, from the device's ::1 GID.
    assert_eq!(ud.ah_attr.dgid, V6_LOOPBACK);
    let ctx = c.id.context().unwrap();
    assert_eq!(
        ctx.query_gid(1, ud.ah_attr.sgid_index).unwrap(),
        V6_LOOPBACK
    );
    let ah = c.r.pd.create_ah(&ud.ah_attr).unwrap();
    c.r.mr.write(0, b"datagram").unwrap();
    c.r.qp
        .post_send_ud(&[UdSendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[sge(&c.r.mr, 0, 8)],
            flags: SendFlags::default(),
            ah: &ah,
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
        }])
        .unwrap();
    assert_eq!(wait_cq(&c.r.cq).status, WcStatus::Success);
    let wc = wait_cq(&sr.cq);
    assert_eq!((wc.wr_id, wc.byte_len), (9, (GRH_LEN + 8) as u32));
    assert_eq!(wc.grh.unwrap().sgid, V6_LOOPBACK);
    // The GRH area is an IPv6 header.
    assert_eq!(sr.mr.lock().unwrap()[0] >> 4, 6);
    assert_eq!(&sr.mr.lock().unwrap()[GRH_LEN..GRH_LEN + 8], b"datagram");
    sid.destroy();
    c.id.destroy();
    lid.destroy();
}
