//! Completion queues and completion channels: `ibv_create_cq`, `ibv_poll_cq` (through
//! `ops.poll_cq`), `ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events`.

use std::sync::atomic::{AtomicUsize, Ordering};

use softrdma::verbs::{CompletionChannel, CompletionQueue, VerbsError, WorkCompletion};

use super::context::Ctx;
use crate::abi::*;
use crate::handle::{fail_null, guard, set_errno, Handle, Kind};

/// Every CQ is an extended CQ (`struct ibv_cq_ex` starts with the fields of `struct ibv_cq`),
/// so `ibv_cq_ex_to_cq` and the polling callbacks work on any of them.
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq_ex,
    pub rust: CompletionQueue,
    /// QPs (and SRQs) using this CQ: a CQ in use cannot be destroyed (EBUSY).
    pub users: AtomicUsize,
    /// The completion the extended polling API (`ibv_start_poll`...) is on.
    pub current: std::sync::Mutex<Option<ibv_wc>>,
}

impl Handle for Cq {
    type C = ibv_cq_ex;
    const KIND: Kind = Kind::Cq;
}

#[repr(C)]
pub(crate) struct Channel {
    pub ibv: ibv_comp_channel,
    pub rust: CompletionChannel,
}

impl Handle for Channel {
    type C = ibv_comp_channel;
    const KIND: Kind = Kind::Channel;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return fail_null(libc::EINVAL);
        };
        match ctx.rust.create_comp_channel() {
            Ok(rust) => Channel {
                ibv: ibv_comp_channel {
                    context: ctx.ibv(),
                    fd: rust.fd(),
                    refcnt: 0,
                },
                rust,
            }
            .into_c(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        match unsafe { Channel::from_c(channel) } {
            None => return libc::EINVAL,
            Some(c) if c.ibv.refcnt > 0 => return libc::EBUSY,
            Some(_) => {}
        }
        // SAFETY: checked handle with no CQ on it.
        drop(unsafe { Channel::take(channel) });
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: i32,
    cq_context: *mut libc::c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: i32,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return fail_null(libc::EINVAL);
        };
        // As rxe: one completion vector, 0.
        if comp_vector != 0 {
            return fail_null(libc::EINVAL);
        }
        let ch = if channel.is_null() {
            None
        } else {
            // SAFETY: checked handle.
            match unsafe { Channel::from_c(channel) } {
                Some(c) => Some(c),
                None => return fail_null(libc::EINVAL),
            }
        };
        new_cq(ctx, cqe, cq_context, channel, ch.map(|c| &c.rust)).cast()
    })
}

