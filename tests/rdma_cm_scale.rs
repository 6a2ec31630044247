//! Many connections at once: one listener accepting hundreds of clients that connect from
//! several threads, each thread with its own event channel.

mod cm_util;

use cm_util::qp_on;

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softrdma::rdma_cm::{ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, QpState};
use softrdma::verbs::QpType;

const T: Duration = Duration::from_secs(60);
const THREADS: usize = 4;
const PER_THREAD: usize = 50;
/// Small queues: 200 connections' worth.
const SMALL: QpCaps = QpCaps {
    max_send_wr: 4,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

#[test]
fn listener_accepts_hundreds_of_clients_from_several_threads() {
    let ch = EventChannel::new().unwrap();
    let listen = ch.create_id(PortSpace::Tcp).unwrap();
    listen
        .bind_addr(SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), 0)))
        .unwrap();
    listen.listen(THREADS * PER_THREAD).unwrap();
    let port = listen.local_addr().unwrap().port();
    let total = THREADS * PER_THREAD;
    let established = Arc::new(AtomicUsize::new(0));

    let clients: Vec<_> = (0..THREADS)
        .map(|t| {
            let established = established.clone();
            std::thread::spawn(move || {
                let ch = EventChannel::new().unwrap();
                let dst = SocketAddr::V4(SocketAddrV4::new(cm_util::loopback(), port));
                let mut ids = Vec::new();
                let mut qps = Vec::new();
                // Resolve every id first: their events come before any connection's.
                for _ in 0..PER_THREAD {
                    let id = ch.create_id(PortSpace::Tcp).unwrap();
                    id.resolve_addr(None, dst, T).unwrap();
                    ch.wait_event(EventType::AddrResolved, T).unwrap();
                    id.resolve_route(T).unwrap();
                    ch.wait_event(EventType::RouteResolved, T).unwrap();
                    qps.push(qp_on(&id, QpType::Rc, SMALL));
                    ids.push(id);
                }
                for (i, id) in ids.iter().enumerate() {
                    let tag = (t * PER_THREAD + i) as u32;
                    id.connect(&ConnParam {
                        private_data: tag.to_be_bytes().to_vec(),
                        ..Default::default()
                    })
                    .unwrap();
                }
                // All REQs are out; collect the answers in whatever order they come.
                let mut seen = 0;
                while seen < PER_THREAD {
                    let ev = ch.get_cm_event_timeout(T).expect("an event in time");
                    assert_eq!(ev.event(), EventType::Established, "status {}", ev.status());
                    let i = ids.iter().position(|x| x == ev.id()).expect("one of ours");
                    let want = ((t * PER_THREAD + i) as u32 + 1_000_000).to_be_bytes();
                    assert_eq!(&ev.private_data()[..4], &want);
                    seen += 1;
                    established.fetch_add(1, Ordering::Relaxed);
                }
                for qp in &qps {
                    assert_eq!(qp.state().unwrap(), QpState::Rts);
                }
                for id in &ids {
                    id.disconnect().unwrap();
                }
                let mut disc = 0;
                while disc < PER_THREAD {
                    let ev = ch.get_cm_event_timeout(T).expect("an event in time");
                    match ev.event() {
                        EventType::Disconnected => disc += 1,
                        EventType::TimewaitExit => {}
                        e => panic!("unexpected {e}"),
                    }
                }
                for id in ids {
                    id.destroy();
                }
            })
        })
        .collect();

    // Accept every request; answer every DREQ (rdma_disconnect on DISCONNECTED, as the seeds do).
    let mut accepted = Vec::new();
    let mut disconnected = 0;
    let mut established_srv = 0;
    while accepted.len() < total || disconnected < total {
        let ev = ch.get_cm_event_timeout(T).expect("an event in time");
        match ev.event() {
            EventType::ConnectRequest => {
                let tag = u32::from_be_bytes(ev.private_data()[..4].try_into().unwrap());
                let id = ev.id().clone();
                drop(ev);
                let qp = qp_on(&id, QpType::Rc, SMALL);
                id.accept(&ConnParam {
                    private_data: (tag + 1_000_000).to_be_bytes().to_vec(),
                    ..Default::default()
                })
                .unwrap();
                accepted.push((id, qp));
            }
            EventType::Established => established_srv += 1,
            EventType::Disconnected => {
                disconnected += 1;
                let (_, qp) = accepted.iter().find(|(id, _)| id == ev.id()).expect("ours");
                assert_eq!(qp.state().unwrap(), QpState::Err);
                ev.id().disconnect().unwrap();
            }
            EventType::TimewaitExit => {}
            e => panic!("unexpected {e} status {}", ev.status()),
        }
    }
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(established.load(Ordering::Relaxed), total);
    assert_eq!(established_srv, total);
}
