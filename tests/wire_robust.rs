//! Robustness of the wire parsers against hostile input, run by `cargo test`: hundreds of
//! thousands of inputs from a seeded xorshift generator (random bytes, truncations and bit flips
//! of the golden packets of tests/data/rxe-basic.pcap and rxe-loss-mtu4096.pcap). Nothing may
//! panic, and whatever parses must re-emit to the bytes it came from.
//!
//! fuzz/ has the same checks as a cargo-fuzz target for longer, coverage-guided runs.

use softrdma::wire::ethernet::{self, EthHeader};
use softrdma::wire::ipv4::{self, Ipv4Udp};
use softrdma::wire::ipv6::Ipv6Udp;
use softrdma::wire::packet::ICRC_LEN;
use softrdma::wire::pcap::{PcapError, PcapReader, PcapSlice};
use softrdma::wire::{icrc, Packet, WireError};

/// xorshift64* (Vigna): tiny, seeded, good enough to pick bytes and positions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.byte();
        }
    }
}

/// Frames of both captures (every frame of the basic one, every 8th of the loss one, so that
/// small packets dominate and mutations are cheap).
fn golden_frames() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (path, step) in [
        ("tests/data/rxe-basic.pcap", 1),
        ("tests/data/rxe-loss-mtu4096.pcap", 8),
    ] {
        let data = std::fs::read(path).unwrap();
        for rec in PcapSlice::new(&data).unwrap().step_by(step) {
            out.push(rec.unwrap().data.to_vec());
        }
    }
    out
}

/// Packet::parse on `b`; if it parses, emitting must give back `b` (with the pad bytes, which
/// emit always writes as zero, zeroed), and the ICRC check must not panic.
fn check_packet(b: &[u8]) -> bool {
    let Ok(p) = Packet::parse(b) else {
        return false;
    };
    let info = p.info().expect("parsed packets have a known opcode");
    let pad = p.bth.pad_count as usize;
    assert_eq!(
        info.header_len() + p.payload.len() + pad + ICRC_LEN,
        b.len()
    );
    assert_eq!(p.buffer_len(), b.len());
    let mut out = vec![0u8; b.len() + 8];
    assert_eq!(p.emit(&mut out), Ok(b.len()));
    out.truncate(b.len());
    let mut want = b.to_vec();
    let pad_at = b.len() - ICRC_LEN - pad;
    want[pad_at..pad_at + pad].fill(0);
    assert_eq!(out, want, "re-emitted packet differs");
    assert_eq!(
        p.emit(&mut out[..b.len() - 1]),
        Err(WireError::BufferTooSmall)
    );
    // Parsing what was emitted gives the same packet.
    assert_eq!(Packet::parse(&want).unwrap(), p);
    true
}

/// Ipv4Udp::parse on `b`; what parses re-emits to the same header, but for what emit computes
/// itself: the IP checksum (always valid) and the UDP checksum (always 0).
fn check_ipv4(b: &[u8]) -> bool {
    let Ok((ip, raw, payload)) = Ipv4Udp::parse(b) else {
        return false;
    };
    assert!(raw.len() >= ipv4::IPV4_LEN && raw.len() <= 60 && raw.len() % 4 == 0);
    assert_eq!(ip.payload_len as usize, payload.len());
    let mut hdr = [0u8; 28];
    ip.emit(&mut hdr);
    assert_eq!(ipv4::checksum(&hdr[..20]), 0);
    let mut again = hdr.to_vec();
    again.extend_from_slice(payload);
    let (ip2, _, payload2) = Ipv4Udp::parse(&again).unwrap();
    assert_eq!((ip2, payload2), (ip, payload));
    // Byte for byte where the input had the shape emit produces.
    let total = u16::from_be_bytes([b[2], b[3]]) as usize;
    if raw.len() == 20 && total == 28 + payload.len() {
        let mut want = [0u8; 28];
        want.copy_from_slice(&b[..28]);
        want[10..12].copy_from_slice(&hdr[10..12]);
        want[26..28].fill(0);
        assert_eq!(hdr, want);
        if ipv4::checksum(&b[..20]) == 0 {
            assert_eq!(hdr[10..12], b[10..12], "valid checksum kept");
        }
    }
    true
}

