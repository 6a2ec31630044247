//! The invariant CRC of RoCEv2 (IBA A17.4.5.1), computed as Linux rdma_rxe does (`rxe_icrc.c`).
//!
//! CRC-32 (the Ethernet polynomial) over: eight 0xff bytes standing for the masked LRH; the IP
//! header with TOS (IPv4) or traffic class and flow label (IPv6), TTL/hop limit and the IPv4
//! checksum set to all ones; the UDP header with its checksum all ones; the BTH with its byte 4
//! (FECN, BECN, reserved) all ones; then the rest of the packet up to the ICRC, pad included.
//! The result goes on the wire least significant byte first.

use super::ipv4::{IPV4_LEN, UDP_LEN};
use super::ipv6::IPV6_LEN;
use super::packet::{possible_len, ICRC_LEN, MAX_PACKET_LEN, PACKET_ALIGN};
use super::{bth, WireError};

/// ICRC of a RoCEv2-over-IPv4 packet. `ip_udp` holds the IPv4 header (20 bytes, no options) and
/// the UDP header as sent; `ib` is the transport packet from BTH to the end of the pad, without
/// the ICRC. Returns the value to store with `to_le_bytes`.
pub fn compute_v4(ip_udp: &[u8; IPV4_LEN + UDP_LEN], ib: &[u8]) -> u32 {
    const HDR_END: usize = 8 + IPV4_LEN + UDP_LEN;
    let mut p = [0xffu8; HDR_END + bth::LEN];
    p[8..HDR_END].copy_from_slice(ip_udp);
    p[8 + 1] = 0xff; // TOS
    p[8 + 8] = 0xff; // TTL
    p[8 + 10] = 0xff; // IP header checksum
    p[8 + 11] = 0xff;
    p[8 + IPV4_LEN + 6] = 0xff; // UDP checksum
    p[8 + IPV4_LEN + 7] = 0xff;
    crc_after(&mut p, HDR_END, ib)
}

/// ICRC of a RoCEv2-over-IPv6 packet. `ip_udp` holds the fixed IPv6 header (40 bytes, no
/// extension headers) and the UDP header as sent; `ib` is the transport packet from BTH to the end
/// of the pad, without the ICRC. As rxe does (`ip6h->priority = 0xf`, `flow_lbl` all ones,
/// `hop_limit = 0xff`), the traffic class, flow label and hop limit are masked with ones, and so
/// is the UDP checksum. Returns the value to store with `to_le_bytes`.
pub fn compute_v6(ip_udp: &[u8; IPV6_LEN + UDP_LEN], ib: &[u8]) -> u32 {
    const HDR_END: usize = 8 + IPV6_LEN + UDP_LEN;
    let mut p = [0xffu8; HDR_END + bth::LEN];
    p[8..HDR_END].copy_from_slice(ip_udp);
    p[8] |= 0x0f; // traffic class, high nibble
    p[8 + 1] = 0xff; // traffic class, low nibble; flow label
    p[8 + 2] = 0xff;
    p[8 + 3] = 0xff;
    p[8 + 7] = 0xff; // hop limit
    p[8 + IPV6_LEN + 6] = 0xff; // UDP checksum
    p[8 + IPV6_LEN + 7] = 0xff;
    crc_after(&mut p, HDR_END, ib)
}

/// A fresh CRC-32. `crc32fast::Hasher::new` detects the CPU's features on every call (about 40
/// instructions, four times per ping-pong round trip); a clone of one built once does not.
fn new_hasher() -> crc32fast::Hasher {
    static FRESH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    FRESH.get_or_init(crc32fast::Hasher::new).clone()
}

