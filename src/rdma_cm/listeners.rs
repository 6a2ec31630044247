//! A device's listening ids, by Service ID, and which one takes an incoming request: as Linux's
//! `cma_match_private_data`, by the address each is bound to and the rdma_cm header's
//! destination address. An id bound to `::` takes IPv4 and IPv6 requests (Linux's default,
//! `bindv6only` 0); one bound to `0.0.0.0` takes IPv4 ones only; one bound to an address takes
//! requests to that address. Several ids may listen on one port of one device when their
//! addresses differ (127.0.0.1 and `::1` on loopback, say).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use super::id::{CmId, Handle, IdInner};
use crate::cm::private_data::CmaHdr;

pub(crate) struct Listener {
    pub handle: Weak<Handle>,
    pub inner: Arc<IdInner>,
    pub backlog: usize,
    /// The address the id is bound to (`0.0.0.0` or `::`: wildcard).
    pub addr: IpAddr,
}

impl Listener {
    pub fn alive(&self) -> Option<CmId> {
        if self.inner.is_destroyed() {
            return None;
        }
        self.handle.upgrade().map(CmId)
    }

    /// An identity for the listening id (for counting its pending requests).
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

/// Whether an id bound to `bound` takes a request with rdma_cm header `hdr` (Linux's
/// `cma_match_private_data`, `afonly` being 1 for IPv4 and `bindv6only` (0) for IPv6). A
/// request without a valid header names no address: any listener takes it.
pub(crate) fn matches(bound: IpAddr, hdr: Option<&CmaHdr>) -> bool {
    let Some(h) = hdr.filter(|h| h.is_valid()) else {
        return true;
    };
    match bound {
        IpAddr::V6(a) if a.is_unspecified() => true,
        IpAddr::V4(a) => h.ip_version == 4 && (a.is_unspecified() || h.dst_ip() == Some(bound)),
        IpAddr::V6(_) => h.ip_version == 6 && h.dst_ip() == Some(bound),
    }
}

#[derive(Default)]
pub(crate) struct Listeners {
    by_sid: HashMap<u64, Vec<Listener>>,
}

impl Listeners {
    /// Add `l` for `sid`; false if a live listener has the same address. Returns also whether
    /// it is the first listener of `sid` (the IB CM must listen then).
    pub fn add(&mut self, sid: u64, l: Listener) -> Option<bool> {
        let v = self.by_sid.entry(sid).or_default();
        v.retain(|o| o.alive().is_some());
        if v.iter().any(|o| o.addr == l.addr) {
            return None;
        }
        let first = v.is_empty();
        v.push(l);
        Some(first)
    }

    /// Remove the listener of `sid` whose id is `inner` (all dead ones too). Returns whether
    /// `sid` has no listener left (the IB CM must stop listening then).
    pub fn remove(&mut self, sid: u64, inner: &Arc<IdInner>) -> bool {
        let Some(v) = self.by_sid.get_mut(&sid) else {
            return false;
        };
        v.retain(|o| !Arc::ptr_eq(&o.inner, inner) && o.alive().is_some());
        if v.is_empty() {
            self.by_sid.remove(&sid);
            return true;
        }
        false
    }

    /// The live listener of `sid` that takes a request with header `hdr`.
    pub fn find(&self, sid: u64, hdr: Option<&CmaHdr>) -> Option<&Listener> {
        self.by_sid
            .get(&sid)?
            .iter()
            .find(|l| l.alive().is_some() && matches(l.addr, hdr))
    }

    /// Service IDs with a dead listener, and those ids.
    pub fn dead(&self) -> Vec<(u64, Arc<IdInner>)> {
        self.by_sid
            .iter()
            .flat_map(|(sid, v)| {
                v.iter()
                    .filter(|l| l.alive().is_none())
                    .map(move |l| (*sid, l.inner.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

    #[test]
    fn address_matching_follows_linux() {
        let v4 = CmaHdr::v4(
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 5000),
            Ipv4Addr::new(10, 0, 0, 1),
        );
        let v6 = CmaHdr::v6(
            SocketAddrV6::new("fd00::2".parse().unwrap(), 5000, 0, 0),
            "fd00::1".parse().unwrap(),
        );
        let any4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let any6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        // `::` takes both families; `0.0.0.0` IPv4 only.
        assert!(matches(any6, Some(&v4)) && matches(any6, Some(&v6)));
        assert!(matches(any4, Some(&v4)) && !matches(any4, Some(&v6)));
        // A bound address takes requests to that address only.
        assert!(matches("10.0.0.1".parse().unwrap(), Some(&v4)));
        assert!(!matches("10.0.0.9".parse().unwrap(), Some(&v4)));
        assert!(matches("fd00::1".parse().unwrap(), Some(&v6)));
        assert!(!matches("fd00::1".parse().unwrap(), Some(&v4)));
        assert!(!matches("10.0.0.1".parse().unwrap(), Some(&v6)));
        // No header (or a bad one): any listener.
        assert!(matches("10.0.0.1".parse().unwrap(), None));
        let bad = CmaHdr {
            ip_version: 5,
            ..v4
        };
        assert!(matches("fd00::1".parse().unwrap(), Some(&bad)));
    }
}
