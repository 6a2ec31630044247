//! Shared receive queues. Until softrdma's transport takes receive WQEs from an SRQ, creating
//! one fails the way rdma-core does on a device without SRQs.

use crate::abi::*;
use crate::handle::fail_null;

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    _pd: *mut ibv_pd,
    _attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    _srq: *mut ibv_srq,
    _attr: *mut ibv_srq_attr,
    _mask: i32,
) -> i32 {
    libc::EINVAL
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(_srq: *mut ibv_srq, _attr: *mut ibv_srq_attr) -> i32 {
    libc::EINVAL
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(_srq: *mut ibv_srq) -> i32 {
    libc::EINVAL
}

versioned!(
    ibv_create_srq @ "IBVERBS_1.1",
    ibv_modify_srq @ "IBVERBS_1.1",
    ibv_query_srq @ "IBVERBS_1.1",
    ibv_destroy_srq @ "IBVERBS_1.1",
);
