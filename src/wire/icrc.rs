//! The invariant CRC of RoCEv2 (IBA A17.4.5.1), computed as Linux rdma_rxe does (`rxe_icrc.c`).
//!
//! CRC-32 (the Ethernet polynomial) over: eight 0xff bytes standing for the masked LRH; the IP
//! header with TOS (IPv4) or traffic class and flow label (IPv6), TTL/hop limit and the IPv4
//! checksum set to all ones; the UDP header with its checksum all ones; the BTH with its byte 4
//! (FECN, BECN, reserved) all ones; then the rest of the packet up to the ICRC, pad included.
//! The result goes on the wire least significant byte first.

use super::ipv4::{IPV4_LEN, UDP_LEN};
use super::ipv6::IPV6_LEN;
use super::packet::ICRC_LEN;
use super::{bth, WireError};

/// ICRC of a RoCEv2-over-IPv4 packet. `ip_udp` holds the IPv4 header (20 bytes, no options) and
/// the UDP header as sent; `ib` is the transport packet from BTH to the end of the pad, without
/// the ICRC. Returns the value to store with `to_le_bytes`.
pub fn compute_v4(ip_udp: &[u8; IPV4_LEN + UDP_LEN], ib: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    let mut hdr = *ip_udp;
    hdr[1] = 0xff; // TOS
    hdr[8] = 0xff; // TTL
    hdr[10] = 0xff; // IP header checksum
    hdr[11] = 0xff;
    hdr[IPV4_LEN + 6] = 0xff; // UDP checksum
    hdr[IPV4_LEN + 7] = 0xff;
    h.update(&hdr);
    update_ib(&mut h, ib);
    h.finalize()
}

/// ICRC of a RoCEv2-over-IPv6 packet. `ip_udp` holds the fixed IPv6 header (40 bytes, no
/// extension headers) and the UDP header as sent; `ib` is the transport packet from BTH to the end
/// of the pad, without the ICRC. As rxe does (`ip6h->priority = 0xf`, `flow_lbl` all ones,
/// `hop_limit = 0xff`), the traffic class, flow label and hop limit are masked with ones, and so
/// is the UDP checksum. Returns the value to store with `to_le_bytes`.
pub fn compute_v6(ip_udp: &[u8; IPV6_LEN + UDP_LEN], ib: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    let mut hdr = *ip_udp;
    hdr[0] |= 0x0f; // traffic class, high nibble
    hdr[1] = 0xff; // traffic class, low nibble; flow label
    hdr[2] = 0xff;
    hdr[3] = 0xff;
    hdr[7] = 0xff; // hop limit
    hdr[IPV6_LEN + 6] = 0xff; // UDP checksum
    hdr[IPV6_LEN + 7] = 0xff;
    h.update(&hdr);
    update_ib(&mut h, ib);
    h.finalize()
}

/// Feed the transport packet to the CRC with the BTH's byte 4 masked.
fn update_ib(h: &mut crc32fast::Hasher, ib: &[u8]) {
    if ib.len() >= bth::LEN {
        let mut b = [0u8; bth::LEN];
        b.copy_from_slice(&ib[..bth::LEN]);
        b[4] = 0xff; // FECN, BECN, resv6
        h.update(&b);
        h.update(&ib[bth::LEN..]);
    } else {
        h.update(ib);
    }
}

/// Check the ICRC at the end of `udp_payload` against the IPv4/UDP headers it arrived with.
pub fn verify_v4(ip_udp: &[u8; IPV4_LEN + UDP_LEN], udp_payload: &[u8]) -> Result<(), WireError> {
    if udp_payload.len() < bth::LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let (ib, tail) = udp_payload.split_at(udp_payload.len() - ICRC_LEN);
    let got = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if compute_v4(ip_udp, ib) == got {
        Ok(())
    } else {
        Err(WireError::BadIcrc)
    }
}

/// Check the ICRC at the end of `udp_payload` against the IPv6/UDP headers it arrived with.
pub fn verify_v6(ip_udp: &[u8; IPV6_LEN + UDP_LEN], udp_payload: &[u8]) -> Result<(), WireError> {
    if udp_payload.len() < bth::LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let (ib, tail) = udp_payload.split_at(udp_payload.len() - ICRC_LEN);
    let got = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if compute_v6(ip_udp, ib) == got {
        Ok(())
    } else {
        Err(WireError::BadIcrc)
    }
}

/// [`fill_v4`] for IPv6.
pub fn fill_v6(ip_udp: &[u8; IPV6_LEN + UDP_LEN], udp_payload: &mut [u8]) {
    if udp_payload.len() < ICRC_LEN {
        return;
    }
    let n = udp_payload.len() - ICRC_LEN;
    let crc = compute_v6(ip_udp, &udp_payload[..n]);
    udp_payload[n..].copy_from_slice(&crc.to_le_bytes());
}

