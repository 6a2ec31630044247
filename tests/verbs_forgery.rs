//! Forged RC traffic from another address while a legitimate session runs (issue 7, item 1).
//!
//! The attacker is a plain UDP socket on a second loopback address that knows everything the
//! pingpong/perftest exchanges send in the clear: QPNs, PSNs, the rkey and the address. It
//! computes valid ICRCs. Its RDMA WRITEs at exactly the PSNs the responder expects must not
//! land, and its ACK/NAK floods at the requester must not disturb the session: the endpoint
//! drops them by source address (as rdma_rxe's `check_addr` does) and counts them.
//! A control shows the same forged packets land when they come from the peer's address, so
//! the test cannot pass because the forgeries were malformed.

mod verbs_util;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softrdma::transport::{SendOp, WcStatus};
use softrdma::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use softrdma::wire::{icrc, Aeth, Bth, NakCode, Opcode, Packet, Psn, Reth, Syndrome, ROCE_V2_PORT};
use verbs_util::*;

const MR_LEN: usize = 64 * 1024;
const FORGED_BYTE: u8 = 0xee;

/// A UDP socket on a loopback address other than `avoid`, any port.
fn attacker_socket(avoid: &[Ipv4Addr]) -> UdpSocket {
    for last in (150..=250u8).rev() {
        let ip = Ipv4Addr::new(127, 0, 0, last);
        if avoid.contains(&ip) {
            continue;
        }
        if let Ok(s) = UdpSocket::bind(SocketAddrV4::new(ip, 0)) {
            return s;
        }
    }
    panic!("no loopback address for the attacker");
}

/// Emit `pkt` with a valid ICRC for the socket's address and send it to `dst`:4791.
fn send_forged(sock: &UdpSocket, dst: Ipv4Addr, pkt: &Packet<'_>, buf: &mut [u8]) {
    let n = pkt.emit(buf).unwrap();
    let std::net::SocketAddr::V4(src) = sock.local_addr().unwrap() else {
        unreachable!()
    };
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    Ipv4Udp::new(*src.ip(), src.port(), dst, ROCE_V2_PORT, n).emit(&mut hdr);
    icrc::fill_v4(&hdr, &mut buf[..n]);
    // A full socket buffer only loses forgeries; the counters below say how many arrived.
    let _ = sock.send_to(&buf[..n], SocketAddrV4::new(dst, ROCE_V2_PORT));
}

/// An RDMA WRITE ONLY of `len` forged bytes into `(va, rkey)` of QP `qpn` at `psn`.
fn forged_write(qpn: u32, psn: u32, va: u64, rkey: u32, payload: &[u8]) -> Packet<'_> {
    let mut bth = Bth::new(Opcode::RC_RDMA_WRITE_ONLY, qpn, Psn::new(psn));
    bth.ack_req = true;
    let mut p = Packet::new(bth, payload);
    p.reth = Some(Reth {
        va,
        rkey,
        dma_len: payload.len() as u32,
    });
    p
}

/// An ACK or NAK to QP `qpn` for `psn`.
fn forged_ack(qpn: u32, psn: u32, syndrome: Syndrome, msn: u32) -> Packet<'static> {
    let mut p = Packet::new(Bth::new(Opcode::RC_ACKNOWLEDGE, qpn, Psn::new(psn)), &[]);
    p.aeth = Some(Aeth { syndrome, msn });
    p
}

