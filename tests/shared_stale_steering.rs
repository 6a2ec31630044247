//! Two contexts on one address (127.0.0.1) while the group's steering is wrong and cannot be
//! repaired: a program that sends every datagram, probes included, to the first context, and a
//! socket of the test's own in the group that answers no probe (so reading the layout again
//! fails). Datagrams for the second context reach the first, which hands them over to the
//! second's forward socket (`driver/forward.rs`): SEND both ways, RDMA WRITE and READ between
//! the two complete. Without the hand-over every datagram for the second context is lost and
//! its peer's QP ends in RETRY_EXC_ERR. (`shared_steering_repair.rs`: a stale program that can
//! be repaired is.)

#[path = "common/netns.rs"]
mod netns;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};
use softrdma::transport::{SendOp, WcOpcode, WcStatus};
use verbs_util::{pair, sge, End};

/// A socket of our own in the group of `addr` whose steering program returns index 0.
fn stale_steering(addr: Ipv4Addr) -> Socket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    s.set_reuse_port(true).unwrap();
    s.bind(&SocketAddrV4::new(addr, 4791).into())
        .expect("join the address's group");
    let prog = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let fprog = libc::sock_fprog {
        len: 1,
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

#[test]
fn datagrams_steered_to_the_wrong_context_are_handed_to_their_owner() {
    if !netns::private_netns() {
        // The host's 127.0.0.1 group may have other members: which one is index 0 is unknown.
        eprintln!("skipped: needs root for a network namespace of its own");
        return;
    }
    let (a, b) = pair();
    assert_eq!(a.ctx.gid(), b.ctx.gid(), "both contexts on one address");
    sends(&a, &b, 4);
    let addr = Ipv4Addr::new(127, 0, 0, 1);
    let _stale = stale_steering(addr);
    let (sa, sb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    // Everything now reaches `a` (index 0, the first to join): `b`'s share is handed over.
    sends(&a, &b, 16);
    sends(&b, &a, 16);
    // RDMA WRITE from a into b, then RDMA READ by b of a's memory (responses to b via a).
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
    let (ea, eb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    assert!(
        ea.tx_forwarded - sa.tx_forwarded > 0 && eb.rx_forwarded - sb.rx_forwarded > 0,
        "a handed {} datagrams over, b took {}",
        ea.tx_forwarded - sa.tx_forwarded,
        eb.rx_forwarded - sb.rx_forwarded
    );
    assert_eq!(eb.tx_forwarded, sb.tx_forwarded, "b gets nothing of a's");
}