/// Compute the ICRC of a finished datagram in place: `udp_payload` is BTH to ICRC, its last four
/// bytes are overwritten.
pub fn fill_v4(ip_udp: &[u8; IPV4_LEN + UDP_LEN], udp_payload: &mut [u8]) {
    if udp_payload.len() < ICRC_LEN {
        return;
    }
    let n = udp_payload.len() - ICRC_LEN;
    let crc = compute_v4(ip_udp, &udp_payload[..n]);
    udp_payload[n..].copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame 4 of tests/data/rxe-basic.pcap: rping's RC SEND_ONLY, 10.77.0.2 -> 10.77.0.3.
    const V4_HDR: [u8; 28] = [
        0x45, 0x00, 0x00, 0x3c, 0xe6, 0xec, 0x40, 0x00, 0x40, 0x11, 0x3f, 0x26, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x03, 0xcb, 0x97, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
    ];
    /// Its UDP payload: BTH, 16 bytes of payload, ICRC.
    const IB: [u8; 32] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x2a, 0x3e, 0x9b, 0x00, 0x00, 0x56,
        0x32, 0x0f, 0xb6, 0x23, 0x70, 0x00, 0x00, 0x05, 0x87, 0x00, 0x00, 0x00, 0x40, 0xad, 0x6b,
        0x5c, 0x84,
    ];

    /// The same transport packet carried over IPv6 (traffic class 0x68, flow label 0xabcde, hop
    /// limit 64, fd00:77::2 -> fd00:77::3, UDP checksum as scapy computed it). The ICRC was
    /// computed by scapy 2.8's `scapy.contrib.roce.BTH` (an implementation independent of this
    /// one, which reproduces the IPv4 ICRCs of rxe-basic.pcap); no IPv6 capture of rxe exists in
    /// tests/data.
    const V6_HDR: [u8; 48] = [
        0x66, 0x8a, 0xbc, 0xde, 0x00, 0x28, 0x11, 0x40, 0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0x02, 0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03, 0xcb,
        0x97, 0x12, 0xb7, 0x00, 0x28, 0x1d, 0x44,
    ];
    const V6_ICRC: [u8; 4] = [0x3d, 0xaf, 0x79, 0x71];

    #[test]
    fn v4_capture_vector() {
        let crc = compute_v4(&V4_HDR, &IB[..28]);
        assert_eq!(crc.to_le_bytes(), IB[28..]);
        verify_v4(&V4_HDR, &IB).unwrap();
        let mut p = IB;
        p[28..].fill(0);
        fill_v4(&V4_HDR, &mut p);
        assert_eq!(p, IB);
    }

    #[test]
    fn v4_masks_only_variant_fields() {
        let mut h = V4_HDR;
        h[1] = 0x02; // ECN CE
        h[8] = 1; // TTL
        h[10] = 0x12; // IP checksum
        h[26] = 0xab; // UDP checksum
        let mut ib = IB;
        ib[4] = 0xc0; // FECN, BECN
        verify_v4(&h, &ib).unwrap();
        for (i, b) in [(12, 1u8), (22, 1), (24, 1)] {
            let mut h = V4_HDR;
            h[i] ^= b;
            assert_eq!(verify_v4(&h, &IB), Err(WireError::BadIcrc), "byte {i}");
        }
        for i in [0, 1, 2, 3, 5, 8, 11, 12, 27] {
            let mut ib = IB;
            ib[i] ^= 1;
            assert_eq!(verify_v4(&V4_HDR, &ib), Err(WireError::BadIcrc), "byte {i}");
        }
        assert_eq!(verify_v4(&V4_HDR, &IB[..15]), Err(WireError::Truncated));
    }

    #[test]
    fn v6_vector() {
        let mut p = IB;
        p[28..].copy_from_slice(&V6_ICRC);
        verify_v6(&V6_HDR, &p).unwrap();
        assert_eq!(compute_v6(&V6_HDR, &IB[..28]).to_le_bytes(), V6_ICRC);
        let mut q = p;
        q[28..].fill(0);
        fill_v6(&V6_HDR, &mut q);
        assert_eq!(q, p);
        // Traffic class, flow label, hop limit and UDP checksum are masked ...
        let mut h = V6_HDR;
        h[0] = 0x60;
        h[1..4].fill(0);
        h[7] = 1;
        h[46] = 0;
        h[47] = 0;
        verify_v6(&h, &p).unwrap();
        // ... the version, lengths, next header, addresses and ports are not.
        for i in [0, 4, 5, 6, 8, 23, 39, 40, 43, 45] {
            let mut h = V6_HDR;
            h[i] ^= 0x10;
            assert_eq!(verify_v6(&h, &p), Err(WireError::BadIcrc), "byte {i}");
        }
    }
}

/// Offset of the IPv4 Identification field in the CRC input (after the 8 bytes of masked LRH).
const ID_AT: usize = 8 + 4;

/// How the 16 bits of the IPv4 Identification field change the ICRC of a packet whose CRC input
/// is `len` bytes long, as a GF(2) elimination table. CRC-32 is affine: for inputs of one length,
/// `crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0)`, so flipping bit `i` of the ID flips the ICRC by a fixed
/// vector that depends only on the length. Entry `b` of the table is a combination of those
/// vectors whose highest set bit is `b` (or zero), with the ID bits that make it up.
type IdTable = [(u32, u16); 32];

