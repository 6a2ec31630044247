//! `rdma_event_str`, `rdma_get_devices` / `rdma_free_devices`, `rdma_set_option`,
//! `rdma_init_qp_attr`, `rdma_establish`, `rdma_notify`, `rdma_get_src_port` /
//! `rdma_get_dst_port`.

use std::ffi::c_char;

use softrdma::verbs::{QpAttr, QpState};

use super::fail;
use super::id::get;
use crate::abi::*;
use crate::handle::{fail_null, guard};

/// `RDMA_UDP_QKEY`: the Q_Key of rdma_cm's UD QPs.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;

#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static [u8] = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr() as *const c_char
}

/// A NULL-terminated `malloc`ed array of each device's context (the same `ibv_context` the ids
/// on that device show); `rdma_free_devices` frees the array, the contexts stay open.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut i32) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let set_num = |n: i32| {
            if !num_devices.is_null() {
                // SAFETY: the caller's int.
                unsafe { *num_devices = n };
            }
        };
        let devs = match super::context::all() {
            Ok(d) => d,
            Err(e) => {
                set_num(0);
                return fail_null(e);
            }
        };
        // SAFETY: malloc has no preconditions; the result is checked.
        let arr =
            unsafe { libc::malloc((devs.len() + 1) * std::mem::size_of::<*mut ibv_context>()) }
                as *mut *mut ibv_context;
        if arr.is_null() {
            set_num(0);
            return fail_null(libc::ENOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `arr` has devs.len() + 1 slots.
            unsafe { *arr.add(i) = d.verbs };
        }
        // SAFETY: as above.
        unsafe { *arr.add(devs.len()) = std::ptr::null_mut() };
        set_num(devs.len() as i32);
        arr
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the array rdma_get_devices malloc'ed, or NULL.
    unsafe { libc::free(list.cast()) }
}

/// Options, as the kernel's rdma_cm takes them: the ID options are accepted (the type of
/// service is kept for the path record; address reuse and IPv6-only binding are what softrdma
/// does anyway; the ACK timeout is the transport's own), setting an IB path is not done on
/// this device, anything else is ENOSYS.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: i32,
    optname: i32,
    optval: *mut libc::c_void,
    optlen: usize,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        let i = match unsafe { get(id) } {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => {
                if optlen != 1 {
                    return fail(libc::EINVAL);
                }
                // SAFETY: the caller's byte.
                i.extra().tos = unsafe { *(optval as *const u8) };
                0
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
                if optlen != std::mem::size_of::<i32>() {
                    return fail(libc::EINVAL);
                }
                0
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                if optlen != 1 {
                    return fail(libc::EINVAL);
                }
                0
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::EOPNOTSUPP),
            _ => fail(libc::ENOSYS),
        }
    })
}

/// The attributes that move a QP the program manages itself (no `rdma_create_qp`) for this
/// id's connection, as the kernel computes them: INIT (port 1, P_Key index 0, remote READ/WRITE
/// for a connected QP, rdma_cm's Q_Key for a UD one); RTR and RTS from what the connection
/// settled: on the passive side from the CONNECT_REQUEST on, on the active side after
/// CONNECT_RESPONSE (EINVAL before).
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut i32,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the caller's structs or NULL.
        let (Ok(i), Some(a), Some(mask)) =
            (unsafe { get(id) }, unsafe { qp_attr.as_mut() }, unsafe {
                qp_attr_mask.as_mut()
            })
        else {
            return fail(libc::EINVAL);
        };
        if i.c.verbs.is_null() {
            return fail(libc::EINVAL);
        }
        let state = match a.qp_state {
            IBV_QPS_INIT => {
                a.pkey_index = 0;
                a.port_num = 1;
                let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
                *mask = if i.c.qp_type == IBV_QPT_UD {
                    a.qkey = RDMA_UDP_QKEY;
                    m | IBV_QP_QKEY
                } else {
                    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                    m | IBV_QP_ACCESS_FLAGS
                } as i32;
                return 0;
            }
            IBV_QPS_RTR if i.c.qp_type != IBV_QPT_UD => QpState::Rtr,
            IBV_QPS_RTS if i.c.qp_type != IBV_QPT_UD => QpState::Rts,
            IBV_QPS_RTR | IBV_QPS_RTS => {
                // UD: nothing but the state (and RTS's send PSN) changes.
                *mask = IBV_QP_STATE as i32;
                if a.qp_state == IBV_QPS_RTS {
                    a.sq_psn = 0;
                    *mask |= IBV_QP_SQ_PSN as i32;
                }
                return 0;
            }
            _ => return fail(libc::EINVAL),
        };
        match i.rust.init_qp_attr(state) {
            Ok(r) => {
                *mask = attr_to_c(&r, a) as i32;
                0
            }
            Err(e) => fail(e.errno()),
        }
    })
}