/// The Ethernet splitter; what splits is consistent with the other parsers.
fn check_frame(f: &[u8]) -> bool {
    if let Ok((eth, rest)) = EthHeader::parse(f) {
        let mut h = [0u8; 18];
        assert_eq!(eth.emit(&mut h), Ok(eth.len()));
        assert_eq!(h[..eth.len()], f[..eth.len()]);
        assert_eq!(rest, &f[eth.len()..]);
        check_ipv4(rest);
        if let Ok((ip6, payload)) = Ipv6Udp::parse(rest) {
            assert_eq!(ip6.payload_len as usize, payload.len());
        }
    }
    let _ = ethernet::split_ipv6_udp(f);
    let Ok((hdr, payload)) = ethernet::split_ipv4_udp(f) else {
        return false;
    };
    let (eth, rest) = EthHeader::parse(f).unwrap();
    assert_eq!(hdr[..], f[eth.len()..eth.len() + 28]);
    let (_, raw, p2) = Ipv4Udp::parse(rest).unwrap();
    assert_eq!((raw.len(), p2), (20, payload));
    let (ih, p3) = ethernet::split_ip_udp(f).unwrap();
    assert_eq!((ih.as_bytes(), p3), (&hdr[..], payload));
    let _ = icrc::verify_v4(&hdr, payload);
    check_packet(payload);
    true
}

/// Flip `n` random bits of `b`.
fn flip(rng: &mut Rng, b: &mut [u8], n: usize) {
    if b.is_empty() {
        return;
    }
    for _ in 0..n {
        let i = rng.below(b.len());
        b[i] ^= 1 << rng.below(8);
    }
}

#[test]
fn random_and_mutated_packets() {
    let frames = golden_frames();
    let mut rng = Rng(0x5eed_0f50_f74d_3a01);
    let (mut parsed, mut total) = (0usize, 0usize);
    let mut buf = Vec::with_capacity(9000);
    for round in 0..600_000 {
        let f = &frames[rng.below(frames.len())];
        let payload = &f[42..];
        buf.clear();
        match round % 6 {
            // Random bytes, with a plausible opcode and no TVer most of the time so that the
            // parser gets past the BTH.
            0 => {
                buf.resize(rng.below(96), 0);
                rng.fill(&mut buf);
                if buf.len() >= 2 && rng.below(4) != 0 {
                    buf[0] = [
                        0x00, 0x04, 0x06, 0x0c, 0x0d, 0x10, 0x11, 0x12, 0x13, 0x64, 0x65,
                    ][rng.below(11)];
                    buf[1] &= 0xf0;
                }
            }
            // Truncated golden packet.
            1 => buf.extend_from_slice(&payload[..rng.below(payload.len() + 1)]),
            // Bit flips of a golden packet, mostly in its headers.
            2 => {
                let n = payload.len().min(64 + rng.below(payload.len()));
                buf.extend_from_slice(&payload[..n]);
                let k = 1 + rng.below(4);
                let head = buf.len().min(48);
                flip(&mut rng, &mut buf[..head], k);
            }
            // Bit flips and a truncation of a whole frame.
            3 => {
                buf.extend_from_slice(f);
                let k = 1 + rng.below(3);
                let head = buf.len().min(80);
                flip(&mut rng, &mut buf[..head], k);
                buf.truncate(rng.below(f.len() + 1).max(f.len().saturating_sub(8)));
            }
            // A golden packet whose opcode is replaced: headers are then read at the wrong
            // offsets and the lengths no longer fit.
            4 => {
                buf.extend_from_slice(payload);
                buf[0] = rng.byte();
            }
            // One bit flipped anywhere the ICRC covers: CRC-32 catches every single-bit error.
            _ => {
                buf.extend_from_slice(f);
                let i = 14 + rng.below(buf.len() - 14);
                let bit = 1u8 << rng.below(8);
                buf[i] ^= bit;
                let masked = matches!(i - 14, 1 | 8 | 10 | 11 | 26 | 27 | 32);
                // Flipping a length or the protocol makes it another frame altogether.
                let shape = matches!(i - 14, 0 | 2 | 3 | 9 | 24 | 25);
                if !masked && !shape {
                    let (hdr, p) = ethernet::split_ipv4_udp(&buf).unwrap();
                    assert_eq!(
                        icrc::verify_v4(&hdr, p),
                        Err(WireError::BadIcrc),
                        "byte {i}"
                    );
                }
            }
        }
        total += 1;
        if round % 6 == 3 || round % 6 == 5 {
            parsed += check_frame(&buf) as usize;
            check_ipv4(&buf);
        } else {
            parsed += check_packet(&buf) as usize;
            check_ipv4(&buf);
            check_frame(&buf);
        }
    }
    // The mix reaches the emitters often, and not always.
    assert!(parsed > total / 5 && parsed < total, "{parsed} of {total}");
}

