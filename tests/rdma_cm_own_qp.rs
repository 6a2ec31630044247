//! QPs the program creates and moves itself (librdmacm's `conn_param.qp_num` without
//! `rdma_create_qp`, `rdma_init_qp_attr`, CONNECT_RESPONSE, `rdma_establish`; `rping -q`):
//! the CM carries the QP numbers and PSNs and reports the attributes, and never touches the QP.

mod cm_util;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpAttr, QpCaps, QpState, SendFlags, SendOp, WcStatus};
use softrdma::verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair, RecvWr, SendWr,
};
use verbs_util::{sge, wait_cq, ALL};

const T: Duration = Duration::from_secs(30);

struct Own {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

/// A QP of the program's own on the id's device, in INIT.
fn own_qp(id: &CmId) -> Own {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(ALL),
        ..Default::default()
    })
    .unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    Own {
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn to_rts(id: &CmId, qp: &QueuePair) {
    assert!(
        id.init_qp_attr(QpState::Init).is_err(),
        "INIT is the program's"
    );
    qp.modify(&id.init_qp_attr(QpState::Rtr).unwrap()).unwrap();
    qp.modify(&id.init_qp_attr(QpState::Rts).unwrap()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
}

#[test]
fn own_qps_connect_and_exchange() {
    let sch = EventChannel::new().unwrap();
    let lid = sch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap();
    let port = lid.local_addr().unwrap().port();
    lid.listen(4).unwrap();

    let client = std::thread::spawn(move || {
        let ch = EventChannel::new().unwrap();
        let id = ch.create_id(PortSpace::Tcp).unwrap();
        let dst = SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), port));
        id.resolve_addr(None, dst, T).unwrap();
        ch.wait_event(EventType::AddrResolved, T).unwrap().ack();
        id.resolve_route(T).unwrap();
        ch.wait_event(EventType::RouteResolved, T).unwrap().ack();
        let o = own_qp(&id);
        assert!(
            id.init_qp_attr(QpState::Rtr).is_err(),
            "nothing settled yet"
        );
        assert!(id.connect(&ConnParam::default()).is_err(), "no QP at all");
        let qpn = o.qp.qp_num();
        id.connect(&ConnParam {
            qp_num: qpn,
            ..Default::default()
        })
        .unwrap();
        let ev = ch.wait_event(EventType::ConnectResponse, T).unwrap();
        let server_qpn = ev.conn_param().unwrap().qp_num;
        ev.ack();
        assert_eq!(
            o.qp.state().unwrap(),
            QpState::Init,
            "the CM left the QP alone"
        );
        let rtr = id.init_qp_attr(QpState::Rtr).unwrap();
        assert_eq!(rtr.dest_qp_num, Some(server_qpn));
        to_rts(&id, &o.qp);
        id.establish().unwrap();
        // The server sends first.
        o.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&o.mr, 0, 64)],
        }])
        .unwrap();
        let wc = wait_cq(&o.cq);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        o.mr.write(100, b"pong").unwrap();
        o.qp.post_send(&[SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[sge(&o.mr, 100, 4)],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
        assert_eq!(wait_cq(&o.cq).status, WcStatus::Success);
        ch.wait_event(EventType::Disconnected, T).unwrap().ack();
        assert_eq!(
            o.qp.state().unwrap(),
            QpState::Rts,
            "still the program's to move"
        );
        id.destroy();
    });

    let ev = sch.wait_event(EventType::ConnectRequest, T).unwrap();
    let cid = ev.id().clone();
    let client_qpn = ev.conn_param().unwrap().qp_num;
    ev.ack();
    let o = own_qp(&cid);
    let rtr = cid.init_qp_attr(QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, Some(client_qpn));
    to_rts(&cid, &o.qp);
    o.qp.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &[sge(&o.mr, 0, 64)],
    }])
    .unwrap();
    cid.accept(&ConnParam {
        qp_num: o.qp.qp_num(),
        ..Default::default()
    })
    .unwrap();
    sch.wait_event(EventType::Established, T).unwrap().ack();
    o.mr.write(200, b"ping").unwrap();
    o.qp.post_send(&[SendWr {
        wr_id: 4,
        op: SendOp::Send,
        sg_list: &[sge(&o.mr, 200, 4)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let wc = wait_cq(&o.cq);
        assert_eq!(wc.status, WcStatus::Success);
        got.push(wc.wr_id);
    }
    got.sort();
    assert_eq!(got, [3, 4]);
    let mut pong = [0u8; 4];
    o.mr.read(0, &mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    cid.disconnect().unwrap();
    sch.wait_event(EventType::Disconnected, T).unwrap().ack();
    client.join().unwrap();
    cid.destroy();
    lid.destroy();
}
