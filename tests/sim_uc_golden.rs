//! UC packets on the wire, byte for byte: a UC SEND_ONLY and a UC RDMA WRITE_FIRST as the UC
//! requester builds them, against headers written out by hand from IBA Tables 38 and 39 (BTH,
//! RETH), with the ICRC computed here independently (bitwise CRC-32 over the masked headers, as
//! IBA A17.4.5.1 and rxe_icrc.c define it), then parsed back by the wire layer.

use softrdma::verbs::SendFlags;
use std::net::Ipv4Addr;

use softrdma::transport::sim::{pattern, send_wr, VecMemory};
use softrdma::transport::{AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendOp, UcQp};
use softrdma::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use softrdma::wire::{icrc, Kind, Opcode, Packet, Position, Service, ROCE_V2_PORT};

const SRC: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// A UC QP 0x11 in RTS toward QP 0x000abc, first PSN 0x123456, path MTU 256.
fn uc_qp() -> UcQp {
    let mut q = UcQp::new(0x11, QpCaps::default(), false);
    for a in [
        QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rtr),
            ah_attr: Some(AddressVector {
                port_num: 1,
                ..Default::default()
            }),
            path_mtu: Some(Mtu::Mtu256),
            dest_qp_num: Some(0xabc),
            rq_psn: Some(0),
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0x12_3456),
            ..Default::default()
        },
    ] {
        q.modify(&a).unwrap();
    }
    q
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xedb88320), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// The ICRC of `ib` (BTH to pad) behind `hdr`: 8 bytes of ones for the LRH, the IPv4 header with
/// TOS, TTL and checksum masked, UDP with its checksum masked, BTH byte 4 masked.
fn icrc_by_hand(hdr: &[u8; 28], ib: &[u8]) -> [u8; 4] {
    let mut v = vec![0xff; 8];
    let mut h = *hdr;
    h[1] = 0xff;
    h[8] = 0xff;
    h[10..12].fill(0xff);
    h[26..28].fill(0xff);
    v.extend_from_slice(&h);
    let mut b = ib.to_vec();
    b[4] = 0xff;
    v.extend_from_slice(&b);
    crc32(&v).to_le_bytes()
}

/// Put the ICRC on a packet from the requester, check it both ways, and return the headers.
fn on_the_wire(pkt: &mut [u8]) -> [u8; 28] {
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    Ipv4Udp::new(SRC, ROCE_V2_PORT, DST, ROCE_V2_PORT, pkt.len()).emit(&mut hdr);
    icrc::fill_v4(&hdr, pkt);
    let n = pkt.len();
    assert_eq!(pkt[n - 4..], icrc_by_hand(&hdr, &pkt[..n - 4]), "ICRC");
    icrc::verify_v4(&hdr, pkt).unwrap();
    hdr
}

