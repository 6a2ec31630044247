//! RoCEv2 over IPv6 through the Verbs API, between two contexts on the loopback device: its
//! GID table (IPv4-mapped at 0 and 1, `::1` after them), RC SEND / WRITE / READ / atomics and
//! UD SEND with an IPv6 address handle (the GRH area is the IPv6 header, the completion's AH
//! answers from `::1`), IPv4 and IPv6 QPs of the same contexts at the same time, and the
//! address checks. Each test returns early (with a note) where the host has IPv6 disabled.
mod verbs_util;

use std::net::{IpAddr, Ipv6Addr};

use softrdma::transport::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, WcOpcode, WcStatus,
};
use softrdma::verbs::{
    gid_from_ipv4, AhAttr, Context, QpInitAttr, QpType, RecvWr, UdSendWr, VerbsError, GRH_LEN,
};
use verbs_util::{loopback_ctx, sge, wait_cq, End};

const V6_LOOPBACK: [u8; 16] = Ipv6Addr::LOCALHOST.octets();
/// `::1` in the loopback device's GID table: after the IPv4-mapped GID at 0 and 1.
const GID_V6: u8 = 2;

/// The loopback device with `::1` bound, or `None` (said on stderr) where IPv6 is off.
fn v6_ctx() -> Option<Context> {
    let off = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map_or(true, |s| s.trim() == "1");
    if off {
        eprintln!("IPv6 is disabled on this host: skipped");
        return None;
    }
    let ctx = loopback_ctx();
    if ctx.query_gid(1, GID_V6).ok() != Some(V6_LOOPBACK) {
        eprintln!("the loopback device has no ::1 (IPv6 off on lo?): skipped");
        return None;
    }
    Some(ctx)
}

/// RESET -> INIT -> RTR -> RTS towards `remote`'s QP at `gid`, sent from GID `sgid_index`.
fn connect(e: &End, sgid_index: u8, local_psn: u32, remote: &End, remote_psn: u32, gid: [u8; 16]) {
    verbs_util::connect_from(
        &e.qp,
        sgid_index,
        local_psn,
        remote.qp.qp_num(),
        remote_psn,
        gid,
    );
}

/// Two RC QPs on two contexts, connected over `::1`.
fn v6_pair() -> Option<(End, End)> {
    let a = End::new(v6_ctx()?);
    let b = End::new(v6_ctx()?);
    connect(&a, GID_V6, 100, &b, 200, V6_LOOPBACK);
    connect(&b, GID_V6, 200, &a, 100, V6_LOOPBACK);
    Some((a, b))
}

#[test]
fn gid_table_lists_the_ipv4_mapped_gid_then_the_ipv6_addresses() {
    let Some(ctx) = v6_ctx() else { return };
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.gid_tbl_len, 3);
    let v4 = gid_from_ipv4(ctx.addr());
    assert!(ctx.addr().is_loopback());
    assert_eq!(ctx.query_gid(1, 0).unwrap(), v4);
    assert_eq!(ctx.query_gid(1, 1).unwrap(), v4);
    assert_eq!(ctx.query_gid(1, 2).unwrap(), V6_LOOPBACK);
    assert!(ctx.query_gid(1, 3).is_err());
    assert_eq!(ctx.gid(), v4);
    assert_eq!(ctx.gid_index(&V6_LOOPBACK), Some(2));
    assert_eq!(ctx.gid_index(&v4), Some(0));
    assert_eq!(
        ctx.ip_addrs(),
        vec![IpAddr::V4(ctx.addr()), IpAddr::V6(Ipv6Addr::LOCALHOST)]
    );
    // Every device lists its addresses the same way: the IPv4-mapped GID twice (when it has
    // an IPv4 address), then each IPv6 address (global ones, then link-local ones).
    for d in softrdma::devices().unwrap() {
        let mut want: Vec<[u8; 16]> = Vec::new();
        if let Some(a) = d.ipv4() {
            want.extend([gid_from_ipv4(a); 2]);
        }
        for a in d.ipv6_addrs() {
            want.push(a.octets());
        }
        if d.ipv4().is_none() {
            want.insert(0, want[0]);
        }
        assert!(d.ipv6_addrs().iter().all(|a| !a.is_unspecified()), "{d:?}");
        let Ok(c) = d.open() else { continue };
        let got: Vec<[u8; 16]> = (0..c.query_port(1).unwrap().gid_tbl_len as u8)
            .map(|i| c.query_gid(1, i).unwrap())
            .collect();
        // A loopback context may have moved to another 127.x (the table shows the one it got).
        if !d.is_loopback() {
            assert_eq!(got, want, "{d:?}");
        }
    }
}

