//! Ethernet II framing, just enough to take RoCEv2 datagrams out of captured frames and to put
//! them back into frames for a pcap file.
//!
//! ```text
//!  0..6 destination MAC | 6..12 source MAC | [12..16 802.1Q TPID 0x8100, TCI] | EtherType | payload
//! ```
//!
//! Everything here borrows from the caller's buffer and never allocates or panics.

use super::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use super::ipv6::{Ipv6Udp, IPV6_LEN};
use super::{be, WireError};

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Tag protocol identifier of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// A MAC address.
pub type Mac = [u8; 6];

/// The parsed Ethernet header of a frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EthHeader {
    /// Destination MAC address.
    pub dst: Mac,
    /// Source MAC address.
    pub src: Mac,
    /// The tag control information (PCP, DEI, VLAN ID) of an 802.1Q tag, if present.
    pub vlan_tci: Option<u16>,
    /// The EtherType after the tag, if any.
    pub ethertype: u16,
}

impl EthHeader {
    /// Length of this header on the wire.
    pub const fn len(&self) -> usize {
        if self.vlan_tci.is_some() {
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Always false: a header is never empty (present for clippy's `len_without_is_empty`).
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// Parse the header at the start of `frame`; returns it and the payload after it.
    /// One 802.1Q tag (TPID 0x8100) is understood; anything else (802.1ad QinQ) is returned as
    /// its EtherType.
    pub fn parse(frame: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if frame.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&frame[0..6]);
        src.copy_from_slice(&frame[6..12]);
        let tpid = be::u16(&frame[12..14]);
        if tpid == ETHERTYPE_VLAN {
            if frame.len() < HEADER_LEN + VLAN_TAG_LEN {
                return Err(WireError::Truncated);
            }
            let h = EthHeader {
                dst,
                src,
                vlan_tci: Some(be::u16(&frame[14..16])),
                ethertype: be::u16(&frame[16..18]),
            };
            return Ok((h, &frame[HEADER_LEN + VLAN_TAG_LEN..]));
        }
        let h = EthHeader {
            dst,
            src,
            vlan_tci: None,
            ethertype: tpid,
        };
        Ok((h, &frame[HEADER_LEN..]))
    }

    /// Write the header into the start of `buf`; returns its length ([`EthHeader::len`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.len();
        if buf.len() < len {
            return Err(WireError::BufferTooSmall);
        }
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        let mut at = 12;
        if let Some(tci) = self.vlan_tci {
            be::put_u16(&mut buf[12..14], ETHERTYPE_VLAN);
            be::put_u16(&mut buf[14..16], tci);
            at = 16;
        }
        be::put_u16(&mut buf[at..at + 2], self.ethertype);
        Ok(len)
    }
}

/// Split an Ethernet frame carrying IPv4/UDP (untagged or with one VLAN tag) into the 28 bytes of
/// IPv4 and UDP header, as [`super::icrc::compute_v4`] wants them, and the UDP payload (for
/// RoCEv2: BTH to ICRC). Trailing Ethernet padding is excluded (the IP and UDP lengths are
/// honoured). The UDP port is not checked. IPv4 options are refused: RoCEv2 never uses them and
/// the ICRC functions take a fixed 20-byte header.
pub fn split_ipv4_udp(frame: &[u8]) -> Result<([u8; IPV4_LEN + UDP_LEN], &[u8]), WireError> {
    let (eth, rest) = EthHeader::parse(frame)?;
    if eth.ethertype != ETHERTYPE_IPV4 {
        return Err(WireError::Malformed("not an IPv4 frame"));
    }
    let (_, ip_hdr, payload) = Ipv4Udp::parse(rest)?;
    if ip_hdr.len() != IPV4_LEN {
        return Err(WireError::Malformed("IPv4 options"));
    }
    let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
    hdr.copy_from_slice(&rest[..IPV4_LEN + UDP_LEN]);
    Ok((hdr, payload))
}

/// Like [`split_ipv4_udp`] for IPv6: the 48 bytes of IPv6 and UDP header (no extension headers)
/// and the UDP payload.
pub fn split_ipv6_udp(frame: &[u8]) -> Result<([u8; IPV6_LEN + UDP_LEN], &[u8]), WireError> {
    let (eth, rest) = EthHeader::parse(frame)?;
    if eth.ethertype != ETHERTYPE_IPV6 {
        return Err(WireError::Malformed("not an IPv6 frame"));
    }
    let (_, payload) = Ipv6Udp::parse(rest)?;
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    hdr.copy_from_slice(&rest[..IPV6_LEN + UDP_LEN]);
    Ok((hdr, payload))
}

/// The IP and UDP headers of a RoCEv2 datagram found in a frame, by IP version.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IpUdpHeader {
    /// The 20-byte IPv4 header (no options) and the 8-byte UDP header.
    V4([u8; IPV4_LEN + UDP_LEN]),
    /// The 40-byte IPv6 header (no extension headers) and the 8-byte UDP header.
    V6([u8; IPV6_LEN + UDP_LEN]),
}

