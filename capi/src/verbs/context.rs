//! Contexts: `ibv_open_device`, `ibv_close_device` and the queries.
//!
//! The context is rdma-core's `struct verbs_context` (the extended-verbs table, then the
//! `struct ibv_context` programs see, with `abi_compat` marking it extended), followed by the
//! softrdma context. `ops` holds the data-path calls that the header's inline functions jump
//! through (`ibv_post_send`, `ibv_poll_cq`, ...); the extended table holds what softrdma
//! implements, and the rest stay NULL, which the inline functions report as EOPNOTSUPP.

use std::collections::HashMap;
use std::sync::Mutex;

use softrdma::verbs::{AtomicCap, Context};

use super::device::Dev;
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Ctx {
    pub vctx: verbs_context,
    pub rust: Context,
    pub dev: &'static Dev,
    /// C handles by softrdma id, for events that name an object by id.
    pub cqs: Handles,
    pub qps: Handles,
    pub srqs: Handles,
}

/// C handles by softrdma id (CQ id, QP number, SRQ id): events name objects by id.
#[derive(Default)]
pub(crate) struct Handles(Mutex<HashMap<u32, usize>>);

impl Handles {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn insert(&self, id: u32, p: usize) {
        self.map().insert(id, p);
    }
    pub(crate) fn remove(&self, id: u32) {
        self.map().remove(&id);
    }
    pub(crate) fn get(&self, id: u32) -> Option<usize> {
        self.map().get(&id).copied()
    }
}

impl Handle for Ctx {
    type C = verbs_context;
    const KIND: Kind = Kind::Context;
}

/// Offset of the `ibv_context` programs hold inside `Ctx`.
const CTX_OFFSET: usize = std::mem::offset_of!(verbs_context, context);

impl Ctx {
    /// The context behind an `ibv_context *`.
    ///
    /// # Safety
    /// The reference is valid until the context is closed.
    pub(crate) unsafe fn from_ibv<'a>(p: *const ibv_context) -> Option<&'a Ctx> {
        if p.is_null() {
            return None;
        }
        let base = (p as *const u8).wrapping_sub(CTX_OFFSET) as *const verbs_context;
        // SAFETY: checked against the registry before any dereference.
        unsafe { Ctx::from_c(base) }
    }

    /// The `ibv_context *` programs hold.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }
}