/// The CRC of `prefix[..hdr_end]` (the masked LRH and IP/UDP headers, already in place) and the
/// transport packet `ib` with the BTH's byte 4 (FECN, BECN, resv6) masked. The BTH is copied
/// behind the headers so that the CRC sees one buffer before the payload (small updates are
/// its slow path).
fn crc_after<const N: usize>(prefix: &mut [u8; N], hdr_end: usize, ib: &[u8]) -> u32 {
    debug_assert_eq!(N, hdr_end + bth::LEN);
    let mut h = new_hasher();
    if ib.len() >= bth::LEN {
        prefix[hdr_end..].copy_from_slice(&ib[..bth::LEN]);
        prefix[hdr_end + 4] = 0xff;
        h.update(prefix);
        h.update(&ib[bth::LEN..]);
    } else {
        h.update(&prefix[..hdr_end]);
        h.update(ib);
    }
    h.finalize()
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

    /// `rxe_icrc_hdr` + `rxe_icrc_generate` (drivers/infiniband/sw/rxe/rxe_icrc.c), transcribed
    /// for IPv6: copy the IPv6 and UDP headers and the BTH into a pseudo-header, set
    /// `ip6h->priority = 0xf` (the low nibble of byte 0 on a little-endian bitfield), the three
    /// `flow_lbl` bytes and `hop_limit` to ones, `udph->check = CSUM_MANGLED_0` and
    /// `bth->qpn |= ~BTH_QPN_MASK`; CRC it with `crc32_le` from the seed 0xdebb20e3, then the
    /// rest of the packet; the ICRC is the complement.
    fn kernel_icrc_v6(ip_udp: &[u8; 48], ib: &[u8]) -> u32 {
        let mut pshdr = [0u8; 48 + 12];
        pshdr[..48].copy_from_slice(ip_udp);
        pshdr[48..].copy_from_slice(&ib[..12]);
        pshdr[0] = (pshdr[0] & 0xf0) | 0x0f; // priority:4 (low bits), version:4
        pshdr[1..4].fill(0xff); // flow_lbl[3]
        pshdr[7] = 0xff; // hop_limit
        pshdr[46..48].fill(0xff); // udph->check
        let qpn = u32::from_be_bytes([pshdr[52], pshdr[53], pshdr[54], pshdr[55]]) | 0xff00_0000;
        pshdr[52..56].copy_from_slice(&qpn.to_be_bytes());
        // crc32fast continues from a finished CRC: the raw register r is the CRC !r.
        let mut h = crc32fast::Hasher::new_with_initial(!0xdebb_20e3);
        h.update(&pshdr);
        h.update(&ib[12..]);
        h.finalize()
    }

    #[test]
    fn v6_matches_the_kernels_algorithm() {
        // The seed is the CRC register after the masked LRH (8 bytes of ones).
        let mut r = !0u32;
        for _ in 0..8 {
            r ^= 0xff;
            for _ in 0..8 {
                r = if r & 1 != 0 {
                    (r >> 1) ^ 0xedb8_8320
                } else {
                    r >> 1
                };
            }
        }
        assert_eq!(r, 0xdebb_20e3);
        // Headers with every masked field set to something, over several packet sizes.
        let mut x = 0x1234_5678u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        };
        for len in [16usize, 32, 60, 1052, 4132] {
            let mut ib: Vec<u8> = (0..len - 4).map(|_| next()).collect();
            ib[0] = 0x04;
            let mut h = [0u8; 48];
            crate::wire::ipv6::Ipv6Udp {
                traffic_class: next(),
                flow_label: u32::from_be_bytes([0, next(), next(), next()]) & 0xf_ffff,
                hop_limit: next(),
                udp_checksum: u16::from_be_bytes([next(), next()]),
                ..crate::wire::ipv6::Ipv6Udp::new(
                    "fe80::fc:ff:fe00:1".parse().unwrap(),
                    0xc000 | next() as u16,
                    "fd00::2".parse().unwrap(),
                    4791,
                    len,
                )
            }
            .emit(&mut h);
            assert_eq!(compute_v6(&h, &ib), kernel_icrc_v6(&h, &ib), "len {len}");
        }
        assert_eq!(kernel_icrc_v6(&V6_HDR, &IB[..28]).to_le_bytes(), V6_ICRC);
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
        // scapy's UDP checksum of the datagram.
        assert_eq!(crate::wire::ipv6::udp_checksum(&V6_HDR, &p), 0x1d44);
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

// ---------------------------------------------------------------------------------------------
// The unknown IPv4 Identification
//
// CRC-32 is affine: for inputs of one length, flipping bits of the input flips the CRC by a vector
// that depends only on which bits and how many bytes follow them. Flipping the 16 ID bits changes
// the CRC register, just after the ID, by `e(id)`, the XOR of 16 fixed vectors `ID_EFFECT[i]` (one
// per set bit); each of the `k` bytes that follow multiplies that change by x^8 modulo the CRC
// polynomial P. So a packet sent with ID `id` but checked with ID 0 leaves the CRCs differing by
// `d = e(id) * x^(8k) mod P`, and `e(id) = d * x^(-8k) mod P` (x is invertible mod P, whose constant
// term is 1). `e` is linear and injective (the 16 vectors are independent: checked at compile
// time), so one multiplication and a fixed 32-step elimination recover the ID: no per-length table,
// no cache, no allocation. `k` follows from the datagram length, which the gate bounds first, and
// `INV_SHIFT` holds x^(-8k) for every possible length: 1034 words, computed at compile time.
//
// Polynomials are in the reflected representation of crc32fast and zlib: bit 31 is x^0.

/// CRC-32 (IEEE 802.3) polynomial, reflected.
const POLY: u32 = 0xedb8_8320;
/// The polynomial 1.
const ONE: u32 = 0x8000_0000;

/// `a * x mod P`.
const fn mul_x(a: u32) -> u32 {
    (a >> 1) ^ (POLY & 0u32.wrapping_sub(a & 1))
}

/// `a * x^-1 mod P`, the inverse of [`mul_x`].
const fn div_x(a: u32) -> u32 {
    if a & ONE != 0 {
        ((a ^ POLY) << 1) | 1
    } else {
        a << 1
    }
}

/// `a * b mod P` (zlib's `multmodp`, without branches on the data).
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut i = 0;
    while i < 32 {
        p ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
        b = mul_x(b);
        i += 1;
    }
    p
}

