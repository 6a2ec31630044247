//! rdma_cm ids (`struct rdma_cm_id`): bind, listen, resolve, connect, accept, reject,
//! disconnect, and a QP the CM moves through its states.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::channel::{ChannelInner, EventChannel};
use super::core::{CmaCore, Transition, DESTROY_GEN};
use super::error::{CmaError, Result};
use super::event::{ConnParam, EventParam, EventType, RawEvent};
use super::route;
use crate::cm::endpoint::ModifyQp;
use crate::cm::manager::{AcceptParams, CmId as IbId, ConnectParams, ConnectRequestInfo, MadAddr};
use crate::cm::private_data::{CmaHdr, CMA_HDR_LEN};
use crate::cm::service_id::PortSpace;
use crate::cm::sidr;
use crate::cm::sidr_manager::{SidrParams, SidrStatus, RDMA_UDP_QKEY};
use crate::cm::{rej, rep, req};
use crate::transport::{AccessFlags, Mtu, QpAttr, QpState};
use crate::verbs::{Context, ProtectionDomain, QpInitAttr, QpType, QueuePair};
use crate::wire::gid::gid_from_ip;

/// Where an id is in its life (librdmacm's `enum rdma_cm_state`, simplified).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    ConnectRequest,
    Accepting,
    Established,
    Disconnecting,
    Disconnected,
}

impl Phase {
    /// Where the id is, and what it allows next (for [`CmaError::InvalidState`]).
    fn name(self) -> &'static str {
        match self {
            Phase::Idle => "has no address yet: bind_addr or resolve_addr first",
            Phase::Bound => "is bound: listen, or resolve_addr to connect",
            Phase::AddrResolved => "has its address resolved: resolve_route next",
            Phase::RouteResolved => "has its route resolved: create_qp and connect next",
            Phase::Listening => "is listening: its connections come as CONNECT_REQUEST events",
            Phase::Connecting => "is connecting: wait for ESTABLISHED (or REJECTED)",
            Phase::ConnectRequest => "is an incoming request: accept or reject it",
            Phase::Accepting => "is accepting: wait for ESTABLISHED",
            Phase::Established => "is connected",
            Phase::Disconnecting => "is disconnecting",
            Phase::Disconnected => "is disconnected: destroy it",
        }
    }
}

pub(crate) struct IdState {
    pub phase: Phase,
    pub ctx: Option<Context>,
    pub listen_ctxs: Vec<Context>,
    pub reservation: Option<(IpAddr, u16)>,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    pub qpn: Option<u32>,
    /// The QP number of a QP the program manages itself (`conn_param.qp_num` without
    /// `create_qp`): the CM puts it in its messages but never modifies it.
    pub own_qp: Option<u32>,
    /// What the connection settled, for `init_qp_attr` (the program's own QP).
    pub settled: Option<Transition>,
    pub conn: Option<IbId>,
    pub rq_psn: u32,
    pub mtu: Mtu,
    pub flow_label: u32,
    pub param: ConnParam,
    pub req: Option<ConnectRequestInfo>,
    /// The requester's GID of an incoming SIDR request.
    pub sidr_peer: Option<[u8; 16]>,
    pub timeouts: CmTimeouts,
}

/// How long the CM waits for answers to this id's REQ (and the peer for our REP, DREQ): IBA time
/// exponents (4.096 µs × 2^t) and a retry count. The defaults are Linux rdma_cm's: packet lifetime
/// 18, CM response timeout 20, 15 retries — a REQ to a host that never answers is given up after
/// about 100 s. A softrdma extension (librdmacm has no call for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmTimeouts {
    /// Packet life time exponent of the path (4.096 µs × 2^n).
    pub packet_life_time: u8,
    /// How long the CM waits for an answer (exponent, as above).
    pub cm_response_timeout: u8,
    /// How often a CM message is sent again before giving up.
    pub max_cm_retries: u8,
}

impl Default for CmTimeouts {
    fn default() -> Self {
        CmTimeouts {
            packet_life_time: 18,
            cm_response_timeout: 20,
            max_cm_retries: 15,
        }
    }
}

impl IdState {
    pub fn peer_gid(&self) -> [u8; 16] {
        if let Some(g) = self.sidr_peer {
            return g;
        }
        match (&self.req, self.remote) {
            (Some(r), _) => r.peer.gid,
            (None, Some(a)) => gid_from_ip(a.ip()),
            _ => [0; 16],
        }
    }

    /// The GID index of the id's local address on its device (the source of its QP's path):
    /// that address's entry (index 1 for the address at 0 and 1, as rdma_cm always had it),
    /// else the device's first GID of its family, else 1.
    pub fn sgid_index(&self) -> u8 {
        let (Some(ctx), Some(local)) = (&self.ctx, self.local) else {
            return 1;
        };
        let gid = gid_from_ip(local.ip());
        if let Some(i) = ctx.gid_index(&gid) {
            let at_1 = ctx.query_gid(1, 1).is_ok_and(|g| g == gid);
            return if i == 0 && at_1 { 1 } else { i };
        }
        let len = ctx.query_port(1).map_or(0, |p| p.gid_tbl_len).min(256);
        (0..len)
            .find(|i| {
                ctx.query_gid(1, *i as u8)
                    .is_ok_and(|g| crate::wire::gid::gid_to_ip(&g).is_ipv4() == local.is_ipv4())
            })
            .map_or(1, |i| i as u8)
    }
}