impl IpUdpHeader {
    /// The header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            IpUdpHeader::V4(h) => h,
            IpUdpHeader::V6(h) => h,
        }
    }

    /// The UDP destination port.
    pub fn dst_port(&self) -> u16 {
        let b = self.as_bytes();
        let udp = b.len() - UDP_LEN;
        be::u16(&b[udp + 2..udp + 4])
    }

    /// Verify the ICRC at the end of `udp_payload` against these headers.
    pub fn verify_icrc(&self, udp_payload: &[u8]) -> Result<(), WireError> {
        match self {
            IpUdpHeader::V4(h) => super::icrc::verify_v4(h, udp_payload),
            IpUdpHeader::V6(h) => super::icrc::verify_v6(h, udp_payload),
        }
    }
}

/// Split an Ethernet frame carrying IPv4/UDP or IPv6/UDP into its IP+UDP header and UDP payload.
pub fn split_ip_udp(frame: &[u8]) -> Result<(IpUdpHeader, &[u8]), WireError> {
    let (eth, _) = EthHeader::parse(frame)?;
    match eth.ethertype {
        ETHERTYPE_IPV4 => split_ipv4_udp(frame).map(|(h, p)| (IpUdpHeader::V4(h), p)),
        ETHERTYPE_IPV6 => split_ipv6_udp(frame).map(|(h, p)| (IpUdpHeader::V6(h), p)),
        _ => Err(WireError::Malformed("not an IP frame")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first 14 + 28 bytes of frame 4 of tests/data/rxe-basic.pcap (rping's RC SEND_ONLY from
    /// 10.77.0.2 to 10.77.0.3), then its 32-byte UDP payload.
    const FRAME: [u8; 74] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0a, 0x08,
        0x00, // eth
        0x45, 0x00, 0x00, 0x3c, 0xe6, 0xec, 0x40, 0x00, 0x40, 0x11, 0x3f, 0x26, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x03, // IPv4
        0xcb, 0x97, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // UDP
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x2a, 0x3e, 0x9b, // BTH
        0x00, 0x00, 0x56, 0x32, 0x0f, 0xb6, 0x23, 0x70, 0x00, 0x00, 0x05, 0x87, 0x00, 0x00, 0x00,
        0x40, // payload
        0xad, 0x6b, 0x5c, 0x84, // ICRC
    ];

    #[test]
    fn splits_untagged_frame() {
        let (h, p) = split_ipv4_udp(&FRAME).unwrap();
        assert_eq!(&h[..], &FRAME[14..42]);
        assert_eq!(p, &FRAME[42..]);
        super::super::icrc::verify_v4(&h, p).unwrap();
        let (e, _) = EthHeader::parse(&FRAME).unwrap();
        assert_eq!(e.ethertype, ETHERTYPE_IPV4);
        assert_eq!(e.vlan_tci, None);
        let mut b = [0u8; 14];
        assert_eq!(e.emit(&mut b), Ok(14));
        assert_eq!(b, FRAME[..14]);
        let (ih, p2) = split_ip_udp(&FRAME).unwrap();
        assert_eq!(ih, IpUdpHeader::V4(h));
        assert_eq!(ih.dst_port(), 4791);
        assert_eq!(p2, p);
        ih.verify_icrc(p2).unwrap();
    }

    #[test]
    fn splits_vlan_tagged_frame_and_ignores_ethernet_padding() {
        let mut f = [0u8; 74 + 4 + 10];
        f[..12].copy_from_slice(&FRAME[..12]);
        f[12..16].copy_from_slice(&[0x81, 0x00, 0x20, 0x07]); // PCP 1, VID 7
        f[16..78].copy_from_slice(&FRAME[12..]);
        let (e, _) = EthHeader::parse(&f).unwrap();
        assert_eq!(e.vlan_tci, Some(0x2007));
        assert_eq!(e.len(), 18);
        let mut b = [0u8; 18];
        assert_eq!(e.emit(&mut b), Ok(18));
        assert_eq!(b, f[..18]);
        let (h, p) = split_ipv4_udp(&f).unwrap();
        assert_eq!(&h[..], &FRAME[14..42]);
        assert_eq!(p, &FRAME[42..]);
    }

    #[test]
    fn refuses_what_it_cannot_split() {
        for n in 0..FRAME.len() {
            assert!(split_ipv4_udp(&FRAME[..n]).is_err(), "{n}");
        }
        let mut f = FRAME;
        f[12] = 0x86;
        f[13] = 0xdd;
        assert!(split_ipv4_udp(&f).is_err());
        assert!(split_ipv6_udp(&f).is_err());
        let mut f = FRAME;
        f[14] = 0x46; // IHL 6: options
        assert!(split_ipv4_udp(&f).is_err());
        let mut f = FRAME;
        f[23] = 6; // TCP
        assert!(split_ipv4_udp(&f).is_err());
        let mut b = [0u8; 13];
        let (e, _) = EthHeader::parse(&FRAME).unwrap();
        assert_eq!(e.emit(&mut b), Err(WireError::BufferTooSmall));
    }
}