/// Offset of the IPv4 Identification field in the CRC input (after the 8 bytes of masked LRH).
const ID_AT: usize = 8 + 4;
/// Bytes of CRC input before the transport packet: masked LRH, IPv4 and UDP headers.
const PRE_IB: usize = 8 + IPV4_LEN + UDP_LEN;
/// Bytes of CRC input after the ID for a UDP payload (with ICRC) of `udp_len` bytes.
const fn bytes_after_id(udp_len: usize) -> usize {
    PRE_IB + udp_len - ICRC_LEN - (ID_AT + 2)
}

/// Bitwise CRC-32 for the compile-time tables.
const fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    let mut i = 0;
    while i < data.len() {
        c ^= data[i] as u32;
        let mut k = 0;
        while k < 8 {
            c = mul_x(c);
            k += 1;
        }
        i += 1;
    }
    !c
}

/// `ID_EFFECT[i]`: the change of the CRC register just after the ID when bit `i` of the ID flips.
const ID_EFFECT: [u32; 16] = {
    let zero = crc32(&[0; ID_AT + 2]);
    let mut t = [0; 16];
    let mut i = 0;
    while i < 16 {
        let mut p = [0u8; ID_AT + 2];
        let b = (1u16 << i).to_be_bytes();
        p[ID_AT] = b[0];
        p[ID_AT + 1] = b[1];
        t[i] = crc32(&p) ^ zero;
        i += 1;
    }
    t
};

/// `ID_EFFECT` as a GF(2) elimination table: entry `b` is a combination of the effect vectors
/// whose highest set bit is `b` (or zero), with the ID bits that make it up.
const ID_BASIS: [(u32, u16); 32] = {
    let mut table = [(0u32, 0u16); 32];
    let mut rank = 0;
    let mut i = 0;
    while i < 16 {
        let (mut v, mut x) = (ID_EFFECT[i], 1u16 << i);
        let mut b = 32;
        while b > 0 {
            b -= 1;
            if v & (1 << b) == 0 {
                continue;
            }
            if table[b].0 == 0 {
                table[b] = (v, x);
                rank += 1;
                break;
            }
            v ^= table[b].0;
            x ^= table[b].1;
        }
        i += 1;
    }
    // Independent: each ID has its own effect, and solving gives the only ID that fits.
    assert!(rank == 16);
    table
};

