//! The sans-IO UD queue pair: state machine, DETH and Q_Key rules, the GRH area of receive
//! buffers, drops, and the UD packets ibv_ud_pingpong sent on kernel rdma_rxe (rxe-basic.pcap).

use softrdma::transport::sim::{recv_wr, send_wr, MemRegion, VecMemory};
use softrdma::transport::ud::*;
use softrdma::transport::*;
use softrdma::wire::deth::GSI_QKEY;
use softrdma::wire::ipv4::Ipv4Udp;
use softrdma::wire::pcap::PcapSlice;
use softrdma::wire::{Opcode, Packet, ROCE_V2_PORT};
use std::net::Ipv4Addr;

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const QKEY: u32 = 0x1111_1111;

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

fn to_rts(qp: &mut UdQp, qkey: u32) {
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qkey: Some(qkey),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0x123456),
        ..Default::default()
    })
    .unwrap();
}

fn v4_hdr(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> NetHeader {
    let mut b = [0u8; 28];
    Ipv4Udp::new(src, 0xc000, dst, ROCE_V2_PORT, len).emit(&mut b);
    net_header_v4(&b).unwrap()
}

fn dest(qpn: u32, qkey: u32) -> UdDest {
    let av = AddressVector {
        dgid: Ipv4Addr::new(10, 77, 0, 3).to_ipv6_mapped().octets(),
        port_num: 1,
        hop_limit: 64,
        ..Default::default()
    };
    UdDest {
        av,
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

struct Pair {
    mem: VecMemory,
    a: UdQp,
    b: UdQp,
    mr_a: MemRegion,
    mr_b: MemRegion,
}

fn pair() -> Pair {
    let mem = VecMemory::new();
    let mr_a = mem.register(8192, rw());
    let mr_b = mem.register(8192, rw());
    let mut a = UdQp::new(0x11, QpCaps::default(), false, Mtu::Mtu1024);
    let mut b = UdQp::new(0x12, QpCaps::default(), false, Mtu::Mtu1024);
    to_rts(&mut a, QKEY);
    to_rts(&mut b, QKEY);
    Pair {
        mem,
        a,
        b,
        mr_a,
        mr_b,
    }
}

/// Send one packet from `a` and return its bytes.
fn xmit(p: &mut Pair) -> (Vec<u8>, UdTransmit) {
    let mut buf = vec![0u8; 2048];
    let t = p.a.poll_transmit(&p.mem, &mut buf).expect("a packet");
    buf.truncate(t.len);
    (buf, t)
}

#[test]
fn state_machine_and_attribute_rules() {
    let mut qp = UdQp::new(5, QpCaps::default(), false, Mtu::Mtu1024);
    let w = send_wr(1, SendOp::Send, vec![]);
    assert_eq!(
        qp.post_send(w.clone(), dest(6, QKEY)),
        Err(PostError::InvalidState(QpState::Reset))
    );
    assert!(qp.post_recv(recv_wr(1, vec![])).is_err());
    // RESET->INIT needs the Q_Key.
    assert_eq!(
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            ..Default::default()
        }),
        Err(QpError::MissingAttr("qkey"))
    );
    // RC-only attributes are refused.
    assert_eq!(
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qkey: Some(QKEY),
            dest_qp_num: Some(3),
            ..Default::default()
        }),
        Err(QpError::UnexpectedAttr("dest_qp_num"))
    );
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qkey: Some(QKEY),
        ..Default::default()
    })
    .unwrap();
    qp.post_recv(recv_wr(1, vec![])).unwrap();
    assert!(qp.post_send(w.clone(), dest(6, QKEY)).is_err());
    assert_eq!(
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0),
            ..Default::default()
        }),
        Err(QpError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Rts
        })
    );
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            ..Default::default()
        }),
        Err(QpError::MissingAttr("sq_psn"))
    );
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(7),
        qkey: Some(0x42),
        ..Default::default()
    })
    .unwrap();
    let q = qp.query();
    assert_eq!(
        (q.qp_state, q.qkey, q.sq_psn),
        (Some(QpState::Rts), Some(0x42), Some(7))
    );
    qp.post_send(w, dest(6, QKEY)).unwrap();
    // To ERR: everything outstanding is flushed.
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    let mut flushed = Vec::new();
    while let Some(c) = qp.poll_completion() {
        assert_eq!(c.wc.status, WcStatus::WrFlushErr);
        flushed.push(c.wc.side);
    }
    assert_eq!(flushed, vec![CqSide::Send, CqSide::Recv]);
    // The GSI QP keeps the GSI Q_Key.
    let mut gsi = UdQp::new(1, QpCaps::default(), false, Mtu::Mtu1024);
    to_rts(&mut gsi, 5);
    assert_eq!(gsi.qkey(), GSI_QKEY);
}

