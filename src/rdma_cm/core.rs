//! The rdma_cm half that lives in a device's engine (like the kernel's `cma.c` over `cm.c`):
//! the device's listeners and connections by comm ID over its IB CM endpoint
//! ([`CmEndpoint`], QP1), and the translation of IB CM events into rdma_cm events and QP state
//! changes. The engine holds it as the device's [`GsiAgent`] (it replaces the bare endpoint
//! the first time rdma_cm uses the device). Everything here runs under the engine lock, so the
//! QP transitions and the CM state move together.

use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::event::{ConnParam, EventParam, EventType, RawEvent, UdParam};
use super::id::{CmId, Handle, IdInner, Phase};
use super::listeners::{Listener, Listeners};
use crate::cm::endpoint::{CmEndpoint, GsiAgent, ModifyQp};
use crate::cm::mad::MAD_LEN;
use crate::cm::manager::{
    CmEvent as IbEvent, CmId as IbId, ConnState, ConnectRequestInfo, EstablishedInfo,
};
use crate::cm::private_data::CmaHdr;
use crate::cm::service_id;
use crate::cm::sidr_manager::{SidrRequestInfo, SidrStatus};
use crate::transport::{AccessFlags, AddressVector, Mtu, QpAttr, QpState};
use crate::verbs::{Context, WeakContext};
use crate::wire::gid::gid_to_ip;

/// Bumped whenever an id is destroyed, so each core sweeps its tables soon after.
pub(crate) static DESTROY_GEN: AtomicU64 = AtomicU64::new(0);

/// rdma_cm's local ACK timeout over RoCE: packet lifetime 18 + 1 (`cm_init_av_by_path`).
pub(crate) const QP_TIMEOUT: u8 = 19;
/// RNR NAK timer this side's QPs advertise (0.64 ms).
pub(crate) const MIN_RNR_TIMER: u8 = 12;

struct ConnRec {
    handle: Weak<Handle>,
    inner: Arc<IdInner>,
    /// The listening id (its [`Listener::key`]) of an incoming request.
    listener: Option<usize>,
}

impl ConnRec {
    fn alive(&self) -> Option<CmId> {
        if self.inner.is_destroyed() {
            return None;
        }
        self.handle.upgrade().map(CmId)
    }
}

pub(crate) struct CmaCore {
    /// The device's IB CM endpoint (QP1), owned while rdma_cm uses the device.
    pub ep: CmEndpoint,
    ctx: Option<WeakContext>,
    listeners: Listeners,
    conns: HashMap<u32, ConnRec>,
    gen_seen: u64,
}

impl CmaCore {
    /// rdma_cm's core over the device's CM endpoint `ep`.
    pub fn new(ep: CmEndpoint) -> Self {
        CmaCore {
            ep,
            ctx: None,
            listeners: Listeners::default(),
            conns: HashMap::new(),
            gen_seen: 0,
        }
    }

    /// Remember the context this core belongs to (ids of incoming connections get it).
    pub fn attach(&mut self, ctx: &Context) {
        if self.ctx.is_none() {
            self.ctx = Some(ctx.downgrade());
        }
    }

    fn context(&self) -> Option<Context> {
        self.ctx.as_ref().and_then(WeakContext::upgrade)
    }

    /// Listen for `sid` with the id `inner` bound to `addr` (a wildcard or one address).
    /// False if an id of this device listens on it with the same address.
    pub fn add_listener(
        &mut self,
        sid: u64,
        addr: IpAddr,
        handle: Weak<Handle>,
        inner: Arc<IdInner>,
        backlog: usize,
    ) -> bool {
        let l = Listener {
            handle,
            inner: inner.clone(),
            backlog,
            addr,
        };
        match self.listeners.add(sid, l) {
            None => false,
            Some(false) => true,
            // The IB CM applies the backlog to unanswered SIDR requests itself (REQs are
            // counted in `on_connect_request`).
            Some(true) => {
                self.ep.cm.unlisten(sid);
                if self.ep.cm.listen_with_backlog(sid, backlog.max(1)).is_err() {
                    self.listeners.remove(sid, &inner);
                    return false;
                }
                true
            }
        }
    }

    /// Stop listening for `sid` with the id `inner`.
    pub fn remove_listener(&mut self, sid: u64, inner: &Arc<IdInner>) {
        if self.listeners.remove(sid, inner) {
            self.ep.cm.unlisten(sid);
        }
    }