/// `INV_SHIFT[n / 4]` = x^(-8k) mod P for a UDP payload of `n` bytes (`k` the CRC input bytes
/// after the ID), for every multiple of 4 up to [`MAX_PACKET_LEN`]: 4 KiB, no other state.
const INV_SHIFT: [u32; MAX_PACKET_LEN / PACKET_ALIGN + 1] = {
    let mut t = [0u32; MAX_PACKET_LEN / PACKET_ALIGN + 1];
    // n = 0 would have k negative; start at n = ICRC_LEN and fill n = 0 with its neighbour's
    // value (never used: the gate refuses it).
    let mut a = ONE;
    let mut j = 0;
    while j < 8 * bytes_after_id(ICRC_LEN) {
        a = div_x(a);
        j += 1;
    }
    let mut m = 1;
    while m < t.len() {
        t[m] = a;
        let mut j = 0;
        while j < 8 * PACKET_ALIGN {
            a = div_x(a);
            j += 1;
        }
        m += 1;
    }
    t[0] = t[1];
    t
};

/// The change that IP ID `id` makes to the CRC register just after the ID.
fn id_effect(id: u16) -> u32 {
    let mut e = 0;
    for (i, v) in ID_EFFECT.iter().enumerate() {
        e ^= v & 0u32.wrapping_sub((id as u32 >> i) & 1);
    }
    e
}

/// The ID whose effect is exactly `e`, if any.
fn solve(mut e: u32) -> Option<u16> {
    let mut x = 0u16;
    for b in (0..32).rev() {
        // Branch-free: an empty entry (0, 0) changes nothing.
        let m = 0u32.wrapping_sub((e >> b) & 1);
        e ^= ID_BASIS[b].0 & m;
        x ^= ID_BASIS[b].1 & m as u16;
    }
    (e == 0).then_some(x)
}

/// The CRC difference `d` (ICRC computed with ID 0 XOR ICRC received) of a UDP payload of
/// `udp_len` bytes, moved back to just after the ID: `e(id)` of the ID the sender used.
fn normalize(d: u32, udp_len: usize) -> u32 {
    debug_assert!(possible_len(udp_len));
    mul_mod(d, INV_SHIFT[udp_len / PACKET_ALIGN])
}

/// Zero the ID in `ip_udp`, and return the difference between the ICRC computed so and the one
/// at the end of `udp_payload` (whose length the caller checked).
fn diff_id0(ip_udp: &mut [u8; IPV4_LEN + UDP_LEN], udp_payload: &[u8]) -> u32 {
    ip_udp[4] = 0;
    ip_udp[5] = 0;
    let (ib, tail) = udp_payload.split_at(udp_payload.len() - ICRC_LEN);
    let got = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    compute_v4(ip_udp, ib) ^ got
}

/// Verify the ICRC of a datagram received through a UDP socket, which does not show the IP
/// header's Identification field. Linux rdma_rxe numbers its packets with an incrementing IP ID
/// even with DF set, and the ICRC covers it (IBA A17.4.5.1 masks only TOS, TTL and checksums).
/// `ip_udp` holds the header as far as it is known (the ID is ignored); on success the ID that
/// makes the ICRC match is written into it and returned.
///
/// Lengths no RoCEv2 sender produces ([`possible_len`]) are refused before any CRC:
/// `Truncated` below [`super::packet::MIN_PACKET_LEN`], `BadLength` otherwise. Then it costs one
/// CRC of the packet, one GF(2) multiplication and a 32-step reduction; no allocation, no state.
/// It accepts a corrupted packet with probability 2^-16 instead of 2^-32 (any of the 2^16 IDs
/// may explain it). [`IcrcGate`] does the same with per-source bookkeeping.
pub fn verify_v4_unknown_id(
    ip_udp: &mut [u8; IPV4_LEN + UDP_LEN],
    udp_payload: &[u8],
) -> Result<u16, WireError> {
    if udp_payload.len() < bth::LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    if !possible_len(udp_payload.len()) {
        return Err(WireError::BadLength);
    }
    let d = diff_id0(ip_udp, udp_payload);
    if d == 0 {
        return Ok(0);
    }
    let id = solve(normalize(d, udp_payload.len())).ok_or(WireError::BadIcrc)?;
    ip_udp[4..6].copy_from_slice(&id.to_be_bytes());
    debug_assert_eq!(diff_id0(&mut ip_udp.clone(), udp_payload), d);
    Ok(id)
}