/// Creates a CQ (plain or extended: every CQ carries the extended polling callbacks).
pub(crate) fn new_cq(
    ctx: &Ctx,
    cqe: i32,
    cq_context: *mut libc::c_void,
    channel: *mut ibv_comp_channel,
    ch: Option<&CompletionChannel>,
) -> *mut ibv_cq_ex {
    if cqe <= 0 {
        return fail_null(libc::EINVAL);
    }
    match ctx.rust.create_cq(cqe as u32, ch) {
        Ok(rust) => {
            // SAFETY: ibv_cq_ex is C data (pointers, integers, pthread objects, NULL-able
            // function pointers), all valid as all-zero (the pthread static initialisers).
            let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
            ibv.context = ctx.ibv();
            ibv.channel = channel;
            ibv.cq_context = cq_context;
            ibv.handle = rust.id();
            ibv.cqe = rust.capacity() as i32;
            super::cq_ex::fill_ops(&mut ibv);
            let id = rust.id();
            let p = Cq {
                ibv,
                rust,
                users: AtomicUsize::new(0),
                current: std::sync::Mutex::new(None),
            }
            .into_c();
            ctx.cqs.insert(id, p as usize);
            // SAFETY: a channel handle checked by the caller, or NULL.
            if let Some(c) = unsafe { channel.as_mut() } {
                c.refcnt += 1;
            }
            p.cast()
        }
        Err(e) => fail_null(e.errno()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        let Some(c) = (unsafe { Cq::from_c(cq.cast()) }) else {
            return libc::EINVAL;
        };
        if c.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // As rdma-core, wait until every event of the CQ was acknowledged.
        let mut rust = c.rust.clone();
        loop {
            match rust.destroy() {
                Ok(()) => break,
                Err((VerbsError::Busy(_), back)) => {
                    rust = back;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err((e, _)) => return e.errno(),
            }
        }
        // SAFETY: checked handle; the program destroys it, so no other thread uses it.
        let Some(c) = (unsafe { Cq::take(cq.cast()) }) else {
            return libc::EINVAL;
        };
        if let Some(ctx) = unsafe { Ctx::from_ibv(c.ibv.context) } {
            ctx.cqs.remove(c.rust.id());
        }
        // SAFETY: the channel outlives its CQs (its refcnt keeps it from being destroyed).
        if let Some(ch) = unsafe { c.ibv.channel.as_mut() } {
            ch.refcnt -= 1;
        }
        0
    })
}

/// Converts a completion to `struct ibv_wc`.
pub(crate) fn to_wc(c: &WorkCompletion, out: &mut ibv_wc) {
    out.wr_id = c.wr_id;
    out.status = c.status as u32;
    out.opcode = c.opcode as u32;
    out.vendor_err = c.vendor_err;
    out.byte_len = c.byte_len;
    let mut flags = 0;
    // Immediate data travels in network byte order, as `__be32 imm_data` holds it.
    out.__bindgen_anon_1.imm_data = match c.imm_data {
        Some(imm) => {
            flags |= IBV_WC_WITH_IMM;
            imm.to_be()
        }
        None => 0,
    };
    if c.grh.is_some() {
        flags |= IBV_WC_GRH;
    }
    out.qp_num = c.qp_num;
    out.src_qp = c.src_qp;
    out.wc_flags = flags;
    out.pkey_index = 0;
    out.slid = 0;
    out.sl = 0;
    out.dlid_path_bits = 0;
}

/// `ops.poll_cq`: the data path, so only NULL is checked (as rdma-core's providers do).
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: i32, wc: *mut ibv_wc) -> i32 {
    guard(-1, || {
        // SAFETY: a handle the program got from ibv_create_cq (the hot path is unchecked).
        let Some(c) = (unsafe { Cq::from_c_unchecked(cq.cast()) }) else {
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let mut buf = [WorkCompletion::default(); 16];
        let mut done = 0usize;
        let want = num_entries as usize;
        while done < want {
            let chunk = (want - done).min(buf.len());
            let n = match c.rust.poll(&mut buf[..chunk]) {
                Ok(n) => n,
                Err(_) if done > 0 => break,
                Err(_) => return -1,
            };
            for (i, comp) in buf[..n].iter().enumerate() {
                // SAFETY: the caller's array has num_entries entries; done + i < num_entries.
                to_wc(comp, unsafe { &mut *wc.add(done + i) });
            }
            done += n;
            if n < chunk {
                break;
            }
        }
        done as i32
    })
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: i32) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: a handle the program got from ibv_create_cq.
        let Some(c) = (unsafe { Cq::from_c_unchecked(cq.cast()) }) else {
            return libc::EINVAL;
        };
        if c.ibv.channel.is_null() {
            // Nothing to notify; rdma_rxe arms such a CQ without complaint.
            return 0;
        }
        match c.rust.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut libc::c_void,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let Some(ch) = (unsafe { Channel::from_c(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let rust = match ch.rust.get_cq_event() {
            Ok(r) => r,
            Err(e) => {
                set_errno(e.errno());
                return -1;
            }
        };
        // SAFETY: the channel's context is live while the channel is.
        let ctx = unsafe { Ctx::from_ibv(ch.ibv.context) };
        let p = ctx.and_then(|c| c.cqs.get(rust.id()));
        let Some(p) = p else {
            // The CQ was destroyed after its event was raised: nothing to hand back.
            set_errno(libc::EAGAIN);
            return -1;
        };
        let p = p as *mut ibv_cq;
        // SAFETY: `p` is a live CQ of this context; the out pointers are the caller's.
        unsafe {
            *cq = p;
            *cq_context = (*p).cq_context;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard((), || {
        // SAFETY: checked handle.
        if let Some(c) = unsafe { Cq::from_c(cq.cast()) } {
            c.rust.ack_events(nevents);
        }
    })
}

/// Resizing is refused with EOPNOTSUPP, the documented answer of a device without it.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, _cqe: i32) -> i32 {
    // SAFETY: checked handle.
    if unsafe { Cq::from_c(cq.cast()) }.is_none() {
        return libc::EINVAL;
    }
    libc::EOPNOTSUPP
}

versioned!(
    ibv_create_comp_channel @ "IBVERBS_1.0",
    ibv_destroy_comp_channel @ "IBVERBS_1.0",
    ibv_create_cq @ "IBVERBS_1.1",
    ibv_destroy_cq @ "IBVERBS_1.1",
    ibv_get_cq_event @ "IBVERBS_1.1",
    ibv_ack_cq_events @ "IBVERBS_1.1",
    ibv_resize_cq @ "IBVERBS_1.1",
);
