//! Event channels and events: `rdma_create_event_channel`, `rdma_destroy_event_channel`,
//! `rdma_get_cm_event`, `rdma_ack_cm_event`.

use std::time::Duration;

use softrdma::rdma_cm::{CmEvent, EventChannel, EventParam, EventType};

use super::fail;
use super::id::{self, Id};
use crate::abi::*;
use crate::handle::{fail_null, guard, Handle, Kind};

#[repr(C)]
pub(crate) struct Chan {
    pub c: rdma_event_channel,
    pub rust: EventChannel,
}

impl Handle for Chan {
    type C = rdma_event_channel;
    const KIND: Kind = Kind::EventChannel;
}

/// A new channel as C sees it.
pub(crate) fn new_channel() -> Result<*mut rdma_event_channel, i32> {
    let rust = EventChannel::new().map_err(|e| e.errno())?;
    Ok(Chan {
        c: rdma_event_channel { fd: rust.fd() },
        rust,
    }
    .into_c())
}

/// Destroys a channel made by `new_channel` (a no-op for anything else).
pub(crate) fn destroy_channel(p: *mut rdma_event_channel) {
    // SAFETY: `take` checks the registry first.
    drop(unsafe { Chan::take(p) });
}

/// `struct rdma_cm_event` with the softrdma event it reports (acknowledged when it is freed)
/// and the private data its parameters point to.
#[repr(C)]
pub(crate) struct Event {
    pub c: rdma_cm_event,
    rust: Option<CmEvent>,
    private_data: Vec<u8>,
}

impl Handle for Event {
    type C = rdma_cm_event;
    const KIND: Kind = Kind::CmEvent;
}

