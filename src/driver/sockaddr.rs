//! Socket addresses in the kernel's layout (`sockaddr_in` or `sockaddr_in6`), for the batched
//! system calls of [`super::batch`]: fixed size, no allocation.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Room for either family: a `sockaddr_in6`, which a `sockaddr_in` fits at the front of.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct RawAddr(libc::sockaddr_in6);

impl RawAddr {
    /// All zero (family `AF_UNSPEC`): what `recvmmsg` overwrites.
    pub fn zeroed() -> RawAddr {
        // SAFETY: sockaddr_in6 is a plain C struct; all-zero is valid.
        RawAddr(unsafe { std::mem::zeroed() })
    }

    pub fn new(a: SocketAddr) -> RawAddr {
        let mut r = RawAddr::zeroed();
        match a {
            SocketAddr::V4(a) => {
                // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
                let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = a.port().to_be();
                s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                // SAFETY: a sockaddr_in (16 bytes, align 4) fits at the front of a
                // sockaddr_in6 (28 bytes, align 4).
                unsafe { std::ptr::write(self_ptr(&mut r).cast::<libc::sockaddr_in>(), s) };
            }
            SocketAddr::V6(a) => {
                r.0.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                r.0.sin6_port = a.port().to_be();
                r.0.sin6_flowinfo = a.flowinfo().to_be();
                r.0.sin6_addr.s6_addr = a.ip().octets();
                r.0.sin6_scope_id = a.scope_id();
            }
        }
        r
    }

    /// The address, if the kernel wrote one of the two families.
    pub fn get(&self) -> Option<SocketAddr> {
        match self.0.sin6_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says the front is a sockaddr_in.
                let s = unsafe { std::ptr::read((&self.0 as *const libc::sockaddr_in6).cast()) };
                let s: libc::sockaddr_in = s;
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(self.0.sin6_addr.s6_addr),
                u16::from_be(self.0.sin6_port),
                u32::from_be(self.0.sin6_flowinfo),
                self.0.sin6_scope_id,
            ))),
            _ => None,
        }
    }

    /// The length the kernel expects for this family (`msg_namelen`).
    pub fn len(&self) -> libc::socklen_t {
        if self.0.sin6_family as libc::c_int == libc::AF_INET {
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        } else {
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }

    /// The room for `recvmmsg` to write into.
    pub const CAPACITY: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in6>() as _;

    pub fn as_mut_ptr(&mut self) -> *mut libc::c_void {
        self_ptr(self).cast()
    }
}

fn self_ptr(r: &mut RawAddr) -> *mut libc::sockaddr_in6 {
    &mut r.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_both_families() {
        for a in [
            "10.1.2.3:4791",
            "[::1]:4791",
            "[fd00::2]:1",
            "[fe80::fc:ff:fe00:1%4]:4791",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let r = RawAddr::new(a);
            assert_eq!(r.get(), Some(a));
            let want = if a.is_ipv4() { 16 } else { 28 };
            assert_eq!(r.len(), want);
        }
        assert_eq!(RawAddr::zeroed().get(), None);
    }
}
