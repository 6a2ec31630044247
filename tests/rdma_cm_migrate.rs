//! `CmId::migrate` (`rdma_migrate_id`): an id's queued and later events go to the new channel,
//! and each channel's fd is readable exactly while it holds events. The fd is a blocking one,
//! so a C program's O_NONBLOCK on it is its own choice (librdmacm's callers make
//! `rdma_get_cm_event` non-blocking that way).

mod cm_util;

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use softrdma::rdma_cm::{EventChannel, EventType, PortSpace};

const T: Duration = Duration::from_secs(30);

fn readable(ch: &EventChannel) -> bool {
    let mut p = libc::pollfd {
        fd: ch.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn migrate_moves_queued_and_later_events() {
    let a = EventChannel::new().unwrap();
    let b = EventChannel::new().unwrap();
    // SAFETY: F_GETFL on our own fd.
    let fl = unsafe { libc::fcntl(a.fd(), libc::F_GETFL) };
    assert_eq!(fl & libc::O_NONBLOCK, 0, "the channel fd is blocking");

    let id = a.create_id(PortSpace::Tcp).unwrap();
    let dst = SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), 9));
    id.resolve_addr(None, dst, T).unwrap();
    assert!(readable(&a) && !readable(&b));

    id.migrate(&b);
    assert!(!readable(&a), "the queued event left the old channel");
    assert!(readable(&b), "and is on the new one");
    assert!(id.channel().is_some());
    let ev = b.wait_event(EventType::AddrResolved, T).unwrap();
    assert!(ev.id() == &id);
    drop(ev);
    assert!(!readable(&b));

    id.resolve_route(T).unwrap();
    assert!(a.get_cm_event_timeout(Duration::ZERO).is_none());
    drop(b.wait_event(EventType::RouteResolved, T).unwrap());

    // Migrating to the channel it is on changes nothing.
    id.migrate(&b);
    assert!(!readable(&b));
    id.destroy();
}