    pub fn add_conn(&mut self, id: IbId, handle: Weak<Handle>, inner: Arc<IdInner>) {
        self.conns.insert(
            id.0,
            ConnRec {
                handle,
                inner,
                listener: None,
            },
        );
    }

    pub fn remove_conn(&mut self, id: IbId) {
        self.conns.remove(&id.0);
    }

    /// The local address of an incoming request for `sid`, and the peer's: from the rdma_cm
    /// header when there is one (as Linux's `cma_save_net_info`: the child's source is the
    /// header's destination), else the address the request came to and the address in the
    /// peer's GID (port unknown).
    fn endpoints(
        &self,
        sid: u64,
        cma: Option<&CmaHdr>,
        peer_gid: &[u8; 16],
    ) -> (SocketAddr, Option<SocketAddr>) {
        let port = service_id::split(sid).map_or(0, |(_, p)| p);
        let remote = cma
            .and_then(|h| h.src_ip().map(|a| SocketAddr::new(a, h.src_port)))
            .or_else(|| Some(SocketAddr::new(gid_to_ip(peer_gid), 0)));
        let local = cma
            .and_then(|h| h.dst_ip())
            .or_else(|| self.ep.local_toward(peer_gid).map(|g| gid_to_ip(&g)))
            .unwrap_or(IpAddr::V4(self.ep.local));
        (SocketAddr::new(local, port), remote)
    }

    /// Track the new id of an incoming request to `listener`; the returned handle goes into
    /// its event.
    fn add_child(&mut self, id: IbId, child: Arc<IdInner>, listener: usize) -> Arc<Handle> {
        let handle = Arc::new(Handle::new(child.clone()));
        self.conns.insert(
            id.0,
            ConnRec {
                handle: Arc::downgrade(&handle),
                inner: child,
                listener: Some(listener),
            },
        );
        handle
    }

    /// Turn the IB CM's events into rdma_cm events and QP transitions (through `modify`), and
    /// tear down what destroyed ids left.
    pub fn process(&mut self, now: Instant, modify: ModifyQp<'_>) {
        // Events taken back from channels; dropped at the end (they may hold the last handle).
        let mut expired = Vec::new();
        let gen = DESTROY_GEN.load(Ordering::Acquire);
        if gen != self.gen_seen {
            self.gen_seen = gen;
            self.sweep(now);
        }
        while let Some(ev) = self.ep.cm.poll_event() {
            match ev {
                IbEvent::ConnectRequest(info) => self.on_connect_request(now, info),
                IbEvent::Established { id, info } => {
                    self.on_established(now, id, info, &mut *modify)
                }
                IbEvent::Rejected {
                    id,
                    reason,
                    private_data,
                } => {
                    let param = EventParam::Conn(ConnParam {
                        private_data,
                        ..zero_param()
                    });
                    self.finish(
                        id,
                        Phase::Idle,
                        EventType::Rejected,
                        reason.code() as i32,
                        param,
                    );
                }
                IbEvent::Unreachable { id } | IbEvent::SidrTimeout { id } => self.finish(
                    id,
                    Phase::Idle,
                    EventType::Unreachable,
                    -libc::ETIMEDOUT,
                    EventParam::None,
                ),
                IbEvent::ConnectError { id } => self.finish(
                    id,
                    Phase::Idle,
                    EventType::ConnectError,
                    -libc::ECONNRESET,
                    EventParam::None,
                ),
                IbEvent::Disconnected { id, private_data } => {
                    self.on_disconnected(id, private_data, &mut *modify)
                }
                IbEvent::TimewaitExit { id } => self.on_timewait_exit(id),
                IbEvent::SidrRequest(info) => self.on_sidr_request(now, info),
                IbEvent::SidrRequestExpired { id } => {
                    expired.extend(self.on_sidr_request_expired(id));
                }
                IbEvent::SidrReply {
                    id,
                    status,
                    qpn,
                    qkey,
                    private_data,
                } => self.on_sidr_reply(id, status, qpn, qkey, private_data),
            }
        }
        drop(expired);
    }