/// Frees an event (and acknowledges it); false if `p` is not a live event.
pub(crate) fn ack(p: *mut rdma_cm_event) -> bool {
    // SAFETY: `take` checks the registry first.
    match unsafe { Event::take(p) } {
        Some(e) => {
            drop(e);
            true
        }
        None => false,
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        // librdmacm fails with ENODEV when the host has no RDMA device.
        match softrdma::verbs::devices() {
            Ok(d) if !d.is_empty() => {}
            Ok(_) => return fail_null(libc::ENODEV),
            Err(e) => return fail_null(e.errno()),
        }
        match new_channel() {
            Ok(p) => p,
            Err(e) => fail_null(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || destroy_channel(channel))
}

fn event_type(t: EventType) -> rdma_cm_event_type {
    match t {
        EventType::AddrResolved => RDMA_CM_EVENT_ADDR_RESOLVED,
        EventType::AddrError => RDMA_CM_EVENT_ADDR_ERROR,
        EventType::RouteResolved => RDMA_CM_EVENT_ROUTE_RESOLVED,
        EventType::RouteError => RDMA_CM_EVENT_ROUTE_ERROR,
        EventType::ConnectRequest => RDMA_CM_EVENT_CONNECT_REQUEST,
        EventType::ConnectResponse => RDMA_CM_EVENT_CONNECT_RESPONSE,
        EventType::ConnectError => RDMA_CM_EVENT_CONNECT_ERROR,
        EventType::Unreachable => RDMA_CM_EVENT_UNREACHABLE,
        EventType::Rejected => RDMA_CM_EVENT_REJECTED,
        EventType::Established => RDMA_CM_EVENT_ESTABLISHED,
        EventType::Disconnected => RDMA_CM_EVENT_DISCONNECTED,
        EventType::DeviceRemoval => RDMA_CM_EVENT_DEVICE_REMOVAL,
        EventType::TimewaitExit => RDMA_CM_EVENT_TIMEWAIT_EXIT,
        // An event newer than this translation: an error the program handles generically.
        _ => RDMA_CM_EVENT_CONNECT_ERROR,
    }
}

/// The C event for a softrdma event, or `None` if it is for an id C no longer has (it is
/// then acknowledged and dropped, as librdmacm discards events of unknown ids).
fn translate(ev: CmEvent) -> Result<Option<*mut rdma_cm_event>, i32> {
    let (idp, listen) = if ev.event() == EventType::ConnectRequest {
        let Some(listen) = ev.listen_id().and_then(id::c_of) else {
            return Ok(None);
        };
        (id::new_child(listen, ev.id())?, listen)
    } else {
        let Some(p) = id::c_of(ev.id()) else {
            return Ok(None);
        };
        (p, std::ptr::null_mut())
    };
    // SAFETY: `idp` is a live id (just looked up or made).
    if let Some(i) = unsafe { Id::from_c(idp) } {
        match ev.event() {
            EventType::AddrResolved
            | EventType::RouteResolved
            | EventType::ConnectResponse
            | EventType::Established => {
                // SAFETY: a live id.
                unsafe { id::refresh(idp, i) }
            }
            _ => {}
        }
    }
    // SAFETY: rdma_cm_event is plain C data; all-zero is valid.
    let mut c: rdma_cm_event = unsafe { std::mem::zeroed() };
    c.id = idp;
    c.listen_id = listen;
    c.event = event_type(ev.event());
    c.status = ev.status();
    let private_data = ev.private_data().to_vec();
    match ev.param() {
        EventParam::Conn(p) => {
            // SAFETY: writing the union's `conn` view of zeroed C data.
            let conn = unsafe { &mut c.param.conn };
            conn.private_data_len = private_data.len().min(255) as u8;
            conn.responder_resources = p.responder_resources;
            conn.initiator_depth = p.initiator_depth;
            conn.flow_control = p.flow_control as u8;
            conn.retry_count = p.retry_count;
            conn.rnr_retry_count = p.rnr_retry_count;
            conn.srq = p.srq as u8;
            conn.qp_num = p.qp_num;
        }
        EventParam::Ud(p) => {
            // SAFETY: writing the union's `ud` view of zeroed C data.
            let ud = unsafe { &mut c.param.ud };
            ud.private_data_len = private_data.len().min(255) as u8;
            crate::verbs::ah::to_c_attr(&p.ah_attr, &mut ud.ah_attr);
            ud.qp_num = p.qp_num;
            ud.qkey = p.qkey;
        }
        EventParam::None => {}
    }
    let p = Event {
        c,
        rust: Some(ev),
        private_data,
    }
    .into_c();
    // SAFETY: `p` was just made; its private data stays put (the Vec is not touched again)
    // until the event is freed.
    unsafe {
        let e = &mut *(p as *mut Event);
        if !e.private_data.is_empty() {
            let pd = e.private_data.as_ptr() as *const libc::c_void;
            match e.rust.as_ref().map(|r| r.param()) {
                Some(EventParam::Ud(_)) => e.c.param.ud.private_data = pd,
                _ => e.c.param.conn.private_data = pd,
            }
        }
    }
    Ok(Some(p))
}

/// Whether a program made the fd non-blocking (`fcntl(fd, F_SETFL, O_NONBLOCK)`).
fn nonblocking(fd: i32) -> bool {
    // SAFETY: F_GETFL on any fd number is harmless.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `rdma_get_cm_event` with the checked channel.
pub(crate) fn get_event(ch: &Chan, out: *mut *mut rdma_cm_event) -> i32 {
    if out.is_null() {
        return fail(libc::EINVAL);
    }
    // A clone, so that a program destroying the channel while this thread waits on it (at exit,
    // say) does not free what the wait uses.
    let (fd, rust) = (ch.c.fd, ch.rust.clone());
    loop {
        let ev = if nonblocking(fd) {
            match rust.get_cm_event_timeout(Duration::ZERO) {
                Some(ev) => ev,
                None => return fail(libc::EAGAIN),
            }
        } else {
            match rust.get_cm_event() {
                Ok(ev) => ev,
                Err(e) => return fail(e.errno()),
            }
        };
        match translate(ev) {
            Ok(Some(p)) => {
                // SAFETY: the caller's out pointer, checked above.
                unsafe { *out = p };
                return 0;
            }
            Ok(None) => continue,
            Err(e) => return fail(e),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle. The channel must outlive the call (the C API's rule).
        match unsafe { Chan::from_c(channel) } {
            Some(ch) => get_event(ch, event),
            None => fail(libc::EINVAL),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> i32 {
    guard(-1, || if ack(event) { 0 } else { fail(libc::EINVAL) })
}

versioned!(
    rdma_create_event_channel @ "RDMACM_1.0",
    rdma_destroy_event_channel @ "RDMACM_1.0",
    rdma_get_cm_event @ "RDMACM_1.0",
    rdma_ack_cm_event @ "RDMACM_1.0",
);