/// Writes the fields `r` has into `a`; returns their `ibv_qp_attr_mask`.
fn attr_to_c(r: &QpAttr, a: &mut ibv_qp_attr) -> u32 {
    let mut m = 0;
    if let Some(v) = r.qp_state {
        a.qp_state = v as u32;
        m |= IBV_QP_STATE;
    }
    if let Some(v) = r.path_mtu {
        a.path_mtu = v as u32;
        m |= IBV_QP_PATH_MTU;
    }
    if let Some(v) = r.dest_qp_num {
        a.dest_qp_num = v;
        m |= IBV_QP_DEST_QPN;
    }
    if let Some(v) = r.rq_psn {
        a.rq_psn = v;
        m |= IBV_QP_RQ_PSN;
    }
    if let Some(v) = r.max_dest_rd_atomic {
        a.max_dest_rd_atomic = v;
        m |= IBV_QP_MAX_DEST_RD_ATOMIC;
    }
    if let Some(v) = r.min_rnr_timer {
        a.min_rnr_timer = v;
        m |= IBV_QP_MIN_RNR_TIMER;
    }
    if let Some(v) = r.qp_access_flags {
        a.qp_access_flags = v.bits();
        m |= IBV_QP_ACCESS_FLAGS;
    }
    if let Some(v) = &r.ah_attr {
        crate::verbs::ah::to_c_attr(v, &mut a.ah_attr);
        m |= IBV_QP_AV;
    }
    if let Some(v) = r.sq_psn {
        a.sq_psn = v;
        m |= IBV_QP_SQ_PSN;
    }
    if let Some(v) = r.timeout {
        a.timeout = v;
        m |= IBV_QP_TIMEOUT;
    }
    if let Some(v) = r.retry_cnt {
        a.retry_cnt = v;
        m |= IBV_QP_RETRY_CNT;
    }
    if let Some(v) = r.rnr_retry {
        a.rnr_retry = v;
        m |= IBV_QP_RNR_RETRY;
    }
    if let Some(v) = r.max_rd_atomic {
        a.max_rd_atomic = v;
        m |= IBV_QP_MAX_QP_RD_ATOMIC;
    }
    m
}

/// After CONNECT_RESPONSE, for a connection whose QP the program manages itself (and has
/// moved to RTS). With a QP from `rdma_create_qp`, EINVAL, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        match unsafe { get(id) } {
            Ok(i) if !i.c.qp.is_null() => fail(libc::EINVAL),
            Ok(i) => match i.rust.establish() {
                Ok(()) => 0,
                Err(e) => fail(e.errno()),
            },
            Err(e) => fail(e),
        }
    })
}

/// An async event on the QP (IBV_EVENT_COMM_EST: data arrived before the RTU): softrdma's
/// connection manager sees the RTU's absence itself, so there is nothing to do.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        match unsafe { get(id) } {
            Ok(_) => 0,
            Err(e) => fail(e),
        }
    })
}

/// The port of the id's local address, in network byte order (0 if none).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: checked handle; the storage view covers the union.
        match unsafe { get(id) } {
            Ok(i) => unsafe { super::port_of(&i.c.route.addr.__bindgen_anon_1.src_storage) },
            Err(_) => 0,
        }
    })
}

/// The port of the id's peer address, in network byte order (0 if none).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: as above.
        match unsafe { get(id) } {
            Ok(i) => unsafe { super::port_of(&i.c.route.addr.__bindgen_anon_2.dst_storage) },
            Err(_) => 0,
        }
    })
}

versioned!(
    rdma_event_str @ "RDMACM_1.0",
    rdma_get_devices @ "RDMACM_1.0",
    rdma_free_devices @ "RDMACM_1.0",
    rdma_set_option @ "RDMACM_1.0",
    rdma_init_qp_attr @ "RDMACM_1.2",
    rdma_establish @ "RDMACM_1.2",
    rdma_notify @ "RDMACM_1.0",
    rdma_get_src_port @ "RDMACM_1.0",
    rdma_get_dst_port @ "RDMACM_1.0",
);
