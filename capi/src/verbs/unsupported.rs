//! Entry points of libibverbs that a device without the feature answers with an error:
//! multicast, ECE, importing objects from another process, dma-buf MRs, and the kernel-ABI
//! copy helpers. Each exists so every program loads, and fails the way rdma-core does on a
//! device that lacks it: EOPNOTSUPP (or ENOSYS where rdma-core uses it) and NULL or non-zero.

use std::ffi::c_char;

use crate::abi::*;
use crate::handle::{fail_null, set_errno};

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> i32 {
    libc::EOPNOTSUPP
}

/// No data-placement ordering guarantee is advertised (0), which is always a correct answer.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> i32 {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(_cmd_fd: i32) -> *mut ibv_context {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: i32,
    _access: i32,
) -> *mut ibv_mr {
    fail_null(libc::EOPNOTSUPP)
}

/// RoCE L2 resolution through the kernel's neighbour table: softrdma sends over UDP, so the
/// kernel resolves L2 itself and there is nothing to report.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _context: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> i32 {
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// Fork protection: nothing is pinned, so every range is fine.
#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut libc::c_void, _size: usize) -> i32 {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut libc::c_void, _size: usize) -> i32 {
    0
}

/// There is no RDMA sysfs tree for softrdma's devices.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    set_errno(libc::ENOENT);
    std::ptr::null()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> i32 {
    set_errno(libc::ENOENT);
    -1
}

/// Kernel-ABI copy helpers (for programs that talk to `/dev/infiniband` themselves): there is
/// no kernel ABI here; they leave the destination untouched.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    _dst: *mut ibv_ah_attr,
    _src: *const libc::c_void,
) {
}
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    _dst: *mut ibv_qp_attr,
    _src: *const libc::c_void,
) {
}
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    _dst: *mut libc::c_void,
    _src: *const libc::c_void,
) {
}
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    _dst: *mut libc::c_void,
    _src: *const libc::c_void,
) {
}

versioned!(
    ibv_attach_mcast @ "IBVERBS_1.1",
    ibv_detach_mcast @ "IBVERBS_1.1",
    ibv_query_ece @ "IBVERBS_1.10",
    ibv_set_ece @ "IBVERBS_1.10",
    ibv_query_qp_data_in_order @ "IBVERBS_1.14",
    ibv_import_device @ "IBVERBS_1.10",
    ibv_import_pd @ "IBVERBS_1.10",
    ibv_unimport_pd @ "IBVERBS_1.10",
    ibv_import_mr @ "IBVERBS_1.10",
    ibv_unimport_mr @ "IBVERBS_1.10",
    ibv_import_dm @ "IBVERBS_1.13",
    ibv_unimport_dm @ "IBVERBS_1.13",
    ibv_reg_dmabuf_mr @ "IBVERBS_1.12",
    ibv_resolve_eth_l2_from_gid @ "IBVERBS_1.1",
    ibv_dontfork_range @ "IBVERBS_1.1",
    ibv_dofork_range @ "IBVERBS_1.1",
    ibv_get_sysfs_path @ "IBVERBS_1.0",
    ibv_read_sysfs_file @ "IBVERBS_1.0",
    ibv_copy_ah_attr_from_kern @ "IBVERBS_1.1",
    ibv_copy_qp_attr_from_kern @ "IBVERBS_1.0",
    ibv_copy_path_rec_from_kern @ "IBVERBS_1.0",
    ibv_copy_path_rec_to_kern @ "IBVERBS_1.0",
);