#[test]
fn forged_writes_and_acks_from_another_address_are_dropped_and_counted() {
    let (a, b) = pair(); // a's QP starts at PSN 100, b's at 200 (verbs_util::pair)
    let target = a.mr(MR_LEN);
    let src = b.mr(MR_LEN);
    let sock = attacker_socket(&[a.ctx.addr(), b.ctx.addr()]);
    let (a_ip, b_ip) = (a.ctx.addr(), b.ctx.addr());
    let (a_qpn, b_qpn) = (a.qp.qp_num(), b.qp.qp_num());
    let (va, rkey) = (target.addr(), target.rkey());

    // Before anything legitimate: forged WRITEs at exactly the PSNs b will use, covering the
    // whole region. Had one been taken, b's real WRITE with that PSN would be a "duplicate".
    let forged = vec![FORGED_BYTE; 1024];
    let mut buf = vec![0u8; 2048];
    let mut sent = 0u64;
    for psn in 200..1200u32 {
        let off = (psn as u64 % 64) * 1024;
        send_forged(
            &sock,
            a_ip,
            &forged_write(a_qpn, psn, va + off, rkey, &forged),
            &mut buf,
        );
        sent += 1;
    }

    // Then a flood beside the session: more forged WRITEs at a, and ACK/NAK floods at b
    // (NAKs that would make b retransmit or fail, ACKs for PSNs it has not sent).
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let forged = vec![FORGED_BYTE; 1024];
            let mut buf = vec![0u8; 2048];
            let mut n = 0u64;
            let syndromes = [
                Syndrome::Nak(NakCode::PsnSequenceError),
                Syndrome::Nak(NakCode::RemoteAccessError),
                Syndrome::Nak(NakCode::InvalidRequest),
                Syndrome::Ack { credits: 0x1f },
                Syndrome::RnrNak { timer: 31 },
            ];
            while !stop.load(Ordering::Relaxed) && n < 400_000 {
                let psn = 200 + (n as u32 % 2000);
                let off = (n % 64) * 1024;
                let w = forged_write(a_qpn, psn, va + off, rkey, &forged);
                send_forged(&sock, a_ip, &w, &mut buf);
                let s = syndromes[(n % syndromes.len() as u64) as usize];
                let ack = forged_ack(b_qpn, psn, s, n as u32);
                send_forged(&sock, b_ip, &ack, &mut buf);
                n += 2;
            }
            n
        })
    };

    // The legitimate session: b writes a known pattern over the whole region, 1 KiB at a time,
    // twice, then SENDs a message a receives.
    let recv_mr = a.mr(256);
    a.post_recv(1, &[sge(&recv_mr, 0, 256)]);
    for round in 0..2u8 {
        for i in 0..64usize {
            let pattern: Vec<u8> = (0..1024)
                .map(|j| (i + j + round as usize) as u8 & 0x7f)
                .collect();
            src.write(i * 1024, &pattern).unwrap();
            b.qp.post_send(&[softrdma::verbs::SendWr {
                wr_id: i as u64,
                op: SendOp::RdmaWrite {
                    remote_addr: va + (i * 1024) as u64,
                    rkey,
                },
                sg_list: &[sge(&src, i * 1024, 1024)],
                flags: softrdma::transport::SendFlags::SIGNALED,
            }])
            .unwrap();
            let wc = b.wait();
            assert_eq!(wc.status, WcStatus::Success, "legitimate WRITE {i}: {wc:?}");
        }
    }
    b.post_send(99, SendOp::Send, &[sge(&src, 0, 64)]);
    assert_eq!(b.wait().status, WcStatus::Success);
    let wc = a.wait();
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 1));

    stop.store(true, Ordering::Relaxed);
    sent += flood.join().unwrap();

    // Nothing forged landed: the region holds exactly the last legitimate pattern.
    let mut got = vec![0u8; MR_LEN];
    target.read(0, &mut got).unwrap();
    for i in 0..64usize {
        for j in 0..1024usize {
            let want = (i + j + 1) as u8 & 0x7f;
            assert_eq!(
                got[i * 1024 + j],
                want,
                "byte {} of the region",
                i * 1024 + j
            );
        }
    }
    let (sa, sb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    assert!(
        sa.rx_bad_source > 0 && sb.rx_bad_source > 0,
        "{sa:?} {sb:?}"
    );
    // Every forged datagram that arrived was counted as a bad source, none as anything else.
    assert!(sa.rx_bad_source + sb.rx_bad_source <= sent);
    assert_eq!(sa.rx_bad_icrc + sb.rx_bad_icrc, 0);
}

/// The control: the same forgery sent from the peer's own address (any port) is a valid packet
/// and lands. (A local process can do this; see docs/security.md.)
#[test]
fn the_same_forgery_from_the_peers_address_lands() {
    let (a, b) = pair();
    let target = a.mr(4096);
    let sock = UdpSocket::bind(SocketAddrV4::new(b.ctx.addr(), 0)).unwrap();
    let forged = vec![FORGED_BYTE; 1024];
    let mut buf = vec![0u8; 2048];
    let w = forged_write(a.qp.qp_num(), 200, target.addr(), target.rkey(), &forged);
    send_forged(&sock, a.ctx.addr(), &w, &mut buf);
    let t0 = std::time::Instant::now();
    let mut got = vec![0u8; 1024];
    loop {
        a.ctx.drive();
        target.read(0, &mut got).unwrap();
        if got == forged {
            break;
        }
        assert!(t0.elapsed() < WAIT, "the control forgery never landed");
        std::thread::yield_now();
    }
    assert_eq!(a.ctx.stats().unwrap().rx_bad_source, 0);
    drop(b);
}