#[test]
fn rc_send_write_read_and_atomics_over_ipv6() {
    let Some((a, b)) = v6_pair() else { return };
    let (ma, mb) = (a.mr(8192), b.mr(8192));
    let before = b.ctx.stats().unwrap().rx_icrc_v6;

    // SEND, two packets of a 1024-byte path MTU and then some.
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    ma.write(0, &msg).unwrap();
    b.post_recv(1, &[sge(&mb, 0, 4096)]);
    a.post_send(2, SendOp::Send, &[sge(&ma, 0, msg.len())]);
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 3000)
    );
    assert_eq!(&mb.lock().unwrap()[..3000], &msg[..]);

    // WRITE into b, READ it back into a.
    ma.write(4096, b"written over IPv6").unwrap();
    a.post_send(
        3,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 5000,
            rkey: mb.rkey(),
        },
        &[sge(&ma, 4096, 17)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&mb.lock().unwrap()[5000..5017], b"written over IPv6");
    a.post_send(
        4,
        SendOp::RdmaRead {
            remote_addr: mb.addr() + 5000,
            rkey: mb.rkey(),
        },
        &[sge(&ma, 6000, 17)],
    );
    let wc = a.wait();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(&ma.lock().unwrap()[6000..6017], b"written over IPv6");

    // Atomics on an 8-byte word of b.
    mb.write(7000, &41u64.to_ne_bytes()).unwrap();
    a.post_send(
        5,
        SendOp::FetchAdd {
            remote_addr: mb.addr() + 7000,
            rkey: mb.rkey(),
            add: 1,
        },
        &[sge(&ma, 7000, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(ma.lock().unwrap()[7000..7008], 41u64.to_ne_bytes());
    a.post_send(
        6,
        SendOp::CompareSwap {
            remote_addr: mb.addr() + 7000,
            rkey: mb.rkey(),
            compare: 42,
            swap: 0x1234_5678_9abc,
        },
        &[sge(&ma, 7008, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(ma.lock().unwrap()[7008..7016], 42u64.to_ne_bytes());
    assert_eq!(
        mb.lock().unwrap()[7000..7008],
        0x1234_5678_9abcu64.to_ne_bytes()
    );

    // The traffic went over IPv6 (and no ICRC failed).
    let sb = b.ctx.stats().unwrap();
    assert!(sb.rx_icrc_v6 > before, "{sb:?}");
    assert_eq!(sb.rx_bad_icrc, 0);
    assert_eq!(sb.rx_bad_source, 0);
}

#[test]
fn ipv4_and_ipv6_qps_of_the_same_contexts_at_once() {
    let Some(ca) = v6_ctx() else { return };
    let Some(cb) = v6_ctx() else { return };
    let (a4, b4) = (End::new(ca.clone()), End::new(cb.clone()));
    let (a6, b6) = (End::new(ca), End::new(cb));
    connect(&a4, 0, 1, &b4, 2, b4.ctx.gid());
    connect(&b4, 1, 2, &a4, 1, a4.ctx.gid());
    connect(&a6, GID_V6, 3, &b6, 4, V6_LOOPBACK);
    connect(&b6, GID_V6, 4, &a6, 3, V6_LOOPBACK);
    let (m4, m6) = (b4.mr(4096), b6.mr(4096));
    let (s4, s6) = (a4.mr(4096), a6.mr(4096));
    let v4_before = b4.ctx.stats().unwrap();
    // Both at once, many times: each QP's messages arrive on its own family's socket.
    for round in 0..20u8 {
        s4.write(0, &[round; 64]).unwrap();
        s6.write(0, &[round ^ 0xff; 64]).unwrap();
        a4.post_send(
            1,
            SendOp::RdmaWrite {
                remote_addr: m4.addr(),
                rkey: m4.rkey(),
            },
            &[sge(&s4, 0, 64)],
        );
        a6.post_send(
            2,
            SendOp::RdmaWrite {
                remote_addr: m6.addr(),
                rkey: m6.rkey(),
            },
            &[sge(&s6, 0, 64)],
        );
        assert_eq!(a4.wait().status, WcStatus::Success);
        assert_eq!(a6.wait().status, WcStatus::Success);
        assert_eq!(m4.lock().unwrap()[..64], [round; 64]);
        assert_eq!(m6.lock().unwrap()[..64], [round ^ 0xff; 64]);
    }
    let after = b4.ctx.stats().unwrap();
    // b's context received IPv4 traffic (the v4 QP) and IPv6 traffic (the v6 QP).
    assert!(after.rx_icrc_id0 > v4_before.rx_icrc_id0, "{after:?}");
    assert!(after.rx_icrc_v6 > v4_before.rx_icrc_v6, "{after:?}");
    assert_eq!(after.rx_bad_source, 0);
}

#[test]
fn a_connected_qp_takes_packets_from_its_peer_address_only() {
    let Some((a, b)) = v6_pair() else { return };
    // A third QP, on b's context, connected to `a` over IPv4: a's QP (connected over IPv6)
    // must drop what comes from a's IPv4 address although the QPN is right.
    let c = End::new(b.ctx.clone());
    connect(&c, 0, 200, &a, 100, a.ctx.gid());
    let (ma, mc) = (a.mr(64), c.mr(64));
    let bad_before = a.ctx.stats().unwrap().rx_bad_source;
    a.post_recv(1, &[sge(&ma, 0, 64)]);
    // c's SEND carries PSN 200, which a's QP expects; it comes from 127.0.0.x, not ::1.
    c.qp.post_send(&[softrdma::verbs::SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sg_list: &[sge(&mc, 0, 8)],
        flags: SendFlags::default(),
    }])
    .unwrap();
    let t0 = std::time::Instant::now();
    while a.ctx.stats().unwrap().rx_bad_source == bad_before {
        assert!(
            t0.elapsed() < verbs_util::WAIT,
            "the forged SEND never arrived"
        );
        a.ctx.drive();
        std::thread::yield_now();
    }
    let mut wc = [Default::default()];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "no completion for it");
    // The real peer, over IPv6, still gets through.
    b.post_send(2, SendOp::Send, &[sge(&b.mr(64), 0, 8)]);
    assert_eq!(b.wait().status, WcStatus::Success);
    assert_eq!(a.wait().status, WcStatus::Success);
}

#[test]
fn ud_send_over_ipv6_with_the_ipv6_header_as_grh() {
    let Some(ca) = v6_ctx() else { return };
    let Some(cb) = v6_ctx() else { return };
    let (pa, qa_cq, qa, ma) = ud_end(&ca);
    let (pb, qb_cq, qb, mb) = ud_end(&cb);
    let ah = pa
        .create_ah(&AhAttr {
            dgid: V6_LOOPBACK,
            sgid_index: GID_V6,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    ma.write(0, b"datagram over IPv6").unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[sge(&mb, 0, 1024)],
    }])
    .unwrap();
    let send = |qp: &softrdma::verbs::QueuePair, mr, ah, qpn, len| {
        qp.post_send_ud(&[UdSendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[sge(mr, 0, len)],
            flags: SendFlags::default(),
            ah,
            remote_qpn: qpn,
            remote_qkey: 0x11,
        }])
        .unwrap()
    };
    send(&qa, &ma, &ah, qb.qp_num(), 18);
    assert_eq!(wait_cq(&qa_cq).status, WcStatus::Success);
    let wc = wait_cq(&qb_cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.src_qp),
        (7, WcStatus::Success, (GRH_LEN + 18) as u32, qa.qp_num())
    );
    let grh = wc.grh.expect("a GRH");
    assert_eq!((grh.sgid, grh.dgid), (V6_LOOPBACK, V6_LOOPBACK));
    {
        let m = mb.lock().unwrap();
        assert_eq!(&m[GRH_LEN..GRH_LEN + 18], b"datagram over IPv6");
        // The GRH area is the IPv6 header as it arrived (rxe copies ipv6_hdr(skb)).
        let h = &m[..GRH_LEN];
        assert_eq!(h[0] >> 4, 6, "version");
        // Payload length: UDP header, BTH, DETH, payload, ICRC.
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 8 + 12 + 8 + 20 + 4);
        assert_eq!(h[6], 17, "next header: UDP");
        assert_eq!(h[7], grh.hop_limit);
        assert_ne!(h[7], 0);
        assert_eq!(&h[8..24], &V6_LOOPBACK);
        assert_eq!(&h[24..40], &V6_LOOPBACK);
    }
    // The reply goes to the sender from the address the datagram came to (GID 2).
    let reply = pb.create_ah_from_wc(1, &wc).unwrap();
    assert_eq!(
        (reply.attr().dgid, reply.attr().sgid_index),
        (V6_LOOPBACK, GID_V6)
    );
    qa.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: &[sge(&ma, 4096, 1024)],
    }])
    .unwrap();
    mb.write(2000, b"reply").unwrap();
    qb.post_send_ud(&[UdSendWr {
        wr_id: 2,
        op: SendOp::SendWithImm { imm: 5 },
        sg_list: &[sge(&mb, 2000, 5)],
        flags: SendFlags::default(),
        ah: &reply,
        remote_qpn: wc.src_qp,
        remote_qkey: 0x11,
    }])
    .unwrap();
    assert_eq!(wait_cq(&qb_cq).status, WcStatus::Success);
    let wc = wait_cq(&qa_cq);
    assert_eq!((wc.wr_id, wc.imm_data), (8, Some(5)));
    assert_eq!(
        &ma.lock().unwrap()[4096 + GRH_LEN..4096 + GRH_LEN + 5],
        b"reply"
    );
    assert!(cb.stats().unwrap().rx_icrc_v6 > 0);
}

