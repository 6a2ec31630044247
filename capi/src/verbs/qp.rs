//! Queue pairs: `ibv_create_qp`, `ibv_create_qp_ex` (through the extended table),
//! `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, and the data path `ops.post_send` /
//! `ops.post_recv`. The extended post API (`ibv_wr_*`) is in `qp_ex.rs`.

use std::sync::Mutex;

use softrdma::transport::SgList;
use softrdma::verbs::{
    AccessFlags, Mtu, ProtectionDomain, QpAttr, QpCaps, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendWqe, UdSend, VerbsError,
};

use super::context::Ctx;
use super::cq::Cq;
use super::pd::Pd;
use super::wr::{send_wqe, sges, to_sges};
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp_ex,
    pub rust: QueuePair,
    pd: *const Pd,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    pub ud: bool,
    pub max_inline: u32,
    sq_sig_all: bool,
    /// Work requests built with the `ibv_wr_*` calls, posted by `ibv_wr_complete`.
    pub batch: Mutex<super::qp_ex::Batch>,
}

impl Handle for Qp {
    type C = ibv_qp;
    const KIND: Kind = Kind::Qp;
}

fn qp_type(t: u32) -> Option<QpType> {
    match t {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

/// Creates a QP from the fields common to `ibv_qp_init_attr` and `ibv_qp_init_attr_ex`.
#[allow(clippy::too_many_arguments)]
fn create(
    pd: *mut ibv_pd,
    qp_context: *mut libc::c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &mut ibv_qp_cap,
    qp_type_c: u32,
    sq_sig_all: bool,
) -> *mut ibv_qp {
    create_with(
        pd,
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type_c,
        sq_sig_all,
        |pd, attr| pd.create_qp(attr).map_err(|e| e.errno()),
    )
}

/// Like `create`, with the softrdma QP made by `make` (librdmacm's `rdma_create_qp` makes it
/// through the connection manager, which then moves it through its states): checks the
/// handles, makes the QP and wraps it as the `ibv_qp` programs use, with `cap` set to what
/// was granted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn create_with(
    pd: *mut ibv_pd,
    qp_context: *mut libc::c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &mut ibv_qp_cap,
    qp_type_c: u32,
    sq_sig_all: bool,
    make: impl FnOnce(&ProtectionDomain, &QpInitAttr<'_>) -> Result<QueuePair, i32>,
) -> *mut ibv_qp {
    // SAFETY: checked handles.
    let (Some(p), Some(scq), Some(rcq)) = (
        unsafe { Pd::from_c(pd) },
        unsafe { Cq::from_c(send_cq.cast()) },
        unsafe { Cq::from_c(recv_cq.cast()) },
    ) else {
        return fail_null(libc::EINVAL);
    };
    let srq_ref = if srq.is_null() {
        None
    } else {
        // SAFETY: checked handle.
        match unsafe { super::srq::Srq::from_c(srq) } {
            Some(s) => Some(s),
            None => return fail_null(libc::EINVAL),
        }
    };
    let Some(t) = qp_type(qp_type_c) else {
        // XRC, raw packet, driver QPs: not on this device.
        return fail_null(libc::EOPNOTSUPP);
    };
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let attr = QpInitAttr {
        send_cq: &scq.rust,
        recv_cq: &rcq.rust,
        cap: caps,
        qp_type: t,
        sq_sig_all,
        srq: srq_ref.map(|s| &s.rust),
    };
    let rust = match make(&p.rust, &attr) {
        Ok(q) => q,
        Err(e) => return fail_null(e),
    };
    let granted = rust.caps();
    cap.max_send_wr = granted.max_send_wr;
    cap.max_recv_wr = granted.max_recv_wr;
    cap.max_send_sge = granted.max_send_sge;
    cap.max_recv_sge = granted.max_recv_sge;
    cap.max_inline_data = granted.max_inline_data;
    // SAFETY: ibv_qp_ex is C data (pointers, integers, pthread objects, NULL-able function
    // pointers); all-zero is valid for each.
    let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut ibv.qp_base;
    b.context = p.ibv.context;
    b.qp_context = qp_context;
    b.pd = pd;
    b.send_cq = send_cq;
    b.recv_cq = recv_cq;
    b.srq = srq;
    b.handle = rust.qp_num();
    b.qp_num = rust.qp_num();
    b.state = match rust.state() {
        Ok(st) => st as u32,
        Err(_) => IBV_QPS_RESET,
    };
    b.qp_type = qp_type_c;
    super::qp_ex::fill_ops(&mut ibv);
    let qpn = rust.qp_num();
    p.hold();
    scq.users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    rcq.users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    if let Some(s) = srq_ref {
        s.users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
    let qp = Qp {
        ibv,
        ud: t == QpType::Ud,
        max_inline: granted.max_inline_data,
        rust,
        pd: p,
        send_cq: scq,
        recv_cq: rcq,
        sq_sig_all,
        batch: Mutex::new(Default::default()),
    };
    let ptr = qp.into_c();
    if let Some(ctx) = p.ctx() {
        ctx.qps.insert(qpn, ptr as usize);
    }
    ptr
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller's attributes or NULL.
        let Some(a) = (unsafe { qp_init_attr.as_mut() }) else {
            return fail_null(libc::EINVAL);
        };
        create(
            pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all != 0,
        )
    })
}

/// `verbs_context.create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Some(_), Some(a)) = (unsafe { Ctx::from_ibv(context) }, unsafe { attr.as_mut() })
        else {
            return fail_null(libc::EINVAL);
        };
        let supported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !supported != 0 || a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            // As rxe's check_qp_init_attr: UC has no READ or atomics.
            let supported = match a.qp_type {
                IBV_QPT_UC => super::qp_ex::SUPPORTED_UC_SEND_OPS,
                _ => super::qp_ex::SUPPORTED_SEND_OPS,
            };
            if a.send_ops_flags & !supported != 0 {
                return fail_null(libc::EOPNOTSUPP);
            }
        }
        create(
            a.pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all != 0,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: checked handle.
    match unsafe { Qp::from_c(qp) } {
        Some(_) => qp.cast(),
        None => fail_null(libc::EINVAL),
    }
}

