//! QPs on ids: `rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`, and the SRQ calls
//! (`rdma_create_srq*` fail as `ibv_create_srq` does on this device).
//!
//! The QP is made by softrdma's connection manager (`CmId::create_qp`), which moves it to INIT
//! (UD: to RTS) now, to RTR and RTS when the connection is made and to ERR on disconnect, and is
//! handed to the program as this library's `ibv_qp`, so the verbs calls work on it as on any
//! other. CQs the program does not give are created as librdmacm creates them: one per
//! direction, each with its own completion channel, the id as their context.

use super::fail;
use super::id::{get, Id};
use crate::abi::*;
use crate::handle::{guard, Handle};
use crate::verbs::cq::ibv_destroy_cq;
use crate::verbs::cq::{ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel};

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels it created for the id.
fn destroy_cqs(c: &mut rdma_cm_id) {
    // SAFETY: the id's own CQs and channels, made by `create_cqs` (the functions check them).
    unsafe {
        if !c.recv_cq.is_null() {
            ibv_destroy_cq(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                ibv_destroy_cq(c.send_cq);
                c.send_cq = std::ptr::null_mut();
            }
            c.recv_cq = std::ptr::null_mut();
        }
        if !c.recv_cq_channel.is_null() {
            ibv_destroy_comp_channel(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                ibv_destroy_comp_channel(c.send_cq_channel);
                c.send_cq_channel = std::ptr::null_mut();
            }
            c.recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// librdmacm's `ucma_create_cqs`: a CQ of `recv`/`send` entries with its channel for each
/// non-zero size.
fn create_cqs(p: *mut rdma_cm_id, c: &mut rdma_cm_id, send: u32, recv: u32) -> Result<(), i32> {
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM)
    };
    for (size, is_recv) in [(recv, true), (send, false)] {
        if size == 0 {
            continue;
        }
        // SAFETY: the id's context (checked by the caller to be set).
        let ch = unsafe { ibv_create_comp_channel(c.verbs) };
        if ch.is_null() {
            let e = errno();
            destroy_cqs(c);
            return Err(e);
        }
        if is_recv {
            c.recv_cq_channel = ch;
        } else {
            c.send_cq_channel = ch;
        }
        let size = size.min(i32::MAX as u32) as i32;
        // SAFETY: as above; the channel was just made on the same context.
        let cq = unsafe { ibv_create_cq(c.verbs, size, p.cast(), ch, 0) };
        if cq.is_null() {
            let e = errno();
            destroy_cqs(c);
            return Err(e);
        }
        if is_recv {
            c.recv_cq = cq;
        } else {
            c.send_cq = cq;
        }
    }
    Ok(())
}

/// `rdma_create_qp_ex` on a checked id.
///
/// # Safety
/// `p` is the live id `i`.
unsafe fn create_qp_ex(p: *mut rdma_cm_id, i: &Id, attr: &mut ibv_qp_init_attr_ex) -> i32 {
    // SAFETY: the caller's live id; librdmacm writes these fields the same way.
    let c = unsafe { &mut *p };
    if !c.qp.is_null() || c.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = c.pd;
    } else {
        // SAFETY: the program's PD; checked against the registry by the QP creation below,
        // here only its context is compared (as librdmacm does).
        let Some(pd) = (unsafe { crate::verbs::pd::Pd::from_c(attr.pd) }) else {
            return fail(libc::EINVAL);
        };
        if pd.ibv.context != c.verbs {
            return fail(libc::EINVAL);
        }
    }
    if attr.pd.is_null() {
        return fail(libc::EINVAL);
    }
    if (!c.recv_cq.is_null() && !attr.recv_cq.is_null() && c.recv_cq != attr.recv_cq)
        || (!c.send_cq.is_null() && !attr.send_cq.is_null() && c.send_cq != attr.send_cq)
    {
        return fail(libc::EINVAL);
    }
    if attr.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let send = if attr.send_cq.is_null() && c.send_cq.is_null() {
        attr.cap.max_send_wr
    } else {
        0
    };
    let recv = if attr.recv_cq.is_null() && c.recv_cq.is_null() {
        attr.cap.max_recv_wr
    } else {
        0
    };
    if let Err(e) = create_cqs(p, c, send, recv) {
        return fail(e);
    }
    if attr.send_cq.is_null() {
        attr.send_cq = c.send_cq;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = c.recv_cq;
    }
    if !c.srq.is_null() && attr.srq.is_null() {
        attr.srq = c.srq;
    }
    let rust = i.rust.clone();
    let qp = crate::verbs::qp::create_with(
        attr.pd,
        attr.qp_context,
        attr.send_cq,
        attr.recv_cq,
        attr.srq,
        &mut attr.cap,
        attr.qp_type,
        attr.sq_sig_all != 0,
        |pd, a| rust.create_qp(pd, a).map_err(|e| e.errno()),
    );
    if qp.is_null() {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        destroy_cqs(c);
        return fail(e);
    }
    // SAFETY: the QP just made.
    c.pd = unsafe { (*qp).pd };
    c.qp = qp;
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Ok(i), Some(a)) = (unsafe { get(id) }, unsafe { qp_init_attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: `id` is the live id `i`.
        unsafe { create_qp_ex(id, i, a) }
    })
}

