//! Work requests from C: `struct ibv_send_wr` / `struct ibv_recv_wr` lists into softrdma's
//! WQEs. Inline data is copied here, from application memory that no MR needs to cover.

use softrdma::transport::SgList;
use softrdma::verbs::{SendFlags, SendOp, SendWqe, Sge, UdSend};

use super::ah::Ah;
use crate::abi::*;
use crate::handle::Handle;

/// Why a WR could not be converted: the errno `ibv_post_send` returns for it.
pub(crate) type WrError = i32;

pub(crate) fn send_flags(f: u32) -> SendFlags {
    let mut flags = SendFlags::empty();
    flags.set(SendFlags::SIGNALED, f & IBV_SEND_SIGNALED != 0);
    flags.set(SendFlags::SOLICITED, f & IBV_SEND_SOLICITED != 0);
    flags.set(SendFlags::FENCE, f & IBV_SEND_FENCE != 0);
    flags.set(SendFlags::INLINE, f & IBV_SEND_INLINE != 0);
    flags
}

/// The SGEs of a WR.
///
/// # Safety
/// `sg_list` points to `num_sge` SGEs (the caller's WR).
pub(crate) unsafe fn sges<'a>(
    sg_list: *const ibv_sge,
    num_sge: i32,
) -> Result<&'a [ibv_sge], WrError> {
    match num_sge {
        0 => Ok(&[]),
        n if n < 0 || sg_list.is_null() => Err(libc::EINVAL),
        // SAFETY: per the contract.
        n => Ok(unsafe { std::slice::from_raw_parts(sg_list, n as usize) }),
    }
}

pub(crate) fn to_sges(s: &[ibv_sge]) -> SgList {
    s.iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect()
}

/// Copies the bytes the SGEs name, for an inline send.
///
/// # Safety
/// Each SGE names readable memory of its length (`IBV_SEND_INLINE`'s contract: the data is
/// read during the call and the buffers may be reused as soon as it returns).
pub(crate) unsafe fn gather_inline(s: &[ibv_sge], max: u32) -> Result<Vec<u8>, WrError> {
    let total: u64 = s.iter().map(|s| s.length as u64).sum();
    if total > max as u64 {
        return Err(libc::EINVAL);
    }
    let mut out = Vec::with_capacity(total as usize);
    for sge in s {
        if sge.length == 0 {
            continue;
        }
        if sge.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract, [addr, addr + length) is readable.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(sge.addr as usize as *const u8, sge.length as usize)
        });
    }
    Ok(out)
}

/// One `ibv_send_wr` as a WQE (and its UD destination).
///
/// # Safety
/// `wr` is the caller's valid WR; its SGE list and, for inline sends, the memory the SGEs name
/// are readable.
pub(crate) unsafe fn send_wqe<'a>(
    wr: &ibv_send_wr,
    ud: bool,
    max_inline: u32,
) -> Result<(SendWqe, Option<UdSend<'a>>), WrError> {
    // SAFETY: the union members are plain integers; which one is meant follows the opcode.
    let (rdma, atomic, imm) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.__bindgen_anon_1.imm_data) };
    let imm = u32::from_be(imm);
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        // Memory windows, invalidation, TSO, ATOMIC_WRITE: not on this device.
        _ => return Err(libc::EINVAL),
    };
    let flags = send_flags(wr.send_flags);
    // SAFETY: per the contract.
    let s = unsafe { sges(wr.sg_list, wr.num_sge) }?;
    let inline_data = if flags.contains(SendFlags::INLINE) {
        // SAFETY: per the contract.
        unsafe { gather_inline(s, max_inline) }?
    } else {
        Vec::new()
    };
    let wqe = SendWqe {
        wr_id: wr.wr_id,
        op,
        flags,
        sg_list: if flags.contains(SendFlags::INLINE) {
            SgList::default()
        } else {
            to_sges(s)
        },
        inline_data,
    };
    let dest = if ud {
        // SAFETY: the union member for UD QPs.
        let u = unsafe { wr.wr.ud };
        // SAFETY: checked handle.
        let ah = unsafe { Ah::from_c(u.ah) }.ok_or(libc::EINVAL)?;
        Some(UdSend {
            ah: &ah.rust,
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    Ok((wqe, dest))
}