#[test]
fn send_builds_deth_packets_and_receive_fills_grh_then_payload() {
    let mut p = pair();
    let data: Vec<u8> = (0..100u8).collect();
    p.mem.write(p.mr_a.addr, &data);
    p.a.post_send(
        send_wr(7, SendOp::Send, vec![p.mr_a.sge(0, 100)]),
        dest(0x12, QKEY),
    )
    .unwrap();
    let mut w2 = send_wr(
        8,
        SendOp::SendWithImm { imm: 0xdead_beef },
        vec![p.mr_a.sge(0, 3)],
    );
    w2.flags.insert(SendFlags::SOLICITED);
    p.a.post_send(w2, dest(0x12, QKEY)).unwrap();

    let (b1, t1) = xmit(&mut p);
    assert_eq!((t1.dest_qpn, t1.av.dgid), (0x12, dest(0, 0).av.dgid));
    let pk = Packet::parse(&b1).unwrap();
    assert_eq!(pk.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!((pk.bth.dest_qpn, pk.bth.psn.value()), (0x12, 0x123456));
    assert_eq!(b1.len(), 12 + 8 + 100 + 4);
    let d = pk.deth.unwrap();
    assert_eq!((d.qkey, d.src_qpn), (QKEY, 0x11));
    assert_eq!(pk.payload, &data[..]);
    let (b2, _) = xmit(&mut p);
    let pk2 = Packet::parse(&b2).unwrap();
    assert_eq!(pk2.bth.opcode, Opcode::UD_SEND_ONLY_WITH_IMMEDIATE);
    assert_eq!(pk2.bth.psn.value(), 0x123457);
    assert_eq!((pk2.bth.pad_count, pk2.immdt), (1, Some(0xdead_beef)));
    assert!(pk2.bth.solicited);
    assert!(p.a.poll_transmit(&p.mem, &mut [0u8; 2048]).is_none());
    let sends: Vec<_> = std::iter::from_fn(|| p.a.poll_completion()).collect();
    assert_eq!(sends.len(), 2);
    assert_eq!(
        (sends[0].wc.wr_id, sends[0].wc.byte_len, sends[0].wc.side),
        (7, 100, CqSide::Send)
    );
    assert!(!sends[0].grh);

    // Receive: two buffers, the first split over two SGEs to check scattering across them.
    p.b.post_recv(recv_wr(1, vec![p.mr_b.sge(0, 30), p.mr_b.sge(1000, 200)]))
        .unwrap();
    p.b.post_recv(recv_wr(2, vec![p.mr_b.sge(4000, 1064)]))
        .unwrap();
    let net = v4_hdr(A, B, b1.len());
    p.b.handle_packet(&pk, &net, &p.mem);
    p.b.handle_packet(&pk2, &net, &p.mem);
    let c1 = p.b.poll_completion().unwrap();
    assert_eq!(c1.wc.status, WcStatus::Success);
    assert_eq!(
        (c1.wc.wr_id, c1.wc.byte_len, c1.wc.src_qp, c1.wc.qp_num),
        (1, 140, 0x11, 0x12)
    );
    assert_eq!((c1.wc.opcode, c1.wc.imm_data), (WcOpcode::Recv, None));
    assert!(c1.grh);
    assert_eq!(c1.network_type, Some(NetworkType::Ipv4));
    assert_eq!(c1.sgid, A.to_ipv6_mapped().octets());
    let mut got = p.mem.read(p.mr_b.addr, 30);
    got.extend(p.mem.read(p.mr_b.addr + 1000, 110));
    assert_eq!(
        &got[..20],
        &[0u8; 20],
        "first 20 bytes of the GRH area are zero"
    );
    let NetHeader::V4(ip) = net else { panic!() };
    assert_eq!(&got[20..40], &ip[..], "the IPv4 header fills bytes 20..40");
    assert_eq!(&got[40..], &data[..]);
    let c2 = p.b.poll_completion().unwrap();
    assert_eq!(
        (c2.wc.wr_id, c2.wc.byte_len, c2.wc.imm_data, c2.wc.solicited),
        (2, 43, Some(0xdead_beef), true)
    );
    assert_eq!(p.mem.read(p.mr_b.addr + 4040, 3), data[..3].to_vec());
    // Reply address from the completion.
    let av = c1.reply_av(1, 0);
    assert_eq!(av.dgid, A.to_ipv6_mapped().octets());
    assert!(p.b.poll_completion().is_none());
}

#[test]
fn qkey_rules_and_drops() {
    let mut p = pair();
    // A WR Q_Key with the high bit set means "use the QP's own Q_Key".
    p.a.post_send(
        send_wr(1, SendOp::Send, vec![p.mr_a.sge(0, 8)]),
        dest(0x12, 0x8000_0000),
    )
    .unwrap();
    p.a.post_send(
        send_wr(2, SendOp::Send, vec![p.mr_a.sge(0, 8)]),
        dest(0x12, 0x2222),
    )
    .unwrap();
    let (good, _) = xmit(&mut p);
    let (bad, _) = xmit(&mut p);
    let good = Packet::parse(&good).unwrap();
    let bad = Packet::parse(&bad).unwrap();
    assert_eq!(good.deth.unwrap().qkey, QKEY);
    assert_eq!(bad.deth.unwrap().qkey, 0x2222);
    let net = v4_hdr(A, B, 40);
    // No receive WQE: dropped, nothing completes (UD has no RNR).
    p.b.handle_packet(&good, &net, &p.mem);
    assert!(p.b.poll_completion().is_none());
    assert_eq!(p.b.drops().no_wqe, 1);
    p.b.post_recv(recv_wr(9, vec![p.mr_b.sge(0, 100)])).unwrap();
    // Q_Key mismatch: dropped silently, the WQE stays.
    p.b.handle_packet(&bad, &net, &p.mem);
    assert!(p.b.poll_completion().is_none());
    assert_eq!(p.b.drops().qkey, 1);
    // Wrong destination QPN, wrong P_Key: dropped.
    let mut other = good;
    other.bth.dest_qpn = 0x99;
    p.b.handle_packet(&other, &net, &p.mem);
    let mut pk = good;
    pk.bth.pkey = 0x1234;
    p.b.handle_packet(&pk, &net, &p.mem);
    assert_eq!(p.b.drops().invalid, 2);
    p.b.handle_packet(&good, &net, &p.mem);
    let c = p.b.poll_completion().unwrap();
    assert_eq!(
        (c.wc.wr_id, c.wc.status, c.wc.byte_len),
        (9, WcStatus::Success, 48)
    );

    // Larger than the port MTU: refused at post.
    assert_eq!(
        p.a.post_send(
            send_wr(3, SendOp::Send, vec![p.mr_a.sge(0, 1025)]),
            dest(0x12, QKEY)
        ),
        Err(PostError::MessageTooLong(1025))
    );
    assert_eq!(
        p.a.post_send(
            send_wr(
                3,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0
                },
                vec![]
            ),
            dest(0x12, QKEY)
        ),
        Err(PostError::UnsupportedOp)
    );
    // A buffer without room for GRH + payload completes with a local length error.
    p.a.post_send(
        send_wr(4, SendOp::Send, vec![p.mr_a.sge(0, 100)]),
        dest(0x12, QKEY),
    )
    .unwrap();
    let (b, _) = xmit(&mut p);
    p.b.post_recv(recv_wr(10, vec![p.mr_b.sge(0, 139)]))
        .unwrap();
    p.b.handle_packet(&Packet::parse(&b).unwrap(), &net, &p.mem);
    let c = p.b.poll_completion().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.status), (10, WcStatus::LocLenErr));
    // The GSI QP accepts only the GSI Q_Key.
    let mut gsi = UdQp::new(1, QpCaps::default(), false, Mtu::Mtu1024);
    to_rts(&mut gsi, 0);
    gsi.post_recv(recv_wr(1, vec![p.mr_b.sge(0, 400)])).unwrap();
    let mut g = good;
    g.bth.dest_qpn = 1;
    gsi.handle_packet(&g, &net, &p.mem);
    assert_eq!(gsi.drops().qkey, 1);
    g.deth = Some(softrdma::wire::Deth {
        qkey: GSI_QKEY,
        resv8: 0,
        src_qpn: 1,
    });
    gsi.handle_packet(&g, &net, &p.mem);
    assert_eq!(gsi.poll_completion().unwrap().wc.src_qp, 1);
}

