//! Two contexts on one address (127.0.0.1) when the group's steering goes wrong (as after a
//! context died, before anyone re-steered): a program that sends every datagram to the first
//! context.
//!
//! * If probes still reach the index they name, the first context reads the layout again and
//!   steers the group right (`driver/probe.rs`, `driver/share.rs`); RC's retransmission covers
//!   what was lost meanwhile.
//! * If the steering cannot be repaired (the program sends probes to the first context too, and
//!   a socket of the test's own in the group answers none), datagrams for the second context
//!   reach the first, which hands them to the second's forward socket (`driver/forward.rs`).
//!   Without the hand-over the second context's peer ends in RETRY_EXC_ERR.
//!
//! Either way SEND both ways, 64 KiB RDMA WRITE and READ between the two complete.

#[path = "common/netns.rs"]
mod netns;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};
use softrdma::transport::{SendOp, WcOpcode, WcStatus};
use verbs_util::{pair, sge, End};

/// The probes' first word (`driver::probe`).
const PROBE_MAGIC: u32 = 0xff53_5250;

/// A socket of our own in the group of 127.0.0.1 that attached a program sending every
/// datagram to index 0, probes too unless `probes_by_index`.
fn stale_steering(probes_by_index: bool) -> Socket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    s.set_reuse_port(true).unwrap();
    s.bind(&SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791).into())
        .expect("join the address's group");
    let ins = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let all_to_0 = [ins(0x06, 0, 0, 0)]; // ret #0
    let probes_by_index_else_0 = [
        ins(0x20, 0, 0, 0),           // ld [0]
        ins(0x15, 0, 2, PROBE_MAGIC), // jeq #PROBE_MAGIC, else to ret #0
        ins(0x28, 0, 0, 4),           // ldh [4]: the probe's index
        ins(0x16, 0, 0, 0),           // ret A
        ins(0x06, 0, 0, 0),           // ret #0
    ];
    let prog: &[libc::sock_filter] = if probes_by_index {
        &probes_by_index_else_0
    } else {
        &all_to_0
    };
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies the program.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "attach: {}", std::io::Error::last_os_error());
    s
}

/// `n` SENDs from `from` to `to`, each received intact.
fn sends(from: &End, to: &End, n: u64) {
    let src = from.mr(4096);
    let dst = to.mr(4096 * n as usize);
    for i in 0..n {
        to.post_recv(i, &[sge(&dst, 4096 * i as usize, 4096)]);
    }
    src.write(0, &[0x5a; 4096]).unwrap();
    for i in 0..n {
        from.post_send(i, SendOp::Send, &[sge(&src, 0, 4096)]);
    }
    for _ in 0..n {
        let wc = from.wait();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let wc = to.wait();
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
    }
    let mut got = vec![0u8; 4096 * n as usize];
    dst.read(0, &mut got).unwrap();
    assert!(got.iter().all(|b| *b == 0x5a));
}

/// SEND both ways, then a 64 KiB RDMA WRITE from `a` into `b` and a READ by `b` of `a`.
fn traffic(a: &End, b: &End) {
    sends(a, b, 16);
    sends(b, a, 16);
    let (ma, mb) = (a.mr(65536), b.mr(65536));
    ma.write(0, &[7; 65536]).unwrap();
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[sge(&ma, 0, 65536)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    let mut got = vec![0u8; 65536];
    mb.read(0, &mut got).unwrap();
    assert!(got.iter().all(|x| *x == 7), "WRITE landed in b");
    ma.write(0, &[9; 65536]).unwrap();
    b.post_send(
        2,
        SendOp::RdmaRead {
            remote_addr: ma.addr(),
            rkey: ma.rkey(),
        },
        &[sge(&mb, 0, 65536)],
    );
    assert_eq!(b.wait().status, WcStatus::Success);
    mb.read(0, &mut got).unwrap();
    assert!(got.iter().all(|x| *x == 9), "READ brought a's memory");
}

/// Two contexts on 127.0.0.1 in a namespace of the test's own (the host's group may have other
/// members: which one is index 0 would be unknown), after some traffic with right steering.
fn two_contexts() -> Option<(End, End)> {
    if !netns::private_netns() {
        eprintln!("skipped: needs root for a network namespace of its own");
        return None;
    }
    let (a, b) = pair();
    assert_eq!(a.ctx.gid(), b.ctx.gid(), "both contexts on one address");
    sends(&a, &b, 4);
    Some((a, b))
}

#[test]
fn stale_steering_is_read_again_and_repaired() {
    let Some((a, b)) = two_contexts() else { return };
    // The program stays with the group when the socket that attached it leaves (as a dead
    // process's socket does).
    drop(stale_steering(true));
    traffic(&a, &b);
}

#[test]
fn datagrams_steered_to_the_wrong_context_are_handed_to_their_owner() {
    let Some((a, b)) = two_contexts() else { return };
    let _stale = stale_steering(false);
    let (sa, sb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    // Everything now reaches `a` (index 0, the first to join): `b`'s share is handed over.
    traffic(&a, &b);
    let (ea, eb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    assert!(
        ea.tx_forwarded - sa.tx_forwarded > 0 && eb.rx_forwarded - sb.rx_forwarded > 0,
        "a handed {} datagrams over, b took {}",
        ea.tx_forwarded - sa.tx_forwarded,
        eb.rx_forwarded - sb.rx_forwarded
    );
    assert_eq!(eb.tx_forwarded, sb.tx_forwarded, "b gets nothing of a's");
}
