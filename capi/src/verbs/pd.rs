//! Protection domains and memory registration over the application's own memory.

use std::sync::atomic::{AtomicUsize, Ordering};

use softrdma::verbs::{AccessFlags, MemoryRegion, ProtectionDomain};

use super::context::Ctx;
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub rust: ProtectionDomain,
    /// MRs, QPs, AHs and SRQs in this PD: a PD in use cannot be freed (EBUSY), as the kernel
    /// refuses it.
    pub users: AtomicUsize,
}

impl Handle for Pd {
    type C = ibv_pd;
    const KIND: Kind = Kind::Pd;
}

impl Pd {
    pub(crate) fn ctx(&self) -> Option<&Ctx> {
        // SAFETY: a PD's context outlives it unless the program closes the context first,
        // which the registry check catches.
        unsafe { Ctx::from_ibv(self.ibv.context) }
    }
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked handle.
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            return fail_null(libc::EINVAL);
        };
        match ctx.rust.alloc_pd() {
            Ok(rust) => {
                let handle = rust.id();
                Pd {
                    ibv: ibv_pd {
                        context: ctx.ibv(),
                        handle,
                    },
                    rust,
                    users: AtomicUsize::new(0),
                }
                .into_c()
            }
            Err(e) => fail_null(e.errno()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: checked handle.
        match unsafe { Pd::from_c(pd) } {
            None => return libc::EINVAL,
            Some(p) if p.users.load(Ordering::Acquire) > 0 => return libc::EBUSY,
            Some(_) => {}
        }
        // SAFETY: checked handle, not in use by any object of ours.
        drop(unsafe { Pd::take(pd) });
        0
    })
}

#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pub rust: MemoryRegion,
    pd: *const Pd,
}

impl Handle for Mr {
    type C = ibv_mr;
    const KIND: Kind = Kind::Mr;
}

/// Access flags softrdma accepts without acting on them: relaxed ordering is a hint, and the
/// range of optional flags is defined as ignorable by devices that lack them.
const IGNORED_ACCESS: u32 = IB_UVERBS_ACCESS_OPTIONAL_RANGE;
/// What this device does not do: memory windows, zero-based MRs, on-demand paging, and
/// and zero-based addressing.
const UNSUPPORTED_ACCESS: u32 = IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND;

fn reg(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: checked handle.
    let Some(p) = (unsafe { Pd::from_c(pd) }) else {
        return fail_null(libc::EINVAL);
    };
    if access & UNSUPPORTED_ACCESS != 0 {
        return fail_null(libc::EOPNOTSUPP);
    }
    let known = 0xf | IBV_ACCESS_HUGETLB | IGNORED_ACCESS;
    if access & !known != 0 {
        return fail_null(libc::EINVAL);
    }
    if addr.is_null() && length != 0 {
        return fail_null(libc::EINVAL);
    }
    let flags = AccessFlags::from_bits_retain(access & 0xf);
    // SAFETY: ibv_reg_mr's contract is the one register_raw states: the program keeps
    // [addr, addr + length) mapped until ibv_dereg_mr returns, and the device may read and
    // write it meanwhile.
    match unsafe { p.rust.register_raw_iova(addr.cast(), length, iova, flags) } {
        Ok(rust) => {
            p.hold();
            let ibv = ibv_mr {
                context: p.ibv.context,
                pd,
                addr,
                length,
                handle: rust.lkey(),
                lkey: rust.lkey(),
                rkey: rust.rkey(),
            };
            Mr { ibv, rust, pd: p }.into_c()
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_reg_mr` (the header turns it into `ibv_reg_mr_iova2` when the flags are not a
/// constant; both arrive here).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    length: usize,
    access: i32,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg(pd, addr, length, addr as u64, access as u32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    length: usize,
    iova: u64,
    access: i32,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg(pd, addr, length, iova, access as u32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg(pd, addr, length, iova, access))
}

/// Returns once no copy into or out of the region is in flight; after that softrdma never
/// touches the memory again.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: `take` checks the registry first.
        let Some(m) = (unsafe { Mr::take(mr) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the MR held its PD (users > 0), so the PD is still live.
        let pd = unsafe { &*m.pd };
        drop(m);
        pd.release();
        0
    })
}

/// Re-registration is not supported: rdma-core's documented answer for a device without it
/// (the MR stays as it was).
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    _flags: i32,
    _pd: *mut ibv_pd,
    _addr: *mut libc::c_void,
    _length: usize,
    _access: i32,
) -> i32 {
    // SAFETY: checked handle.
    if unsafe { Mr::from_c(mr) }.is_none() {
        return IBV_REREG_MR_ERR_INPUT;
    }
    crate::handle::set_errno(libc::EOPNOTSUPP);
    IBV_REREG_MR_ERR_CMD
}

versioned!(
    ibv_alloc_pd @ "IBVERBS_1.1",
    ibv_dealloc_pd @ "IBVERBS_1.1",
    ibv_reg_mr @ "IBVERBS_1.1",
    ibv_reg_mr_iova @ "IBVERBS_1.7",
    ibv_reg_mr_iova2 @ "IBVERBS_1.8",
    ibv_dereg_mr @ "IBVERBS_1.1",
    ibv_rereg_mr @ "IBVERBS_1.1",
);