#[test]
fn ipv6_header_fills_the_whole_grh_area() {
    let mut p = pair();
    p.a.post_send(
        send_wr(1, SendOp::Send, vec![p.mr_a.sge(0, 16)]),
        dest(0x12, QKEY),
    )
    .unwrap();
    let (b, _) = xmit(&mut p);
    let mut h = [0u8; 40];
    h[0] = 0x60;
    h[7] = 64;
    h[8..24].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
    let net = net_header_v6(&h).unwrap();
    p.b.post_recv(recv_wr(1, vec![p.mr_b.sge(0, 100)])).unwrap();
    p.b.handle_packet(&Packet::parse(&b).unwrap(), &net, &p.mem);
    let c = p.b.poll_completion().unwrap();
    assert_eq!(c.network_type, Some(NetworkType::Ipv6));
    assert_eq!(p.mem.read(p.mr_b.addr, 40), h.to_vec());
    assert_eq!(c.sgid, h[8..24]);
    assert_eq!(c.hop_limit, 64);
}

/// The UD SENDs that `ibv_ud_pingpong -g 1 -s 100` exchanged between two kernel rxe hosts
/// (rxe-basic.pcap) are accepted by a softrdma UD QP with the same QPN and Q_Key, and the GRH
/// area is the IPv4 header they arrived with.
#[test]
fn captured_ud_pingpong_packets_are_received() {
    let raw = std::fs::read("tests/data/rxe-basic.pcap").unwrap();
    let mut seen = 0;
    for rec in PcapSlice::new(&raw).unwrap() {
        let rec = rec.unwrap().data;
        if rec.len() < 14 + 28 || rec[12..14] != [0x08, 0x00] {
            continue;
        }
        let Ok((ip, iph, udp)) = Ipv4Udp::parse(&rec[14..]) else {
            continue;
        };
        if ip.dst_port != ROCE_V2_PORT {
            continue;
        }
        let Ok(pk) = Packet::parse(udp) else { continue };
        if pk.bth.opcode != Opcode::UD_SEND_ONLY || pk.bth.dest_qpn == 1 {
            continue;
        }
        let deth = pk.deth.unwrap();
        assert_eq!(deth.qkey, QKEY, "ibv_ud_pingpong's Q_Key");
        let mem = VecMemory::new();
        let mr = mem.register(4096, rw());
        let mut qp = UdQp::new(pk.bth.dest_qpn, QpCaps::default(), false, Mtu::Mtu1024);
        to_rts(&mut qp, QKEY);
        qp.post_recv(recv_wr(1, vec![mr.sge(0, 4096)])).unwrap();
        let net = net_header_v4(iph).unwrap();
        qp.handle_packet(&pk, &net, &mem);
        let c = qp.poll_completion().expect("received");
        assert_eq!(c.wc.status, WcStatus::Success);
        assert_eq!(c.wc.byte_len as usize, 40 + pk.payload.len());
        assert_eq!(c.wc.src_qp, deth.src_qpn);
        assert_eq!(c.sgid, ip.src.to_ipv6_mapped().octets());
        assert_eq!(mem.read(mr.addr + 20, 20), iph.to_vec());
        assert_eq!(
            mem.read(mr.addr + 40, pk.payload.len()),
            pk.payload.to_vec()
        );
        seen += 1;
    }
    assert!(seen >= 2, "ud_pingpong packets in the capture: {seen}");
}
