//! Ids: `rdma_create_id`, `rdma_destroy_id`, `rdma_bind_addr`, `rdma_resolve_addr`,
//! `rdma_resolve_route`, `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`,
//! `rdma_disconnect`, `rdma_migrate_id`.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use softrdma::rdma_cm::{CmId, ConnParam, PortSpace};
use softrdma::wire::gid::gid_from_ip;

use super::context::cm_dev;
use super::event_channel::{self, Chan};
use super::{fail, from_sockaddr, to_sockaddr};
use crate::abi::*;
use crate::handle::{guard, Handle, Kind};

/// What librdmacm keeps beside `struct rdma_cm_id` (its `cma_id_private`).
pub(crate) struct Extra {
    /// Created without a channel: the id has a private one and waits for its own events.
    pub sync: bool,
    /// Bound or resolved with an AF_INET6 address: addresses are reported as `sockaddr_in6`.
    pub v6: bool,
    /// `rdma_create_ep` on a passive id: the QP attributes `rdma_get_request` creates QPs with.
    pub qp_init_attr: Option<ibv_qp_init_attr>,
    /// `route.path_rec` once the route is known.
    pub path: Option<Box<ibv_sa_path_rec>>,
    /// RDMA_OPTION_ID_TOS.
    pub tos: u8,
    /// `rdma_create_ep`'s `ai_connect`: private data the next `rdma_connect` sends first.
    pub connect: Vec<u8>,
}

#[repr(C)]
pub(crate) struct Id {
    pub c: rdma_cm_id,
    pub rust: CmId,
    pub extra: Mutex<Extra>,
}

impl Handle for Id {
    type C = rdma_cm_id;
    const KIND: Kind = Kind::CmId;
}

impl Id {
    pub(crate) fn extra(&self) -> MutexGuard<'_, Extra> {
        self.extra.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The C id of each softrdma id, for the events that name them.
fn ids() -> MutexGuard<'static, HashMap<CmId, usize>> {
    static IDS: LazyLock<Mutex<HashMap<CmId, usize>>> = LazyLock::new(Default::default);
    IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The C id of a softrdma id, if C still has it.
pub(crate) fn c_of(id: &CmId) -> Option<*mut rdma_cm_id> {
    ids().get(id).map(|&p| p as *mut rdma_cm_id)
}

/// `enum rdma_port_space` as softrdma takes it.
fn port_space(ps: rdma_port_space) -> Result<PortSpace, i32> {
    match ps {
        RDMA_PS_TCP => Ok(PortSpace::Tcp),
        RDMA_PS_UDP => Ok(PortSpace::Udp),
        // IPoIB and native IB port spaces need an InfiniBand fabric.
        RDMA_PS_IPOIB | RDMA_PS_IB => Err(libc::EPROTONOSUPPORT),
        _ => Err(libc::EINVAL),
    }
}

/// Wraps `rust` as a C id on `channel`.
fn make(
    rust: CmId,
    channel: *mut rdma_event_channel,
    context: *mut libc::c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
    sync: bool,
) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is plain C data (pointers, integers, unions of addresses); all-zero
    // is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = qp_type;
    let p = Id {
        c,
        rust: rust.clone(),
        extra: Mutex::new(Extra {
            sync,
            v6: false,
            qp_init_attr: None,
            path: None,
            tos: 0,
            connect: Vec::new(),
        }),
    }
    .into_c();
    ids().insert(rust, p as usize);
    p
}