/// Sources [`IcrcGate`] remembers the last IP ID of (direct-mapped by source IPv4 address; a
/// colliding source replaces the previous one).
pub const GATE_SOURCES: usize = 64;

/// IDs after a source's last one that count as [`Accepted::Predicted`]: Linux advances the ID by
/// one per packet to the same destination, plus a random jump when a jiffy has passed since the
/// bucket's last packet (`ip_idents_reserve`); the rxe captures of tests/data step by 1 to 8 most
/// of the time and by up to a few hundred after a pause.
pub const GATE_PREDICT_WINDOW: u16 = 64;

/// How the gate accepted a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The ICRC matches with IP ID 0 (softrdma, or any sender whose ID the kernel leaves 0).
    Id0,
    /// The ICRC matches with an ID at most [`GATE_PREDICT_WINDOW`] after the last ID accepted
    /// from that source. A random datagram gets here with probability 64 * 2^-32.
    Predicted,
    /// Some other ID makes the ICRC match (a source's first packet, a jump after a pause, or a
    /// corrupted or forged datagram that happens to fit: probability 2^-16 each).
    Solved,
}

/// Why the gate refused a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejected {
    /// Not a possible RoCEv2 packet length ([`possible_len`]); no CRC was computed.
    Length,
    /// No IP ID makes the ICRC match.
    Icrc,
}

#[derive(Clone, Copy, Default)]
struct Source {
    addr: u32,
    last_id: u16,
    valid: bool,
}

/// The receive-side ICRC check of one endpoint, for datagrams whose IPv4 Identification the
/// socket hides (see [`verify_v4_unknown_id`]). In order, each cheaper than the next:
///
/// 1. the length: refused unless [`possible_len`] (no CRC computed);
/// 2. ID 0 ([`Accepted::Id0`]);
/// 3. the source's last accepted ID + 1, then any ID up to [`GATE_PREDICT_WINDOW`] after it
///    ([`Accepted::Predicted`]);
/// 4. any ID ([`Accepted::Solved`]).
///
/// **A solved ID far from a known source's sequence is accepted.** Linux's IP ID generator
/// (`ip_idents_reserve`) adds a random jump of up to the jiffies elapsed since the bucket was
/// last used, and shares the counter with every flow hashed to the same bucket, so a genuine
/// rdma_rxe peer jumps by hundreds after a pause of a fraction of a second (tests/data shows
/// jumps up to 509) and by anything after longer ones; refusing would drop its packets, and the
/// retransmission would jump again. The price: a corrupted or forged datagram of a possible
/// length passes with probability 2^-16 (plus 2^-32 for ID 0), as with [`verify_v4_unknown_id`].
/// The counts of [`Accepted`] let an operator see it: a steady stream of `Solved` from a source
/// that otherwise sends `Id0` or `Predicted` is corruption or an attack.
///
/// State: [`GATE_SOURCES`] entries of 8 bytes, fixed; no allocation, no cache. The source is
/// read from `ip_udp` (bytes 12..16).
#[derive(Clone)]
pub struct IcrcGate {
    sources: [Source; GATE_SOURCES],
}

impl Default for IcrcGate {
    fn default() -> Self {
        Self::new()
    }
}

impl IcrcGate {
    /// A gate that remembers no source yet.
    pub fn new() -> Self {
        IcrcGate {
            sources: [Source::default(); GATE_SOURCES],
        }
    }

