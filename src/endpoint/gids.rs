//! A context's GID table, as rdma_rxe lists a netdev's addresses: every IP address the endpoint
//! is bound to is a RoCE v2 GID (IPv4 as `::ffff:a.b.c.d`, IPv6 as itself, link-local ones
//! included). Indexes 0 and 1 both hold the first address — the IPv4 one when there is one —
//! as softrdma always had them (programs pass `-g 0`, `-g 1`, `-x 1`); the IPv6 addresses
//! follow. Each entry names the socket that sends from its address, which is how an address
//! vector's `sgid_index` picks the source.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::transport::AddressVector;
use crate::wire::gid::{gid_from_ip as gid_of, gid_to_ip};
use crate::wire::ROCE_V2_PORT;

#[derive(Clone, Copy, Debug)]
struct Entry {
    gid: [u8; 16],
    /// The socket (index into the endpoint's sockets) bound to the address.
    sock: u8,
    local: SocketAddr,
}

/// The GID table of one endpoint.
#[derive(Clone, Debug)]
pub(crate) struct GidTable {
    entries: Vec<Entry>,
    /// The interface index of the link-local addresses (0: none), for sending to a link-local
    /// peer.
    link_scope: u32,
}

/// Where a packet goes: out of which socket, to which address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Route {
    pub sock: u8,
    pub to: SocketAddr,
    /// The source address (the socket's).
    pub from: IpAddr,
}

fn link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

impl GidTable {
    /// The table of an endpoint whose sockets are bound to `locals` (the IPv4 one first).
    pub fn new(locals: &[SocketAddr]) -> GidTable {
        let mut entries: Vec<Entry> = locals
            .iter()
            .enumerate()
            .map(|(k, l)| Entry {
                gid: gid_of(l.ip()),
                sock: k as u8,
                local: *l,
            })
            .collect();
        if let Some(first) = entries.first().copied() {
            entries.insert(1, first);
        }
        let link_scope = locals
            .iter()
            .find_map(|l| match l {
                SocketAddr::V6(a) if link_local(a.ip()) => Some(a.scope_id()),
                _ => None,
            })
            .unwrap_or(0);
        GidTable {
            entries,
            link_scope,
        }
    }

    /// `gid_tbl_len`.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The GID at `index`.
    pub fn get(&self, index: usize) -> Option<[u8; 16]> {
        self.entries.get(index).map(|e| e.gid)
    }

    /// The first index holding `gid`.
    pub fn index_of(&self, gid: &[u8; 16]) -> Option<usize> {
        self.entries.iter().position(|e| e.gid == *gid)
    }

    /// The source GID index for a path to `dgid`: the first entry of its family, for IPv6 the
    /// first that is link-local when `dgid` is and global when it is not (else the first IPv6
    /// one). `None`: no address of that family.
    pub fn source_for(&self, dgid: &[u8; 16]) -> Option<u8> {
        let dst = gid_to_ip(dgid);
        let same = |e: &Entry| e.local.is_ipv4() == dst.is_ipv4();
        let scope = |e: &Entry| match (e.local.ip(), dst) {
            (IpAddr::V6(l), IpAddr::V6(d)) => link_local(&l) == link_local(&d),
            _ => true,
        };
        let first = |f: &dyn Fn(&Entry) -> bool| self.entries.iter().position(f);
        first(&|e| same(e) && scope(e))
            .or_else(|| first(&same))
            .map(|i| i as u8)
    }