/// `rdma_create_id2`: a channel of NULL makes a synchronous id with a private channel.
pub(crate) fn create(
    channel: *mut rdma_event_channel,
    context: *mut libc::c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> Result<*mut rdma_cm_id, i32> {
    let rps = port_space(ps)?;
    let (channel, sync) = if channel.is_null() {
        (event_channel::new_channel()?, true)
    } else {
        (channel, false)
    };
    // SAFETY: checked handle.
    let Some(ch) = (unsafe { Chan::from_c(channel) }) else {
        return Err(libc::EINVAL);
    };
    match ch.rust.create_id(rps) {
        Ok(rust) => Ok(make(rust, channel, context, ps, qp_type, sync)),
        Err(e) => {
            if sync {
                event_channel::destroy_channel(channel);
            }
            Err(e.errno())
        }
    }
}

/// The id of a CONNECT_REQUEST: on the listener's channel, with its context, port space and
/// QP type; a synchronous listener's requests get their own private channel, as librdmacm's
/// `ucma_process_conn_req` migrates them.
pub(crate) fn new_child(listen: *mut rdma_cm_id, rust: &CmId) -> Result<*mut rdma_cm_id, i32> {
    if let Some(p) = c_of(rust) {
        return Ok(p);
    }
    // SAFETY: `listen` came from the registry map, so it is live.
    let Some(l) = (unsafe { Id::from_c(listen) }) else {
        return Err(libc::EINVAL);
    };
    let sync = l.extra().sync;
    let channel = if sync {
        let ch = event_channel::new_channel()?;
        // SAFETY: just made.
        let c = unsafe { Chan::from_c(ch) }.expect("live channel");
        rust.migrate(&c.rust);
        ch
    } else {
        l.c.channel
    };
    let p = make(
        rust.clone(),
        channel,
        l.c.context,
        l.c.ps,
        l.c.qp_type,
        sync,
    );
    // SAFETY: just made.
    if let Some(child) = unsafe { Id::from_c(p) } {
        // SAFETY: a live id.
        unsafe { refresh(p, child) };
    }
    Ok(p)
}

/// Brings the fields programs read up to date with the softrdma id: the device (`verbs`,
/// `pd`, `port_num`) once it has one, the addresses, the GIDs and, once there is a peer, the
/// path.
///
/// # Safety
/// `p` is the live id `id`.
pub(crate) unsafe fn refresh(p: *mut rdma_cm_id, id: &Id) {
    let mut x = id.extra();
    let ctx = id.rust.context();
    // SAFETY: the caller's live id; the fields written are those librdmacm writes when it
    // processes the same events.
    let c = unsafe { &mut *p };
    if let Some(ctx) = &ctx {
        if c.verbs.is_null() {
            if let Ok(d) = cm_dev(ctx) {
                c.verbs = d.verbs;
                if c.pd.is_null() {
                    c.pd = d.pd;
                }
                c.port_num = 1;
            }
        }
    }
    let a = &mut c.route.addr;
    let ib = &mut a.addr.ibaddr;
    ib.pkey = 0xffffu16.to_be();
    if let Some(l) = id.rust.local_socket_addr() {
        // SAFETY: the union's storage view covers the whole union.
        to_sockaddr(unsafe { &mut a.__bindgen_anon_1.src_storage }, l, x.v6);
        // The GID of the address the id is bound to (librdmacm's `rdma_ip2gid`); for the
        // wildcard, the device's first.
        ib.sgid.raw = match &ctx {
            _ if !l.ip().is_unspecified() => gid_from_ip(l.ip()),
            Some(ctx) => ctx.gid(),
            None => [0; 16],
        };
    }
    if let Some(r) = id.rust.peer_socket_addr() {
        // SAFETY: as above.
        to_sockaddr(unsafe { &mut a.__bindgen_anon_2.dst_storage }, r, x.v6);
        ib.dgid.raw = gid_from_ip(r.ip());
        if let Some(ctx) = &ctx {
            // SAFETY: ibv_sa_path_rec is plain C data; all-zero is valid.
            let mut path: ibv_sa_path_rec = unsafe { std::mem::zeroed() };
            path.dgid = ib.dgid;
            path.sgid = ib.sgid;
            path.hop_limit = 64;
            path.traffic_class = x.tos;
            path.reversible = 1;
            path.numb_path = 1;
            path.pkey = 0xffffu16.to_be();
            path.mtu_selector = 2; // exactly
            path.mtu = ctx.device().active_mtu() as u8;
            path.rate_selector = 2;
            path.rate = IBV_RATE_25_GBPS as u8;
            path.packet_life_time_selector = 2;
            path.packet_life_time = 16;
            let rec = x.path.get_or_insert_with(|| Box::new(path));
            **rec = path;
            c.route.path_rec = &mut **rec as *mut ibv_sa_path_rec;
            c.route.num_paths = 1;
        }
    }
}

/// The checked id behind a C pointer.
///
/// # Safety
/// The reference is valid until the id is destroyed (the C API's rule: not during a call).
pub(crate) unsafe fn get<'a>(p: *mut rdma_cm_id) -> Result<&'a Id, i32> {
    // SAFETY: checked handle.
    unsafe { Id::from_c(p) }.ok_or(libc::EINVAL)
}

/// librdmacm's `ucma_complete`: on a synchronous id, wait for the event the call started and
/// keep it in `id->event`; its failure becomes the call's.
///
/// # Safety
/// `p` is a live id.
pub(crate) unsafe fn complete(p: *mut rdma_cm_id, id: &Id) -> i32 {
    if !id.extra().sync {
        return 0;
    }
    // SAFETY: the caller's live id.
    let c = unsafe { &mut *p };
    if !c.event.is_null() {
        event_channel::ack(c.event);
        c.event = std::ptr::null_mut();
    }
    // SAFETY: a synchronous id's private channel lives as long as the id.
    let Some(ch) = (unsafe { Chan::from_c(c.channel) }) else {
        return fail(libc::EINVAL);
    };
    let mut ev = std::ptr::null_mut();
    let r = event_channel::get_event(ch, &mut ev);
    if r != 0 {
        return r;
    }
    c.event = ev;
    // SAFETY: the event just made.
    let e = unsafe { &*ev };
    if e.status != 0 {
        let errno = if e.event == RDMA_CM_EVENT_REJECTED {
            libc::ECONNREFUSED
        } else {
            e.status.abs()
        };
        return fail(errno);
    }
    0
}

/// Runs `f` on the checked id, turning its errno into librdmacm's -1.
fn with_id(p: *mut rdma_cm_id, f: impl FnOnce(&Id) -> Result<i32, i32>) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle.
        match unsafe { get(p) }.and_then(f) {
            Ok(r) => r,
            Err(e) => fail(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut libc::c_void,
    ps: rdma_port_space,
) -> i32 {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        match create(channel, context, ps, qp_type) {
            Ok(p) => {
                // SAFETY: the caller's out pointer.
                unsafe { *id = p };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_id` on a checked id.
pub(crate) fn destroy(p: *mut rdma_cm_id) -> i32 {
    // SAFETY: checked handle.
    let Ok(id) = (unsafe { get(p) }) else {
        return fail(libc::EINVAL);
    };
    if !id.c.event.is_null() {
        event_channel::ack(id.c.event);
        // SAFETY: a live id.
        unsafe { (*p).event = std::ptr::null_mut() };
    }
    ids().remove(&id.rust);
    let sync = id.extra().sync;
    let channel = id.c.channel;
    // Waits until every event reported for the id is acknowledged, as librdmacm does.
    id.rust.clone().destroy();
    // SAFETY: checked above; the program destroys it, so no other thread uses it.
    drop(unsafe { Id::take(p) });
    if sync {
        event_channel::destroy_channel(channel);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> i32 {
    guard(-1, || destroy(id))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> i32 {
    with_id(id, |i| {
        // SAFETY: the caller's address.
        let (a, v6) = unsafe { from_sockaddr(addr) }?;
        i.extra().v6 = v6;
        i.rust.bind_addr(a).map_err(|e| e.errno())?;
        // SAFETY: a live id.
        unsafe { refresh(id, i) };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: i32,
) -> i32 {
    with_id(id, |i| {
        // SAFETY: the caller's addresses.
        let (dst, v6) = unsafe { from_sockaddr(dst_addr) }?;
        let src = if src_addr.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { from_sockaddr(src_addr) }?.0)
        };
        {
            let mut x = i.extra();
            x.v6 = v6;
            // As librdmacm, the destination is in the route before the call completes.
            // SAFETY: a live id; the storage view covers the union.
            to_sockaddr(
                unsafe { &mut (*id).route.addr.__bindgen_anon_2.dst_storage },
                dst,
                v6,
            );
        }
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        i.rust
            .resolve_addr(src, dst, timeout)
            .map_err(|e| e.errno())?;
        // SAFETY: a live id.
        unsafe { refresh(id, i) };
        // SAFETY: a live id.
        Ok(unsafe { complete(id, i) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: i32) -> i32 {
    with_id(id, |i| {
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        i.rust.resolve_route(timeout).map_err(|e| e.errno())?;
        // SAFETY: a live id.
        unsafe { refresh(id, i) };
        // SAFETY: a live id.
        Ok(unsafe { complete(id, i) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: i32) -> i32 {
    with_id(id, |i| {
        i.rust
            .listen(backlog.max(0) as usize)
            .map_err(|e| e.errno())?;
        // SAFETY: a live id.
        unsafe { refresh(id, i) };
        Ok(0)
    })
}

/// The device's limit on READ/atomic depth, for RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH and
/// calls without parameters.
fn max_rd_atomic(i: &Id) -> u8 {
    i.rust
        .context()
        .map_or(1, |c| c.query_device().max_qp_rd_atom.min(255) as u8)
}

/// A `struct rdma_conn_param` (or its absence) as softrdma takes it, checked as librdmacm's
/// `ucma_valid_param` checks it.
///
/// # Safety
/// `p` is NULL or the caller's parameters, with `private_data_len` readable bytes.
unsafe fn to_conn_param(i: &Id, p: *const rdma_conn_param) -> Result<ConnParam, i32> {
    let max = max_rd_atomic(i);
    let tcp = i.c.ps == RDMA_PS_TCP;
    // SAFETY: per the contract.
    let Some(p) = (unsafe { p.as_ref() }) else {
        if tcp && i.c.qp.is_null() {
            return Err(libc::EINVAL);
        }
        return Ok(ConnParam {
            responder_resources: max,
            initiator_depth: max,
            ..ConnParam::default()
        });
    };
    let depth = |v: u8| -> Result<u8, i32> {
        if v == RDMA_MAX_RESP_RES as u8 {
            Ok(max)
        } else if tcp && v > max {
            Err(libc::EINVAL)
        } else {
            Ok(v)
        }
    };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract.
        unsafe {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
        }
        .to_vec()
    };
    Ok(ConnParam {
        private_data,
        responder_resources: depth(p.responder_resources)?,
        initiator_depth: depth(p.initiator_depth)?,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        srq: p.srq != 0,
        qp_num: p.qp_num,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> i32 {
    with_id(id, |i| {
        // SAFETY: the caller's parameters or NULL.
        let mut param = unsafe { to_conn_param(i, conn_param) }?;
        let prefix = std::mem::take(&mut i.extra().connect);
        if !prefix.is_empty() {
            param.private_data.splice(0..0, prefix);
        }
        i.rust.connect(&param).map_err(|e| e.errno())?;
        // SAFETY: a live id.
        Ok(unsafe { complete(id, i) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> i32 {
    with_id(id, |i| {
        // SAFETY: the caller's parameters or NULL.
        let param = unsafe { to_conn_param(i, conn_param) }?;
        i.rust.accept(&param).map_err(|e| e.errno())?;
        if i.c.qp_type == IBV_QPT_UD {
            return Ok(0);
        }
        // SAFETY: a live id.
        Ok(unsafe { complete(id, i) })
    })
}

/// `rdma_reject` on a checked id.
pub(crate) fn reject(i: &Id, private_data: *const libc::c_void, len: u8) -> Result<i32, i32> {
    let data: &[u8] = if private_data.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's `len` bytes.
        unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }
    };
    i.rust.reject(data).map_err(|e| e.errno())?;
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const libc::c_void,
    private_data_len: u8,
) -> i32 {
    with_id(id, |i| reject(i, private_data, private_data_len))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> i32 {
    with_id(id, |i| {
        if i.c.verbs.is_null() {
            return Err(libc::EINVAL);
        }
        i.rust.disconnect().map_err(|e| e.errno())?;
        // SAFETY: a live id.
        Ok(unsafe { complete(id, i) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> i32 {
    with_id(id, |i| {
        let was_sync = i.extra().sync;
        if was_sync && channel.is_null() {
            return Err(libc::EINVAL);
        }
        let (channel, sync) = if channel.is_null() {
            (event_channel::new_channel()?, true)
        } else {
            (channel, false)
        };
        // SAFETY: checked handle.
        let Some(ch) = (unsafe { Chan::from_c(channel) }) else {
            return Err(libc::EINVAL);
        };
        i.rust.migrate(&ch.rust);
        let old = i.c.channel;
        // SAFETY: a live id; the program does not use it during this call.
        let c = unsafe { &mut *id };
        if was_sync {
            if !c.event.is_null() {
                event_channel::ack(c.event);
                c.event = std::ptr::null_mut();
            }
            event_channel::destroy_channel(old);
        }
        c.channel = channel;
        i.extra().sync = sync;
        Ok(0)
    })
}

versioned!(
    rdma_create_id @ "RDMACM_1.0",
    rdma_destroy_id @ "RDMACM_1.0",
    rdma_bind_addr @ "RDMACM_1.0",
    rdma_resolve_addr @ "RDMACM_1.0",
    rdma_resolve_route @ "RDMACM_1.0",
    rdma_listen @ "RDMACM_1.0",
    rdma_connect @ "RDMACM_1.0",
    rdma_accept @ "RDMACM_1.0",
    rdma_reject @ "RDMACM_1.0",
    rdma_disconnect @ "RDMACM_1.0",
    rdma_migrate_id @ "RDMACM_1.0",
);