    /// DISCONNECTED: the QP goes to ERR (as the kernel's cma does), the id's owner hears of it
    /// once.
    fn on_disconnected(&mut self, id: IbId, private_data: Vec<u8>, modify: ModifyQp<'_>) {
        let Some(rec) = self.conns.get(&id.0) else {
            return;
        };
        let Some(cid) = rec.alive() else { return };
        let mut st = rec.inner.state();
        let already = st.phase == Phase::Disconnected;
        st.phase = Phase::Disconnected;
        if let Some(qpn) = st.qpn {
            let a = QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            };
            modify(qpn, &a);
        }
        drop(st);
        if !already {
            let param = EventParam::Conn(ConnParam {
                private_data,
                ..zero_param()
            });
            push(
                &rec.inner,
                RawEvent::new(cid, EventType::Disconnected, 0, param),
            );
        }
    }

    /// TIMEWAIT_EXIT: the connection is forgotten; its id's owner hears of it.
    fn on_timewait_exit(&mut self, id: IbId) {
        if let Some(rec) = self.conns.remove(&id.0) {
            if let Some(cid) = rec.alive() {
                rec.inner.state().conn = None;
                push(
                    &rec.inner,
                    RawEvent::new(cid, EventType::TimewaitExit, 0, EventParam::None),
                );
            }
        }
    }

    /// The consumer did not answer a SIDR request in time: the id is no longer a connect
    /// request (accept/reject on it fail), and a CONNECT_REQUEST not yet retrieved is taken
    /// back (returned, to be dropped by the caller after the loop).
    fn on_sidr_request_expired(&mut self, id: IbId) -> Vec<RawEvent> {
        let Some(rec) = self.conns.remove(&id.0) else {
            return Vec::new();
        };
        {
            let mut st = rec.inner.state();
            if st.phase == Phase::ConnectRequest {
                st.phase = Phase::Idle;
            }
            st.conn = None;
        }
        match rec.inner.channel().upgrade() {
            Some(ch) => ch.purge(&rec.inner),
            None => Vec::new(),
        }
    }

    /// Our SIDR_REQ was answered: ESTABLISHED with the peer's UD QPN and Q_Key, or, as
    /// `cma_sidr_rep_handler` does for any other status, UNREACHABLE with the SIDR status.
    fn on_sidr_reply(
        &mut self,
        id: IbId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    ) {
        let Some(rec) = self.conns.get(&id.0) else {
            return;
        };
        let (peer, sgid_index) = {
            let st = rec.inner.state();
            (st.peer_gid(), st.sgid_index())
        };
        let mut ud = UdParam {
            private_data,
            ah_attr: ud_av(peer, sgid_index),
            qp_num: qpn,
            qkey,
        };
        let (phase, ev, st) = if status == SidrStatus::Ok {
            (Phase::Established, EventType::Established, 0)
        } else {
            ud.qp_num = 0;
            (Phase::Idle, EventType::Unreachable, status.code() as i32)
        };
        self.finish(id, phase, ev, st, EventParam::Ud(ud));
    }

    /// A SIDR_REQ for a listened UDP port: a new id and CONNECT_REQUEST, as for a REQ. The IB
    /// CM already refused those over the listener's backlog.
    fn on_sidr_request(&mut self, now: Instant, info: SidrRequestInfo) {
        let id = info.id;
        let listener = self
            .listeners
            .find(info.service_id, info.cma.as_ref())
            .and_then(|l| Some((l.alive()?, l.inner.clone(), l.key())));
        let (Some((lid, linner, key)), Some(ctx)) = (listener, self.context()) else {
            let _ = self
                .ep
                .cm
                .sidr_reply(now, id, SidrStatus::Unsupported, 0, 0, &[]);
            return;
        };
        let (local, remote) = self.endpoints(info.service_id, info.cma.as_ref(), &info.peer.gid);
        let child = IdInner::child_ud(&linner, ctx, local, remote, id, info.peer.gid);
        let sgid_index = child.state().sgid_index();
        let handle = self.add_child(id, child, key);
        let param = EventParam::Ud(UdParam {
            private_data: info.private_data,
            ah_attr: ud_av(info.peer.gid, sgid_index),
            // A SIDR_REQ names no QP of the requester.
            qp_num: 0,
            qkey: 0,
        });
        let mut ev = RawEvent::new(CmId(handle), EventType::ConnectRequest, 0, param);
        ev.listen_id = Some(lid);
        push(&linner, ev);
    }

    /// REJECTED, UNREACHABLE, CONNECT_ERROR: the connection is over before it began.
    fn finish(&mut self, id: IbId, phase: Phase, ev: EventType, status: i32, param: EventParam) {
        let Some(rec) = self.conns.remove(&id.0) else {
            return;
        };
        let Some(cid) = rec.alive() else { return };
        {
            let mut st = rec.inner.state();
            st.phase = phase;
            st.conn = None;
        }
        push(&rec.inner, RawEvent::new(cid, ev, status, param));
    }

    fn on_connect_request(&mut self, now: Instant, info: ConnectRequestInfo) {
        let id = info.id;
        let listener = self
            .listeners
            .find(info.service_id, info.cma.as_ref())
            .and_then(|l| Some((l.alive()?, l.inner.clone(), l.backlog, l.key())));
        let Some((lid, linner, backlog, key)) = listener else {
            let _ = self.ep.cm.refuse(now, id);
            return;
        };
        let pending = self
            .conns
            .values()
            .filter(|c| c.listener == Some(key) && c.inner.state().phase == Phase::ConnectRequest)
            .count();
        let ctx = self.context();
        let (Some(ctx), true) = (ctx, pending < backlog.max(1)) else {
            // Over the backlog: a rate-limited REJ, so a REQ flood does not make us reflect.
            let _ = self.ep.cm.refuse(now, id);
            return;
        };
        let (local, remote) = self.endpoints(info.service_id, info.cma.as_ref(), &info.peer.gid);
        let child = IdInner::child(&linner, ctx, local, remote, id, info.clone());
        let handle = self.add_child(id, child, key);
        let param = EventParam::Conn(ConnParam {
            private_data: info.private_data.clone(),
            // From this side's point of view (as ib_cm's cm_format_req_event swaps them).
            responder_resources: info.initiator_depth,
            initiator_depth: info.responder_resources,
            flow_control: info.flow_control,
            retry_count: info.retry_count,
            rnr_retry_count: info.rnr_retry_count,
            srq: info.srq,
            qp_num: info.remote_qpn,
        });
        let mut ev = RawEvent::new(CmId(handle), EventType::ConnectRequest, 0, param);
        ev.listen_id = Some(lid);
        push(&linner, ev);
    }

    fn on_established(
        &mut self,
        now: Instant,
        id: IbId,
        info: EstablishedInfo,
        modify: ModifyQp<'_>,
    ) {
        let _ = now;
        let Some(rec) = self.conns.get(&id.0) else {
            return;
        };
        let Some(cid) = rec.alive() else {
            return;
        };
        let inner = rec.inner.clone();
        let mut st = inner.state();
        let mut param = zero_param();
        param.private_data = info.private_data.clone();
        param.qp_num = info.remote_qpn;
        if st.phase == Phase::Connecting {
            // Active side: the REP settled the path; move the QP to RTS (the RTU is out).
            param.responder_resources = info.initiator_depth;
            param.initiator_depth = info.responder_resources;
            param.rnr_retry_count = info.rnr_retry_count;
            param.srq = info.srq;
            // What the REP settled, for whichever QP the id has.
            let settled = |qpn| Transition {
                qpn,
                peer_gid: st.peer_gid(),
                sgid_index: st.sgid_index(),
                remote_qpn: info.remote_qpn,
                rq_psn: st.rq_psn,
                sq_psn: info.remote_psn,
                mtu: st.mtu,
                max_dest_rd_atomic: st.param.responder_resources,
                max_rd_atomic: st.param.initiator_depth.min(info.responder_resources),
                retry_cnt: st.param.retry_count,
                rnr_retry: info.rnr_retry_count,
                flow_label: st.flow_label,
            };
            if let Some(qpn) = st.own_qp {
                // The program's own QP (librdmacm: no `id->qp`): it moves the QP itself with
                // what `rdma_init_qp_attr` reports, after CONNECT_RESPONSE.
                let t = settled(qpn);
                st.settled = Some(t);
                st.phase = Phase::Established;
                drop(st);
                push(
                    &inner,
                    RawEvent::new(cid, EventType::ConnectResponse, 0, EventParam::Conn(param)),
                );
                return;
            }
            let ok = match st.qpn {
                Some(qpn) => settled(qpn).run(modify),
                None => true,
            };
            if !ok {
                st.phase = Phase::Idle;
                st.conn = None;
                drop(st);
                let _ = self.ep.cm.disconnect(now, id, &[]);
                push(
                    &inner,
                    RawEvent::new(
                        cid,
                        EventType::ConnectError,
                        -libc::EINVAL,
                        EventParam::None,
                    ),
                );
                return;
            }
        } else if st.phase != Phase::Accepting {
            return;
        }
        st.phase = Phase::Established;
        drop(st);
        push(
            &inner,
            RawEvent::new(cid, EventType::Established, 0, EventParam::Conn(param)),
        );
    }

    /// Connections and listeners whose id was destroyed: answer the peer as Linux's
    /// `ib_destroy_cm_id` does (DREQ, DREP or REJ), then forget them.
    fn sweep(&mut self, now: Instant) {
        let dead: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, r)| r.handle.strong_count() == 0 || r.inner.is_destroyed())
            .map(|(k, _)| *k)
            .collect();
        for k in dead {
            self.conns.remove(&k);
            let id = IbId(k);
            match self.ep.cm.conn_info(id).map(|c| c.state) {
                Some(ConnState::Established | ConnState::DreqRcvd) => {
                    let _ = self.ep.cm.disconnect(now, id, &[]);
                }
                None => {
                    // A SIDR request never answered: refuse it (no-op for other ids).
                    let _ = self
                        .ep
                        .cm
                        .sidr_reply(now, id, SidrStatus::Reject, 0, 0, &[]);
                }
                Some(
                    ConnState::ReqSent
                    | ConnState::MraReqRcvd
                    | ConnState::ReqRcvd
                    | ConnState::MraReqSent
                    | ConnState::RepSent
                    | ConnState::MraRepRcvd,
                ) => {
                    let _ = self.ep.cm.reject(id, &[]);
                }
                _ => {}
            }
        }
        for (sid, inner) in self.listeners.dead() {
            self.remove_listener(sid, &inner);
        }
    }
}

