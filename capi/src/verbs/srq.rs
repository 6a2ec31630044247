//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (resize and the limit event),
//! `ibv_query_srq`, `ibv_destroy_srq` and the data path `ops.post_srq_recv`.

use std::sync::atomic::{AtomicUsize, Ordering};

use softrdma::verbs::{SharedReceiveQueue, SrqInitAttr};

use super::pd::Pd;
use super::qp::post_recv_list;
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub rust: SharedReceiveQueue,
    pd: *const Pd,
    /// QPs on this SRQ: it cannot be destroyed while any is (EBUSY).
    pub users: AtomicUsize,
}

impl Handle for Srq {
    type C = ibv_srq;
    const KIND: Kind = Kind::Srq;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Some(p), Some(a)) = (unsafe { Pd::from_c(pd) }, unsafe { attr.as_mut() }) else {
            return fail_null(libc::EINVAL);
        };
        let init = SrqInitAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        let rust = match p.rust.create_srq(init) {
            Ok(s) => s,
            Err(e) => return fail_null(e.errno()),
        };
        if let Ok(got) = rust.query() {
            a.attr.max_wr = got.max_wr;
            a.attr.max_sge = got.max_sge;
        }
        // SAFETY: ibv_srq is C data (pointers, integers, pthread objects); all-zero is valid.
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = p.ibv.context;
        ibv.srq_context = a.srq_context;
        ibv.pd = pd;
        ibv.handle = rust.id();
        let id = rust.id();
        p.hold();
        let s = Srq {
            ibv,
            rust,
            pd: p,
            users: AtomicUsize::new(0),
        }
        .into_c();
        if let Some(ctx) = p.ctx() {
            ctx.srqs.insert(id, s as usize);
        }
        s
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: i32,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Some(s), Some(a)) = (unsafe { Srq::from_c(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let mask = mask as u32;
        if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        let max_wr = (mask & IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
        match s.rust.modify(max_wr, limit) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle; the caller's struct or NULL.
        let (Some(s), Some(out)) = (unsafe { Srq::from_c(srq) }, unsafe { attr.as_mut() }) else {
            return libc::EINVAL;
        };
        match s.rust.query() {
            Ok(a) => {
                out.max_wr = a.max_wr;
                out.max_sge = a.max_sge;
                out.srq_limit = a.srq_limit;
                0
            }
            Err(e) => e.errno(),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        match unsafe { Srq::from_c(srq) } {
            None => return libc::EINVAL,
            Some(s) if s.users.load(Ordering::Acquire) > 0 => return libc::EBUSY,
            Some(_) => {}
        }
        // SAFETY: checked handle with no QP on it; the program destroys it.
        let Some(s) = (unsafe { Srq::take(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the SRQ held its PD, so the PD is live.
        let pd = unsafe { &*s.pd };
        if let Some(ctx) = pd.ctx() {
            ctx.srqs.remove(s.rust.id());
        }
        drop(s);
        pd.release();
        0
    })
}

/// `ops.post_srq_recv`: the data path, so the SRQ is only checked for NULL.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: a handle the program got from ibv_create_srq.
        let Some(s) = (unsafe { Srq::from_c_unchecked(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's WR list.
        unsafe { post_recv_list(wr, bad_wr, |wrs| s.rust.post_recv(wrs)) }
    })
}

versioned!(
    ibv_create_srq @ "IBVERBS_1.1",
    ibv_modify_srq @ "IBVERBS_1.1",
    ibv_query_srq @ "IBVERBS_1.1",
    ibv_destroy_srq @ "IBVERBS_1.1",
);