#[derive(Default)]
struct EvCount {
    reported: u64,
    acked: u64,
}

pub(crate) struct IdInner {
    pub ps: PortSpace,
    /// The channel events go to; [`CmId::migrate`] changes it. Held while an event is queued,
    /// so no event goes to a channel the id has left.
    channel: Mutex<Weak<ChannelInner>>,
    st: Mutex<IdState>,
    destroyed: AtomicBool,
    ev: Mutex<EvCount>,
    ev_cv: Condvar,
}

impl IdInner {
    fn new(channel: Weak<ChannelInner>, ps: PortSpace, st: IdState) -> Arc<IdInner> {
        Arc::new(IdInner {
            ps,
            channel: Mutex::new(channel),
            st: Mutex::new(st),
            destroyed: AtomicBool::new(false),
            ev: Mutex::new(EvCount::default()),
            ev_cv: Condvar::new(),
        })
    }

    /// The id of an incoming connection, on `listener`'s channel.
    pub(crate) fn child(
        listener: &Arc<IdInner>,
        ctx: Context,
        local: SocketAddr,
        remote: Option<SocketAddr>,
        conn: IbId,
        req: ConnectRequestInfo,
    ) -> Arc<IdInner> {
        let mtu = req
            .path_mtu
            .unwrap_or(Mtu::Mtu1024)
            .min(ctx.device().active_mtu());
        let st = IdState {
            phase: Phase::ConnectRequest,
            mtu,
            flow_label: req.primary_path.flow_label,
            ctx: Some(ctx),
            local: Some(local),
            remote,
            conn: Some(conn),
            req: Some(req),
            ..blank_state()
        };
        IdInner::new(listener.channel(), listener.ps, st)
    }

    /// The id of an incoming SIDR request (UDP port space), on `listener`'s channel.
    pub(crate) fn child_ud(
        listener: &Arc<IdInner>,
        ctx: Context,
        local: SocketAddr,
        remote: Option<SocketAddr>,
        conn: IbId,
        peer_gid: [u8; 16],
    ) -> Arc<IdInner> {
        let st = IdState {
            phase: Phase::ConnectRequest,
            ctx: Some(ctx),
            local: Some(local),
            remote,
            conn: Some(conn),
            sidr_peer: Some(peer_gid),
            ..blank_state()
        };
        IdInner::new(listener.channel(), listener.ps, st)
    }

    /// The channel the id reports to.
    pub(crate) fn channel(&self) -> Weak<ChannelInner> {
        self.channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Queue `ev` on the id's current channel (a no-op if the channel is gone).
    pub(crate) fn push_event(&self, ev: RawEvent) {
        let ch = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ch) = ch.upgrade() {
            ch.push(ev);
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    pub(crate) fn event_reported(&self) {
        self.ev.lock().unwrap_or_else(|p| p.into_inner()).reported += 1;
    }

    pub(crate) fn event_acked(&self) {
        let mut e = self.ev.lock().unwrap_or_else(|p| p.into_inner());
        e.acked += 1;
        drop(e);
        self.ev_cv.notify_all();
    }

    fn unacked(&self) -> u64 {
        let e = self.ev.lock().unwrap_or_else(|p| p.into_inner());
        e.reported - e.acked
    }

    /// Mark destroyed, give back the port, and have the device cores answer the peer.
    fn teardown(&self) {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (res, ctxs, listened) = {
            let mut st = self.state();
            let mut ctxs = std::mem::take(&mut st.listen_ctxs);
            let listened = ctxs.len();
            ctxs.extend(st.ctx.clone());
            (st.reservation.take(), ctxs, listened)
        };
        if let (Some((a, p)), true) = (res, listened > 0) {
            for c in &ctxs[..listened] {
                let _ = c.shared.io.set_listening(p, false, a);
            }
        }
        if let Some((a, p)) = res {
            route::release_port(self.ps, a, p);
        }
        DESTROY_GEN.fetch_add(1, Ordering::AcqRel);
        for c in ctxs {
            c.shared.io.wake();
        }
    }
}

fn blank_state() -> IdState {
    IdState {
        phase: Phase::Idle,
        ctx: None,
        listen_ctxs: Vec::new(),
        reservation: None,
        local: None,
        remote: None,
        qpn: None,
        own_qp: None,
        settled: None,
        conn: None,
        rq_psn: 0,
        mtu: Mtu::Mtu1024,
        flow_label: 0,
        param: ConnParam::default(),
        req: None,
        sidr_peer: None,
        timeouts: CmTimeouts::default(),
    }
}

/// The one owner of an id's lifetime: when the last [`CmId`] clone (events included) goes, the
/// id is destroyed.
pub(crate) struct Handle {
    inner: Arc<IdInner>,
}

impl Handle {
    pub(crate) fn new(inner: Arc<IdInner>) -> Handle {
        Handle { inner }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.teardown();
    }
}

/// An rdma_cm id. Clones refer to the same id; it is destroyed by [`CmId::destroy`] or when the
/// last clone (including those in events) is dropped.
#[derive(Clone)]
pub struct CmId(pub(crate) Arc<Handle>);

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner().state();
        f.debug_struct("CmId")
            .field("ps", &self.inner().ps)
            .field("state", &st.phase)
            .field("local", &st.local)
            .field("remote", &st.remote)
            .field("qpn", &st.qpn)
            .finish()
    }
}

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        Arc::ptr_eq(&self.0.inner, &o.0.inner)
    }
}
impl Eq for CmId {}