fn id_table(len: usize) -> IdTable {
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        // One entry per packet length seen: at most a few thousand, computed once per thread.
        static CACHE: RefCell<HashMap<usize, IdTable>> = RefCell::new(HashMap::new());
    }
    if let Some(t) = CACHE.with(|c| c.borrow().get(&len).copied()) {
        return t;
    }
    const ZEROS: [u8; 1024] = [0; 1024];
    let crc_of = |prefix: &[u8; ID_AT + 2]| {
        let mut h = crc32fast::Hasher::new();
        h.update(prefix);
        let mut rest = len - prefix.len();
        while rest > 0 {
            let n = rest.min(ZEROS.len());
            h.update(&ZEROS[..n]);
            rest -= n;
        }
        h.finalize()
    };
    let zero = crc_of(&[0; ID_AT + 2]);
    let mut table: IdTable = [(0, 0); 32];
    for i in 0..16 {
        let mut p = [0u8; ID_AT + 2];
        p[ID_AT..].copy_from_slice(&(1u16 << i).to_be_bytes());
        let (mut v, mut x) = (crc_of(&p) ^ zero, 1u16 << i);
        // Insert into the elimination table, reducing from the highest bit down.
        for b in (0..32).rev() {
            if v & (1 << b) == 0 {
                continue;
            }
            if table[b].0 == 0 {
                table[b] = (v, x);
                break;
            }
            v ^= table[b].0;
            x ^= table[b].1;
        }
    }
    CACHE.with(|c| c.borrow_mut().insert(len, table));
    table
}

/// The ID bits whose ICRC effect is exactly `d`, if any.
fn solve(table: &IdTable, mut d: u32) -> Option<u16> {
    let mut x = 0u16;
    for b in (0..32).rev() {
        if d & (1 << b) != 0 && table[b].0 != 0 {
            d ^= table[b].0;
            x ^= table[b].1;
        }
    }
    (d == 0).then_some(x)
}

/// Verify the ICRC of a datagram received through a UDP socket, which does not show the IP
/// header's Identification field. Linux rdma_rxe numbers its packets with an incrementing IP ID
/// even with DF set, and the ICRC covers it (IBA A17.4.5.1 masks only TOS, TTL and checksums).
/// `ip_udp` holds the header as far as it is known (ID 0); on success the ID that makes the ICRC
/// match is written into it and returned. Costs one CRC of the packet plus a 32-step GF(2)
/// reduction, no allocation (after a length's first packet on a thread);
/// it accepts a corrupted packet with probability 2^-16 instead of 2^-32.
pub fn verify_v4_unknown_id(
    ip_udp: &mut [u8; IPV4_LEN + UDP_LEN],
    udp_payload: &[u8],
) -> Result<u16, WireError> {
    if udp_payload.len() < bth::LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    ip_udp[4] = 0;
    ip_udp[5] = 0;
    let (ib, tail) = udp_payload.split_at(udp_payload.len() - ICRC_LEN);
    let got = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let d = compute_v4(ip_udp, ib) ^ got;
    if d == 0 {
        return Ok(0);
    }
    let len = 8 + IPV4_LEN + UDP_LEN + ib.len();
    let id = solve(&id_table(len), d).ok_or(WireError::BadIcrc)?;
    ip_udp[4..6].copy_from_slice(&id.to_be_bytes());
    debug_assert_eq!(compute_v4(ip_udp, ib), got);
    Ok(id)
}

#[cfg(test)]
mod unknown_id_tests {
    use super::*;

    #[test]
    fn recovers_any_ip_id() {
        let mut ib = vec![0u8; 12 + 100 + 4];
        ib[0] = 0x04; // RC SEND_ONLY
        for (i, b) in ib[12..112].iter_mut().enumerate() {
            *b = i as u8;
        }
        for id in [0u16, 1, 0x1234, 0xe6e6, 0xffff, 0x8000] {
            let mut hdr = [0u8; 28];
            let f = super::super::ipv4::Ipv4Udp {
                id,
                ..super::super::ipv4::Ipv4Udp::new(
                    [10, 0, 0, 2].into(),
                    49441,
                    [10, 0, 0, 1].into(),
                    4791,
                    ib.len(),
                )
            };
            f.emit(&mut hdr);
            fill_v4(&hdr, &mut ib);
            let mut guess = hdr;
            guess[4] = 0;
            guess[5] = 0;
            assert_eq!(verify_v4_unknown_id(&mut guess, &ib), Ok(id));
            assert_eq!(guess[4..6], hdr[4..6]);
            // A corrupted payload is refused: for this packet no ID explains the change.
            let mut bad = ib.clone();
            bad[50] ^= 0x01;
            let mut g2 = guess;
            assert_eq!(verify_v4_unknown_id(&mut g2, &bad), Err(WireError::BadIcrc));
        }
    }
}
