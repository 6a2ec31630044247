//! Unreliable Connected QPs through the Verbs API, over the loopback device: two contexts, one
//! UC QP each, connected as `ibv_uc_pingpong` connects them.

mod verbs_util;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use softrdma::transport::{
    AccessFlags, AddressVector, Mtu, PostError, QpAttr, QpCaps, QpError, QpState, SendFlags,
    SendOp, WcOpcode, WcStatus,
};
use softrdma::verbs::{QpInitAttr, QpType, QueuePair, SendWr, SrqInitAttr, VerbsError};
use softrdma::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use softrdma::wire::{icrc, Bth, Opcode, Packet, Psn, Reth, ROCE_V2_PORT};
use verbs_util::*;

/// One side with a UC QP (the verbs_util `End`, with `QpType::Uc`).
fn uc_end() -> End {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps::default(),
            qp_type: QpType::Uc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    End { ctx, pd, cq, qp }
}

/// RESET -> INIT -> RTR -> RTS toward `remote_qpn` at `remote_gid`, as ibv_uc_pingpong does.
fn uc_connect(
    qp: &QueuePair,
    local_psn: u32,
    remote_qpn: u32,
    remote_gid: [u8; 16],
    remote_psn: u32,
) {
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(remote_qpn),
        rq_psn: Some(remote_psn),
        ah_attr: Some(AddressVector {
            dgid: remote_gid,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(local_psn),
        ..Default::default()
    })
    .unwrap();
}

/// Two connected UC QPs: a starts at PSN 100, b at 200.
fn uc_pair() -> (End, End) {
    let a = uc_end();
    let b = uc_end();
    uc_connect(&a.qp, 100, b.qp.qp_num(), b.ctx.gid(), 200);
    uc_connect(&b.qp, 200, a.qp.qp_num(), a.ctx.gid(), 100);
    (a, b)
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn send_write_and_immediates_of_many_packets() {
    let (a, b) = uc_pair();
    assert_eq!(a.qp.qp_type(), QpType::Uc);
    let src = a.mr(64 * 1024);
    let dst = b.mr(64 * 1024);
    let data = pattern(7, 10_000);
    src.write(0, &data).unwrap();

    // SEND of 10 packets into a receive buffer.
    b.post_recv(1, &[sge(&dst, 0, 16 * 1024)]);
    a.post_send(10, SendOp::Send, &[sge(&src, 0, 10_000)]);
    let s = a.wait();
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.byte_len),
        (10, WcStatus::Success, WcOpcode::Send, 10_000)
    );
    let r = b.wait();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
        (1, WcStatus::Success, WcOpcode::Recv, 10_000, None)
    );
    assert_eq!(r.src_qp, a.qp.qp_num());
    let mut got = vec![0u8; 10_000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, data);

    // SEND_WITH_IMM of zero bytes.
    b.post_recv(2, &[]);
    a.post_send(11, SendOp::SendWithImm { imm: 0xfeed }, &[]);
    assert_eq!(a.wait().status, WcStatus::Success);
    let r = b.wait();
    assert_eq!((r.wr_id, r.byte_len, r.imm_data), (2, 0, Some(0xfeed)));

    // RDMA WRITE (no completion at b), then WRITE_WITH_IMM (one, with the whole length).
    a.post_send(
        12,
        SendOp::RdmaWrite {
            remote_addr: dst.addr() + 20_000,
            rkey: dst.rkey(),
        },
        &[sge(&src, 0, 10_000)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    b.post_recv(3, &[]);
    a.post_send(
        13,
        SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr() + 40_000,
            rkey: dst.rkey(),
            imm: 77,
        },
        &[sge(&src, 0, 5000), sge(&src, 5000, 5000)],
    );
    let s = a.wait();
    assert_eq!((s.wr_id, s.opcode), (13, WcOpcode::RdmaWrite));
    let r = b.wait();
    assert_eq!(
        (r.wr_id, r.opcode, r.byte_len, r.imm_data),
        (3, WcOpcode::RecvRdmaWithImm, 10_000, Some(77))
    );
    // The plain WRITE came before the WRITE_WITH_IMM on the same connection.
    for off in [20_000, 40_000] {
        dst.read(off, &mut got).unwrap();
        assert_eq!(got, data, "WRITE at {off}");
    }
    assert!(b.cq.poll_one().unwrap().is_none());
}