/// Wraps an open softrdma context as an `ibv_context` (librdmacm hands out contexts too).
pub(crate) fn wrap(rust: Context, dev: &'static Dev) -> *mut ibv_context {
    // SAFETY: verbs_context is C data: integers, NULL-able function pointers and a pthread
    // mutex, for all of which all-zero is valid (PTHREAD_MUTEX_INITIALIZER is all-zero).
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.query_port = Some(query_port_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.create_qp_ex = Some(super::qp::create_qp_ex);
    vctx.create_cq_ex = Some(super::cq_ex::create_cq_ex);
    let c = &mut vctx.context;
    c.device = &dev.ibv as *const ibv_device as *mut ibv_device;
    c.cmd_fd = -1;
    c.async_fd = rust.async_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut libc::c_void; // __VERBS_ABI_IS_EXTENDED
    c.ops.poll_cq = Some(super::cq::poll_cq);
    c.ops.req_notify_cq = Some(super::cq::req_notify_cq);
    c.ops.post_send = Some(super::qp::post_send);
    c.ops.post_recv = Some(super::qp::post_recv);
    c.ops.post_srq_recv = Some(super::srq::post_srq_recv);
    let ctx = Ctx {
        vctx,
        rust,
        dev,
        cqs: Handles::default(),
        qps: Handles::default(),
        srqs: Handles::default(),
    };
    let p = ctx.into_c();
    // SAFETY: `p` was just made by into_c and nobody else has it yet.
    unsafe { &mut (*p).context as *mut ibv_context }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some(dev) = Dev::from_c(device) else {
            return fail_null(libc::EINVAL);
        };
        match dev.device().open() {
            Ok(rust) => wrap(rust, dev),
            Err(e) => {
                eprintln!("softrdma: ibv_open_device({}): {e}", dev.device().name());
                fail_null(e.errno())
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> i32 {
    guard(libc::EIO, || {
        let base = (context as *mut u8).wrapping_sub(CTX_OFFSET) as *mut verbs_context;
        // SAFETY: `take` checks the registry before touching the pointer.
        match unsafe { Ctx::take(base) } {
            Some(ctx) => {
                drop(ctx);
                0
            }
            None => libc::EINVAL,
        }
    })
}

/// Fills `struct ibv_device_attr`.
fn fill_device_attr(ctx: &Ctx, out: &mut ibv_device_attr) {
    let a = ctx.rust.query_device();
    // SAFETY: ibv_device_attr is plain C data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    crate::handle::copy_cstr(&mut out.fw_ver, &a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = 0xfffff000;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    out.max_qp = a.max_qp as i32;
    out.max_qp_wr = a.max_qp_wr as i32;
    out.device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR
        | IBV_DEVICE_BAD_QKEY_CNTR
        | IBV_DEVICE_CHANGE_PHY_PORT
        | IBV_DEVICE_SYS_IMAGE_GUID
        | IBV_DEVICE_RC_RNR_NAK_GEN
        | IBV_DEVICE_SRQ_RESIZE
        | IBV_DEVICE_PORT_ACTIVE_EVENT;
    out.max_sge = a.max_sge as i32;
    out.max_sge_rd = a.max_sge as i32;
    out.max_cq = a.max_cq as i32;
    out.max_cqe = a.max_cqe as i32;
    out.max_mr = a.max_mr as i32;
    out.max_pd = a.max_pd as i32;
    out.max_qp_rd_atom = a.max_qp_rd_atom as i32;
    out.max_qp_init_rd_atom = a.max_qp_init_rd_atom as i32;
    out.max_res_rd_atom = a.max_res_rd_atom as i32;
    out.atomic_cap = match a.atomic_cap {
        AtomicCap::None => IBV_ATOMIC_NONE,
        AtomicCap::Hca => IBV_ATOMIC_HCA,
        AtomicCap::Glob => IBV_ATOMIC_GLOB,
    };
    out.max_ah = 1 << 15;
    out.max_srq = a.max_srq as i32;
    out.max_srq_wr = a.max_srq_wr as i32;
    out.max_srq_sge = a.max_srq_sge as i32;
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = 15;
    out.phys_port_cnt = a.phys_port_cnt;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle; `device_attr` is the caller's struct or NULL.
        let (Some(ctx), Some(out)) = (unsafe { Ctx::from_ibv(context) }, unsafe {
            device_attr.as_mut()
        }) else {
            return libc::EINVAL;
        };
        fill_device_attr(ctx, out);
        0
    })
}

/// `verbs_context.query_device_ex`: the legacy attributes plus the extended fields softrdma has.
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return libc::EINVAL;
        };
        let min = std::mem::offset_of!(ibv_device_attr_ex, comp_mask) + 4;
        if attr.is_null() || attr_size < min {
            return libc::EINVAL;
        }
        // SAFETY: ibv_device_attr_ex is plain C data; all-zero is valid.
        let mut full: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        fill_device_attr(ctx, &mut full.orig_attr);
        full.max_dm_size = 0;
        // The port count again, in the field that also holds counts above 255.
        full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt as u32;
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct has `attr_size` bytes; we copy at most that many.
        unsafe { std::ptr::copy_nonoverlapping(&full as *const _ as *const u8, attr.cast(), n) };
        0
    })
}

fn port_attributes(ctx: &Ctx, port: u8) -> Result<ibv_port_attr, i32> {
    let p = ctx.rust.query_port(port).map_err(|e| e.errno())?;
    // SAFETY: ibv_port_attr is plain C data; all-zero is valid.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = p.state as u32;
    a.max_mtu = p.max_mtu as u32;
    a.active_mtu = p.active_mtu as u32;
    a.gid_tbl_len = p.gid_tbl_len as i32;
    a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
    a.max_msg_sz = p.max_msg_sz.min(u32::MAX as u64) as u32;
    a.pkey_tbl_len = p.pkey_tbl_len;
    a.lid = p.lid;
    a.max_vl_num = 1;
    a.active_width = 1; // 1X
    a.active_speed = 32; // EDR, 25 Gb/s per lane: what a 25 GbE link shows with rdma_rxe
    a.phys_state = 5; // LinkUp
    a.link_layer = if p.link_layer_ethernet {
        IBV_LINK_LAYER_ETHERNET as u8
    } else {
        IBV_LINK_LAYER_INFINIBAND as u8
    };
    Ok(a)
}

/// `ibv_query_port` as exported (programs compiled against old headers): the compat layout is
/// the prefix of `struct ibv_port_attr` up to `link_layer`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> i32 {
    let compat = std::mem::offset_of!(ibv_port_attr, link_layer) + 1;
    // SAFETY: forwards the caller's pointers; `compat` bytes is the old structure's size.
    unsafe { query_port_ex(context, port_num, port_attr, compat) }
}

