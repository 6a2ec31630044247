//! Two processes on one machine talk with no configuration: both open the loopback device and
//! share its address, 127.0.0.1:4791 (`driver::share`). The peer process is this
//! test binary re-executed on the ignored `child` test; connection data goes over its stdio.
mod verbs_util;

use std::io::{BufRead, Write};

use softrdma::transport::{SendOp, WcOpcode, WcStatus};
use softrdma::verbs::ipv4_from_gid;
use verbs_util::child::{self, hex, unhex};
use verbs_util::*;

/// `QP <qpn> <psn> <gid> <addr> <rkey>`
fn info_line(e: &End, psn: u32, mr: &softrdma::verbs::MemoryRegion) -> String {
    format!(
        "QP {} {} {} {} {}",
        e.qp.qp_num(),
        psn,
        hex(&e.ctx.gid()),
        mr.addr(),
        mr.rkey()
    )
}

struct Peer {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    addr: u64,
    rkey: u32,
}

fn parse(line: &str) -> Peer {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[0], "QP", "{line}");
    Peer {
        qpn: f[1].parse().unwrap(),
        psn: f[2].parse().unwrap(),
        gid: unhex(f[3]),
        addr: f[4].parse().unwrap(),
        rkey: f[5].parse().unwrap(),
    }
}

#[test]
fn two_processes_over_loopback() {
    let me = End::new(loopback_ctx());
    let mr = me.mr(4096);
    let (mut child, mut stdin, rx) = child::spawn("child");
    let peer = parse(&child::line_with(&rx, "QP "));
    // Both processes share the loopback device's address (UDP 127.0.0.1:4791 with
    // SO_REUSEPORT); their QPNs carry distinct slots, which steer each datagram to its owner.
    assert_eq!(
        ipv4_from_gid(&peer.gid),
        Some(me.ctx.addr()),
        "one shared address"
    );
    assert_ne!(peer.qpn >> 16, me.qp.qp_num() >> 16, "distinct slots");
    writeln!(stdin, "{}", info_line(&me, 11, &mr)).unwrap();
    connect(&me.qp, 11, peer.qpn, peer.psn, peer.gid);

    // READ what the child wrote into its MR, then SEND to it and get its echo.
    me.post_send(
        1,
        SendOp::RdmaRead {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        },
        &[sge(&mr, 0, 32)],
    );
    assert_eq!(me.wait().status, WcStatus::Success);
    assert_eq!(
        &mr.lock().unwrap()[..32],
        b"written by the child process...."
    );
    me.post_recv(2, &[sge(&mr, 1024, 64)]);
    mr.write(512, b"ping from the parent").unwrap();
    me.post_send(3, SendOp::Send, &[sge(&mr, 512, 20)]);
    let mut got = Vec::new();
    for _ in 0..2 {
        let wc = me.wait();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        got.push(wc.opcode);
        if wc.opcode == WcOpcode::Recv {
            assert_eq!(wc.byte_len, 20);
            assert_eq!(&mr.lock().unwrap()[1024..1044], b"PING FROM THE PARENT");
        }
    }
    got.sort_by_key(|o| *o as u32);
    assert_eq!(got, [WcOpcode::Send, WcOpcode::Recv]);
    writeln!(stdin, "DONE").unwrap();
    child::wait_success(&mut child);
}

#[test]
#[ignore = "the peer process of two_processes_over_loopback"]
fn child() {
    if std::env::var_os("SOFTRDMA_TEST_CHILD").is_none() {
        return;
    }
    let me = End::new(loopback_ctx());
    let mr = me.mr(4096);
    mr.write(0, b"written by the child process....").unwrap();
    println!("{}", info_line(&me, 22, &mr));
    std::io::stdout().flush().unwrap();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let peer = parse(&lines.next().unwrap().unwrap());
    connect(&me.qp, 22, peer.qpn, peer.psn, peer.gid);
    // (A SEND arriving before this is answered with an RNR NAK and retried.)
    me.post_recv(1, &[sge(&mr, 1024, 64)]);
    let wc = me.wait();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 20)
    );
    let upper = mr.lock().unwrap()[1024..1044].to_ascii_uppercase();
    mr.write(2048, &upper).unwrap();
    me.post_send(2, SendOp::Send, &[sge(&mr, 2048, 20)]);
    assert_eq!(me.wait().status, WcStatus::Success);
    // Stay up (serving nothing more) until the parent is done.
    assert_eq!(lines.next().unwrap().unwrap(), "DONE");
}
