//! The extended post API (`ibv_qp_to_qp_ex` and `ibv_wr_*`): `wr_start`, one builder call
//! per WR (`wr_send`, `wr_rdma_write`, ...) followed by its data (`wr_set_sge*` or
//! `wr_set_inline_data*`) and, on UD, `wr_set_ud_addr`; `wr_complete` posts the batch,
//! `wr_abort` drops it.

use softrdma::verbs::SendFlags;
use softrdma::verbs::{SendOp, SendWqe};

use super::ah::Ah;
use super::qp::Qp;
use super::wr::{send_flags, to_sges};
use crate::abi::*;
use crate::handle::{guard, Handle};

/// The send operations `ibv_create_qp_ex` may ask for.
pub(crate) const SUPPORTED_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// The send operations `ibv_create_qp_ex` may ask for on a UC QP.
pub(crate) const SUPPORTED_UC_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;

/// One WR being built: the WQE and, on UD, its destination.
struct Pending {
    wqe: SendWqe,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
}

/// The WRs between `wr_start` and `wr_complete`.
#[derive(Default)]
pub(crate) struct Batch {
    wrs: Vec<Pending>,
    /// A builder call failed (an unsupported opcode, inline data too long): `wr_complete`
    /// reports it and posts nothing, as providers do.
    error: i32,
}

// SAFETY: the raw AH pointers are only handles, resolved through the registry at
// `wr_complete`; nothing is dereferenced through them directly.
unsafe impl Send for Batch {}

pub(crate) fn fill_ops(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
}

/// Runs `f` on the QP's batch (the QP must be one of ours: these are its own callbacks).
fn with_batch(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Batch)) {
    guard((), || {
        // SAFETY: these callbacks are reached only through a QP's own table.
        let Some(q) = (unsafe { Qp::from_c_unchecked(qp.cast()) }) else {
            return;
        };
        let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
        f(q, &mut b);
    })
}

fn push(qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: the program's QP; wr_id and wr_flags are set by it before the builder call.
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    with_batch(qp, |_, b| {
        b.wrs.push(Pending {
            wqe: SendWqe {
                wr_id,
                op,
                flags: send_flags(flags),
                sg_list: softrdma::transport::SgList::default(),
                inline_data: Vec::new(),
            },
            ah: std::ptr::null_mut(),
            remote_qpn: 0,
            remote_qkey: 0,
        })
    });
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| *b = Batch::default());
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| *b = Batch::default());
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> i32 {
    let mut r = libc::EINVAL;
    with_batch(qp, |q, b| {
        let batch = std::mem::take(b);
        if batch.error != 0 {
            r = batch.error;
            return;
        }
        let mut wqes = Vec::with_capacity(batch.wrs.len());
        for p in batch.wrs {
            let dest = if q.ud {
                // SAFETY: checked handle.
                let Some(ah) = (unsafe { Ah::from_c(p.ah) }) else {
                    r = libc::EINVAL;
                    return;
                };
                Some(softrdma::verbs::UdSend {
                    ah: &ah.rust,
                    remote_qpn: p.remote_qpn,
                    remote_qkey: p.remote_qkey,
                })
            } else {
                None
            };
            wqes.push((p.wqe, dest));
        }
        r = match q.rust.post_send_wqes(wqes) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        };
    });
    r
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    push(qp, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) {
    push(
        qp,
        SendOp::SendWithImm {
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(qp, SendOp::RdmaWrite { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: __be32,
) {
    push(
        qp,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(qp, SendOp::RdmaRead { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    push(
        qp,
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    push(
        qp,
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    with_batch(qp, |_, b| match b.wrs.last_mut() {
        Some(p) => {
            p.ah = ah;
            p.remote_qpn = remote_qpn;
            p.remote_qkey = remote_qkey;
        }
        None => b.error = libc::EINVAL,
    });
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = ibv_sge { addr, length, lkey };
    with_batch(qp, |_, b| match b.wrs.last_mut() {
        Some(p) => p.wqe.sg_list = to_sges(&[sge]),
        None => b.error = libc::EINVAL,
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: the caller's SGE array of num_sge entries.
    let s = match unsafe { super::wr::sges(sg_list, num_sge.min(i32::MAX as usize) as i32) } {
        Ok(s) => to_sges(s),
        Err(e) => {
            with_batch(qp, |_, b| b.error = e);
            return;
        }
    };
    with_batch(qp, |_, b| match b.wrs.last_mut() {
        Some(p) => p.wqe.sg_list = s,
        None => b.error = libc::EINVAL,
    });
}

/// Appends inline bytes to the current WR, within the QP's inline capacity.
fn set_inline(qp: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    with_batch(qp, |q, b| {
        let Some(p) = b.wrs.last_mut() else {
            b.error = libc::EINVAL;
            return;
        };
        let total: usize = bufs.iter().map(|x| x.1).sum();
        if total > q.max_inline as usize {
            b.error = libc::EINVAL;
            return;
        }
        p.wqe.flags.insert(SendFlags::INLINE);
        p.wqe.inline_data.clear();
        for &(addr, len) in bufs {
            if len == 0 {
                continue;
            }
            // SAFETY: ibv_wr_set_inline_data's contract: [addr, addr + len) is readable now.
            p.wqe
                .inline_data
                .extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
        }
    });
}

unsafe extern "C" fn wr_set_inline_data(
    qp: *mut ibv_qp_ex,
    addr: *mut libc::c_void,
    length: usize,
) {
    if addr.is_null() && length > 0 {
        with_batch(qp, |_, b| b.error = libc::EINVAL);
        return;
    }
    set_inline(qp, &[(addr as *const u8, length)]);
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    if buf_list.is_null() && num_buf > 0 {
        with_batch(qp, |_, b| b.error = libc::EINVAL);
        return;
    }
    let bufs: Vec<(*const u8, usize)> = (0..num_buf)
        // SAFETY: the caller's array of num_buf entries.
        .map(|i| unsafe {
            (
                (*buf_list.add(i)).addr as *const u8,
                (*buf_list.add(i)).length,
            )
        })
        .collect();
    set_inline(qp, &bufs);
}
