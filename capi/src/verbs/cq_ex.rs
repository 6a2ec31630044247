//! Extended CQs: `ibv_create_cq_ex` (through the extended table) and the polling callbacks
//! the header's `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` / `ibv_wc_read_*` call.

use softrdma::verbs::WorkCompletion;

use super::context::Ctx;
use super::cq::{new_cq, Cq};
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle};

/// What `wc_flags` may ask for: the standard fields. Timestamps, CVLAN, flow tags and tag
/// matching are not kept by this device.
const SUPPORTED_WC_FLAGS: u64 = IBV_WC_STANDARD_FLAGS as u64;

pub(crate) fn fill_ops(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// `verbs_context.create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle; the caller's attributes or NULL.
        let (Some(ctx), Some(a)) = (unsafe { Ctx::from_ibv(context) }, unsafe { attr.as_ref() })
        else {
            return fail_null(libc::EINVAL);
        };
        if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            return fail_null(libc::EOPNOTSUPP);
        }
        let ch = if a.channel.is_null() {
            None
        } else {
            // SAFETY: checked handle.
            match unsafe { super::cq::Channel::from_c(a.channel) } {
                Some(c) => Some(&c.rust),
                None => return fail_null(libc::EINVAL),
            }
        };
        let Ok(cqe) = i32::try_from(a.cqe) else {
            return fail_null(libc::EINVAL);
        };
        // As rxe: one completion vector, 0.
        if a.comp_vector != 0 {
            return fail_null(libc::EINVAL);
        }
        new_cq(ctx, cqe, a.cq_context, a.channel, ch)
    })
}

/// The CQ behind a callback's argument (these are its own callbacks, so it is one of ours).
fn cq<'a>(p: *mut ibv_cq_ex) -> Option<&'a Cq> {
    // SAFETY: the callbacks are reached only through a live CQ's own table.
    unsafe { Cq::from_c_unchecked(p) }
}

/// Takes the next completion into `current` and the public `status`/`wr_id`; ENOENT if none.
fn advance(p: *mut ibv_cq_ex) -> i32 {
    guard(libc::EIO, || {
        let Some(c) = cq(p) else { return libc::EINVAL };
        let mut one = [WorkCompletion::default()];
        match c.rust.poll(&mut one) {
            Ok(1) => {
                let wc = one[0];
                // SAFETY: ibv_wc is plain C data; all-zero is valid.
                let mut w: ibv_wc = unsafe { std::mem::zeroed() };
                super::cq::to_wc(&wc, &mut w);
                *c.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
                // SAFETY: `p` is this live CQ; programs read status and wr_id from it.
                unsafe {
                    (*p).status = wc.status as u32;
                    (*p).wr_id = wc.wr_id;
                }
                0
            }
            Ok(_) => libc::ENOENT,
            Err(e) => e.errno(),
        }
    })
}

unsafe extern "C" fn start_poll(p: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> i32 {
    // SAFETY: the caller's attributes or NULL.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    advance(p)
}

unsafe extern "C" fn next_poll(p: *mut ibv_cq_ex) -> i32 {
    advance(p)
}

unsafe extern "C" fn end_poll(p: *mut ibv_cq_ex) {
    if let Some(c) = cq(p) {
        *c.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A field of the current completion as `ibv_wc` has it (0 with none).
fn field<T: Default>(p: *mut ibv_cq_ex, f: impl FnOnce(&ibv_wc) -> T) -> T {
    let Some(c) = cq(p) else { return T::default() };
    let cur = c.current.lock().unwrap_or_else(|e| e.into_inner());
    cur.as_ref().map_or_else(T::default, f)
}

unsafe extern "C" fn read_opcode(p: *mut ibv_cq_ex) -> ibv_wc_opcode {
    field(p, |w| w.opcode)
}
unsafe extern "C" fn read_vendor_err(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.vendor_err)
}
unsafe extern "C" fn read_byte_len(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.byte_len)
}
unsafe extern "C" fn read_imm_data(p: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: the union's members are both plain u32.
    field(p, |w| unsafe { w.__bindgen_anon_1.imm_data })
}
unsafe extern "C" fn read_qp_num(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.qp_num)
}
unsafe extern "C" fn read_src_qp(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.src_qp)
}
unsafe extern "C" fn read_wc_flags(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.wc_flags)
}
unsafe extern "C" fn read_slid(p: *mut ibv_cq_ex) -> u32 {
    field(p, |w| w.slid as u32)
}
unsafe extern "C" fn read_sl(p: *mut ibv_cq_ex) -> u8 {
    field(p, |w| w.sl)
}
unsafe extern "C" fn read_dlid_path_bits(p: *mut ibv_cq_ex) -> u8 {
    field(p, |w| w.dlid_path_bits)
}