/// `verbs_context.query_port`, which the header's `ibv_query_port` calls with the size the
/// program was compiled with.
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return libc::EINVAL;
        };
        if port_attr.is_null() {
            return libc::EINVAL;
        }
        match port_attributes(ctx, port_num) {
            Ok(a) => {
                let n = port_attr_len.min(std::mem::size_of::<ibv_port_attr>());
                // SAFETY: the caller's struct has `port_attr_len` bytes; we copy at most that.
                unsafe {
                    std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, port_attr.cast(), n)
                };
                0
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: i32,
    gid: *mut ibv_gid,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        };
        if gid.is_null() || index < 0 {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        }
        // An index past 255 is past every GID table softrdma has.
        let index = u8::try_from(index).unwrap_or(u8::MAX);
        match ctx.rust.query_gid(port_num, index) {
            Ok(g) => {
                // SAFETY: `gid` is the caller's 16-byte union.
                unsafe { (*gid).raw = g };
                0
            }
            Err(e) => {
                crate::handle::set_errno(e.errno());
                -1
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return libc::EINVAL;
        };
        if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        let Ok(gid_index) = u8::try_from(gid_index) else {
            return libc::ENODATA;
        };
        match ctx.rust.query_gid(port, gid_index) {
            Ok(g) => {
                let ifindex = std::ffi::CString::new(ctx.rust.device().ifname())
                    .map(|n| {
                        // SAFETY: a NUL-terminated name.
                        unsafe { libc::if_nametoindex(n.as_ptr()) }
                    })
                    .unwrap_or(0);
                // SAFETY: the caller's entry, checked for size above.
                unsafe {
                    *entry = ibv_gid_entry {
                        gid: ibv_gid { raw: g },
                        gid_index: gid_index as u32,
                        port_num,
                        gid_type: IBV_GID_TYPE_ROCE_V2,
                        ndev_ifindex: ifindex,
                    }
                };
                0
            }
            // rdma-core: ENODATA for an empty or out-of-range entry.
            Err(_) => libc::ENODATA,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        if entries.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: checked handle (the entries below are checked again, one by one).
        let len = match unsafe { Ctx::from_ibv(context) } {
            Some(c) => c.rust.query_port(1).map_or(0, |p| p.gid_tbl_len),
            None => return -(libc::EINVAL as isize),
        };
        let mut n = 0;
        for index in 0..len {
            if n >= max_entries {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: `n < max_entries` entries of `entry_size` bytes each.
            let e = unsafe { (entries as *mut u8).add(n * entry_size) } as *mut ibv_gid_entry;
            // SAFETY: forwards checked pointers.
            let r = unsafe { _ibv_query_gid_ex(context, 1, index, e, flags, entry_size) };
            if r != 0 {
                return -(r as isize);
            }
            n += 1;
        }
        n as isize
    })
}

/// Private in rdma-core, but `ibv_devinfo` imports it: the sysfs GID type (1: RoCE v2).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        };
        let index = u8::try_from(index).unwrap_or(u8::MAX);
        if gid_type.is_null() || ctx.rust.query_gid(port_num, index).is_err() {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's int.
        unsafe { *gid_type = 1 }; // IBV_GID_TYPE_SYSFS_ROCE_V2
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: i32,
    pkey: *mut u16,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let ok = unsafe { Ctx::from_ibv(context) }.is_some();
        if !ok || pkey.is_null() || port_num != 1 || index != 0 {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's u16. The default P_Key, in network byte order.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> i32 {
    // SAFETY: checked handle.
    let ok = unsafe { Ctx::from_ibv(context) }.is_some();
    if ok && port_num == 1 && u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        -libc::EINVAL
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> i32 {
    // softrdma registers no memory with a kernel, so fork needs no preparation.
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> u32 {
    IBV_FORK_UNNEEDED
}

versioned!(
    ibv_open_device @ "IBVERBS_1.1",
    ibv_close_device @ "IBVERBS_1.1",
    ibv_query_device @ "IBVERBS_1.1",
    ibv_query_port @ "IBVERBS_1.1",
    ibv_query_gid @ "IBVERBS_1.1",
    _ibv_query_gid_ex @ "IBVERBS_1.11",
    _ibv_query_gid_table @ "IBVERBS_1.11",
    ibv_query_gid_type @ "IBVERBS_PRIVATE_34",
    ibv_query_pkey @ "IBVERBS_1.1",
    ibv_get_pkey_index @ "IBVERBS_1.5",
    ibv_fork_init @ "IBVERBS_1.1",
    ibv_is_fork_initialized @ "IBVERBS_1.13",
);