    fn slot(addr: u32) -> usize {
        (addr.wrapping_mul(0x9e37_79b1) >> (32 - GATE_SOURCES.trailing_zeros())) as usize
    }

    /// The last ID accepted from source `addr`, if the gate remembers it.
    pub fn last_id(&self, addr: u32) -> Option<u16> {
        let s = &self.sources[Self::slot(addr)];
        (s.valid && s.addr == addr).then_some(s.last_id)
    }

    /// Check a datagram: `ip_udp` the IPv4 and UDP headers as far as known (source address and
    /// ports, lengths; the ID is ignored), `udp_payload` the UDP payload. On success the ID is
    /// written into `ip_udp` and returned with how it was found.
    pub fn check_v4(
        &mut self,
        ip_udp: &mut [u8; IPV4_LEN + UDP_LEN],
        udp_payload: &[u8],
    ) -> Result<(u16, Accepted), Rejected> {
        let len = udp_payload.len();
        if !possible_len(len) {
            return Err(Rejected::Length);
        }
        let addr = u32::from_be_bytes([ip_udp[12], ip_udp[13], ip_udp[14], ip_udp[15]]);
        let d = diff_id0(ip_udp, udp_payload);
        let last = self.last_id(addr);
        let (id, how) = if d == 0 {
            (0, Accepted::Id0)
        } else {
            let e = normalize(d, len);
            match last {
                Some(l) if id_effect(l.wrapping_add(1)) == e => {
                    (l.wrapping_add(1), Accepted::Predicted)
                }
                _ => {
                    let id = solve(e).ok_or(Rejected::Icrc)?;
                    let ahead = last.map(|l| id.wrapping_sub(l));
                    match ahead {
                        Some(a) if (1..=GATE_PREDICT_WINDOW).contains(&a) => {
                            (id, Accepted::Predicted)
                        }
                        _ => (id, Accepted::Solved),
                    }
                }
            }
        };
        self.sources[Self::slot(addr)] = Source {
            addr,
            last_id: id,
            valid: true,
        };
        ip_udp[4..6].copy_from_slice(&id.to_be_bytes());
        Ok((id, how))
    }
}

#[cfg(test)]
mod unknown_id_tests {
    use super::*;
    use crate::wire::ipv4::Ipv4Udp;

    fn packet(id: u16, src: [u8; 4], len: usize) -> ([u8; 28], Vec<u8>) {
        let mut ib = vec![0u8; len];
        ib[0] = 0x04; // RC SEND_ONLY
        for (i, b) in ib[12..len - 4].iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut hdr = [0u8; 28];
        Ipv4Udp {
            id,
            ..Ipv4Udp::new(src.into(), 49441, [10, 0, 0, 1].into(), 4791, len)
        }
        .emit(&mut hdr);
        fill_v4(&hdr, &mut ib);
        (hdr, ib)
    }

    #[test]
    fn field_arithmetic() {
        for a in [ONE, 1, 0x1234_5678, 0xdead_beef] {
            assert_eq!(div_x(mul_x(a)), a);
            assert_eq!(mul_x(div_x(a)), a);
            assert_eq!(mul_mod(a, ONE), a);
            assert_eq!(mul_mod(ONE, a), a);
            assert_eq!(mul_mod(a, mul_x(ONE)), mul_x(a));
        }
        // x^(-8k) * x^(8k) = 1 for every entry.
        for (m, &inv) in INV_SHIFT.iter().enumerate().skip(1) {
            let mut a = inv;
            for _ in 0..8 * bytes_after_id(m * 4) {
                a = mul_x(a);
            }
            assert_eq!(a, ONE, "len {}", m * 4);
        }
        // The effect vectors agree with crc32fast.
        let zero = crc32fast::hash(&[0; ID_AT + 2]);
        for (i, &e) in ID_EFFECT.iter().enumerate() {
            let mut p = [0u8; ID_AT + 2];
            p[ID_AT..].copy_from_slice(&(1u16 << i).to_be_bytes());
            assert_eq!(crc32fast::hash(&p) ^ zero, e);
            assert_eq!(id_effect(1 << i), e);
            assert_eq!(solve(e), Some(1 << i));
        }
        assert_eq!(
            std::mem::size_of_val(&INV_SHIFT) + std::mem::size_of_val(&ID_BASIS),
            4136 + 256
        );
    }