impl GsiAgent for CmaCore {
    fn endpoint(&self) -> &CmEndpoint {
        &self.ep
    }
    fn endpoint_mut(&mut self) -> &mut CmEndpoint {
        &mut self.ep
    }
    fn process(&mut self, now: Instant, modify: ModifyQp<'_>) {
        CmaCore::process(self, now, modify)
    }
    /// An id was destroyed since the core last swept.
    fn work_pending(&self) -> bool {
        DESTROY_GEN.load(Ordering::Acquire) != self.gen_seen
    }
    fn into_endpoint(self: Box<Self>) -> CmEndpoint {
        self.ep
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn zero_param() -> ConnParam {
    ConnParam {
        private_data: Vec::new(),
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: false,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: false,
        qp_num: 0,
    }
}

/// The address vector toward `gid` from GID `sgid_index` that rdma_cm reports for UD
/// (`event->param.ud.ah_attr`).
pub(crate) fn ud_av(gid: [u8; 16], sgid_index: u8) -> AddressVector {
    AddressVector {
        dgid: gid,
        sgid_index,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        dlid: 0,
        sl: 0,
        port_num: 1,
    }
}

fn push(owner: &Arc<IdInner>, ev: RawEvent) {
    owner.push_event(ev);
}

/// INIT → RTR → RTS for a connected RC QP, with what the CM settled.
#[derive(Clone, Debug)]
pub(crate) struct Transition {
    pub qpn: u32,
    pub peer_gid: [u8; 16],
    /// The GID index of the id's local address.
    pub sgid_index: u8,
    pub remote_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub mtu: Mtu,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub flow_label: u32,
}

impl Transition {
    pub fn run(&self, modify: ModifyQp<'_>) -> bool {
        modify(self.qpn, &self.rtr()) && modify(self.qpn, &self.rts())
    }

    /// The attributes of the move to RTR (`rdma_init_qp_attr(IBV_QPS_RTR)`).
    pub fn rtr(&self) -> QpAttr {
        let mut access = AccessFlags::REMOTE_WRITE;
        if self.max_dest_rd_atomic > 0 {
            access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        }
        QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(self.mtu),
            dest_qp_num: Some(self.remote_qpn),
            rq_psn: Some(self.rq_psn),
            max_dest_rd_atomic: Some(self.max_dest_rd_atomic),
            min_rnr_timer: Some(MIN_RNR_TIMER),
            qp_access_flags: Some(access),
            ah_attr: Some(AddressVector {
                dgid: self.peer_gid,
                sgid_index: self.sgid_index,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: self.flow_label,
                dlid: 0,
                sl: 0,
                port_num: 1,
            }),
            ..Default::default()
        }
    }

    /// The attributes of the move to RTS (`rdma_init_qp_attr(IBV_QPS_RTS)`).
    pub fn rts(&self) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(self.sq_psn),
            timeout: Some(QP_TIMEOUT),
            retry_cnt: Some(self.retry_cnt.min(7)),
            rnr_retry: Some(self.rnr_retry.min(7)),
            max_rd_atomic: Some(self.max_rd_atomic),
            ..Default::default()
        }
    }
}

const _: () = assert!(MAD_LEN == 256);
