//! rdma_cm in the UDP port space: SIDR resolves the peer's UD QP and Q_Key, then datagrams flow
//! through address handles made from what the CM reported.

mod cm_util;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use softrdma::cm::sidr_manager::RDMA_UDP_QKEY;
use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, QpState, SendFlags, SendOp, WcOpcode, WcStatus};
use softrdma::verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair, RecvWr,
    UdSendWr, GRH_LEN,
};
use verbs_util::{sge, wait_cq, ALL};

const T: Duration = Duration::from_secs(30);

struct Res {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn ud_resources(id: &CmId) -> Res {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let attr = |t| QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCaps::default(),
        qp_type: t,
        sq_sig_all: false,
        srq: None,
    };
    // A UDP-port-space id takes a UD QP only.
    assert!(id.create_qp(&pd, &attr(QpType::Rc)).is_err());
    let qp = id.create_qp(&pd, &attr(QpType::Ud)).unwrap();
    // librdmacm moves a UD QP to RTS at creation, with the rdma_cm UDP Q_Key.
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    assert_eq!(qp.query().unwrap().qkey, Some(RDMA_UDP_QKEY));
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    Res { pd, cq, qp, mr }
}

/// A UDP-port-space id bound to an ephemeral port on every device.
fn bound(ch: &EventChannel) -> CmId {
    let id = ch.create_id(PortSpace::Udp).unwrap();
    id.bind_addr(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap();
    id
}

fn resolved(ch: &EventChannel, port: u16) -> CmId {
    let id = ch.create_id(PortSpace::Udp).unwrap();
    id.resolve_addr(
        None,
        SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), port)),
        T,
    )
    .unwrap();
    ch.wait_event(EventType::AddrResolved, T).unwrap();
    id.resolve_route(T).unwrap();
    ch.wait_event(EventType::RouteResolved, T).unwrap();
    id
}

#[test]
fn sidr_resolution_then_datagrams_both_ways() {
    let sch = EventChannel::new().unwrap();
    let listen = bound(&sch);
    listen.listen(4).unwrap();
    let port = listen.local_addr().unwrap().port();

    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, port);
    let cr = ud_resources(&c);
    c.connect(&ConnParam {
        private_data: b"who are you".to_vec(),
        ..Default::default()
    })
    .unwrap();

    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert_eq!(ev.listen_id(), Some(&listen));
    assert!(ev.private_data().starts_with(b"who are you"));
    let sid = ev.id().clone();
    drop(ev);
    let sr = ud_resources(&sid);
    sr.qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &[sge(&sr.mr, 0, GRH_LEN + 64)],
        }])
        .unwrap();
    sid.accept(&ConnParam {
        private_data: b"the server".to_vec(),
        ..Default::default()
    })
    .unwrap();

    let ev = ch.wait_event(EventType::Established, T).unwrap();
    let ud = ev.ud_param().expect("UD parameters").clone();
    drop(ev);
    assert_eq!(ud.qp_num, sr.qp.qp_num());
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert!(ud.private_data.starts_with(b"the server"));

    // Client -> server through an AH made from the reported address vector.
    let ah = cr.pd.create_ah(&ud.ah_attr).unwrap();
    cr.mr.write(0, b"hello over UD").unwrap();
    cr.qp
        .post_send_ud(&[UdSendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[sge(&cr.mr, 0, 13)],
            flags: SendFlags::SIGNALED,
            ah: &ah,
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
        }])
        .unwrap();
    assert_eq!(wait_cq(&cr.cq).status, WcStatus::Success);
    let wc = wait_cq(&sr.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len as usize, GRH_LEN + 13);
    assert_eq!(wc.src_qp, cr.qp.qp_num());
    let mut got = [0u8; 13];
    sr.mr.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"hello over UD");

    // Server -> client with an AH from the receive completion.
    cr.qp
        .post_recv(&[RecvWr {
            wr_id: 2,
            sg_list: &[sge(&cr.mr, 1024, GRH_LEN + 64)],
        }])
        .unwrap();
    let back = sr.pd.create_ah_from_wc(1, &wc).unwrap();
    sr.mr.write(512, b"hi").unwrap();
    sr.qp
        .post_send_ud(&[UdSendWr {
            wr_id: 3,
            op: SendOp::Send,
            sg_list: &[sge(&sr.mr, 512, 2)],
            flags: SendFlags::SIGNALED,
            ah: &back,
            remote_qpn: wc.src_qp,
            remote_qkey: RDMA_UDP_QKEY,
        }])
        .unwrap();
    assert_eq!(wait_cq(&sr.cq).status, WcStatus::Success);
    let wc = wait_cq(&cr.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let mut got = [0u8; 2];
    cr.mr.read(1024 + GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"hi");
}

#[test]
fn sidr_to_a_port_nobody_listens_on_is_unreachable() {
    let ch = EventChannel::new().unwrap();
    let other = bound(&ch);
    let port = other.local_addr().unwrap().port();
    let c = resolved(&ch, port);
    let _r = ud_resources(&c);
    c.connect(&ConnParam::default()).unwrap();
    let ev = ch.wait_event(EventType::Unreachable, T).unwrap();
    assert_eq!(ev.status(), 1, "SIDR status 1: service ID not supported");
}

#[test]
fn sidr_reject_and_private_data_limits() {
    let sch = EventChannel::new().unwrap();
    let listen = bound(&sch);
    listen.listen(4).unwrap();
    let port = listen.local_addr().unwrap().port();
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, port);
    let _r = ud_resources(&c);
    let long = ConnParam {
        private_data: vec![0; 181],
        ..Default::default()
    };
    assert_eq!(c.connect(&long).unwrap_err().errno(), libc::EINVAL);
    c.connect(&ConnParam::default()).unwrap();
    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    assert!(ev.id().reject(&[0; 137]).is_err());
    ev.id().reject(b"no").unwrap();
    drop(ev);
    let ev = ch.wait_event(EventType::Unreachable, T).unwrap();
    assert_eq!(ev.status(), 2, "SIDR status 2: rejected");
}