impl std::hash::Hash for CmId {
    /// Clones of one id hash alike (ids can key a map, as a C binding's does).
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        Arc::as_ptr(&self.0.inner).hash(h);
    }
}

/// The backlog of `listen(0)` (the kernel's `max_backlog` default).
const DEFAULT_BACKLOG: usize = 1024;

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::getrandom(&mut b);
    u32::from_ne_bytes(b) & 0x00ff_ffff
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address it is.
fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, v6.port())),
            None => a,
        },
        a => a,
    }
}

/// `a` in the IPv4 form [`CmId::local_addr`] reports: IPv4 as is, the IPv6 wildcard as
/// `0.0.0.0`; `None` for another IPv6 address.
fn as_v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            Some(SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, a.port()))
        }
        SocketAddr::V6(_) => None,
    }
}

impl CmId {
    pub(crate) fn new(channel: &Arc<ChannelInner>, ps: PortSpace) -> Result<CmId> {
        if !matches!(ps, PortSpace::Tcp | PortSpace::Udp) {
            return Err(CmaError::InvalidArgument(
                "port space not supported (RDMA_PS_TCP and RDMA_PS_UDP)",
            ));
        }
        let inner = IdInner::new(Arc::downgrade(channel), ps, blank_state());
        Ok(CmId(Arc::new(Handle::new(inner))))
    }

    pub(crate) fn inner(&self) -> &Arc<IdInner> {
        &self.0.inner
    }

    fn push(&self, ev: EventType, status: i32) {
        self.inner()
            .push_event(RawEvent::new(self.clone(), ev, status, EventParam::None));
    }

    /// `rdma_migrate_id`: report this id's events on `channel` from now on; its events queued
    /// and not yet retrieved move there too. (A listener's CONNECT_REQUESTs already queued
    /// move with it.)
    pub fn migrate(&self, channel: &EventChannel) {
        let mut cur = self
            .inner()
            .channel
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let old = cur.upgrade();
        *cur = Arc::downgrade(&channel.inner);
        if let Some(old) = old {
            if !Arc::ptr_eq(&old, &channel.inner) {
                for ev in old.purge(self.inner()) {
                    channel.inner.push(ev);
                }
            }
        }
    }

    /// The channel the id reports to (`id->channel`), if it still exists.
    pub fn channel(&self) -> Option<EventChannel> {
        self.inner()
            .channel()
            .upgrade()
            .map(|inner| EventChannel { inner })
    }

    fn check_phase(st: &IdState, ok: &[Phase]) -> Result<()> {
        if ok.contains(&st.phase) {
            Ok(())
        } else {
            Err(CmaError::InvalidState(st.phase.name()))
        }
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner().ps
    }

    /// The device context the id is bound to (`id->verbs`): after a bind to a specific address,
    /// address resolution, or for an incoming connection. Allocate PDs and CQs on it.
    pub fn context(&self) -> Option<Context> {
        self.inner().state().ctx.clone()
    }

    /// `rdma_get_local_addr` of an IPv4 id (and of one bound to `[::]`, as `0.0.0.0`); `None`
    /// for an IPv6 address: see [`CmId::local_socket_addr`].
    pub fn local_addr(&self) -> Option<SocketAddrV4> {
        self.local_socket_addr().and_then(as_v4)
    }

    /// `rdma_get_peer_addr` of an IPv4 id; `None` for an IPv6 peer: see
    /// [`CmId::peer_socket_addr`].
    pub fn peer_addr(&self) -> Option<SocketAddrV4> {
        self.peer_socket_addr().and_then(as_v4)
    }

    /// `rdma_get_local_addr`, IPv4 or IPv6. An incoming connection's id has the address the
    /// peer connected to (an IPv4 one for an IPv4 peer of an id bound to `[::]`, as Linux).
    pub fn local_socket_addr(&self) -> Option<SocketAddr> {
        self.inner().state().local
    }

    /// `rdma_get_peer_addr`, IPv4 or IPv6.
    pub fn peer_socket_addr(&self) -> Option<SocketAddr> {
        self.inner().state().remote
    }

    /// The QP created with [`CmId::create_qp`], if any.
    pub fn qp_num(&self) -> Option<u32> {
        self.inner().state().qpn
    }

