//! What this librdmacm does not do: multicast, ECE and rsockets.
//!
//! - Multicast (`rdma_join_multicast*`, `rdma_leave_multicast`): EOPNOTSUPP.
//! - ECE: `rdma_set_local_ece` fails with EOPNOTSUPP (softrdma's CM sends no ECE);
//!   `rdma_get_remote_ece` reports that the peer sent none (all zero), and `rdma_reject_ece`
//!   rejects as `rdma_reject` does.
//! - rsockets: `rsocket` fails with ENOSYS, so no rsocket ever exists, and every call on one
//!   fails with EBADF. `rpoll` and `rselect` are the exception: librdmacm's example programs
//!   import them (through `rs_poll`/`rs_select`), and on descriptors that are not rsockets they
//!   are `poll` and `select`, which is what they are here.

use super::fail;
use super::id::get;
use crate::abi::*;
use crate::handle::guard;

fn id_then(id: *mut rdma_cm_id, errno: i32) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        match unsafe { get(id) } {
            Ok(_) => fail(errno),
            Err(e) => fail(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    _addr: *mut sockaddr,
    _context: *mut libc::c_void,
) -> i32 {
    id_then(id, libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    _mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    _context: *mut libc::c_void,
) -> i32 {
    id_then(id, libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, _addr: *mut sockaddr) -> i32 {
    // Nothing was joined.
    id_then(id, libc::EADDRNOTAVAIL)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> i32 {
    if ece.is_null() {
        return fail(libc::EINVAL);
    }
    id_then(id, libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the caller's struct or NULL.
        match (unsafe { get(id) }, unsafe { ece.as_mut() }) {
            (Ok(i), Some(e)) if i.c.qp.is_null() => {
                e.vendor_id = 0;
                e.options = 0;
                e.comp_mask = 0;
                0
            }
            _ => fail(libc::EINVAL),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const libc::c_void,
    private_data_len: u8,
) -> i32 {
    // SAFETY: forwards the caller's arguments.
    unsafe { super::id::rdma_reject(id, private_data, private_data_len) }
}

/// `rpoll`: `poll` (no descriptor is an rsocket).
#[no_mangle]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: i32) -> i32 {
    // SAFETY: forwards the caller's array.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// `rselect`: `select` (no descriptor is an rsocket).
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: i32,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> i32 {
    // SAFETY: forwards the caller's sets.
    unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn rsocket(_domain: i32, _type: i32, _protocol: i32) -> i32 {
    fail(libc::ENOSYS)
}

/// The calls on an rsocket: there is none, so the descriptor is bad.
macro_rules! no_rsocket {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($(_: $ty),*) -> $ret {
                crate::handle::set_errno(libc::EBADF);
                -1 as _
            }
        )*
    };
}

no_rsocket! {
    rbind(s: i32, a: *const sockaddr, l: socklen_t) -> i32;
    rlisten(s: i32, b: i32) -> i32;
    raccept(s: i32, a: *mut sockaddr, l: *mut socklen_t) -> i32;
    rconnect(s: i32, a: *const sockaddr, l: socklen_t) -> i32;
    rshutdown(s: i32, how: i32) -> i32;
    rclose(s: i32) -> i32;
    rrecv(s: i32, b: *mut libc::c_void, l: usize, f: i32) -> isize;
    rrecvfrom(s: i32, b: *mut libc::c_void, l: usize, f: i32, a: *mut sockaddr, al: *mut socklen_t) -> isize;
    rrecvmsg(s: i32, m: *mut libc::msghdr, f: i32) -> isize;
    rsend(s: i32, b: *const libc::c_void, l: usize, f: i32) -> isize;
    rsendto(s: i32, b: *const libc::c_void, l: usize, f: i32, a: *const sockaddr, al: socklen_t) -> isize;
    rsendmsg(s: i32, m: *const libc::msghdr, f: i32) -> isize;
    rread(s: i32, b: *mut libc::c_void, l: usize) -> isize;
    rreadv(s: i32, v: *const libc::iovec, n: i32) -> isize;
    rwrite(s: i32, b: *const libc::c_void, l: usize) -> isize;
    rwritev(s: i32, v: *const libc::iovec, n: i32) -> isize;
    rgetpeername(s: i32, a: *mut sockaddr, l: *mut socklen_t) -> i32;
    rgetsockname(s: i32, a: *mut sockaddr, l: *mut socklen_t) -> i32;
    rsetsockopt(s: i32, lv: i32, o: i32, v: *const libc::c_void, l: socklen_t) -> i32;
    rgetsockopt(s: i32, lv: i32, o: i32, v: *mut libc::c_void, l: *mut socklen_t) -> i32;
    riomap(s: i32, b: *mut libc::c_void, l: usize, p: i32, f: i32, o: libc::off_t) -> libc::off_t;
    riounmap(s: i32, b: *mut libc::c_void, l: usize) -> i32;
    riowrite(s: i32, b: *const libc::c_void, l: usize, o: libc::off_t, f: i32) -> usize;
}

/// `rfcntl(int socket, int cmd, ... /* arg */)`: a variadic C function; this definition takes
/// the one optional argument as a fixed one, which the x86-64 and AArch64 calling conventions
/// pass the same way for integers and pointers.
#[no_mangle]
pub unsafe extern "C" fn rfcntl(_socket: i32, _cmd: i32, _arg: usize) -> i32 {
    fail(libc::EBADF)
}

versioned!(
    rdma_join_multicast @ "RDMACM_1.0",
    rdma_join_multicast_ex @ "RDMACM_1.1",
    rdma_leave_multicast @ "RDMACM_1.0",
    rdma_set_local_ece @ "RDMACM_1.3",
    rdma_get_remote_ece @ "RDMACM_1.3",
    rdma_reject_ece @ "RDMACM_1.3",
    rpoll @ "RDMACM_1.0",
    rselect @ "RDMACM_1.0",
    rsocket @ "RDMACM_1.0",
    rbind @ "RDMACM_1.0",
    rlisten @ "RDMACM_1.0",
    raccept @ "RDMACM_1.0",
    rconnect @ "RDMACM_1.0",
    rshutdown @ "RDMACM_1.0",
    rclose @ "RDMACM_1.0",
    rrecv @ "RDMACM_1.0",
    rrecvfrom @ "RDMACM_1.0",
    rrecvmsg @ "RDMACM_1.0",
    rsend @ "RDMACM_1.0",
    rsendto @ "RDMACM_1.0",
    rsendmsg @ "RDMACM_1.0",
    rread @ "RDMACM_1.0",
    rreadv @ "RDMACM_1.0",
    rwrite @ "RDMACM_1.0",
    rwritev @ "RDMACM_1.0",
    rgetpeername @ "RDMACM_1.0",
    rgetsockname @ "RDMACM_1.0",
    rsetsockopt @ "RDMACM_1.0",
    rgetsockopt @ "RDMACM_1.0",
    rfcntl @ "RDMACM_1.0",
    riomap @ "RDMACM_1.0",
    riounmap @ "RDMACM_1.0",
    riowrite @ "RDMACM_1.0",
);
