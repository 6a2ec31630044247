//! GIDs of IP addresses: RoCEv2 carries an IPv4 address as the IPv4-mapped GID
//! `::ffff:a.b.c.d` and an IPv6 address as itself; softrdma derives a device's node GUID from
//! its address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The node GUID of an address: `02:00:5e:ff:a:b:c:d`.
pub(crate) fn guid_from_ipv4(a: Ipv4Addr) -> u64 {
    let o = a.octets();
    u64::from_be_bytes([0x02, 0x00, 0x5e, 0xff, o[0], o[1], o[2], o[3]])
}

/// The IPv4-mapped RoCEv2 GID `::ffff:a.b.c.d`.
pub fn gid_from_ipv4(a: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a.octets());
    g
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn ipv4_from_gid(g: &[u8; 16]) -> Option<Ipv4Addr> {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        Some(Ipv4Addr::new(g[12], g[13], g[14], g[15]))
    } else {
        None
    }
}

/// The GID of an IP address: IPv4-mapped for IPv4, the address itself for IPv6.
pub fn gid_from_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => gid_from_ipv4(a),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The IP address of a GID (IPv4 for an IPv4-mapped one), for building the network header of a packet to send.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    match ipv4_from_gid(gid) {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::from(*gid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_round_trip() {
        let a = Ipv4Addr::new(10, 1, 2, 3);
        assert_eq!(gid_from_ipv4(a), a.to_ipv6_mapped().octets());
        assert_eq!(ipv4_from_gid(&gid_from_ipv4(a)), Some(a));
        assert_eq!(ipv4_from_gid(&[0xfe; 16]), None);
        assert_eq!(gid_to_ip(&gid_from_ipv4(a)), IpAddr::V4(a));
        assert_eq!(gid_from_ip(IpAddr::V4(a)), gid_from_ipv4(a));
        let v6: Ipv6Addr = "fd00::2".parse().unwrap();
        assert_eq!(gid_to_ip(&gid_from_ip(IpAddr::V6(v6))), IpAddr::V6(v6));
        assert_eq!(guid_from_ipv4(a), 0x0200_5eff_0a01_0203);
    }
}
