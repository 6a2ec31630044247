//! The IPv4 and UDP headers in front of a RoCEv2 packet.
//!
//! softrdma sends through ordinary UDP sockets, so the kernel writes these headers; they matter to
//! the ICRC, which covers them with the variant fields masked (IBA A17.4.5.1). This module builds
//! the header the kernel will send (`DF` set, so Linux writes IP ID 0 on an unconnected socket, as
//! rdma_rxe does) and parses the headers found in a captured frame.

use super::{be, WireError};
use std::net::Ipv4Addr;

/// Length of an IPv4 header without options.
pub const IPV4_LEN: usize = 20;
/// Length of a UDP header.
pub const UDP_LEN: usize = 8;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// The IPv4 and UDP header fields of one RoCEv2 datagram.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ipv4Udp {
    /// Source IPv4 address.
    pub src: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst: Ipv4Addr,
    /// Type of service byte (DSCP and ECN).
    pub tos: u8,
    /// Identification field (IP ID).
    pub id: u16,
    /// Flags and fragment offset; `0x4000` is DF.
    pub flags_frag: u16,
    /// Time to live.
    pub ttl: u8,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port ([`super::ROCE_V2_PORT`] for RoCEv2).
    pub dst_port: u16,
    /// Length of the UDP payload (the IB transport packet including ICRC).
    pub payload_len: u16,
}

impl Ipv4Udp {
    /// The headers Linux writes for a datagram sent on an unconnected UDP socket with `DF` set.
    pub fn new(
        src: Ipv4Addr,
        src_port: u16,
        dst: Ipv4Addr,
        dst_port: u16,
        payload_len: usize,
    ) -> Self {
        Ipv4Udp {
            src,
            dst,
            tos: 0,
            id: 0,
            flags_frag: 0x4000,
            ttl: 64,
            src_port,
            dst_port,
            payload_len: payload_len as u16,
        }
    }

    /// Write both headers (28 bytes). The IP checksum is computed; the UDP checksum is left 0
    /// (RoCEv2 permits it and the ICRC masks it).
    pub fn emit(&self, buf: &mut [u8; IPV4_LEN + UDP_LEN]) {
        self.emit_no_checksum(buf);
        let sum = checksum(&buf[..IPV4_LEN]);
        be::put_u16(&mut buf[10..12], sum);
    }

    /// [`Ipv4Udp::emit`] with the IPv4 header checksum left zero: all the ICRC needs (it masks
    /// the checksum), for a header that never goes on the wire (the kernel writes that one).
    pub fn emit_no_checksum(&self, buf: &mut [u8; IPV4_LEN + UDP_LEN]) {
        let total = (IPV4_LEN + UDP_LEN) as u16 + self.payload_len;
        buf[0] = 0x45;
        buf[1] = self.tos;
        be::put_u16(&mut buf[2..4], total);
        be::put_u16(&mut buf[4..6], self.id);
        be::put_u16(&mut buf[6..8], self.flags_frag);
        buf[8] = self.ttl;
        buf[9] = PROTO_UDP;
        buf[10..12].fill(0);
        buf[12..16].copy_from_slice(&self.src.octets());
        buf[16..20].copy_from_slice(&self.dst.octets());
        be::put_u16(&mut buf[20..22], self.src_port);
        be::put_u16(&mut buf[22..24], self.dst_port);
        be::put_u16(&mut buf[24..26], UDP_LEN as u16 + self.payload_len);
        buf[26..28].fill(0);
    }

    /// Parse an IPv4 packet carrying UDP; returns the fields, the raw IPv4 header (with options, if
    /// any) and the UDP payload.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8], &[u8]), WireError> {
        if buf.len() < IPV4_LEN {
            return Err(WireError::Truncated);
        }
        if buf[0] >> 4 != 4 {
            return Err(WireError::Malformed("not IPv4"));
        }
        let ihl = (buf[0] & 0x0f) as usize * 4;
        let total = be::u16(&buf[2..4]) as usize;
        if ihl < IPV4_LEN || total < ihl + UDP_LEN || buf.len() < total {
            return Err(WireError::Malformed("bad IPv4 lengths"));
        }
        if buf[9] != PROTO_UDP {
            return Err(WireError::Malformed("not UDP"));
        }
        let udp = &buf[ihl..total];
        let udp_len = be::u16(&udp[4..6]) as usize;
        if udp_len < UDP_LEN || udp_len > udp.len() {
            return Err(WireError::Malformed("bad UDP length"));
        }
        let f = Ipv4Udp {
            src: Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]),
            dst: Ipv4Addr::new(buf[16], buf[17], buf[18], buf[19]),
            tos: buf[1],
            id: be::u16(&buf[4..6]),
            flags_frag: be::u16(&buf[6..8]),
            ttl: buf[8],
            src_port: be::u16(&udp[0..2]),
            dst_port: be::u16(&udp[2..4]),
            payload_len: (udp_len - UDP_LEN) as u16,
        };
        Ok((f, &buf[..ihl], &udp[UDP_LEN..udp_len]))
    }
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [b] = chunks.remainder() {
        sum += (*b as u32) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
