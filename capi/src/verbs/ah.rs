//! Address handles: `ibv_create_ah`, `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`.

use softrdma::verbs::{gid_from_ipv4, AddressHandle, AhAttr};

use super::pd::Pd;
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub rust: AddressHandle,
    pd: *const Pd,
}

impl Handle for Ah {
    type C = ibv_ah;
    const KIND: Kind = Kind::Ah;
}

pub(crate) fn from_c_attr(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        // SAFETY: the GID union is 16 plain bytes.
        dgid: unsafe { a.grh.dgid.raw },
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        dlid: a.dlid,
        sl: a.sl,
        port_num: a.port_num,
    }
}

pub(crate) fn to_c_attr(a: &AhAttr, out: &mut ibv_ah_attr) {
    // SAFETY: ibv_ah_attr is plain C data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.grh.dgid.raw = a.dgid;
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.grh.flow_label = a.flow_label;
    out.dlid = a.dlid;
    out.sl = a.sl;
    out.is_global = 1;
    out.port_num = a.port_num;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle and the caller's attributes.
        let (Some(p), Some(a)) = (unsafe { Pd::from_c(pd) }, unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        if a.is_global == 0 {
            // RoCE has no LID-routed AH: rdma-core's RoCE providers refuse it the same way.
            return fail_null(libc::EINVAL);
        }
        match p.rust.create_ah(&from_c_attr(a)) {
            Ok(rust) => {
                p.hold();
                Ah {
                    ibv: ibv_ah {
                        context: p.ibv.context,
                        pd,
                        handle: 0,
                    },
                    rust,
                    pd: p,
                }
                .into_c()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: `take` checks the registry first.
        let Some(a) = (unsafe { Ah::take(ah) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the AH held its PD, so the PD is live.
        let pd = unsafe { &*a.pd };
        drop(a);
        pd.release();
        0
    })
}

/// The sender's and the receiver's GIDs from the 40-byte GRH area of a UD receive buffer, laid
/// out as rdma_rxe writes it: an IPv4 header in its last 20 bytes, or an IPv6 header filling it.
fn grh_gids(grh: &[u8; 40]) -> Option<([u8; 16], [u8; 16])> {
    if grh[20] >> 4 == 4 {
        let v4 = |a: &[u8]| gid_from_ipv4(std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]));
        Some((v4(&grh[32..36]), v4(&grh[36..40])))
    } else if grh[0] >> 4 == 6 {
        let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
        s.copy_from_slice(&grh[8..24]);
        d.copy_from_slice(&grh[24..40]);
        Some((s, d))
    } else {
        None
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the other pointers are the caller's structs or NULL.
        let ctx = unsafe { super::context::Ctx::from_ibv(context) };
        let ok = ctx.is_some();
        let (Some(wc), Some(out)) = (unsafe { wc.as_ref() }, unsafe { ah_attr.as_mut() }) else {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        };
        if !ok || grh.is_null() || wc.wc_flags & IBV_WC_GRH == 0 {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `grh` points to the 40-byte GRH area at the front of the receive buffer.
        let area = unsafe { &*(grh as *const [u8; 40]) };
        let Some((dgid, local)) = grh_gids(area) else {
            crate::handle::set_errno(libc::EINVAL);
            return -1;
        };
        // As rdma-core: the source is the GID the message came to (`ibv_find_gid_index`).
        let sgid_index = ctx.and_then(|c| c.rust.gid_index(&local)).unwrap_or(0);
        let attr = AhAttr {
            dgid,
            sgid_index,
            hop_limit: 0xff,
            port_num,
            ..Default::default()
        };
        to_c_attr(&attr, out);
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle.
        let Some(p) = (unsafe { Pd::from_c(pd) }) else {
            return fail_null(libc::EINVAL);
        };
        // SAFETY: ibv_ah_attr is plain C data; all-zero is valid.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwards the caller's pointers.
        if unsafe { ibv_init_ah_from_wc(p.ibv.context, port_num, wc, grh, &mut attr) } != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: forwards a checked PD and a local attribute struct.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}

versioned!(
    ibv_create_ah @ "IBVERBS_1.1",
    ibv_destroy_ah @ "IBVERBS_1.1",
    ibv_init_ah_from_wc @ "IBVERBS_1.1",
    ibv_create_ah_from_wc @ "IBVERBS_1.1",
);