fn state(v: u32) -> Option<QpState> {
    Some(match v {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

/// `struct ibv_qp_attr` + mask as softrdma's attributes (a `Some` is in the mask).
fn attr_from_c(a: &ibv_qp_attr, mask: i32) -> Result<QpAttr, i32> {
    let mask = mask as u32;
    let has = |bit: u32| mask & bit != 0;
    let unsupported = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_RATE_LIMIT;
    if mask & unsupported != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let mut r = QpAttr::default();
    if has(IBV_QP_STATE) {
        r.qp_state = Some(state(a.qp_state).ok_or(libc::EINVAL)?);
    }
    if has(IBV_QP_CUR_STATE) {
        r.cur_qp_state = Some(state(a.cur_qp_state).ok_or(libc::EINVAL)?);
    }
    r.sq_draining = has(IBV_QP_EN_SQD_ASYNC_NOTIFY).then_some(a.en_sqd_async_notify != 0);
    r.qp_access_flags =
        has(IBV_QP_ACCESS_FLAGS).then_some(AccessFlags::from_bits_retain(a.qp_access_flags & 0xf));
    r.pkey_index = has(IBV_QP_PKEY_INDEX).then_some(a.pkey_index);
    r.port_num = has(IBV_QP_PORT).then_some(a.port_num);
    r.qkey = has(IBV_QP_QKEY).then_some(a.qkey);
    r.ah_attr = has(IBV_QP_AV).then(|| super::ah::from_c_attr(&a.ah_attr));
    if has(IBV_QP_PATH_MTU) {
        r.path_mtu = Some(Mtu::from_enum(a.path_mtu).ok_or(libc::EINVAL)?);
    }
    r.timeout = has(IBV_QP_TIMEOUT).then_some(a.timeout);
    r.retry_cnt = has(IBV_QP_RETRY_CNT).then_some(a.retry_cnt);
    r.rnr_retry = has(IBV_QP_RNR_RETRY).then_some(a.rnr_retry);
    r.rq_psn = has(IBV_QP_RQ_PSN).then_some(a.rq_psn);
    r.max_rd_atomic = has(IBV_QP_MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic);
    r.min_rnr_timer = has(IBV_QP_MIN_RNR_TIMER).then_some(a.min_rnr_timer);
    r.sq_psn = has(IBV_QP_SQ_PSN).then_some(a.sq_psn);
    r.max_dest_rd_atomic = has(IBV_QP_MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic);
    r.dest_qp_num = has(IBV_QP_DEST_QPN).then_some(a.dest_qp_num);
    Ok(r)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: i32,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Some(q), Some(a)) = (unsafe { Qp::from_c(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let r = match attr_from_c(a, attr_mask) {
            Ok(r) => r,
            Err(e) => return e,
        };
        match q.rust.modify(&r) {
            Ok(()) => {
                if let Some(s) = r.qp_state {
                    // SAFETY: `qp` is live (checked); programs read qp->state, as rdma-core
                    // keeps it current after a modify.
                    unsafe { (*qp).state = s as u32 };
                }
                0
            }
            Err(e) => e.errno(),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: i32,
    init_attr: *mut ibv_qp_init_attr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle; the caller's structs or NULL.
        let (Some(q), Some(out), Some(init)) = (
            unsafe { Qp::from_c(qp) },
            unsafe { attr.as_mut() },
            unsafe { init_attr.as_mut() },
        ) else {
            return libc::EINVAL;
        };
        let r = match q.rust.query() {
            Ok(r) => r,
            Err(e) => return e.errno(),
        };
        // SAFETY: ibv_qp_attr is plain C data; all-zero is valid.
        *out = unsafe { std::mem::zeroed() };
        let st = r.qp_state.unwrap_or(QpState::Reset) as u32;
        out.qp_state = st;
        out.cur_qp_state = st;
        out.path_mtu = r.path_mtu.map_or(0, |m| m as u32);
        out.qkey = r.qkey.unwrap_or(0);
        out.rq_psn = r.rq_psn.unwrap_or(0);
        out.sq_psn = r.sq_psn.unwrap_or(0);
        out.dest_qp_num = r.dest_qp_num.unwrap_or(0);
        out.qp_access_flags = r.qp_access_flags.map_or(0, |f| f.bits());
        let caps = q.rust.caps();
        let cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        out.cap = cap;
        if let Some(av) = r.ah_attr {
            super::ah::to_c_attr(&av, &mut out.ah_attr);
        }
        out.pkey_index = r.pkey_index.unwrap_or(0);
        out.sq_draining = r.sq_draining.unwrap_or(false) as u8;
        out.max_rd_atomic = r.max_rd_atomic.unwrap_or(0);
        out.max_dest_rd_atomic = r.max_dest_rd_atomic.unwrap_or(0);
        out.min_rnr_timer = r.min_rnr_timer.unwrap_or(0);
        out.port_num = r.port_num.unwrap_or(1);
        out.timeout = r.timeout.unwrap_or(0);
        out.retry_cnt = r.retry_cnt.unwrap_or(0);
        out.rnr_retry = r.rnr_retry.unwrap_or(0);
        let b = &q.ibv.qp_base;
        // SAFETY: ibv_qp_init_attr is plain C data; all-zero is valid.
        *init = unsafe { std::mem::zeroed() };
        init.qp_context = b.qp_context;
        init.send_cq = b.send_cq;
        init.recv_cq = b.recv_cq;
        init.srq = b.srq;
        init.cap = cap;
        init.qp_type = b.qp_type;
        init.sq_sig_all = q.sq_sig_all as i32;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: `take` checks the registry first; the program destroys it, so no other
        // thread uses it.
        let Some(q) = (unsafe { Qp::take(qp) }) else {
            return libc::EINVAL;
        };
        let qpn = q.rust.qp_num();
        let srq = q.ibv.qp_base.srq;
        // SAFETY: the QP held its PD and CQs, so they are live.
        let (pd, scq, rcq) = unsafe { (&*q.pd, &*q.send_cq, &*q.recv_cq) };
        if let Some(ctx) = pd.ctx() {
            ctx.qps.remove(qpn);
        }
        drop(q);
        scq.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        rcq.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        // SAFETY: the QP held its SRQ, so it is live.
        if let Some(s) = unsafe { super::srq::Srq::from_c(srq) } {
            s.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        pd.release();
        0
    })
}

/// Posts converted WQEs; on failure sets `bad` to the WR at the failing index.
///
/// # Safety
/// `first` heads the caller's WR list, of at least `index + 1` entries for any failing index.
pub(crate) unsafe fn post_converted(
    q: &Qp,
    wqes: Vec<(SendWqe, Option<UdSend<'_>>)>,
    first: *mut ibv_send_wr,
    skip: usize,
    bad: *mut *mut ibv_send_wr,
) -> i32 {
    match q.rust.post_send_wqes(wqes) {
        Ok(()) => 0,
        Err(e) => {
            let index = e.bad_wr().unwrap_or(0) + skip;
            let mut wr = first;
            for _ in 0..index {
                // SAFETY: the list has more than `index` entries (per the contract).
                wr = unsafe { (*wr).next };
            }
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            e.errno()
        }
    }
}

/// `ops.post_send`: the data path, so the QP is only checked for NULL.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: a handle the program got from ibv_create_qp.
        let Some(q) = (unsafe { Qp::from_c_unchecked(qp) }) else {
            return libc::EINVAL;
        };
        let mut wqes = Vec::new();
        let mut cur = wr;
        let mut failed = None;
        while !cur.is_null() {
            // SAFETY: the caller's WR list.
            let w = unsafe { &*cur };
            // SAFETY: the caller's WR, its SGEs and inline memory.
            match unsafe { send_wqe(w, q.ud, q.max_inline) } {
                Ok(x) => wqes.push(x),
                Err(e) => {
                    failed = Some((cur, e));
                    break;
                }
            }
            cur = w.next;
        }
        // The WRs before a bad one are posted, as a device posts them.
        // SAFETY: `wr` heads the list the WQEs came from.
        let r = unsafe { post_converted(q, wqes, wr, 0, bad_wr) };
        match failed {
            Some((w, e)) if r == 0 => {
                if !bad_wr.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad_wr = w };
                }
                e
            }
            _ => r,
        }
    })
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: a handle the program got from ibv_create_qp.
        let Some(q) = (unsafe { Qp::from_c_unchecked(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's WR list.
        unsafe { post_recv_list(wr, bad_wr, |wrs| q.rust.post_recv(wrs)) }
    })
}

/// Converts a receive WR list and posts it with `post`; shared with SRQs.
///
/// # Safety
/// `wr` heads the caller's valid WR list.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr<'_>]) -> Result<(), VerbsError>,
) -> i32 {
    let set_bad = |w: *mut ibv_recv_wr| {
        if !bad_wr.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *bad_wr = w };
        }
    };
    // One WR, as most posts are: no list to build (nothing allocated).
    // SAFETY: the caller's WR list (a null head is handled by the general path).
    if !wr.is_null() && unsafe { (*wr).next.is_null() } {
        // SAFETY: as above.
        let w = unsafe { &*wr };
        // SAFETY: the WR's SGE array.
        let r = match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(s) => post(&[RecvWr {
                wr_id: w.wr_id,
                sg_list: &to_sges(s),
            }]),
            Err(e) => {
                set_bad(wr);
                return e;
            }
        };
        return match r {
            Ok(()) => 0,
            Err(e) => {
                set_bad(wr);
                e.errno()
            }
        };
    }
    let mut nodes = Vec::new();
    let mut lists: Vec<SgList> = Vec::new();
    let mut cur = wr;
    let mut failed = None;
    while !cur.is_null() {
        // SAFETY: the caller's WR list.
        let w = unsafe { &*cur };
        // SAFETY: the WR's SGE array.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(s) => {
                lists.push(to_sges(s));
                nodes.push(cur);
            }
            Err(e) => {
                failed = Some((cur, e));
                break;
            }
        }
        cur = w.next;
    }
    let wrs: Vec<RecvWr<'_>> = nodes
        .iter()
        .zip(&lists)
        // SAFETY: each node is one of the caller's WRs.
        .map(|(n, s)| RecvWr {
            wr_id: unsafe { (**n).wr_id },
            sg_list: s,
        })
        .collect();
    if let Err(e) = post(&wrs) {
        if let Some(n) = nodes.get(e.bad_wr().unwrap_or(0)).or(nodes.first()) {
            set_bad(*n);
        }
        return e.errno();
    }
    match failed {
        Some((w, e)) => {
            set_bad(w);
            e
        }
        None => 0,
    }
}

versioned!(
    ibv_create_qp @ "IBVERBS_1.1",
    ibv_qp_to_qp_ex @ "IBVERBS_1.6",
    ibv_modify_qp @ "IBVERBS_1.1",
    ibv_query_qp @ "IBVERBS_1.1",
    ibv_destroy_qp @ "IBVERBS_1.1",
);