#[test]
fn a_send_with_no_receive_posted_is_dropped_and_the_next_arrives() {
    let (a, b) = uc_pair();
    let src = a.mr(4096);
    let dst = b.mr(4096);
    src.write(0, &pattern(1, 2000)).unwrap();
    // No receive WQE at b: the sender still completes successfully; b drops it silently.
    a.post_send(1, SendOp::Send, &[sge(&src, 0, 2000)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    std::thread::sleep(Duration::from_millis(100));
    assert!(b.cq.poll_one().unwrap().is_none());
    assert_eq!(b.qp.state().unwrap(), QpState::Rts);
    // The next one finds a WQE.
    b.post_recv(5, &[sge(&dst, 0, 4096)]);
    src.write(0, &pattern(2, 2000)).unwrap();
    a.post_send(2, SendOp::Send, &[sge(&src, 0, 2000)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    let r = b.wait();
    assert_eq!((r.wr_id, r.byte_len), (5, 2000));
    let mut got = vec![0u8; 2000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(2, 2000));
}

#[test]
fn read_and_atomics_are_refused_with_einval() {
    let (a, b) = uc_pair();
    let src = a.mr(4096);
    let dst = b.mr(4096);
    b.post_recv(1, &[sge(&dst, 0, 64)]);
    let send = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[sge(&src, 0, 8)],
        flags: SendFlags::SIGNALED,
    };
    for op in [
        SendOp::RdmaRead {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        },
        SendOp::FetchAdd {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
            add: 1,
        },
        SendOp::CompareSwap {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
            compare: 0,
            swap: 1,
        },
    ] {
        let bad = SendWr {
            wr_id: 2,
            op,
            ..send.clone()
        };
        let e = a.qp.post_send(&[bad]).unwrap_err();
        assert!(
            matches!(
                e,
                VerbsError::Post {
                    index: 0,
                    error: PostError::UnsupportedOp
                }
            ),
            "{op:?}: {e:?}"
        );
        assert_eq!(e.errno(), libc::EINVAL);
    }
    // In a list: the SEND before it is posted, bad_wr is the READ.
    let read = SendWr {
        wr_id: 3,
        op: SendOp::RdmaRead {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        },
        ..send.clone()
    };
    let e = a.qp.post_send(&[send, read]).unwrap_err();
    assert_eq!(e.bad_wr(), Some(1));
    assert_eq!(a.wait().wr_id, 1);
    assert_eq!(b.wait().wr_id, 1);
    assert_eq!(a.qp.state().unwrap(), QpState::Rts);
}

#[test]
fn rc_only_attributes_are_refused_and_query_shows_uc_ones() {
    let a = uc_end();
    let b = uc_end();
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
        ..Default::default()
    })
    .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu2048),
        dest_qp_num: Some(b.qp.qp_num()),
        rq_psn: Some(0x1234),
        ah_attr: Some(AddressVector {
            dgid: b.ctx.gid(),
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    // ibv_rc_pingpong's RTR attributes on a UC QP: EINVAL.
    let e =
        a.qp.modify(&QpAttr {
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..rtr
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Qp(QpError::UnexpectedAttr("min_rnr_timer"))
                | VerbsError::Qp(QpError::UnexpectedAttr("max_dest_rd_atomic"))
        ),
        "{e:?}"
    );
    assert_eq!(e.errno(), libc::EINVAL);
    a.qp.modify(&rtr).unwrap();
    let e =
        a.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0x55),
            timeout: Some(14),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0x55),
        ..Default::default()
    })
    .unwrap();
    let q = a.qp.query().unwrap();
    assert_eq!(q.qp_state, Some(QpState::Rts));
    assert_eq!(q.path_mtu, Some(Mtu::Mtu2048));
    assert_eq!(q.dest_qp_num, Some(b.qp.qp_num()));
    assert_eq!((q.rq_psn, q.sq_psn), (Some(0x1234), Some(0x55)));
    assert_eq!(q.qp_access_flags, Some(AccessFlags::REMOTE_WRITE));
    assert_eq!(
        (q.timeout, q.retry_cnt, q.max_rd_atomic),
        (None, None, None)
    );
}

/// A UC RDMA WRITE ONLY, emitted with a valid ICRC for `sock`'s address, sent to `dst`:4791.
fn send_uc_write(sock: &UdpSocket, dst: Ipv4Addr, qpn: u32, psn: u32, va: u64, rkey: u32) {
    let payload = [0xeeu8; 256];
    let mut p = Packet::new(
        Bth::new(Opcode::UC_RDMA_WRITE_ONLY, qpn, Psn::new(psn)),
        &payload,
    );
    p.reth = Some(Reth {
        va,
        rkey,
        dma_len: payload.len() as u32,
    });
    let mut buf = [0u8; 1024];
    let n = p.emit(&mut buf).unwrap();
    let std::net::SocketAddr::V4(src) = sock.local_addr().unwrap() else {
        unreachable!()
    };
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    Ipv4Udp::new(*src.ip(), src.port(), dst, ROCE_V2_PORT, n).emit(&mut hdr);
    icrc::fill_v4(&hdr, &mut buf[..n]);
    sock.send_to(&buf[..n], SocketAddrV4::new(dst, ROCE_V2_PORT))
        .unwrap();
}