#[test]
fn uc_send_only() {
    let mem = VecMemory::new();
    let mr = mem.register(64, AccessFlags::LOCAL_WRITE);
    mem.write(mr.addr, b"hello, UC!");
    let mut q = uc_qp();
    let mut wr = send_wr(1, SendOp::Send, vec![mr.sge(0, 10)]);
    wr.flags.insert(SendFlags::SOLICITED);
    q.post_send(wr).unwrap();
    let mut buf = vec![0u8; 512];
    let n = q.poll_transmit(&mem, &mut buf).unwrap();
    assert!(q.poll_transmit(&mem, &mut buf).is_none());
    let pkt = &mut buf[..n];
    #[rustfmt::skip]
    let want: [u8; 12] = [
        0x24,             // OpCode: UC SEND Only (IBA Table 38: 001 00100)
        0x80 | 0x20,      // SE, MigReq 0, PadCnt 2 (10 bytes of payload), TVer 0
        0xff, 0xff,       // P_Key: default partition
        0x00,             // FECN, BECN, reserved
        0x00, 0x0a, 0xbc, // DestQP
        0x80,             // AckReq (rxe sets it on every END packet, UC too), reserved
        0x12, 0x34, 0x56, // PSN
    ];
    assert_eq!(pkt[..12], want, "BTH");
    assert_eq!(&pkt[12..22], b"hello, UC!");
    assert_eq!(pkt[22..24], [0, 0], "pad");
    assert_eq!(
        n,
        12 + 10 + 2 + 4,
        "BTH, payload, pad, ICRC: no extension header"
    );
    on_the_wire(pkt);
    let p = Packet::parse(pkt).unwrap();
    let info = p.info().unwrap();
    assert_eq!(
        (info.service, info.kind, info.position),
        (Service::Uc, Kind::Send, Position::Only)
    );
    assert_eq!(p.bth.opcode, Opcode::UC_SEND_ONLY);
    assert!(p.reth.is_none() && p.immdt.is_none() && p.aeth.is_none() && p.deth.is_none());
    assert_eq!(p.payload, b"hello, UC!");
    let mut again = vec![0u8; n];
    assert_eq!(p.emit(&mut again).unwrap(), n);
    assert_eq!(again[..n - 4], pkt[..n - 4], "re-emitted byte for byte");
}

#[test]
fn uc_rdma_write_first() {
    let mem = VecMemory::new();
    let mr = mem.register(1024, AccessFlags::LOCAL_WRITE);
    let data = pattern(5, 600);
    mem.write(mr.addr, &data);
    let mut q = uc_qp();
    q.post_send(send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: 0x0000_7f00_dead_b000,
            rkey: 0x1234_5678,
        },
        vec![mr.sge(0, 600)],
    ))
    .unwrap();
    let mut buf = vec![0u8; 512];
    let mut opcodes = Vec::new();
    let mut first = None;
    while let Some(n) = q.poll_transmit(&mem, &mut buf) {
        opcodes.push(buf[0]);
        if first.is_none() {
            first = Some(buf[..n].to_vec());
        }
    }
    // FIRST, MIDDLE, LAST: 0x26, 0x27, 0x28.
    assert_eq!(opcodes, [0x26, 0x27, 0x28]);
    let mut pkt = first.unwrap();
    #[rustfmt::skip]
    let want: [u8; 28] = [
        // BTH
        0x26,             // OpCode: UC RDMA WRITE First
        0x00,             // SE 0, MigReq 0, PadCnt 0, TVer 0
        0xff, 0xff,       // P_Key
        0x00,             // FECN, BECN, reserved
        0x00, 0x0a, 0xbc, // DestQP
        0x00,             // AckReq 0 (not the last packet)
        0x12, 0x34, 0x56, // PSN
        // RETH: VA, R_Key, DMA length (the whole message)
        0x00, 0x00, 0x7f, 0x00, 0xde, 0xad, 0xb0, 0x00,
        0x12, 0x34, 0x56, 0x78,
        0x00, 0x00, 0x02, 0x58,
    ];
    assert_eq!(pkt[..28], want, "BTH + RETH");
    assert_eq!(pkt.len(), 28 + 256 + 4, "a full path MTU of payload");
    assert_eq!(pkt[28..28 + 256], data[..256]);
    on_the_wire(&mut pkt);
    let p = Packet::parse(&pkt).unwrap();
    let info = p.info().unwrap();
    assert_eq!(
        (info.service, info.kind, info.position),
        (Service::Uc, Kind::RdmaWrite, Position::First)
    );
    let reth = p.reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x0000_7f00_dead_b000, 0x1234_5678, 600)
    );
    // The opcode is under the ICRC: the RC opcode with the same bytes is another packet.
    let mut rc = pkt.clone();
    rc[0] = Opcode::RC_RDMA_WRITE_FIRST.0;
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    Ipv4Udp::new(SRC, ROCE_V2_PORT, DST, ROCE_V2_PORT, rc.len()).emit(&mut hdr);
    assert!(icrc::verify_v4(&hdr, &rc).is_err());
}
