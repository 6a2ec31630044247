//! rdma_cm events (`struct rdma_cm_event`): what happened to which id, with the connection
//! parameters the peer sent. Dropping an event acknowledges it (`rdma_ack_cm_event`).

use std::sync::Arc;

use super::id::{CmId, IdInner};
use crate::verbs::AddressVector;

/// `enum rdma_cm_event_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[non_exhaustive]
pub enum EventType {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: `resolve_addr` found the device.
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: it did not.
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: `resolve_route` is done.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a peer connects to a listener (on a new id).
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted; the program moves its own QP.
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer never answered.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer refused (nobody listens, or it rejected).
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`: the connection is up.
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`: either side disconnected, or the peer went away.
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP may be reused.
    TimewaitExit,
}

impl EventType {
    /// `rdma_event_str`: the C name, e.g. `RDMA_CM_EVENT_ESTABLISHED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `struct rdma_conn_param`: what `connect`/`accept` offer, and what a CONNECT_REQUEST or
/// ESTABLISHED event reports of the peer (from this side's point of view: `responder_resources`
/// is how many READs/atomics this side should accept, i.e. the peer's initiator depth).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// At most 56 bytes for connect, 196 for accept.
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side serves at a time (0: none; needed above 0 for the
    /// peer's READs).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side issues at a time (0: none).
    pub initiator_depth: u8,
    /// End-to-end flow control (the REQ/REP bit; informational here).
    pub flow_control: bool,
    /// 0..=7: transport retries (connect only).
    pub retry_count: u8,
    /// 0..=7, 7 infinite.
    pub rnr_retry_count: u8,
    /// The QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// Events: the peer's QP number. `connect`/`accept` on an id without a QP from
    /// [`CmId::create_qp`](super::CmId::create_qp): the QP the program manages itself (it then
    /// moves it with [`CmId::init_qp_attr`](super::CmId::init_qp_attr); the active side gets
    /// CONNECT_RESPONSE instead of ESTABLISHED).
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// What rping passes: one READ in flight each way, 7 retries, infinite RNR retry.
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// `struct rdma_ud_param`: what a UDP-port-space resolution reports.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UdParam {
    /// Private data of the SIDR reply.
    pub private_data: Vec<u8>,
    /// Address of the peer, for an address handle.
    pub ah_attr: AddressVector,
    /// The peer's UD QPN.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

/// The parameters an event carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventParam {
    /// No parameters.
    None,
    /// A connected id's (RC/UC).
    Conn(ConnParam),
    /// A UD id's (SIDR).
    Ud(UdParam),
}

pub(crate) struct RawEvent {
    pub id: CmId,
    pub listen_id: Option<CmId>,
    pub event: EventType,
    pub status: i32,
    pub param: EventParam,
}

impl RawEvent {
    pub(crate) fn new(id: CmId, event: EventType, status: i32, param: EventParam) -> Self {
        RawEvent {
            id,
            listen_id: None,
            event,
            status,
            param,
        }
    }

    /// The id whose event count this event is charged to (librdmacm: the listener for a
    /// CONNECT_REQUEST).
    pub(crate) fn owner(&self) -> &Arc<IdInner> {
        match (&self.listen_id, self.event) {
            (Some(l), EventType::ConnectRequest) => l.inner(),
            _ => self.id.inner(),
        }
    }
}

/// One event, as `rdma_get_cm_event` returns it. Acknowledge it with [`CmEvent::ack`] or by
/// dropping it; an id cannot be destroyed while its events are not acknowledged.
pub struct CmEvent {
    raw: Option<RawEvent>,
}

impl CmEvent {
    pub(crate) fn new(raw: RawEvent) -> Self {
        raw.owner().event_reported();
        CmEvent { raw: Some(raw) }
    }

    fn raw(&self) -> &RawEvent {
        self.raw.as_ref().expect("present until drop")
    }

    /// The id the event is about (for CONNECT_REQUEST: the new id of the incoming connection).
    pub fn id(&self) -> &CmId {
        &self.raw().id
    }

    /// For CONNECT_REQUEST: the listening id.
    pub fn listen_id(&self) -> Option<&CmId> {
        self.raw().listen_id.as_ref()
    }

    /// The event's type.
    pub fn event(&self) -> EventType {
        self.raw().event
    }

    /// 0, a negative errno (UNREACHABLE: `-ETIMEDOUT`), or for REJECTED the IB reject reason
    /// (8: nobody listens on that port; 28: the consumer rejected).
    pub fn status(&self) -> i32 {
        self.raw().status
    }

    /// The event's parameters.
    pub fn param(&self) -> &EventParam {
        &self.raw().param
    }

    /// The connection parameters (CONNECT_REQUEST, ESTABLISHED, REJECTED, DISCONNECTED).
    pub fn conn_param(&self) -> Option<&ConnParam> {
        match &self.raw().param {
            EventParam::Conn(c) => Some(c),
            _ => None,
        }
    }

    /// The UD parameters (UDP port space: CONNECT_REQUEST, ESTABLISHED).
    pub fn ud_param(&self) -> Option<&UdParam> {
        match &self.raw().param {
            EventParam::Ud(u) => Some(u),
            _ => None,
        }
    }

    /// The peer's private data, if the event carries any.
    pub fn private_data(&self) -> &[u8] {
        match &self.raw().param {
            EventParam::Conn(c) => &c.private_data,
            EventParam::Ud(u) => &u.private_data,
            EventParam::None => &[],
        }
    }

    /// `rdma_ack_cm_event`.
    pub fn ack(self) {}
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            raw.owner().event_acked();
        }
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("event", &self.event())
            .field("status", &self.status())
            .field("param", self.param())
            .finish()
    }
}
