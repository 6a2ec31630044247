//! `libmlx5.so.1` stand-in: no device is an mlx5 device.

use crate::abi::*;
use crate::handle::fail_null;

type Void = libc::c_void;

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_is_supported(_device: *mut ibv_device) -> bool {
    false
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_open_device(
    _device: *mut ibv_device,
    _attr: *mut Void,
) -> *mut ibv_context {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_query_device(_context: *mut ibv_context, _attrs: *mut Void) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_qp(
    _context: *mut ibv_context,
    _qp_attr: *mut ibv_qp_init_attr_ex,
    _mlx5_qp_attr: *mut Void,
) -> *mut ibv_qp {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut ibv_qp_ex) -> *mut Void {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_mkey(_attr: *mut Void) -> *mut Void {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_destroy_mkey(_mkey: *mut Void) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_general_cmd(
    _context: *mut ibv_context,
    _in: *const Void,
    _inlen: usize,
    _out: *mut Void,
    _outlen: usize,
) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login(_context: *mut ibv_context, _attr: *mut Void) -> i32 {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dek_create(
    _context: *mut ibv_context,
    _attr: *mut Void,
) -> *mut Void {
    fail_null(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dek_destroy(_dek: *mut Void) -> i32 {
    libc::EOPNOTSUPP
}

versioned!(
    mlx5dv_is_supported @ "MLX5_1.8",
    mlx5dv_open_device @ "MLX5_1.7",
    mlx5dv_query_device @ "MLX5_1.0",
    mlx5dv_create_qp @ "MLX5_1.3",
    mlx5dv_qp_ex_from_ibv_qp_ex @ "MLX5_1.10",
    mlx5dv_create_mkey @ "MLX5_1.10",
    mlx5dv_destroy_mkey @ "MLX5_1.10",
    mlx5dv_devx_general_cmd @ "MLX5_1.7",
    mlx5dv_crypto_login @ "MLX5_1.21",
    mlx5dv_dek_create @ "MLX5_1.21",
    mlx5dv_dek_destroy @ "MLX5_1.21",
);

/// `mlx5dv_init_obj@MLX5_1.0`: the compatibility version old binaries bind (the default is
/// `@@MLX5_1.2`, in the generated stand-ins).
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_init_obj_v1_0(_obj: *mut Void, _obj_type: u64) -> i32 {
    libc::EOPNOTSUPP
}

core::arch::global_asm!(".symver mlx5dv_init_obj_v1_0, mlx5dv_init_obj@MLX5_1.0");