    /// `rdma_init_qp_attr` for RTR or RTS: the attributes that move a QP the program manages
    /// itself (no [`CmId::create_qp`]) to that state for this connection — on the passive side
    /// from the CONNECT_REQUEST on (before `accept`, which must then name the QP in
    /// [`ConnParam::qp_num`]), on the active side after CONNECT_RESPONSE.
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] before the connection parameters are known (see the text).
    pub fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        let mut st = self.inner().state();
        if st.settled.is_none() && st.phase == Phase::ConnectRequest {
            let req = st
                .req
                .clone()
                .ok_or(CmaError::InvalidState("has no connection"))?;
            let sgid_index = st.sgid_index();
            st.settled = Some(Transition {
                qpn: 0,
                peer_gid: req.peer.gid,
                sgid_index,
                remote_qpn: req.remote_qpn,
                rq_psn: random_psn(),
                sq_psn: req.remote_psn,
                mtu: st.mtu,
                max_dest_rd_atomic: req.initiator_depth,
                max_rd_atomic: req.responder_resources,
                retry_cnt: req.retry_count,
                rnr_retry: req.rnr_retry_count,
                flow_label: st.flow_label,
            });
        }
        let t = st
            .settled
            .as_ref()
            .ok_or(CmaError::InvalidState("has no connection parameters yet"))?;
        match state {
            QpState::Rtr => Ok(t.rtr()),
            QpState::Rts => Ok(t.rts()),
            _ => Err(CmaError::InvalidArgument("init_qp_attr: RTR or RTS")),
        }
    }

    /// `rdma_establish`: after CONNECT_RESPONSE, with the program's own QP in RTS. (The RTU
    /// went out with the REP's acceptance, so there is nothing left to send.)
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] without a CONNECT_RESPONSE to confirm.
    pub fn establish(&self) -> Result<()> {
        let st = self.inner().state();
        if st.own_qp.is_none() || st.settled.is_none() {
            return Err(CmaError::InvalidState(
                "has no CONNECT_RESPONSE to establish",
            ));
        }
        Self::check_phase(&st, &[Phase::Established])
    }

    /// Set the CM timeouts used by the next [`CmId::connect`] (see [`CmTimeouts`]).
    ///
    /// # Errors
    /// [`CmaError::InvalidArgument`] for a value out of its range.
    pub fn set_cm_timeouts(&self, t: CmTimeouts) -> Result<()> {
        if t.packet_life_time > 31 || t.cm_response_timeout > 31 || t.max_cm_retries > 15 {
            return Err(CmaError::InvalidArgument(
                "CM timeouts: exponents 0..=31, retries 0..=15",
            ));
        }
        self.inner().state().timeouts = t;
        Ok(())
    }

    /// `rdma_bind_addr`, IPv4 or IPv6 (`impl Into<SocketAddr>`: a `SocketAddrV4` will do):
    /// port 0 picks an ephemeral port ([`CmId::local_socket_addr`] tells which); `0.0.0.0`
    /// binds every device for IPv4, `[::]` every device for IPv4 and IPv6 (as Linux with
    /// `bindv6only` 0), an address the device that has it.
    ///
    /// # Errors
    /// [`CmaError::AddrInUse`] if the port is taken on that address; [`CmaError::AddrNotAvailable`] if no device has it; [`CmaError::InvalidState`] if already bound.
    pub fn bind_addr(&self, addr: impl Into<SocketAddr>) -> Result<()> {
        let mut addr = unmapped(addr.into());
        let mut st = self.inner().state();
        Self::check_phase(&st, &[Phase::Idle])?;
        let ip = addr.ip();
        let ctx = if ip.is_unspecified() {
            None
        } else {
            Some(route::context_for_local(ip)?)
        };
        let port = route::bind_port(self.inner().ps, ip, addr.port())?;
        st.reservation = Some((ip, port));
        addr.set_port(port);
        st.local = Some(addr);
        st.ctx = ctx;
        st.phase = Phase::Bound;
        Ok(())
    }

    /// `rdma_listen`: report CONNECT_REQUEST for connections to the bound port; at most
    /// `backlog` of them wait for accept/reject at a time (more are rejected). 0 means the
    /// default, 1024, as in the kernel.
    ///
    /// # Errors
    /// [`CmaError::AddrInUse`] if another process listens on the port; [`CmaError::InvalidState`] if not bound.
    pub fn listen(&self, backlog: usize) -> Result<()> {
        let backlog = if backlog == 0 {
            DEFAULT_BACKLOG
        } else {
            backlog
        };
        let (ctxs, sid, port, ip) = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::Bound])?;
            let local = st.local.ok_or(CmaError::InvalidState("lost its address"))?;
            let ctxs = match &st.ctx {
                Some(c) => vec![c.clone()],
                None => route::all_contexts()?,
            };
            let sid = self.inner().ps.service_id(local.port());
            (ctxs, sid, local.port(), local.ip())
        };
        let me = self.inner().clone();
        let mut done: Vec<Context> = Vec::new();
        for c in &ctxs {
            let ok = c.with_cma(|core, _, _| {
                core.attach(c);
                core.add_listener(sid, ip, Arc::downgrade(&self.0), me.clone(), backlog)
            })?;
            // Other processes on the same address: REQs for the port are steered here, unless
            // one of them listens on it already.
            let ok = ok && {
                let steered = c.shared.io.set_listening(port, true, ip).is_ok();
                if !steered {
                    let _ = c.with_cma(|core, _, _| core.remove_listener(sid, &me));
                }
                steered
            };
            if !ok {
                for d in &done {
                    let _ = d.with_cma(|core, _, _| core.remove_listener(sid, &me));
                    let _ = d.shared.io.set_listening(port, false, ip);
                }
                return Err(CmaError::AddrInUse);
            }
            done.push(c.clone());
        }
        let mut st = self.inner().state();
        st.listen_ctxs = ctxs;
        st.phase = Phase::Listening;
        Ok(())
    }

    /// `rdma_resolve_addr`: pick the local device and address toward `dst` (from `src` if
    /// given), IPv4 or IPv6, and bind an ephemeral port if unbound. Reports ADDR_RESOLVED or
    /// ADDR_ERROR. The source, given or bound, must be of the destination's family.
    ///
    /// # Errors
    /// [`CmaError::AddrNotAvailable`] if no device reaches the destination; [`CmaError::InvalidState`] in the wrong state. Failures found later come as ADDR_ERROR events.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: impl Into<SocketAddr>,
        timeout: Duration,
    ) -> Result<()> {
        let _ = timeout; // resolution is immediate: the kernel's IP stack does ARP for us
        let dst = unmapped(dst.into());
        if dst.ip().is_unspecified() {
            return Err(CmaError::InvalidArgument("destination address"));
        }
        let src = src.map(unmapped);
        let mut st = self.inner().state();
        Self::check_phase(&st, &[Phase::Idle, Phase::Bound])?;
        let bound = st.local.filter(|a| !a.ip().is_unspecified());
        let from = bound.or(src.filter(|s| !s.ip().is_unspecified()));
        if from.is_some_and(|a| a.is_ipv4() != dst.is_ipv4()) {
            return Err(CmaError::InvalidArgument(
                "source and destination address families differ",
            ));
        }
        let found = match (&st.ctx, from) {
            (Some(c), Some(a)) => Ok((c.clone(), a.ip())),
            (None, Some(a)) => route::context_for_local(a.ip()).map(|c| (c, a.ip())),
            _ => route::context_toward(dst),
        };
        let (ctx, ip) = match found {
            Ok(c) => c,
            Err(e) => {
                drop(st);
                self.push(EventType::AddrError, -e.errno());
                return Ok(());
            }
        };
        if st.reservation.is_none() {
            let port = route::bind_port(self.inner().ps, ip, src.map_or(0, |s| s.port()))?;
            st.reservation = Some((ip, port));
        }
        let port = st
            .reservation
            .ok_or(CmaError::InvalidState("lost its port"))?
            .1;
        // A link-local source has the destination's scope (the interface it is on).
        let local = match (ip, dst) {
            (IpAddr::V6(a), SocketAddr::V6(d)) => {
                SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, d.scope_id()))
            }
            (ip, _) => SocketAddr::new(ip, port),
        };
        st.local = Some(local);
        st.remote = Some(dst);
        st.mtu = ctx.device().active_mtu();
        st.ctx = Some(ctx);
        st.phase = Phase::AddrResolved;
        drop(st);
        self.push(EventType::AddrResolved, 0);
        Ok(())
    }

    /// `rdma_resolve_route`: reports ROUTE_RESOLVED (RoCE: the path is the resolved address).
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] before ADDR_RESOLVED.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let _ = timeout;
        let mut st = self.inner().state();
        Self::check_phase(&st, &[Phase::AddrResolved])?;
        st.phase = Phase::RouteResolved;
        drop(st);
        self.push(EventType::RouteResolved, 0);
        Ok(())
    }

    /// `rdma_create_qp`: an RC QP on the id's device, moved to INIT; the CM moves it to RTR and
    /// RTS when the connection is made, and to ERR on disconnect.
    ///
    /// # Errors
    /// [`CmaError::WrongDevice`] if `pd` is on another device; [`CmaError::InvalidState`] if the id has a QP or no device; what [`ProtectionDomain::create_qp`] returns.
    pub fn create_qp(&self, pd: &ProtectionDomain, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        let ctx = self.context().ok_or(CmaError::InvalidState(
            "no device yet (bind or resolve first)",
        ))?;
        if !Arc::ptr_eq(&pd.shared, &ctx.shared) {
            return Err(CmaError::WrongDevice);
        }
        if self.inner().state().qpn.is_some() {
            return Err(CmaError::InvalidState("already has a QP"));
        }
        let ud = self.inner().ps == PortSpace::Udp;
        // The CM brings RC QPs up with RC's attributes; UC over rdma_cm is not supported.
        let want = if ud { QpType::Ud } else { QpType::Rc };
        if attr.qp_type != want {
            return Err(CmaError::InvalidArgument(
                "RDMA_PS_TCP ids take RC QPs, RDMA_PS_UDP ids UD QPs",
            ));
        }
        let qp = pd.create_qp(attr)?;
        if ud {
            // As librdmacm's ucma_init_ud_qp: straight to RTS with rdma_cm's UDP Q_Key.
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qkey: Some(RDMA_UDP_QKEY),
                ..Default::default()
            })?;
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            })?;
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(0),
                ..Default::default()
            })?;
        } else {
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qp_access_flags: Some(AccessFlags::NONE),
                ..Default::default()
            })?;
        }
        self.inner().state().qpn = Some(qp.qp_num());
        Ok(qp)
    }

    /// `rdma_connect`: send the REQ. ESTABLISHED follows when the peer accepts (the QP is then
    /// in RTS), REJECTED or UNREACHABLE when it does not.
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] before ROUTE_RESOLVED or without a QP; [`CmaError::PrivateDataTooLong`] beyond 56 bytes.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        if self.inner().ps == PortSpace::Udp {
            return self.connect_ud(param);
        }
        let max = req::PRIVATE_DATA_LEN - CMA_HDR_LEN;
        if param.private_data.len() > max {
            return Err(CmaError::PrivateDataTooLong {
                len: param.private_data.len(),
                max,
            });
        }
        if param.retry_count > 7 || param.rnr_retry_count > 7 {
            return Err(CmaError::InvalidArgument(
                "retry_count/rnr_retry_count above 7",
            ));
        }
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::RouteResolved])?;
            if st.qpn.is_none() && param.qp_num == 0 {
                return Err(CmaError::InvalidState("has no QP: create_qp first"));
            }
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        ctx.with_cma(|core, _, now| -> Result<()> {
            core.attach(&ctx);
            let mut st = self.inner().state();
            Self::check_phase(&st, &[Phase::RouteResolved])?;
            let lost = || CmaError::InvalidState("lost its resolved addresses");
            let (local, remote) = (st.local.ok_or_else(lost)?, st.remote.ok_or_else(lost)?);
            let (qpn, own) = match st.qpn {
                Some(q) => (q, None),
                None if param.qp_num != 0 => (param.qp_num, Some(param.qp_num)),
                None => return Err(CmaError::InvalidState("has no QP: create_qp first")),
            };
            st.own_qp = own;
            let rq_psn = random_psn();
            let mut p = ConnectParams::rdma_cm_tcp_ip(local, remote, qpn, rq_psn);
            // The CM's MADs to the peer go out from the id's address.
            core.ep
                .set_route(gid_from_ip(remote.ip()), gid_from_ip(local.ip()));
            p.responder_resources = param.responder_resources;
            p.initiator_depth = param.initiator_depth;
            p.retry_count = param.retry_count;
            p.rnr_retry_count = param.rnr_retry_count;
            p.path_mtu = st.mtu;
            p.srq = param.srq;
            p.flow_control = param.flow_control;
            p.private_data = param.private_data.clone();
            p.packet_life_time = st.timeouts.packet_life_time;
            p.cm_response_timeout = st.timeouts.cm_response_timeout;
            p.max_cm_retries = st.timeouts.max_cm_retries;
            let id = core
                .ep
                .cm
                .connect(now, &p)
                .map_err(|_| CmaError::InvalidArgument("connection parameters"))?;
            core.add_conn(id, Arc::downgrade(&self.0), self.inner().clone());
            st.conn = Some(id);
            st.rq_psn = rq_psn;
            st.flow_label = p.flow_label;
            st.param = param.clone();
            st.phase = Phase::Connecting;
            Ok(())
        })?
    }

    /// `rdma_connect` in the UDP port space: a SIDR_REQ. ESTABLISHED carries the peer's QPN,
    /// Q_Key and an address vector for an address handle; UNREACHABLE a refusal or a timeout.
    fn connect_ud(&self, param: &ConnParam) -> Result<()> {
        let max = sidr::REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN;
        if param.private_data.len() > max {
            return Err(CmaError::PrivateDataTooLong {
                len: param.private_data.len(),
                max,
            });
        }
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::RouteResolved])?;
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        ctx.with_cma(|core, _, now| -> Result<()> {
            core.attach(&ctx);
            let mut st = self.inner().state();
            Self::check_phase(&st, &[Phase::RouteResolved])?;
            let lost = || CmaError::InvalidState("lost its resolved addresses");
            let (local, remote) = (st.local.ok_or_else(lost)?, st.remote.ok_or_else(lost)?);
            let hdr = match (local, remote.ip()) {
                (SocketAddr::V6(l), IpAddr::V6(r)) => CmaHdr::v6(l, r),
                (SocketAddr::V4(l), IpAddr::V4(r)) => CmaHdr::v4(l, r),
                _ => return Err(CmaError::InvalidArgument("address families differ")),
            };
            core.ep
                .set_route(gid_from_ip(remote.ip()), gid_from_ip(local.ip()));
            let mut p = SidrParams::rdma_cm_udp(
                MadAddr::gsi(remote.ip()),
                hdr,
                remote.port(),
                param.private_data.clone(),
            );
            p.timeout = crate::cm::manager::iba_time(st.timeouts.cm_response_timeout);
            p.max_retries = st.timeouts.max_cm_retries;
            let id = core
                .ep
                .cm
                .sidr_request(now, &p)
                .map_err(|_| CmaError::InvalidArgument("SIDR parameters"))?;
            core.add_conn(id, Arc::downgrade(&self.0), self.inner().clone());
            st.conn = Some(id);
            st.param = param.clone();
            st.phase = Phase::Connecting;
            Ok(())
        })?
    }

    /// `rdma_accept` in the UDP port space: the SIDR_REP with this id's QP and Q_Key.
    fn accept_ud(&self, param: &ConnParam) -> Result<()> {
        if param.private_data.len() > sidr::REP_PRIVATE_DATA_LEN {
            return Err(CmaError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: sidr::REP_PRIVATE_DATA_LEN,
            });
        }
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            if st.qpn.is_none() {
                return Err(CmaError::InvalidState("has no QP: create_qp first"));
            }
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        ctx.with_cma(|core, _, now| -> Result<()> {
            let mut st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            let id = st
                .conn
                .take()
                .ok_or(CmaError::InvalidState("is a request that is gone"))?;
            let r = core.ep.cm.sidr_reply(
                now,
                id,
                SidrStatus::Ok,
                st.qpn
                    .ok_or(CmaError::InvalidState("has no QP: create_qp first"))?,
                RDMA_UDP_QKEY,
                &param.private_data,
            );
            core.remove_conn(id);
            if r.is_err() {
                // Expired (or otherwise gone): this id is no connect request any more.
                st.phase = Phase::Idle;
                return Err(CmaError::InvalidState("is a request that is gone"));
            }
            st.phase = Phase::Established;
            Ok(())
        })?
    }

    /// `rdma_accept` (on the id of a CONNECT_REQUEST): move the QP to RTS and send the REP.
    /// ESTABLISHED follows when the RTU arrives. In the UDP port space: the SIDR_REP.
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] on an id that is no incoming request, or without a QP; [`CmaError::PrivateDataTooLong`] beyond 196 bytes.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        if self.inner().ps == PortSpace::Udp {
            return self.accept_ud(param);
        }
        if param.private_data.len() > rep::PRIVATE_DATA_LEN {
            return Err(CmaError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: rep::PRIVATE_DATA_LEN,
            });
        }
        if param.rnr_retry_count > 7 {
            return Err(CmaError::InvalidArgument("rnr_retry_count above 7"));
        }
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            if st.qpn.is_none() && param.qp_num == 0 {
                return Err(CmaError::InvalidState("has no QP: create_qp first"));
            }
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        ctx.with_cma(|core, modify: ModifyQp<'_>, now| -> Result<()> {
            let mut st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            let req = st
                .req
                .clone()
                .ok_or(CmaError::InvalidState("is a request that is gone"))?;
            let id = st
                .conn
                .ok_or(CmaError::InvalidState("is a request that is gone"))?;
            let (qpn, own) = match st.qpn {
                Some(q) => (q, false),
                None if param.qp_num != 0 => (param.qp_num, true),
                None => return Err(CmaError::InvalidState("has no QP: create_qp first")),
            };
            // The program's own QP already has the RQ PSN `init_qp_attr` reported.
            let rq_psn = match (&st.settled, own) {
                (Some(t), true) => t.rq_psn,
                _ => random_psn(),
            };
            let max_dest = param.responder_resources.min(req.initiator_depth);
            let max_rd = param.initiator_depth.min(req.responder_resources);
            let t = Transition {
                qpn,
                peer_gid: req.peer.gid,
                sgid_index: st.sgid_index(),
                remote_qpn: req.remote_qpn,
                rq_psn,
                sq_psn: req.remote_psn,
                mtu: st.mtu,
                max_dest_rd_atomic: max_dest,
                max_rd_atomic: max_rd,
                retry_cnt: req.retry_count,
                rnr_retry: req.rnr_retry_count,
                flow_label: st.flow_label,
            };
            if own {
                st.own_qp = Some(qpn);
            } else if !t.run(modify) {
                return Err(CmaError::InvalidState("the QP could not be moved to RTS"));
            }
            let mut ap = AcceptParams::new(qpn, rq_psn);
            ap.responder_resources = max_dest;
            ap.initiator_depth = max_rd;
            ap.rnr_retry_count = param.rnr_retry_count;
            ap.srq = param.srq;
            ap.flow_control = param.flow_control;
            ap.private_data = param.private_data.clone();
            core.ep
                .cm
                .accept(now, id, &ap)
                .map_err(|_| CmaError::InvalidState("the connection request is gone"))?;
            st.rq_psn = rq_psn;
            st.param = param.clone();
            st.phase = Phase::Accepting;
            Ok(())
        })?
    }

    /// `rdma_reject` (on the id of a CONNECT_REQUEST): REJ with up to 148 bytes of private data;
    /// the peer sees REJECTED with status 28 (consumer defined).
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] on an id that is no incoming request; [`CmaError::PrivateDataTooLong`] beyond 148 bytes.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let max = if self.inner().ps == PortSpace::Udp {
            sidr::REP_PRIVATE_DATA_LEN
        } else {
            rej::PRIVATE_DATA_LEN
        };
        if private_data.len() > max {
            return Err(CmaError::PrivateDataTooLong {
                len: private_data.len(),
                max,
            });
        }
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        let ud = self.inner().ps == PortSpace::Udp;
        ctx.with_cma(|core, _, now| -> Result<()> {
            let mut st = self.inner().state();
            Self::check_phase(&st, &[Phase::ConnectRequest])?;
            let id = st
                .conn
                .take()
                .ok_or(CmaError::InvalidState("is a request that is gone"))?;
            if ud {
                let _ = core
                    .ep
                    .cm
                    .sidr_reply(now, id, SidrStatus::Reject, 0, 0, private_data);
            } else {
                let _ = core.ep.cm.reject(id, private_data);
            }
            core.remove_conn(id);
            st.phase = Phase::Idle;
            Ok(())
        })?
    }

    /// `rdma_disconnect`: move the QP to ERR (its posted work completes with flush errors) and
    /// send the DREQ, or the DREP if the peer disconnected first. Both sides then see
    /// DISCONNECTED.
    ///
    /// # Errors
    /// [`CmaError::InvalidState`] if the id has no connection.
    pub fn disconnect(&self) -> Result<()> {
        let ctx = {
            let st = self.inner().state();
            Self::check_phase(
                &st,
                &[
                    Phase::Connecting,
                    Phase::Accepting,
                    Phase::Established,
                    Phase::Disconnected,
                ],
            )?;
            st.ctx.clone().ok_or(CmaError::NoDevice)?
        };
        ctx.with_cma(|core, modify, now| -> Result<()> {
            let mut st = self.inner().state();
            if let Some(qpn) = st.qpn {
                modify(
                    qpn,
                    &QpAttr {
                        qp_state: Some(QpState::Err),
                        ..Default::default()
                    },
                );
            }
            let Some(id) = st.conn else {
                return Err(CmaError::InvalidState(st.phase.name()));
            };
            match st.phase {
                Phase::Connecting | Phase::Accepting => {
                    let _ = core.ep.cm.reject(id, &[]);
                    core.remove_conn(id);
                    st.conn = None;
                    st.phase = Phase::Disconnected;
                    drop(st);
                    self.push(EventType::Disconnected, 0);
                }
                Phase::Established => {
                    core.ep
                        .cm
                        .disconnect(now, id, &[])
                        .map_err(|_| CmaError::InvalidState("established"))?;
                    st.phase = Phase::Disconnecting;
                }
                _ => {
                    // DREQ received: answer it. Already answered: nothing to do.
                    let _ = core.ep.cm.disconnect(now, id, &[]);
                }
            }
            Ok(())
        })?
    }

    /// `rdma_destroy_id`: waits until every event reported for this id is acknowledged (as
    /// librdmacm does: do not hold one of its events on this thread), drops its queued events,
    /// and answers the peer (DREQ/DREP/REJ) if a connection is open.
    pub fn destroy(self) {
        let inner = self.inner().clone();
        let mut e = inner.ev.lock().unwrap_or_else(|p| p.into_inner());
        while e.reported > e.acked {
            e = inner.ev_cv.wait(e).unwrap_or_else(|p| p.into_inner());
        }
        drop(e);
        self.finish_destroy();
    }

    /// Like [`CmId::destroy`], but fails with [`CmaError::Busy`] instead of waiting when events
    /// are not acknowledged.
    ///
    /// # Errors
    /// [`CmaError::Busy`] (with the id back) while its events are not acknowledged.
    pub fn try_destroy(self) -> std::result::Result<(), (CmaError, CmId)> {
        let n = self.inner().unacked();
        if n > 0 {
            return Err((CmaError::Busy(n), self));
        }
        self.finish_destroy();
        Ok(())
    }

    fn finish_destroy(self) {
        let inner = self.inner().clone();
        inner.teardown();
        if let Some(ch) = inner.channel().upgrade() {
            let purged = ch.purge(&inner);
            drop(purged);
        }
        // Let the cores answer the peer now rather than at their next wake-up.
        let ctxs: Vec<Context> = {
            let st = inner.state();
            st.ctx.iter().cloned().collect()
        };
        drop(self);
        for c in ctxs {
            let _ = c.with_cma(|_, _, _| ());
        }
    }
}

