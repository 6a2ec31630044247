//! For the rdma_cm tests: the address of this process's loopback endpoint (127.0.0.1, shared
//! with this user's other processes).
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::OnceLock;
use std::time::Duration;

use softrdma::rdma_cm::{CmId, EventChannel, EventType, PortSpace};
use softrdma::transport::QpCaps;
use softrdma::verbs::{QpInitAttr, QpType, QueuePair};

pub fn loopback() -> Ipv4Addr {
    static A: OnceLock<Ipv4Addr> = OnceLock::new();
    *A.get_or_init(|| {
        let ch = EventChannel::new().unwrap();
        let id = ch.create_id(PortSpace::Tcp).unwrap();
        let dst = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9));
        id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
        let ev = ch
            .wait_event(EventType::AddrResolved, Duration::from_secs(30))
            .unwrap();
        drop(ev);
        let a = *id.local_addr().unwrap().ip();
        id.destroy();
        a
    })
}

/// A QP of `qp_type` with `cap` on the id's device (its own PD and CQ), created through
/// `rdma_create_qp`.
pub fn qp_on(id: &CmId, qp_type: QpType, cap: QpCaps) -> QueuePair {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    id.create_qp(
        &pd,
        &QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type,
            sq_sig_all: false,
            srq: None,
        },
    )
    .unwrap()
}