/// `rdma_create_qp` on a checked id (also used by `rdma_create_ep` and `rdma_get_request`).
///
/// # Safety
/// `p` is the live id `i`.
pub(crate) unsafe fn create_qp(
    p: *mut rdma_cm_id,
    i: &Id,
    pd: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
) -> i32 {
    // SAFETY: ibv_qp_init_attr_ex is plain C data; all-zero is valid.
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    // SAFETY: the caller's live id.
    ex.pd = if pd.is_null() { unsafe { (*p).pd } } else { pd };
    // SAFETY: as above.
    let r = unsafe { create_qp_ex(p, i, &mut ex) };
    // As librdmacm, the attributes come back with the CQs used and the capabilities granted.
    a.send_cq = ex.send_cq;
    a.recv_cq = ex.recv_cq;
    a.srq = ex.srq;
    a.cap = ex.cap;
    r
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Ok(i), Some(a)) = (unsafe { get(id) }, unsafe { qp_init_attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: `id` is the live id `i`.
        unsafe { create_qp(id, i, pd, a) }
    })
}

/// `rdma_destroy_qp` on a checked id.
pub(crate) fn destroy_qp(p: *mut rdma_cm_id) {
    // SAFETY: the caller checked the id; the program does not use it during the call.
    let c = unsafe { &mut *p };
    if !c.qp.is_null() {
        // SAFETY: the id's QP (checked against the registry by the call).
        unsafe { crate::verbs::qp::ibv_destroy_qp(c.qp) };
        c.qp = std::ptr::null_mut();
    }
    destroy_cqs(c);
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: checked handle.
        if unsafe { get(id) }.is_ok() {
            destroy_qp(id);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    _pd: *mut ibv_pd,
    _attr: *mut ibv_srq_init_attr,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        match unsafe { get(id) } {
            // As ibv_create_srq on this device.
            Ok(_) => fail(libc::EOPNOTSUPP),
            Err(e) => fail(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    _attr: *mut ibv_srq_init_attr_ex,
) -> i32 {
    // SAFETY: forwards a handle it checks.
    unsafe { rdma_create_srq(id, std::ptr::null_mut(), std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: checked handle.
        if unsafe { get(id) }.is_err() {
            return;
        }
        // SAFETY: a live id; no SRQ can have been made, so only librdmacm's CQ clean-up runs.
        let c = unsafe { &mut *id };
        c.srq = std::ptr::null_mut();
        destroy_cqs(c);
    })
}

versioned!(
    rdma_create_qp @ "RDMACM_1.0",
    rdma_create_qp_ex @ "RDMACM_1.0",
    rdma_destroy_qp @ "RDMACM_1.0",
    rdma_create_srq @ "RDMACM_1.0",
    rdma_create_srq_ex @ "RDMACM_1.0",
    rdma_destroy_srq @ "RDMACM_1.0",
);
