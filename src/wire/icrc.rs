//! The invariant CRC of RoCEv2 (IBA A17.4.5.1), computed as Linux rdma_rxe does (`rxe_icrc.c`).
//!
//! CRC-32 (the Ethernet polynomial) over: eight 0xff bytes standing for the masked LRH; the IP
//! header with TOS (IPv4) or traffic class and flow label (IPv6), TTL/hop limit and the IPv4
//! checksum set to all ones; the UDP header with its checksum all ones; the BTH with its byte 4
//! (FECN, BECN, reserved) all ones; then the rest of the packet up to the ICRC, pad included.
//! The result goes on the wire least significant byte first.

use super::ipv4::{IPV4_LEN, UDP_LEN};
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
    if ib.len() >= bth::LEN {
        let mut b = [0u8; bth::LEN];
        b.copy_from_slice(&ib[..bth::LEN]);
        b[4] = 0xff; // FECN, BECN, resv6
        h.update(&b);
        h.update(&ib[bth::LEN..]);
    } else {
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
