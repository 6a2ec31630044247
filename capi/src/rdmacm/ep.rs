//! Synchronous endpoints: `rdma_create_ep`, `rdma_destroy_ep`, `rdma_get_request` (the calls
//! `rdma_server` and `rdma_client` are written with).

use super::fail;
use super::id::{self, get};
use super::qp::{create_qp, destroy_qp};
use crate::abi::*;
use crate::handle::guard;

const RAI_PASSIVE: i32 = 1;

/// `rdma_create_ep` with the checked arguments; on failure the id is destroyed.
///
/// # Safety
/// `res` is the caller's address information; `qp_init_attr` NULL or its attributes.
unsafe fn create_ep(
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> Result<*mut rdma_cm_id, i32> {
    let p = id::create(
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        res.ai_port_space as rdma_port_space,
        res.ai_qp_type as ibv_qp_type,
    )?;
    // SAFETY: just made.
    let i = unsafe { get(p) }?;
    let r = (|| -> Result<(), i32> {
        if res.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: forwards the caller's address.
            if unsafe { id::rdma_bind_addr(p, res.ai_src_addr) } != 0 {
                return Err(errno());
            }
            if !pd.is_null() {
                // SAFETY: a live id.
                unsafe { (*p).pd = pd };
            }
            // SAFETY: the caller's attributes or NULL.
            if let Some(a) = unsafe { qp_init_attr.as_ref() } {
                let mut a = *a;
                a.qp_type = res.ai_qp_type as ibv_qp_type;
                i.extra().qp_init_attr = Some(a);
            }
            return Ok(());
        }
        // SAFETY: forwards the caller's addresses.
        if unsafe { id::rdma_resolve_addr(p, res.ai_src_addr, res.ai_dst_addr, 2000) } != 0 {
            return Err(errno());
        }
        // SAFETY: a live id.
        if unsafe { id::rdma_resolve_route(p, 2000) } != 0 {
            return Err(errno());
        }
        // SAFETY: the caller's attributes or NULL.
        if let Some(a) = unsafe { qp_init_attr.as_mut() } {
            a.qp_type = res.ai_qp_type as ibv_qp_type;
            // SAFETY: `p` is the live id `i`.
            if unsafe { create_qp(p, i, pd, a) } != 0 {
                return Err(errno());
            }
        }
        if !res.ai_connect.is_null() && res.ai_connect_len > 0 {
            // SAFETY: the caller's `ai_connect_len` bytes.
            let data = unsafe {
                std::slice::from_raw_parts(res.ai_connect as *const u8, res.ai_connect_len)
            };
            i.extra().connect = data.to_vec();
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(p),
        Err(e) => {
            destroy_ep(p);
            Err(e)
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> i32 {
    guard(-1, || {
        // SAFETY: the caller's address information or NULL.
        let Some(res) = (unsafe { res.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: checked arguments.
        match unsafe { create_ep(res, pd, qp_init_attr) } {
            Ok(p) => {
                // SAFETY: the caller's out pointer.
                unsafe { *id = p };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_ep` on an id that may not be live (then nothing happens).
fn destroy_ep(p: *mut rdma_cm_id) {
    // SAFETY: checked handle.
    let Ok(i) = (unsafe { get(p) }) else {
        return;
    };
    if !i.c.qp.is_null() {
        destroy_qp(p);
    }
    i.extra().qp_init_attr = None;
    id::destroy(p);
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || destroy_ep(id))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let Ok(l) = (unsafe { get(listen) }) else {
            return fail(libc::EINVAL);
        };
        if !l.extra().sync || id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a live id; the program does not use it during the call.
        let lc = unsafe { &mut *listen };
        if !lc.event.is_null() {
            super::event_channel::ack(lc.event);
            lc.event = std::ptr::null_mut();
        }
        // SAFETY: forwards the listener's own channel.
        let mut ev = std::ptr::null_mut();
        if unsafe { super::event_channel::rdma_get_cm_event(lc.channel, &mut ev) } != 0 {
            return -1;
        }
        // SAFETY: the event just returned.
        let e = unsafe { &*ev };
        let err = if e.event == RDMA_CM_EVENT_REJECTED {
            Some(libc::ECONNREFUSED)
        } else if e.status != 0 {
            Some(e.status.abs())
        } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(err) = err {
            lc.event = ev;
            return fail(err);
        }
        let child = e.id;
        let attr = l.extra().qp_init_attr;
        if let Some(mut a) = attr {
            // SAFETY: the child id the event names, live until the program destroys it.
            let Ok(ci) = (unsafe { get(child) }) else {
                lc.event = ev;
                return fail(libc::EINVAL);
            };
            // SAFETY: `child` is the live id `ci`.
            if unsafe { create_qp(child, ci, lc.pd, &mut a) } != 0 {
                let e = errno();
                lc.event = ev;
                return fail(e);
            }
        }
        // SAFETY: the caller's out pointer; the child is live.
        unsafe {
            *id = child;
            (*child).event = ev;
        }
        0
    })
}

versioned!(
    rdma_create_ep @ "RDMACM_1.0",
    rdma_destroy_ep @ "RDMACM_1.0",
    rdma_get_request @ "RDMACM_1.0",
);