/// Every truncation of every golden frame: each layer either refuses or round-trips.
#[test]
fn every_truncation_of_small_frames() {
    let frames = golden_frames();
    let mut n = 0;
    for f in frames.iter().filter(|f| f.len() <= 400) {
        for len in 0..=f.len() {
            check_frame(&f[..len]);
            check_packet(&f[42.min(len)..len]);
            n += 1;
        }
    }
    assert!(n > 20_000, "{n}");
}

/// Hostile pcap files: truncated, bit-flipped (record lengths, magic), random. The in-memory
/// and the streaming reader must agree and neither may panic or allocate wildly.
#[test]
fn mutated_pcap_files() {
    let data = std::fs::read("tests/data/rxe-basic.pcap").unwrap();
    // The header and the first 12 records (CM MADs, rping): about 2 KB.
    let mut end = 24;
    for _ in 0..12 {
        let incl = u32::from_le_bytes(data[end + 8..end + 12].try_into().unwrap()) as usize;
        end += 16 + incl;
    }
    let small = &data[..end];
    let mut rng = Rng(0x9ca9_0000_1234_5678);
    let mut buf = Vec::new();
    let mut clean = 0;
    for round in 0..50_000 {
        buf.clear();
        match round % 4 {
            0 => buf.extend_from_slice(&small[..rng.below(small.len() + 1)]),
            1 => {
                buf.extend_from_slice(small);
                // Flip bits in the file header or in a record header's length fields.
                let k = 1 + rng.below(3);
                for _ in 0..k {
                    let i = if rng.below(2) == 0 {
                        rng.below(24)
                    } else {
                        24 + 8 + rng.below(8)
                    };
                    buf[i] ^= 1 << rng.below(8);
                }
            }
            2 => {
                buf.extend_from_slice(small);
                let k = 1 + rng.below(8);
                flip(&mut rng, &mut buf, k);
            }
            _ => {
                buf.resize(rng.below(200), 0);
                rng.fill(&mut buf);
                if buf.len() >= 4 && rng.below(2) == 0 {
                    let magic: [u8; 4] = [
                        [0xd4, 0xc3, 0xb2, 0xa1],
                        [0xa1, 0xb2, 0xc3, 0xd4],
                        [0x4d, 0x3c, 0xb2, 0xa1],
                        [0xa1, 0xb2, 0x3c, 0x4d],
                    ][rng.below(4)];
                    buf[..4].copy_from_slice(&magic);
                }
            }
        }
        let slice = match PcapSlice::new(&buf) {
            Ok(s) => s,
            Err(_) => {
                assert!(PcapReader::new(&buf[..]).is_err());
                continue;
            }
        };
        let mut reader = PcapReader::new(&buf[..]).unwrap();
        assert_eq!(reader.header(), slice.header());
        let mut slice_err = false;
        for rec in slice {
            match (rec, reader.next_record()) {
                (Ok(a), Some(Ok(b))) => {
                    assert_eq!((a.ts, a.orig_len, a.data), (b.ts, b.orig_len, b.data));
                    check_frame(a.data);
                }
                (Err(PcapError::TruncatedRecord { offset }), Some(Err(e))) => {
                    match e {
                        PcapError::TruncatedRecord { offset: o }
                        | PcapError::RecordTooLarge { offset: o, .. } => assert_eq!(o, offset),
                        e => panic!("{e}"),
                    }
                    slice_err = true;
                }
                (a, b) => panic!("readers disagree: {a:?} / {b:?}"),
            }
        }
        if !slice_err {
            assert!(reader.next_record().is_none());
            clean += 1;
        }
    }
    assert!(clean > 1000 && clean < 50_000, "{clean}");
}