/// A UD QP in RTS with Q_Key 0x11, its CQ and an 8 KiB MR.
fn ud_end(
    ctx: &Context,
) -> (
    softrdma::verbs::ProtectionDomain,
    softrdma::verbs::CompletionQueue,
    softrdma::verbs::QueuePair,
    softrdma::verbs::MemoryRegion,
) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps::default(),
            qp_type: QpType::Ud,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    for a in [
        QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qkey: Some(0x11),
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0),
            ..Default::default()
        },
    ] {
        qp.modify(&a).unwrap();
    }
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    (pd, cq, qp, mr)
}

/// On a device with several IPv6 addresses (a global and a link-local one, say), `sgid_index`
/// picks the source: a datagram sent from GID `i` to GID `i` arrives from that address. A
/// link-local destination is reached on the device's interface.
#[test]
fn sgid_index_picks_the_source_address() {
    if v6_ctx().is_none() {
        return;
    }
    let Some(d) = softrdma::devices()
        .unwrap()
        .into_iter()
        .find(|d| !d.is_loopback() && d.ipv6_addrs().len() >= 2)
    else {
        eprintln!("no device with two IPv6 addresses: skipped");
        return;
    };
    let (Ok(ca), Ok(cb)) = (d.open(), d.open()) else {
        eprintln!("{} cannot be opened: skipped", d.name());
        return;
    };
    let (pa, _, qa, ma) = ud_end(&ca);
    let (_, cq_b, qb, mb) = ud_end(&cb);
    let len = ca.query_port(1).unwrap().gid_tbl_len as u8;
    let mut tried = 0;
    for i in 0..len {
        let gid = ca.query_gid(1, i).unwrap();
        // The GIDs of addresses both contexts got (a tentative address may be missing).
        if cb.gid_index(&gid).is_none() {
            continue;
        }
        let ah = pa
            .create_ah(&AhAttr {
                dgid: gid,
                sgid_index: i,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            })
            .unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[sge(&mb, 0, 1024)],
        }])
        .unwrap();
        qa.post_send_ud(&[UdSendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            sg_list: &[sge(&ma, 0, 8)],
            flags: SendFlags::default(),
            ah: &ah,
            remote_qpn: qb.qp_num(),
            remote_qkey: 0x11,
        }])
        .unwrap();
        let wc = wait_cq(&cq_b);
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        let grh = wc.grh.unwrap();
        assert_eq!((grh.sgid, grh.dgid), (gid, gid), "GID {i}");
        tried += 1;
    }
    assert!(tried >= 3, "{tried} GIDs of {len}");
}

