//! Every packet of the golden captures of Linux Soft-RoCE (tests/data/*.pcap, see
//! tests/data/SCENARIOS.md) through the wire layer: pcap reader, Ethernet splitter, IPv4/UDP,
//! ICRC, packet parser and emitter, byte for byte.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use softrdma::wire::aeth::CREDITS_INVALID;
use softrdma::wire::deth::GSI_QKEY;
use softrdma::wire::ethernet::{self, EthHeader, ETHERTYPE_IPV4};
use softrdma::wire::pcap::{PcapReader, PcapSlice, PcapWriter, LINKTYPE_ETHERNET};
use softrdma::wire::{icrc, Ipv4Udp, Kind, NakCode, Opcode, Packet, Syndrome, ROCE_V2_PORT};

const BASIC: &str = "tests/data/rxe-basic.pcap";
const LOSS: &str = "tests/data/rxe-loss-mtu4096.pcap";

// Packets per BTH opcode, obtained with tshark 4.x (Debian):
//   tshark -r FILE -d udp.port==4791,infiniband -T fields -e infiniband.bth.opcode | sort | uniq -c
// Every frame of both files decodes as InfiniBand; the sums are the files' packet counts
// (capinfos: 413 and 2567).
const BASIC_COUNTS: &[(Opcode, usize)] = &[
    (Opcode::RC_SEND_FIRST, 5),
    (Opcode::RC_SEND_MIDDLE, 5),
    (Opcode::RC_SEND_LAST, 5),
    (Opcode::RC_SEND_ONLY, 131),
    (Opcode::RC_RDMA_WRITE_FIRST, 5),
    (Opcode::RC_RDMA_WRITE_MIDDLE, 15),
    (Opcode::RC_RDMA_WRITE_LAST, 5),
    (Opcode::RC_RDMA_WRITE_ONLY, 2),
    (Opcode::RC_RDMA_READ_REQUEST, 7),
    (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 5),
    (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 15),
    (Opcode::RC_RDMA_READ_RESPONSE_LAST, 5),
    (Opcode::RC_RDMA_READ_RESPONSE_ONLY, 2),
    (Opcode::RC_ACKNOWLEDGE, 143),
    (Opcode::RC_ATOMIC_ACKNOWLEDGE, 5),
    (Opcode::RC_FETCH_ADD, 5),
    (Opcode::UD_SEND_ONLY, 53),
];
const BASIC_PACKETS: usize = 413;

const LOSS_COUNTS: &[(Opcode, usize)] = &[
    (Opcode::RC_SEND_FIRST, 10),
    (Opcode::RC_SEND_MIDDLE, 10),
    (Opcode::RC_SEND_LAST, 10),
    (Opcode::RC_SEND_ONLY, 77),
    (Opcode::RC_RDMA_WRITE_FIRST, 65),
    (Opcode::RC_RDMA_WRITE_MIDDLE, 870),
    (Opcode::RC_RDMA_WRITE_LAST, 65),
    (Opcode::RC_RDMA_READ_REQUEST, 83),
    (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 75),
    (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1079),
    (Opcode::RC_RDMA_READ_RESPONSE_LAST, 82),
    (Opcode::RC_ACKNOWLEDGE, 116),
    (Opcode::UD_SEND_ONLY, 25),
];
const LOSS_PACKETS: usize = 2567;

/// One RoCEv2 packet of a capture, checked: the frame split, the IPv4/UDP header re-emitted, the
/// ICRC reproduced and the transport packet re-emitted, all byte for byte.
struct Seen<'a> {
    ts: Duration,
    ip: Ipv4Udp,
    hdr: [u8; 28],
    pkt: Packet<'a>,
}