    #[test]
    fn recovers_any_ip_id() {
        for len in [16, 116, 4132] {
            for id in [0u16, 1, 0x1234, 0xe6e6, 0xffff, 0x8000] {
                let (hdr, ib) = packet(id, [10, 0, 0, 2], len);
                let mut guess = hdr;
                guess[4] = 0;
                guess[5] = 0;
                assert_eq!(verify_v4_unknown_id(&mut guess, &ib), Ok(id));
                assert_eq!(guess[4..6], hdr[4..6]);
                // A corrupted payload is refused: for this packet no ID explains the change.
                let mut bad = ib.clone();
                bad[len / 2] ^= 0x01;
                let mut g2 = guess;
                assert_eq!(verify_v4_unknown_id(&mut g2, &bad), Err(WireError::BadIcrc));
            }
        }
    }

    #[test]
    fn impossible_lengths_refused_before_the_crc() {
        let (mut hdr, ib) = packet(7, [10, 0, 0, 2], 116);
        let mut gate = IcrcGate::new();
        for len in [0, 4, 12, 15, 17, 18, 19, 114, 4133, 4136, 9000, 65535] {
            let mut b = ib.clone();
            b.resize(len, 0);
            assert_eq!(gate.check_v4(&mut hdr, &b), Err(Rejected::Length), "{len}");
            assert!(verify_v4_unknown_id(&mut hdr, &b).is_err(), "{len}");
        }
        assert_eq!(gate.last_id(u32::from_be_bytes([10, 0, 0, 2])), None);
    }

    #[test]
    fn gate_classifies_id0_predicted_solved() {
        let mut gate = IcrcGate::new();
        let a = [10, 0, 0, 2];
        let b = [10, 0, 0, 3];
        let mut chk = |id, src, len| {
            let (hdr, ib) = packet(id, src, len);
            let mut h = hdr;
            h[4] = 0xaa;
            let r = gate.check_v4(&mut h, &ib);
            if r.is_ok() {
                assert_eq!(h, hdr);
            }
            r.map(|(got, how)| {
                assert_eq!(got, id);
                how
            })
        };
        assert_eq!(chk(0, a, 64), Ok(Accepted::Id0));
        assert_eq!(chk(0, a, 64), Ok(Accepted::Id0));
        assert_eq!(chk(1, a, 64), Ok(Accepted::Predicted));
        assert_eq!(chk(5000, b, 64), Ok(Accepted::Solved));
        assert_eq!(chk(5001, b, 1000), Ok(Accepted::Predicted));
        assert_eq!(chk(5001 + 64, b, 32), Ok(Accepted::Predicted));
        assert_eq!(chk(5001 + 64 + 65, b, 32), Ok(Accepted::Solved));
        assert_eq!(chk(2, a, 4132), Ok(Accepted::Predicted));
        // Wrapping: 0xffff -> 0 (ID 0 is found first) -> 1.
        assert_eq!(chk(0xffff, b, 32), Ok(Accepted::Solved));
        assert_eq!(chk(0, b, 32), Ok(Accepted::Id0));
        assert_eq!(chk(1, b, 32), Ok(Accepted::Predicted));
        // Behind the last one (reordering): still accepted, as solved.
        assert_eq!(chk(0, b, 32), Ok(Accepted::Id0));
        assert_eq!(chk(60000, b, 32), Ok(Accepted::Solved));
        assert_eq!(chk(59990, b, 32), Ok(Accepted::Solved));
        assert_eq!(gate.last_id(u32::from_be_bytes(b)), Some(59990));
        assert_eq!(gate.last_id(u32::from_be_bytes(a)), Some(2));
    }
}
