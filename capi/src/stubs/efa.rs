//! `libefa.so.1` stand-in: no device is an EFA device.

use crate::abi::*;
use crate::handle::fail_null;

#[no_mangle]
pub unsafe extern "C" fn efadv_query_device(
    _context: *mut ibv_context,
    _attr: *mut libc::c_void,
    _inlen: u32,
) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn efadv_create_qp_ex(
    _context: *mut ibv_context,
    _attr_ex: *mut ibv_qp_init_attr_ex,
    _efa_attr: *mut libc::c_void,
    _inlen: u32,
) -> *mut ibv_qp {
    fail_null(libc::EOPNOTSUPP)
}

versioned!(
    efadv_query_device @ "EFA_1.1",
    efadv_create_qp_ex @ "EFA_1.1",
);
