//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`, as librdmacm's: the system's `getaddrinfo`
//! resolves the name and service, and its first answer becomes the source (RAI_PASSIVE) or
//! destination address, with the QP type and port space from the hints or from the socket
//! type and protocol (stream/TCP: RC in RDMA_PS_TCP; datagram/UDP: UD in RDMA_PS_UDP). No
//! route or connect data is added (that needs an IB address service).

use std::ffi::c_char;

use super::fail;
use crate::abi::*;
use crate::handle::guard;

const RAI_PASSIVE: i32 = 1;
const RAI_NUMERICHOST: i32 = 2;
const AF_IB: i32 = 27;

/// librdmacm's `ucma_convert_to_ai`: the hints as `getaddrinfo` takes them.
fn to_ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: addrinfo is plain C data; all-zero is valid.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != AF_IB {
        ai.ai_family = h.ai_family;
    }
    match h.ai_qp_type as u32 {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => {
            ai.ai_socktype = libc::SOCK_STREAM
        }
        IBV_QPT_UD => ai.ai_socktype = libc::SOCK_DGRAM,
        _ => {}
    }
    match h.ai_port_space as u32 {
        RDMA_PS_TCP => ai.ai_protocol = libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => ai.ai_protocol = libc::IPPROTO_UDP,
        RDMA_PS_IB => {
            if ai.ai_socktype == libc::SOCK_STREAM {
                ai.ai_protocol = libc::IPPROTO_TCP;
            } else if ai.ai_socktype == libc::SOCK_DGRAM {
                ai.ai_protocol = libc::IPPROTO_UDP;
            }
        }
        _ => {}
    }
    ai
}

/// A `malloc`ed copy of an address, as `rdma_freeaddrinfo` frees it.
///
/// # Safety
/// `src` has `len` readable bytes.
unsafe fn copy_addr(src: *const sockaddr, len: socklen_t) -> Result<*mut sockaddr, i32> {
    // SAFETY: malloc has no preconditions; the result is checked.
    let dst = unsafe { libc::malloc(len as usize) } as *mut sockaddr;
    if dst.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: both have `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
    Ok(dst)
}

/// librdmacm's `ucma_convert_to_rai`.
///
/// # Safety
/// `ai` is an answer of `getaddrinfo`.
unsafe fn from_ai(
    rai: &mut rdma_addrinfo,
    hints: &rdma_addrinfo,
    ai: &libc::addrinfo,
) -> Result<(), i32> {
    rai.ai_qp_type = if hints.ai_qp_type != 0 {
        hints.ai_qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC as i32,
            libc::SOCK_DGRAM => IBV_QPT_UD as i32,
            _ => 0,
        }
    };
    rai.ai_port_space = if hints.ai_port_space != 0 {
        hints.ai_port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => RDMA_PS_TCP as i32,
            libc::IPPROTO_UDP => RDMA_PS_UDP as i32,
            _ => 0,
        }
    };
    rai.ai_family = ai.ai_family;
    let canon = if ai.ai_canonname.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: a NUL-terminated name from getaddrinfo.
        unsafe { libc::strdup(ai.ai_canonname) }
    };
    // SAFETY: getaddrinfo's address of `ai_addrlen` bytes.
    let addr = unsafe { copy_addr(ai.ai_addr as *const sockaddr, ai.ai_addrlen) }?;
    if ai.ai_flags & libc::AI_PASSIVE != 0 {
        rai.ai_flags = RAI_PASSIVE;
        rai.ai_src_canonname = canon;
        rai.ai_src_addr = addr;
        rai.ai_src_len = ai.ai_addrlen;
    } else {
        rai.ai_dst_canonname = canon;
        rai.ai_dst_addr = addr;
        rai.ai_dst_len = ai.ai_addrlen;
    }
    Ok(())
}

/// Fills `rai`; an `Err` is an errno (`Ok(Some(code))`: a `getaddrinfo` error code, returned
/// as is, as librdmacm returns it).
///
/// # Safety
/// The caller's strings are NUL-terminated or NULL; `hints` is NULL or valid.
unsafe fn fill(
    rai: &mut rdma_addrinfo,
    node: *const c_char,
    service: *const c_char,
    hints: Option<&rdma_addrinfo>,
) -> Result<Option<i32>, i32> {
    // SAFETY: rdma_addrinfo is plain C data; all-zero is valid (librdmacm's `nohints`).
    let none: rdma_addrinfo = unsafe { std::mem::zeroed() };
    let h = hints.unwrap_or(&none);
    if !node.is_null() || !service.is_null() {
        let ai_hints = hints.map(to_ai_hints);
        let mut res: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: the caller's strings; hints NULL or a local; `res` an out pointer.
        let r = unsafe {
            libc::getaddrinfo(
                node,
                service,
                ai_hints
                    .as_ref()
                    .map_or(std::ptr::null(), |h| h as *const libc::addrinfo),
                &mut res,
            )
        };
        if r != 0 {
            return Ok(Some(r));
        }
        // SAFETY: getaddrinfo succeeded, so `res` heads a list of at least one answer.
        let out = unsafe { from_ai(rai, h, &*res) };
        // SAFETY: the list getaddrinfo returned.
        unsafe { libc::freeaddrinfo(res) };
        out?;
    } else {
        rai.ai_flags = h.ai_flags;
        rai.ai_family = h.ai_family;
        rai.ai_qp_type = h.ai_qp_type;
        rai.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 {
            // SAFETY: the hints' address of `ai_dst_len` bytes.
            rai.ai_dst_addr = unsafe { copy_addr(h.ai_dst_addr, h.ai_dst_len) }?;
            rai.ai_dst_len = h.ai_dst_len;
        }
    }
    if rai.ai_src_len == 0 && h.ai_src_len != 0 {
        // SAFETY: the hints' address of `ai_src_len` bytes.
        rai.ai_src_addr = unsafe { copy_addr(h.ai_src_addr, h.ai_src_len) }?;
        rai.ai_src_len = h.ai_src_len;
    }
    Ok(None)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> i32 {
    guard(-1, || {
        if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: calloc has no preconditions; the result is checked. rdma_freeaddrinfo frees
        // it with free().
        let rai =
            unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
        if rai.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: `rai` was just allocated and zeroed; the caller's strings and hints.
        let r = unsafe { fill(&mut *rai, node, service, hints.as_ref()) };
        match r {
            Ok(None) => {
                // SAFETY: the caller's out pointer.
                unsafe { *res = rai };
                0
            }
            Ok(Some(code)) => {
                // SAFETY: ours, partly filled.
                unsafe { rdma_freeaddrinfo(rai) };
                code
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { rdma_freeaddrinfo(rai) };
                fail(e)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list made by rdma_getaddrinfo: each node and field malloc'ed or NULL
        // (free(NULL) is a no-op).
        unsafe {
            let r = &*cur;
            let next = r.ai_next;
            libc::free(r.ai_connect);
            libc::free(r.ai_route);
            libc::free(r.ai_src_canonname.cast());
            libc::free(r.ai_dst_canonname.cast());
            libc::free(r.ai_src_addr.cast());
            libc::free(r.ai_dst_addr.cast());
            libc::free(cur.cast());
            cur = next;
        }
    }
}

versioned!(
    rdma_getaddrinfo @ "RDMACM_1.0",
    rdma_freeaddrinfo @ "RDMACM_1.0",
);
