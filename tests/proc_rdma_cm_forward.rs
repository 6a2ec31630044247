//! Several processes on one address: a REQ for an rdma_cm port nobody listens on yet reaches
//! whichever process the kernel picks. Here the client's process is the only one on the
//! address when its REQ goes out, so the REQ lands in the client's own process and waits there
//! (`cm/manager/unclaimed.rs`); a server process then starts, joins the address and listens,
//! and the waiting REQ is handed to it (`driver/forward.rs`): the connection is made, with no
//! REJ and no retry. The server then returns from `main` with the connection still up, and the
//! client gets DISCONNECTED, as from a Linux peer whose exiting process's ids the kernel
//! destroys (`rdma_cm/route.rs`, `at_exit_disconnect`).
//!
//! A test without the libtest harness: run with `server PORT`, the binary is that server.

mod cm_util;
#[path = "common/netns.rs"]
mod netns;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::transport::{QpCaps, QpState};
use softrdma::verbs::{QpType, QueuePair};

const T: Duration = Duration::from_secs(30);

fn rc_qp(id: &CmId) -> QueuePair {
    cm_util::qp_on(id, QpType::Rc, QpCaps::default())
}

/// The server: listen on `addr` at once, accept one connection, report.
fn server(addr: SocketAddr) {
    let ch = EventChannel::new().unwrap();
    let lid = ch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(addr).unwrap();
    lid.listen(1).unwrap();
    let ev = ch.wait_event(EventType::ConnectRequest, T).unwrap();
    let id = ev.id().clone();
    ev.ack();
    let qp = rc_qp(&id);
    id.accept(&ConnParam::default()).unwrap();
    ch.wait_event(EventType::Established, T).unwrap().ack();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    let st = id.context().unwrap().stats().unwrap();
    println!("established rx_forwarded={}", st.rx_forwarded);
    std::io::stdout().flush().unwrap();
    // Stay until the client has seen its side established, then exit as a C program returning
    // from `main` does: no destructor runs, the connection is up.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(0);
}

fn main() {
    // No libtest harness: `--list` names the one test, other flags are ignored.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("server") {
        let addr: SocketAddr = args[2].parse().expect("server ADDR:PORT");
        server(addr);
        return;
    }
    if args.iter().any(|a| a == "--list") {
        println!("a_req_waiting_in_the_clients_process_reaches_a_server_that_listens_later: test");
        return;
    }
    // This process and the server it starts get a namespace of their own (when root): no
    // other process on the machine shares 127.0.0.1's device with them then.
    netns::private_netns();
    let lo = cm_util::loopback();
    // A port nobody uses: bound here for a moment, then free.
    let port = {
        let ch = EventChannel::new().unwrap();
        let id = ch.create_id(PortSpace::Tcp).unwrap();
        id.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
            .unwrap();
        id.local_addr().unwrap().port()
    };
    let dst = SocketAddr::new(IpAddr::V4(lo), port);
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    ch.wait_event(EventType::AddrResolved, T).unwrap().ack();
    id.resolve_route(T).unwrap();
    ch.wait_event(EventType::RouteResolved, T).unwrap().ack();
    let qp = rc_qp(&id);
    let ctx = id.context().unwrap();
    let before = ctx.stats().unwrap();
    let t0 = Instant::now();
    id.connect(&ConnParam::default()).unwrap();
    // This process is the only one on the address: the REQ came back to it and waits.
    let mut server = Command::new(std::env::current_exe().unwrap())
        .arg("server")
        .arg(dst.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the server");
    let ev = ch.get_cm_event_timeout(T);
    let waited = t0.elapsed();
    match ev {
        Some(ev) if ev.event() == EventType::Established => ev.ack(),
        other => {
            let _ = server.kill();
            panic!(
                "expected ESTABLISHED, got {:?} after {waited:?} (a REQ waits {:?} for a listener)",
                other.map(|e| (e.event(), e.status())),
                softrdma::rdma_cm::UNCLAIMED_REQ_WAIT
            );
        }
    }
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    let after = ctx.stats().unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success(), "the server failed");
    assert_eq!(
        after.tx_forwarded - before.tx_forwarded,
        1,
        "the REQ was handed over by this process"
    );
    assert_eq!(
        line.trim(),
        "established rx_forwarded=1",
        "the server's report"
    );
    // The server exited with the connection up: its exit handler sent a DREQ.
    match ch.get_cm_event_timeout(Duration::from_secs(10)) {
        Some(ev) if ev.event() == EventType::Disconnected => ev.ack(),
        other => panic!(
            "expected DISCONNECTED after the server exited, got {:?}",
            other.map(|e| e.event())
        ),
    }
    println!(
        "test a_req_waiting_in_the_clients_process_reaches_a_server_that_listens_later ... ok ({waited:?})"
    );
}