fn check_frame(no: usize, frame: &[u8]) -> Seen<'_> {
    let (eth, _) = EthHeader::parse(frame).unwrap();
    assert_eq!(eth.ethertype, ETHERTYPE_IPV4, "frame {no}");
    assert_eq!(eth.vlan_tci, None, "frame {no}");
    let (hdr, udp_payload) =
        ethernet::split_ipv4_udp(frame).unwrap_or_else(|e| panic!("frame {no}: {e}"));
    // The captures were taken on the sending side: no Ethernet padding, nothing after the UDP
    // datagram.
    assert_eq!(14 + 28 + udp_payload.len(), frame.len(), "frame {no}");

    // IPv4 and UDP: the kernel's header is what Ipv4Udp::emit builds (DF, valid IP checksum,
    // UDP checksum 0 as rxe sends it).
    let (ip, raw_ip, p2) = Ipv4Udp::parse(&frame[14..]).unwrap();
    assert_eq!((raw_ip, p2), (&hdr[..20], udp_payload), "frame {no}");
    assert_eq!(ip.dst_port, ROCE_V2_PORT, "frame {no}");
    assert_eq!(ip.payload_len as usize, udp_payload.len(), "frame {no}");
    let mut again = [0u8; 28];
    ip.emit(&mut again);
    assert_eq!(again, hdr, "frame {no}: IPv4/UDP header re-emitted");

    // ICRC.
    icrc::verify_v4(&hdr, udp_payload).unwrap_or_else(|e| panic!("frame {no}: {e}"));
    let n = udp_payload.len() - 4;
    assert_eq!(
        icrc::compute_v4(&hdr, &udp_payload[..n]).to_le_bytes(),
        udp_payload[n..],
        "frame {no}"
    );

    // Transport packet.
    let pkt = Packet::parse(udp_payload).unwrap_or_else(|e| panic!("frame {no}: {e}"));
    assert_eq!(pkt.buffer_len(), udp_payload.len(), "frame {no}");
    let mut out = vec![0u8; udp_payload.len()];
    assert_eq!(pkt.emit(&mut out), Ok(udp_payload.len()), "frame {no}");
    assert_eq!(out, udp_payload, "frame {no}: packet re-emitted");
    // With the ICRC left zero and filled in afterwards, as a sender does.
    let mut p0 = pkt;
    p0.icrc = 0;
    p0.emit(&mut out).unwrap();
    icrc::fill_v4(&hdr, &mut out);
    assert_eq!(out, udp_payload, "frame {no}: ICRC filled in");

    Seen {
        ts: Duration::ZERO,
        ip,
        hdr,
        pkt,
    }
}

fn check_file(data: &[u8]) -> Vec<Seen<'_>> {
    let pcap = PcapSlice::new(data).unwrap();
    assert_eq!(pcap.header().link_type() as u32, LINKTYPE_ETHERNET);
    assert!(!pcap.header().nanos && !pcap.header().big_endian);
    let mut out = Vec::new();
    for (i, rec) in pcap.enumerate() {
        let rec = rec.unwrap();
        assert!(!rec.is_truncated(), "frame {}", i + 1);
        let mut s = check_frame(i + 1, rec.data);
        s.ts = rec.ts;
        out.push(s);
    }
    // Timestamps never go back (capinfos: "Strict time order: True"; equal ones occur).
    assert!(out.windows(2).all(|w| w[0].ts <= w[1].ts));
    out
}