#[test]
fn uc_packets_are_taken_from_the_peer_only() {
    let (a, b) = uc_pair();
    let target = a.mr(4096);
    let (a_ip, b_ip) = (a.ctx.addr(), b.ctx.addr());
    let before = a.ctx.stats().unwrap().rx_bad_source;
    // From another loopback address, at exactly the PSN a expects: dropped and counted.
    let stranger = (150..=250u8)
        .rev()
        .map(|l| Ipv4Addr::new(127, 0, 0, l))
        .filter(|ip| *ip != a_ip && *ip != b_ip)
        .find_map(|ip| UdpSocket::bind(SocketAddrV4::new(ip, 0)).ok())
        .expect("a loopback address for the stranger");
    send_uc_write(
        &stranger,
        a_ip,
        a.qp.qp_num(),
        200,
        target.addr(),
        target.rkey(),
    );
    let t0 = Instant::now();
    while a.ctx.stats().unwrap().rx_bad_source == before {
        assert!(t0.elapsed() < WAIT, "the forged packet was never counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut got = vec![0u8; 256];
    target.read(0, &mut got).unwrap();
    assert_eq!(got, vec![0; 256], "a stranger's WRITE landed");
    // The control: the same packet from the peer's address (any port) lands.
    let peer = UdpSocket::bind(SocketAddrV4::new(b_ip, 0)).unwrap();
    send_uc_write(
        &peer,
        a_ip,
        a.qp.qp_num(),
        200,
        target.addr(),
        target.rkey(),
    );
    let t0 = Instant::now();
    loop {
        target.read(0, &mut got).unwrap();
        if got == vec![0xee; 256] {
            break;
        }
        assert!(t0.elapsed() < WAIT, "the peer's WRITE never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_uc_qps_on_one_shared_receive_queue() {
    // b's two UC QPs take their receive WQEs from one SRQ; a1 and a2 send to them.
    let b_ctx = loopback_ctx();
    let b_pd = b_ctx.alloc_pd().unwrap();
    let b_cq = b_ctx.create_cq(64, None).unwrap();
    let srq = b_pd
        .create_srq(SrqInitAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let b_qp = || {
        b_pd.create_qp(&QpInitAttr {
            send_cq: &b_cq,
            recv_cq: &b_cq,
            cap: QpCaps::default(),
            qp_type: QpType::Uc,
            sq_sig_all: false,
            srq: Some(&srq),
        })
        .unwrap()
    };
    let b = [b_qp(), b_qp()];
    assert!(b[0].has_srq());
    let a = [uc_end(), uc_end()];
    let b_dst = b_pd.alloc_mr(64 * 1024, ALL).unwrap();
    for (ai, bi) in a.iter().zip(&b) {
        uc_connect(&ai.qp, 100, bi.qp_num(), b_ctx.gid(), 200);
        uc_connect(bi, 200, ai.qp.qp_num(), ai.ctx.gid(), 100);
    }
    let sges: Vec<_> = (0..4)
        .map(|k| sge(&b_dst, k * 16 * 1024, 16 * 1024))
        .collect();
    for (k, s) in sges.iter().enumerate() {
        srq.post_recv(&[softrdma::verbs::RecvWr {
            wr_id: k as u64,
            sg_list: std::slice::from_ref(s),
        }])
        .unwrap();
    }
    for (i, ai) in a.iter().enumerate() {
        let src = ai.mr(16 * 1024);
        src.write(0, &pattern(i as u8, 5000)).unwrap();
        ai.post_send(i as u64, SendOp::Send, &[sge(&src, 0, 5000)]);
        assert_eq!(ai.wait().status, WcStatus::Success);
        let r = wait_cq(&b_cq);
        assert_eq!(
            (r.status, r.wr_id, r.byte_len, r.qp_num, r.src_qp),
            (
                WcStatus::Success,
                i as u64,
                5000,
                b[i].qp_num(),
                ai.qp.qp_num()
            )
        );
        let mut got = vec![0u8; 5000];
        b_dst.read(i * 16 * 1024, &mut got).unwrap();
        assert_eq!(got, pattern(i as u8, 5000));
    }
    assert_eq!(srq.posted().unwrap(), 2);
}