    /// Whether an address vector toward `dgid` from `sgid_index` can be used: the index is in
    /// the table and the endpoint has an address of the destination's family.
    pub fn check(&self, dgid: &[u8; 16], sgid_index: u8) -> Result<(), &'static str> {
        if sgid_index as usize >= self.entries.len() {
            return Err("sgid_index out of the GID table");
        }
        let dst = gid_to_ip(dgid);
        if dst.is_unspecified() {
            return Err("dgid must be a RoCEv2 GID: an IP address (RoCE has no LID-only AH)");
        }
        if !self
            .entries
            .iter()
            .any(|e| e.local.is_ipv4() == dst.is_ipv4())
        {
            return Err(if dst.is_ipv4() {
                "dgid is an IPv4 address and the device has none"
            } else {
                "dgid is an IPv6 address and the device has none"
            });
        }
        Ok(())
    }

    /// The route of a packet to `dgid` from the GID at `sgid_index`. When that GID is of the
    /// other family (an address vector made without the table at hand), the first GID of the
    /// destination's family is the source. `None`: no address of that family.
    pub fn route_gid(&self, dgid: &[u8; 16], sgid_index: u8) -> Option<Route> {
        let dst = gid_to_ip(dgid);
        if dst.is_unspecified() {
            return None;
        }
        let same = |e: &&Entry| e.local.is_ipv4() == dst.is_ipv4();
        let e = self
            .entries
            .get(sgid_index as usize)
            .filter(same)
            .or_else(|| self.entries.iter().find(same))?;
        let to = match dst {
            IpAddr::V4(a) => SocketAddr::from((a, ROCE_V2_PORT)),
            IpAddr::V6(a) => {
                let scope = if link_local(&a) { self.link_scope } else { 0 };
                SocketAddr::V6(SocketAddrV6::new(a, ROCE_V2_PORT, 0, scope))
            }
        };
        Some(Route {
            sock: e.sock,
            to,
            from: e.local.ip(),
        })
    }

    /// [`GidTable::route_gid`] for an address vector.
    pub fn route(&self, av: &AddressVector) -> Option<Route> {
        self.route_gid(&av.dgid, av.sgid_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_at_0_and_1_then_ipv6_and_routes_by_family() {
        let locals: Vec<SocketAddr> = vec![
            "192.0.2.2:4791".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
            "[fe80::fc:ff:fe00:1%4]:4791".parse().unwrap(),
        ];
        let t = GidTable::new(&locals);
        assert_eq!(t.len(), 4);
        let v4 = gid_of("192.0.2.2".parse().unwrap());
        assert_eq!((t.get(0), t.get(1)), (Some(v4), Some(v4)));
        assert_eq!(
            t.get(2),
            Some("fd00::2".parse::<Ipv6Addr>().unwrap().octets())
        );
        assert_eq!(t.get(4), None);
        assert_eq!(t.index_of(&v4), Some(0));
        let peer6: Ipv6Addr = "fd00::3".parse().unwrap();
        let r = t.route_gid(&peer6.octets(), 2).unwrap();
        assert_eq!((r.sock, r.to), (1, "[fd00::3]:4791".parse().unwrap()));
        // The other family at the index: the first of the right one.
        assert_eq!(t.route_gid(&peer6.octets(), 0).unwrap().sock, 1);
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        // The source of a path: its family's first, of its scope for IPv6.
        assert_eq!(t.source_for(&gid_of("192.0.2.9".parse().unwrap())), Some(0));
        assert_eq!(t.source_for(&peer6.octets()), Some(2));
        assert_eq!(t.source_for(&ll.octets()), Some(3));
        let only_ll = GidTable::new(&locals[2..]);
        assert_eq!(only_ll.source_for(&peer6.octets()), Some(0));
        assert_eq!(
            only_ll.source_for(&gid_of("192.0.2.9".parse().unwrap())),
            None
        );
        let r = t.route_gid(&ll.octets(), 3).unwrap();
        assert_eq!((r.sock, r.to), (2, "[fe80::1%4]:4791".parse().unwrap()));
        let r = t
            .route_gid(&gid_of("192.0.2.9".parse().unwrap()), 3)
            .unwrap();
        assert_eq!((r.sock, r.to), (0, "192.0.2.9:4791".parse().unwrap()));
        assert!(t.route_gid(&[0; 16], 0).is_none());
        assert!(t.check(&peer6.octets(), 4).is_err());
        assert!(t.check(&[0; 16], 0).is_err());
        assert!(t.check(&peer6.octets(), 0).is_ok());
        // IPv6 only: the first IPv6 address at 0 and 1; no IPv4 route.
        let t = GidTable::new(&locals[1..]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.get(0), t.get(1));
        assert!(t.route_gid(&v4, 0).is_none());
        assert!(t.check(&v4, 0).is_err());
    }
}