impl Context {
    /// Send a DREQ (or the DREP owed) for every connection of this device, once (see
    /// `route::at_exit_disconnect`). Never waits long for the engine: the process is exiting,
    /// and another thread may hold it for good.
    pub(crate) fn disconnect_all_at_exit(&self) {
        let s = &self.shared;
        let deadline = Instant::now() + std::time::Duration::from_millis(50);
        let mut e = loop {
            match s.engine.try_lock() {
                Ok(e) => break e,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
        };
        let now = Instant::now();
        if e.cm_endpoint().cm.disconnect_all(now) > 0 {
            e.flush_gsi(&s.io, now);
        }
    }

    /// Run `f` on this device's rdma_cm core under the engine lock, then send what the CM has to
    /// send, deliver its events, and flush the QPs it changed.
    pub(crate) fn with_cma<R>(
        &self,
        f: impl FnOnce(&mut CmaCore, ModifyQp<'_>, Instant) -> R,
    ) -> Result<R> {
        let s = &self.shared;
        let mut e = s.lock_engine_for_verb()?;
        let now = Instant::now();
        let r = e.with_gsi(now, CmaCore::new, f);
        e.flush_gsi(&s.io, now);
        e.flush_dirty(&s.io, &s.mrs, &s.async_events, now);
        s.kick_if_earlier(e.next_deadline());
        Ok(r)
    }
}
