//! The IPv6 and UDP headers in front of a RoCEv2 packet (RoCEv2 over IPv6, GIDs that are not
//! IPv4-mapped).
//!
//! Only what the ICRC and captures need: the fixed 40-byte header followed directly by UDP
//! (no extension headers).

use super::ipv4::{PROTO_UDP, UDP_LEN};
use super::{be, WireError};
use std::net::Ipv6Addr;

/// Length of the fixed IPv6 header.
pub const IPV6_LEN: usize = 40;

/// The IPv6 and UDP header fields of one RoCEv2 datagram.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ipv6Udp {
    /// Source IPv6 address.
    pub src: Ipv6Addr,
    /// Destination IPv6 address.
    pub dst: Ipv6Addr,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port ([`super::ROCE_V2_PORT`] for RoCEv2).
    pub dst_port: u16,
    /// The UDP checksum as carried (the ICRC masks it).
    pub udp_checksum: u16,
    /// Length of the UDP payload (the IB transport packet including ICRC).
    pub payload_len: u16,
}

impl Ipv6Udp {
    /// Headers with traffic class 0, flow label 0, hop limit 64 and UDP checksum 0.
    pub fn new(
        src: Ipv6Addr,
        src_port: u16,
        dst: Ipv6Addr,
        dst_port: u16,
        payload_len: usize,
    ) -> Self {
        Ipv6Udp {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            src_port,
            dst_port,
            udp_checksum: 0,
            payload_len: payload_len as u16,
        }
    }

    /// Write both headers (48 bytes), the UDP checksum as given.
    pub fn emit(&self, buf: &mut [u8; IPV6_LEN + UDP_LEN]) {
        let udp_len = UDP_LEN as u16 + self.payload_len;
        let word0 = 6u32 << 28 | (self.traffic_class as u32) << 20 | (self.flow_label & 0xf_ffff);
        be::put_u32(&mut buf[0..4], word0);
        be::put_u16(&mut buf[4..6], udp_len);
        buf[6] = PROTO_UDP;
        buf[7] = self.hop_limit;
        buf[8..24].copy_from_slice(&self.src.octets());
        buf[24..40].copy_from_slice(&self.dst.octets());
        be::put_u16(&mut buf[40..42], self.src_port);
        be::put_u16(&mut buf[42..44], self.dst_port);
        be::put_u16(&mut buf[44..46], udp_len);
        be::put_u16(&mut buf[46..48], self.udp_checksum);
    }

    /// Parse an IPv6 packet whose next header is UDP; returns the fields and the UDP payload.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if buf.len() < IPV6_LEN + UDP_LEN {
            return Err(WireError::Truncated);
        }
        let word0 = be::u32(&buf[0..4]);
        if word0 >> 28 != 6 {
            return Err(WireError::Malformed("not IPv6"));
        }
        if buf[6] != PROTO_UDP {
            return Err(WireError::Malformed("not UDP (or IPv6 extension headers)"));
        }
        let plen = be::u16(&buf[4..6]) as usize;
        if plen < UDP_LEN || buf.len() < IPV6_LEN + plen {
            return Err(WireError::Malformed("bad IPv6 payload length"));
        }
        let udp = &buf[IPV6_LEN..IPV6_LEN + plen];
        let udp_len = be::u16(&udp[4..6]) as usize;
        if udp_len < UDP_LEN || udp_len > udp.len() {
            return Err(WireError::Malformed("bad UDP length"));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&buf[8..24]);
        dst.copy_from_slice(&buf[24..40]);
        let f = Ipv6Udp {
            src: Ipv6Addr::from(src),
            dst: Ipv6Addr::from(dst),
            traffic_class: (word0 >> 20) as u8,
            flow_label: word0 & 0xf_ffff,
            hop_limit: buf[7],
            src_port: be::u16(&udp[0..2]),
            dst_port: be::u16(&udp[2..4]),
            udp_checksum: be::u16(&udp[6..8]),
            payload_len: (udp_len - UDP_LEN) as u16,
        };
        Ok((f, &udp[UDP_LEN..udp_len]))
    }
}

/// The UDP checksum of a datagram over IPv6 (RFC 8200 8.1): the one's complement sum over the
/// pseudo-header (addresses, UDP length, next header 17), the UDP header with its checksum
/// field taken as 0, and the payload; 0 comes out as 0xffff. `ip_udp` holds both headers as
/// [`Ipv6Udp::emit`] writes them, `payload` the UDP payload.
pub fn udp_checksum(ip_udp: &[u8; IPV6_LEN + UDP_LEN], payload: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u64;
        }
    };
    add(&ip_udp[8..40]);
    let udp_len = (UDP_LEN + payload.len()) as u32;
    add(&udp_len.to_be_bytes());
    add(&[0, 0, 0, PROTO_UDP]);
    add(&ip_udp[IPV6_LEN..IPV6_LEN + 6]);
    add(payload);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv6 + UDP header of the IPv6 ICRC vector in `icrc.rs` (built with scapy).
    const HDR: [u8; 48] = [
        0x66, 0x8a, 0xbc, 0xde, 0x00, 0x28, 0x11, 0x40, // ver 6, TC 0x68, FL 0xabcde, plen 40
        0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, // src fd00:77::2
        0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03, // dst fd00:77::3
        0xcb, 0x97, 0x12, 0xb7, 0x00, 0x28, 0x1d, 0x44, // UDP
    ];

    #[test]
    fn parse_and_emit() {
        let mut pkt = [0u8; 48 + 32];
        pkt[..48].copy_from_slice(&HDR);
        let (h, p) = Ipv6Udp::parse(&pkt).unwrap();
        assert_eq!(h.src, "fd00:77::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(h.dst, "fd00:77::3".parse::<Ipv6Addr>().unwrap());
        assert_eq!(h.traffic_class, 0x68);
        assert_eq!(h.flow_label, 0xabcde);
        assert_eq!(h.hop_limit, 64);
        assert_eq!((h.src_port, h.dst_port), (0xcb97, 4791));
        assert_eq!(h.udp_checksum, 0x1d44);
        assert_eq!(h.payload_len, 32);
        assert_eq!(p.len(), 32);
        let mut out = [0u8; 48];
        h.emit(&mut out);
        assert_eq!(out, HDR);
        let n = Ipv6Udp::new(h.src, 0xcb97, h.dst, 4791, 32);
        assert_eq!(n.hop_limit, 64);
        for len in 0..pkt.len() {
            assert!(Ipv6Udp::parse(&pkt[..len]).is_err(), "{len}");
        }
    }
}