fn counts(seen: &[Seen<'_>]) -> BTreeMap<u8, usize> {
    let mut m = BTreeMap::new();
    for s in seen {
        *m.entry(s.pkt.bth.opcode.0).or_default() += 1;
    }
    m
}

fn expected(c: &[(Opcode, usize)]) -> BTreeMap<u8, usize> {
    c.iter().map(|(o, n)| (o.0, *n)).collect()
}

fn count(seen: &[Seen<'_>], f: impl Fn(&Seen<'_>) -> bool) -> usize {
    seen.iter().filter(|s| f(s)).count()
}

/// Requests (SEND, WRITE, READ request, atomics) sent more than once: the same destination QP
/// and PSN seen again. Returns (distinct requests retransmitted, extra copies).
fn duplicate_requests(seen: &[Seen<'_>]) -> (usize, usize) {
    let mut m: HashMap<(u32, u32, u32), usize> = HashMap::new();
    for s in seen {
        let info = s.pkt.info().unwrap();
        let request = matches!(
            info.kind,
            Kind::Send | Kind::RdmaWrite | Kind::ReadRequest | Kind::CompareSwap | Kind::FetchAdd
        );
        if request && s.pkt.deth.is_none() {
            let key = (
                u32::from(s.ip.dst),
                s.pkt.bth.dest_qpn,
                s.pkt.bth.psn.value(),
            );
            *m.entry(key).or_default() += 1;
        }
    }
    let dup: Vec<_> = m.values().filter(|&&n| n > 1).collect();
    (dup.len(), dup.iter().map(|&&n| n - 1).sum())
}

#[test]
fn basic_capture_every_packet_round_trips() {
    let data = std::fs::read(BASIC).unwrap();
    let seen = check_file(&data);
    assert_eq!(seen.len(), BASIC_PACKETS);
    assert_eq!(counts(&seen), expected(BASIC_COUNTS));
    assert_eq!(
        BASIC_COUNTS.iter().map(|c| c.1).sum::<usize>(),
        BASIC_PACKETS
    );

    // ib_atomic_bw: FETCH_ADDs answered by ATOMIC_ACKNOWLEDGEs (ib_atomic_bw's default is
    // FETCH_AND_ADD: no COMPARE_SWAP in this capture).
    assert_eq!(
        count(&seen, |s| s.pkt.bth.opcode == Opcode::RC_COMPARE_SWAP),
        0
    );
    for s in seen
        .iter()
        .filter(|s| s.pkt.bth.opcode == Opcode::RC_FETCH_ADD)
    {
        let a = s.pkt.atomic_eth.unwrap();
        assert_eq!((a.swap_add, a.compare), (1, 0));
        assert_eq!(a.va % 8, 0);
    }
    for s in seen
        .iter()
        .filter(|s| s.pkt.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE)
    {
        assert!(s.pkt.atomic_ack_eth.is_some());
        assert!(matches!(s.pkt.aeth.unwrap().syndrome, Syndrome::Ack { .. }));
    }

    // Multi-packet READ responses at path MTU 1024: ib_read_bw's 5000 bytes are FIRST, 3 MIDDLE,
    // LAST (1024 * 4 + 904); rping's 64 bytes are READ_RESPONSE_ONLY.
    let resp_len = |op: Opcode| {
        seen.iter()
            .filter(|s| s.pkt.bth.opcode == op)
            .map(|s| s.pkt.payload.len())
            .collect::<Vec<_>>()
    };
    assert!(resp_len(Opcode::RC_RDMA_READ_RESPONSE_FIRST)
        .iter()
        .all(|&n| n == 1024));
    assert!(resp_len(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE)
        .iter()
        .all(|&n| n == 1024));
    assert_eq!(resp_len(Opcode::RC_RDMA_READ_RESPONSE_LAST), vec![904; 5]);
    assert_eq!(resp_len(Opcode::RC_RDMA_READ_RESPONSE_ONLY), vec![64; 2]);

    // UD: CM MADs on QP1 (GSI Q_Key, from QP1 to QP1, one 256-byte MAD each) and
    // ibv_ud_pingpong's SENDs (its Q_Key 0x11111111).
    let ud: Vec<_> = seen.iter().filter(|s| s.pkt.deth.is_some()).collect();
    assert_eq!(ud.len(), 53);
    let gsi: Vec<_> = ud
        .iter()
        .filter(|s| s.pkt.deth.unwrap().qkey == GSI_QKEY)
        .collect();
    assert_eq!(gsi.len(), 47);
    for s in &gsi {
        assert_eq!(s.pkt.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!((s.pkt.bth.dest_qpn, s.pkt.deth.unwrap().src_qpn), (1, 1));
        assert_eq!(s.pkt.payload.len(), 256);
    }
    let pingpong: Vec<_> = ud
        .iter()
        .filter(|s| s.pkt.deth.unwrap().qkey == 0x1111_1111)
        .collect();
    assert_eq!(pingpong.len(), 6);

    // rxe never advertises credits: every ACK and AETH-carrying read response says 0x1f.
    for s in seen.iter().filter(|s| s.pkt.aeth.is_some()) {
        assert_eq!(
            s.pkt.aeth.unwrap().syndrome,
            Syndrome::Ack {
                credits: CREDITS_INVALID
            }
        );
    }
    // No loss: nothing was sent twice.
    assert_eq!(duplicate_requests(&seen), (0, 0));
    // Pad bytes: perftest's 2-byte SENDs carry PadCnt 2 (8 of them, all pads zero).
    assert_eq!(count(&seen, |s| s.pkt.bth.pad_count != 0), 8);
    // Nothing sets SE, MigReq, FECN/BECN or reserved bits; TOS 0, TTL 64, IP ID not 0.
    for s in &seen {
        let b = s.pkt.bth;
        assert!(!b.solicited && !b.mig_req && !b.fecn && !b.becn);
        assert_eq!((b.resv6, b.resv7, b.tver, b.pkey), (0, 0, 0, 0xffff));
        assert_eq!((s.ip.tos, s.ip.ttl, s.ip.flags_frag), (0, 64, 0x4000));
        assert_eq!(s.hdr[26..28], [0, 0], "UDP checksum");
    }
}

#[test]
fn loss_capture_every_packet_round_trips() {
    let data = std::fs::read(LOSS).unwrap();
    let seen = check_file(&data);
    assert_eq!(seen.len(), LOSS_PACKETS);
    assert_eq!(counts(&seen), expected(LOSS_COUNTS));
    assert_eq!(LOSS_COUNTS.iter().map(|c| c.1).sum::<usize>(), LOSS_PACKETS);

    // Path MTU 4096: full-sized WRITE and READ response packets carry 4096 bytes.
    for s in &seen {
        let info = s.pkt.info().unwrap();
        if matches!(info.kind, Kind::RdmaWrite | Kind::ReadResponse)
            && matches!(
                info.position,
                softrdma::wire::Position::First | softrdma::wire::Position::Middle
            )
        {
            assert_eq!(s.pkt.payload.len(), 4096, "{:?}", s.pkt.bth);
        }
    }

    // Recovery from loss: PSN sequence error NAKs (and no other NAK, no RNR NAK) ...
    let naks = count(&seen, |s| {
        matches!(
            s.pkt.aeth.map(|a| a.syndrome),
            Some(Syndrome::Nak(NakCode::PsnSequenceError))
        )
    });
    assert_eq!(naks, 8);
    assert_eq!(
        count(&seen, |s| s.pkt.aeth.is_some_and(|a| !matches!(
            a.syndrome,
            Syndrome::Ack { .. } | Syndrome::Nak(NakCode::PsnSequenceError)
        ))),
        0
    );
    // ... retransmitted (duplicate) requests ...
    let (dups, copies) = duplicate_requests(&seen);
    assert_eq!((dups, copies), (DUP_REQUESTS, DUP_COPIES));
    // ... and read responses sent again for the same PSN.
    let mut resp: HashMap<(u32, u32, u32), usize> = HashMap::new();
    for s in seen
        .iter()
        .filter(|s| s.pkt.info().unwrap().kind == Kind::ReadResponse)
    {
        let key = (
            u32::from(s.ip.dst),
            s.pkt.bth.dest_qpn,
            s.pkt.bth.psn.value(),
        );
        *resp.entry(key).or_default() += 1;
    }
    let again: Vec<_> = resp.values().filter(|&&n| n > 1).collect();
    assert_eq!(
        (again.len(), again.iter().map(|&&n| n - 1).sum::<usize>()),
        (DUP_READ_RESPONSES, DUP_READ_RESPONSE_COPIES)
    );
}

// Retransmissions in the loss capture, keyed by (destination IP, destination QP, PSN). Obtained
// independently of this crate from tshark's fields (ip.dst, infiniband.bth.opcode, .destqp, .psn)
// with a few lines of Python: 323 request PSNs were sent more than once, 720 extra copies in all
// (go-back-N resends whole windows); 266 read response PSNs were sent again, 901 extra copies
// (rxe answers a duplicate READ request by sending the response again from its PSN).
const DUP_REQUESTS: usize = 323;
const DUP_COPIES: usize = 720;
const DUP_READ_RESPONSES: usize = 266;
const DUP_READ_RESPONSE_COPIES: usize = 901;

/// The streaming reader sees the same records as the in-memory one.
#[test]
fn streaming_reader_agrees() {
    for path in [BASIC, LOSS] {
        let data = std::fs::read(path).unwrap();
        let mut slice = PcapSlice::new(&data).unwrap();
        let mut stream = PcapReader::open(path).unwrap();
        assert_eq!(stream.header(), slice.header());
        let mut n = 0;
        while let Some(r) = stream.next_record() {
            let r = r.unwrap();
            let s = slice.next().unwrap().unwrap();
            assert_eq!((r.ts, r.orig_len, r.data), (s.ts, s.orig_len, s.data));
            n += 1;
        }
        assert!(slice.next().is_none());
        assert!(n > 400);
    }
}

/// Re-writing the basic capture with PcapWriter keeps every datagram and timestamp.
#[test]
fn pcap_writer_rewrites_capture() {
    let data = std::fs::read(BASIC).unwrap();
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let mut n = 0;
    for rec in PcapSlice::new(&data).unwrap() {
        let rec = rec.unwrap();
        let (hdr, payload) = ethernet::split_ipv4_udp(rec.data).unwrap();
        w.write_roce(rec.timestamp(), &hdr, payload).unwrap();
        n += 1;
    }
    let out = w.into_inner().unwrap();
    // Same record sizes (14-byte Ethernet header both ways), so the same file length.
    assert_eq!(out.len(), data.len());
    let a = PcapSlice::new(&data).unwrap();
    let b = PcapSlice::new(&out).unwrap();
    assert_eq!(a.header(), b.header());
    let mut m = 0;
    for (x, y) in a.zip(b) {
        let (x, y) = (x.unwrap(), y.unwrap());
        assert_eq!(x.ts, y.ts);
        assert_eq!(x.data[12..], y.data[12..]);
        let (e, _) = EthHeader::parse(y.data).unwrap();
        assert_eq!(e.src[..2], [0x02, 0x00]);
        assert_eq!(e.src[2..], y.data[14 + 12..14 + 16]);
        m += 1;
    }
    assert_eq!((n, m), (BASIC_PACKETS, BASIC_PACKETS));
}
