//! The host's network interfaces and their IP addresses (getifaddrs), and the default routes:
//! what the device list is made of.

use std::ffi::CStr;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::error::Result;

/// One IPv6 address of an interface, with the scope a link-local one needs (its interface
/// index; 0 for other addresses).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub(crate) struct V6Addr {
    pub ip: Ipv6Addr,
    pub scope: u32,
}

impl V6Addr {
    pub fn is_link_local(&self) -> bool {
        self.ip.segments()[0] & 0xffc0 == 0xfe80
    }
}

/// One interface that is up: its first IPv4 address (with netmask), if any, and its IPv6
/// addresses, global ones before link-local ones.
pub(crate) struct Interface {
    pub name: String,
    pub v4: Option<(Ipv4Addr, Ipv4Addr)>,
    pub v6: Vec<V6Addr>,
    pub mtu: u32,
    /// IFF_RUNNING: up with a carrier.
    pub running: bool,
    pub loopback: bool,
}

impl Interface {
    /// Whether `a` is in the subnet of the interface's IPv4 address.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        self.v4.is_some_and(|(addr, mask)| {
            let m = u32::from(mask);
            m != 0 && u32::from(a) & m == u32::from(addr) & m
        })
    }
}

/// The interfaces that are up and have at least one IP address, in getifaddrs order (a host
/// with IPv6 disabled lists no IPv6 address).
pub(crate) fn interfaces() -> Result<Vec<Interface>> {
    let mut out: Vec<Interface> = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`; we free it with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of at least sa_family's size.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family != libc::AF_INET && family != libc::AF_INET6 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let i = match out.iter().position(|i| i.name == name) {
            Some(i) => i,
            None => {
                let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(1500);
                out.push(Interface {
                    name,
                    v4: None,
                    v6: Vec::new(),
                    mtu,
                    running: ifa.ifa_flags & libc::IFF_RUNNING as u32 != 0,
                    loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0,
                });
                out.len() - 1
            }
        };
        let f = &mut out[i];
        if family == libc::AF_INET {
            // SAFETY: for AF_INET the address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            let mask = if ifa.ifa_netmask.is_null() {
                Ipv4Addr::UNSPECIFIED
            } else {
                // SAFETY: for an AF_INET address the netmask, when present, is a sockaddr_in.
                let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in) };
                Ipv4Addr::from(u32::from_be(m.sin_addr.s_addr))
            };
            // One device per interface, on its first IPv4 address, as before.
            if f.v4.is_none() {
                f.v4 = Some((addr, mask));
            }
        } else {
            // SAFETY: for AF_INET6 the address is a sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let a = V6Addr {
                ip: Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                scope: sin6.sin6_scope_id,
            };
            if !f.v6.contains(&a) {
                f.v6.push(a);
            }
        }
    }
    // SAFETY: `ifap` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    for i in &mut out {
        // Global addresses first (stable: otherwise in the kernel's order).
        i.v6.sort_by_key(V6Addr::is_link_local);
        i.v6.retain(|a| !a.ip.is_unspecified() && !a.ip.is_multicast());
    }
    out.retain(|i| i.v4.is_some() || !i.v6.is_empty());
    Ok(out)
}

/// The interface of the default route: IPv4's (`/proc/net/route`), else IPv6's
/// (`/proc/net/ipv6_route`).
pub(crate) fn default_route_interface() -> Option<String> {
    if let Some(i) = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|table| {
            table.lines().skip(1).find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
            })
        })
    {
        return Some(i);
    }
    // dest, dest prefix length, source, source prefix, next hop, metric, refcnt, use, flags,
    // device: a default route is ::/0 through a device other than lo.
    let table = std::fs::read_to_string("/proc/net/ipv6_route").ok()?;
    table.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" && f[9] != "lo")
            .then(|| f[9].to_string())
    })
}
