//! For the rdma_cm tests: the address of this process's loopback endpoint. It is 127.0.0.1
//! unless another process holds that address's RoCE port, in which case the endpoint took the
//! next free 127.0.0.x; tests connect to wherever it is.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::OnceLock;
use std::time::Duration;

use softrdma::rdma_cm::{EventChannel, EventType, PortSpace};

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
