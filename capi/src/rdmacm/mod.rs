//! librdmacm (`rdma_*`, RDMACM_1.0 … RDMACM_1.3) over softrdma's connection manager
//! (`softrdma::rdma_cm`).
//!
//! An `rdma_event_channel` wraps a softrdma [`EventChannel`] (its `fd` is the channel's pollable
//! fd), an `rdma_cm_id` wraps a [`CmId`], and `rdma_get_cm_event` turns each softrdma event
//! into a heap `rdma_cm_event` that `rdma_ack_cm_event` frees. The fields programs read directly
//! (`verbs`, `pd`, `route.addr`, `qp`, the CQs and their channels) are kept up to date as
//! librdmacm keeps them: after a bind, an address or route resolution, and on the new id of a
//! CONNECT_REQUEST. Each device's context is wrapped once as an `ibv_context` with a default
//! PD (`context.rs`), so every id on a device shows the same `verbs` pointer and the verbs
//! calls on it are the ones of this library.
//!
//! Ids created without a channel are synchronous, as in librdmacm: they get a private channel
//! and the calls that wait for an event (resolve, connect, accept, disconnect) wait for it
//! themselves, leaving it in `id->event`.
//!
//! Addresses: AF_INET and AF_INET6. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is that
//! IPv4 address, reported back in the family the program used; an id bound to the IPv6 wildcard
//! `::` accepts IPv4 peers too, as Linux's does, and the ids of their connections have AF_INET
//! addresses, as Linux gives them.
//!
//! [`EventChannel`]: softrdma::rdma_cm::EventChannel
//! [`CmId`]: softrdma::rdma_cm::CmId

mod addr;
mod context;
mod ep;
mod event_channel;
mod id;
mod misc;
mod qp;
mod unsupported;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::abi::*;
use crate::handle::set_errno;

/// -1 with errno `e`: how librdmacm's calls fail.
pub(crate) fn fail(e: i32) -> i32 {
    set_errno(e);
    -1
}

/// An address a program passed in, as softrdma takes it (an IPv4-mapped IPv6 address as the
/// IPv4 one), and whether it was AF_INET6.
///
/// # Safety
/// `p` is NULL or points to a `struct sockaddr` of the size its family implies.
pub(crate) unsafe fn from_sockaddr(p: *const sockaddr) -> Result<(SocketAddr, bool), i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract, at least a `struct sockaddr`.
    let family = unsafe { (*p).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let a = unsafe { &*(p as *const sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok((
                SocketAddrV4::new(ip, u16::from_be(a.sin_port)).into(),
                false,
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let a = unsafe { &*(p as *const sockaddr_in6) };
            // SAFETY: in6_addr is a union of byte views of the same 16 bytes.
            let raw: [u8; 16] = unsafe { a.sin6_addr.__in6_u.__u6_addr8 };
            let v6 = Ipv6Addr::from(raw);
            let port = u16::from_be(a.sin6_port);
            let addr = match v6.to_ipv4_mapped() {
                Some(ip) => SocketAddrV4::new(ip, port).into(),
                None => SocketAddrV6::new(v6, port, u32::from_be(a.sin6_flowinfo), a.sin6_scope_id)
                    .into(),
            };
            Ok((addr, true))
        }
        // librdmacm: `ucma_addrlen` knows no such family.
        _ => Err(libc::EINVAL),
    }
}

/// Writes `a` into a `sockaddr_storage`: an IPv6 address as a `sockaddr_in6`; an IPv4 one as a
/// `sockaddr_in`, or, for an id the program gave an AF_INET6 address (`v6`), as the
/// IPv4-mapped `sockaddr_in6` (`::` for the wildcard).
pub(crate) fn to_sockaddr(dst: &mut sockaddr_storage, a: SocketAddr, v6: bool) {
    // SAFETY: sockaddr_storage is plain C data; all-zero is valid.
    *dst = unsafe { std::mem::zeroed() };
    let (raw, port, flow, scope) = match a {
        SocketAddr::V4(a) if !v6 => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let s = unsafe { &mut *(dst as *mut sockaddr_storage as *mut sockaddr_in) };
            s.sin_family = libc::AF_INET as sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            return;
        }
        SocketAddr::V4(a) if a.ip().is_unspecified() => ([0u8; 16], a.port(), 0, 0),
        SocketAddr::V4(a) => (a.ip().to_ipv6_mapped().octets(), a.port(), 0, 0),
        SocketAddr::V6(a) => (a.ip().octets(), a.port(), a.flowinfo(), a.scope_id()),
    };
    // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
    let s = unsafe { &mut *(dst as *mut sockaddr_storage as *mut sockaddr_in6) };
    s.sin6_family = libc::AF_INET6 as sa_family_t;
    s.sin6_port = port.to_be();
    s.sin6_flowinfo = flow.to_be();
    s.sin6_addr.__in6_u.__u6_addr8 = raw;
    s.sin6_scope_id = scope;
}

/// The port of a `struct sockaddr` (network byte order), 0 for other families.
///
/// # Safety
/// `p` points to a live `sockaddr_storage`.
pub(crate) unsafe fn port_of(p: *const sockaddr_storage) -> u16 {
    // SAFETY: per the contract.
    let family = unsafe { (*p).ss_family } as i32;
    match family {
        // SAFETY: the family says which structure it is; the storage holds either.
        libc::AF_INET => unsafe { (*(p as *const sockaddr_in)).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*(p as *const sockaddr_in6)).sin6_port },
        _ => 0,
    }
}
