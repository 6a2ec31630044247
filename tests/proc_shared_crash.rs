//! Processes share a device (one address, UDP 4791 with SO_REUSEPORT, `driver::share`): when
//! one of them is killed with SIGKILL, the kernel moves the last socket of the group into its
//! place, and the survivors must steer to the moved one again. Here three processes share the
//! loopback device: this one, a victim that joined second, and a peer that joined last; the
//! victim is killed and this process keeps talking to the peer over RC.
mod verbs_util;

use std::io::{BufRead, Write};
use std::time::Duration;

use softrdma::transport::{SendOp, WcOpcode, WcStatus};
use verbs_util::child::{hex, line_with, spawn, unhex, wait_success};
use verbs_util::*;

/// `QP <qpn> <gid>`; PSNs are fixed: 11 here, 22 in the peer.
fn qp_line(e: &End) -> String {
    format!("QP {} {}", e.qp.qp_num(), hex(&e.ctx.gid()))
}

fn parse(l: &str) -> (u32, [u8; 16]) {
    let f: Vec<&str> = l.split_whitespace().collect();
    (f[1].parse().unwrap(), unhex(f[2]))
}

/// SEND `n` messages to the peer and check each echo (upper-cased).
fn ping(me: &End, mr: &softrdma::verbs::MemoryRegion, n: usize, tag: &str) {
    for i in 0..n {
        let msg = format!("{tag} {i:04}");
        me.post_recv(1, &[sge(mr, 1024, 64)]);
        mr.write(0, msg.as_bytes()).unwrap();
        me.post_send(2, SendOp::Send, &[sge(mr, 0, msg.len())]);
        let mut seen = (false, false);
        while !(seen.0 && seen.1) {
            let wc = me.wait();
            assert_eq!(wc.status, WcStatus::Success, "{tag} {i}: {wc:?}");
            match wc.opcode {
                WcOpcode::Send => seen.0 = true,
                WcOpcode::Recv => seen.1 = true,
                o => panic!("unexpected {o:?}"),
            }
        }
        let mut got = vec![0u8; msg.len()];
        mr.read(1024, &mut got).unwrap();
        assert_eq!(got, msg.to_ascii_uppercase().as_bytes());
    }
}

#[test]
fn a_killed_sharer_does_not_disturb_the_others() {
    let me = End::new(loopback_ctx());
    let mr = me.mr(4096);
    // The victim joins second, the peer last: killing the victim moves the peer's socket.
    let (mut victim, _vin, vrx) = spawn("victim");
    line_with(&vrx, "READY");
    let (mut peer, mut pin, prx) = spawn("peer");
    let (pqpn, pgid) = parse(&line_with(&prx, "QP "));
    assert_eq!(pgid, me.ctx.gid(), "one shared address");
    writeln!(pin, "{}", qp_line(&me)).unwrap();
    connect(&me.qp, 11, pqpn, 22, pgid);
    ping(&me, &mr, 20, "before");

    victim.0.kill().unwrap();
    victim.0.wait().unwrap();
    // Right away, and again after the survivors' checks have certainly run.
    ping(&me, &mr, 20, "after");
    std::thread::sleep(Duration::from_millis(500));
    ping(&me, &mr, 20, "later");

    writeln!(pin, "DONE").unwrap();
    wait_success(&mut peer);
}

#[test]
#[ignore = "a process of a_killed_sharer_does_not_disturb_the_others"]
fn victim() {
    if std::env::var_os("SOFTRDMA_TEST_CHILD").is_none() {
        return;
    }
    let _me = End::new(loopback_ctx());
    println!("READY");
    std::io::stdout().flush().unwrap();
    // Until killed.
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

#[test]
#[ignore = "a process of a_killed_sharer_does_not_disturb_the_others"]
fn peer() {
    if std::env::var_os("SOFTRDMA_TEST_CHILD").is_none() {
        return;
    }
    let me = End::new(loopback_ctx());
    let mr = me.mr(4096);
    println!("{}", qp_line(&me));
    std::io::stdout().flush().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let (qpn, gid) = parse(&rx.recv_timeout(WAIT).unwrap());
    connect(&me.qp, 22, qpn, 11, gid);
    me.post_recv(1, &[sge(&mr, 0, 64)]);
    // Echo every message upper-cased until told DONE.
    loop {
        if let Ok(l) = rx.try_recv() {
            assert_eq!(l, "DONE");
            return;
        }
        let mut wc = [softrdma::verbs::WorkCompletion::default()];
        if me.cq.poll(&mut wc).unwrap() == 0 {
            std::thread::yield_now();
            continue;
        }
        let wc = wc[0];
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.opcode == WcOpcode::Recv {
            let mut m = vec![0u8; wc.byte_len as usize];
            mr.read(0, &mut m).unwrap();
            me.post_recv(1, &[sge(&mr, 0, 64)]);
            mr.write(2048, &m.to_ascii_uppercase()).unwrap();
            me.post_send(2, SendOp::Send, &[sge(&mr, 2048, m.len())]);
        }
    }
}