#[test]
fn address_checks_follow_the_gid_table() {
    let Some(ctx) = v6_ctx() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let ok = AhAttr {
        dgid: V6_LOOPBACK,
        sgid_index: GID_V6,
        port_num: 1,
        ..Default::default()
    };
    assert_eq!(pd.create_ah(&ok).unwrap().attr(), ok);
    // Past the table.
    let e = pd.create_ah(&AhAttr {
        sgid_index: 3,
        ..ok
    });
    assert!(matches!(e, Err(VerbsError::InvalidArgument(_))), "{e:?}");
    // A zero GID is no address.
    assert!(pd
        .create_ah(&AhAttr {
            dgid: [0; 16],
            ..ok
        })
        .is_err());
    // A QP's path is checked the same way at RTR.
    let e = End::new(ctx);
    e.qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::NONE),
        ..Default::default()
    })
    .unwrap();
    let rtr = |sgid_index| QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(0x12),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(1),
        ah_attr: Some(AddressVector {
            dgid: V6_LOOPBACK,
            sgid_index,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(matches!(
        e.qp.modify(&rtr(9)),
        Err(VerbsError::InvalidArgument(_))
    ));
    e.qp.modify(&rtr(GID_V6)).unwrap();
    assert_eq!(e.qp.query().unwrap().ah_attr.unwrap().dgid, V6_LOOPBACK);
}

/// rdma_rxe sends RoCEv2 over IPv6 with a zero UDP checksum (its tunnel socket computes none;
/// the ICRC covers the packet), which a plain UDP socket drops. A UD SEND sent so, from an
/// ordinary socket with `UDP_NO_CHECK6_TX`, with rxe's ICRC over its IPv6 header, arrives.
#[test]
fn a_datagram_with_rxes_zero_udp_checksum_arrives() {
    use softrdma::wire::ipv4::UDP_LEN;
    use softrdma::wire::ipv6::{Ipv6Udp, IPV6_LEN};
    use softrdma::wire::{icrc, Bth, Deth, Opcode, Packet, Psn, ROCE_V2_PORT};
    use std::os::fd::AsRawFd;

    let Some(ctx) = v6_ctx() else { return };
    let (_pd, cq, qp, mr) = ud_end(&ctx);
    qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[sge(&mr, 0, 1024)],
    }])
    .unwrap();
    let tx = std::net::UdpSocket::bind("[::1]:0").unwrap();
    const UDP_NO_CHECK6_TX: libc::c_int = 101;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads an int from a live local.
    let r = unsafe {
        libc::setsockopt(
            tx.as_raw_fd(),
            libc::SOL_UDP,
            UDP_NO_CHECK6_TX,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    let mut p = Packet::new(
        Bth::new(Opcode::UD_SEND_ONLY, qp.qp_num(), Psn::new(7)),
        b"zero",
    );
    p.deth = Some(Deth {
        qkey: 0x11,
        resv8: 0,
        src_qpn: 0x42,
    });
    let mut buf = [0u8; 256];
    let n = p.emit(&mut buf).unwrap();
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    let port = tx.local_addr().unwrap().port();
    Ipv6Udp::new(
        Ipv6Addr::LOCALHOST,
        port,
        Ipv6Addr::LOCALHOST,
        ROCE_V2_PORT,
        n,
    )
    .emit(&mut hdr);
    icrc::fill_v6(&hdr, &mut buf[..n]);
    // The datagram (and its retries: a loaded host may drop one) carries checksum 0 on `lo`.
    let t0 = std::time::Instant::now();
    let wc = loop {
        tx.send_to(&buf[..n], ("::1", ROCE_V2_PORT)).unwrap();
        let mut wc = [Default::default()];
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while std::time::Instant::now() < until && cq.poll(&mut wc).unwrap() == 0 {
            std::thread::yield_now();
        }
        if wc[0].wr_id == 5 {
            break wc[0];
        }
        assert!(
            t0.elapsed() < verbs_util::WAIT,
            "the datagram never arrived"
        );
    };
    assert_eq!((wc.status, wc.src_qp), (WcStatus::Success, 0x42));
    assert_eq!(&mr.lock().unwrap()[GRH_LEN..GRH_LEN + 4], b"zero");
}
