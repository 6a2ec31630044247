//! A sans-IO IB Communication Manager endpoint for one port (one GID): the connection state
//! machine of IBA Vol 1 chapter 12 with the wire behaviour of Linux `ib_cm` (`cm.c`) and the
//! parameters `rdma_cm` (`cma.c`) uses.
//!
//! [`CmManager`] holds listeners (by Service ID) and connections (by local comm ID). It is fed
//! MADs ([`CmManager::handle_mad`]) and time ([`CmManager::handle_timeout`]), and is asked for
//! MADs to send ([`CmManager::poll_transmit`]) and events ([`CmManager::poll_event`]). It never
//! reads a clock, draws no OS randomness (comm IDs come from a seeded generator) and does no I/O.
//!
//! Linux behaviour followed here:
//! * Transaction IDs: REQ, RTU and a side's own DREQ carry `linux_tid(hi_tid, local comm ID)`;
//!   REP, REJ, MRA and DREP echo the TID of the message they answer (a passive side keeps the
//!   REQ's TID for the connection).
//! * Starting PSNs: each side's REQ/REP "starting PSN" is the PSN it will *receive* first. The
//!   [`CmEvent::ConnectRequest`] / [`CmEvent::Established`] `remote_psn` is therefore the local
//!   QP's `sq_psn`, and the `starting_psn` a side passes in is its QP's `rq_psn`.
//! * The active side sends the RTU as soon as it accepts the REP.
//! * REQ for a Service ID nobody listens on: REJ reason 8 (invalid Service ID), TID echoed.
//! * Retransmission: the REQ waits `2 * packet lifetime + remote CM response timeout`, the REP
//!   the REQ's `local CM response timeout`, DREQ the connection's timeout; each is resent up to
//!   `max CM retries` times (rdma_cm: 15). Times are `2^(t-8)` ms as `cm_convert_to_ms` does.
//! * A duplicate REQ while the CM waits for the consumer gets an MRA (service timeout 24, as
//!   rdma_cm's delayed MRA); a duplicate REP in ESTABLISHED gets the RTU again; a DREQ in
//!   TIMEWAIT or for an unknown connection gets a DREP; a duplicate REQ in TIMEWAIT gets REJ
//!   "stale connection". Deviation: a duplicate REQ while the REP is outstanding makes the REP
//!   go out again at once (Linux waits for the REP's own retry timer).
//! * MRA received: the outstanding message's timeout becomes `service timeout + packet lifetime`.
//! * Disconnect: a DREQ received produces [`CmEvent::Disconnected`]; the consumer answers with
//!   [`CmManager::disconnect`], which sends the DREP (as `rdma_disconnect` does). Both sides then
//!   stay in TIMEWAIT for the path's ACK timeout and report [`CmEvent::TimewaitExit`].
//! * SIDR (UD service resolution, rdma_cm's UDP port space) is in [`super::sidr_manager`].
//!
//! Limits on what a peer can make this CM hold or send (any local process can forge CM MADs):
//! * Timers taken from a REQ are clamped: the REP's retransmission timeout to
//!   [`PEER_CM_RESPONSE_TIMEOUT_MAX`], its retries so that all sends fit in [`PEER_HOLD_MAX`],
//!   and the timewait to [`PEER_ACK_TIMEOUT_MAX`]. A passive connection whose REP is never
//!   answered is gone [`PEER_HOLD_MAX`] after the accept, MRAs included.
//! * An MRA's service timeout is clamped to [`MRA_SERVICE_TIMEOUT_MAX`], and only the first MRA
//!   of a message extends its timeout (as Linux, which leaves MRA_*_RCVD on further MRAs).
//! * Answers sent without holding state (REJ to an unknown Service ID, SIDR_REP unsupported or
//!   over backlog, DREP to an unknown DREQ) and resends triggered by duplicates go through a
//!   rate limit per destination and per endpoint ([`super::ratelimit`]); what it suppresses is
//!   counted in [`CmStats`].
//! * Unanswered SIDR requests are bounded by the listener's backlog and expire; see
//!   [`super::sidr_manager`].
//!
//! The code is split by role: this file holds the types, the state and the dispatch of received
//! MADs; `manager/active.rs` the REQ and REP of the active side; `manager/passive.rs` the REQ
//! received, accept, reject and RTU; `manager/disconnect.rs` DREQ, DREP and timewait;
//! `manager/timers.rs` retransmission, MRA and the clamps on timers a peer sets.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use super::mad::{self, attr, linux_tid, MadHdr, MAD_LEN};
use super::private_data::{CmaHdr, CMA_HDR_LEN};
use super::ratelimit::RefusalLimiter;
use super::rej::rejected;
use super::service_id::{self, PortSpace};
use super::sidr_manager::{SidrRequestInfo, SidrStatus, SidrTable};
use super::{
    drep, dreq, ipv4_to_gid, mra, rej, rep, req, CmMad, ConnectReject, ConnectReply,
    ConnectRequest, DisconnectReply, DisconnectRequest, MessageReceiptAck, PathInfo, PrivateData,
    ReadyToUse, RejReason,
};
use crate::transport::types::Mtu;
use crate::wire::{deth::GSI_QKEY, Bth, Deth, Opcode, Packet, Psn};

mod active;
mod disconnect;
mod passive;
mod timers;
mod unclaimed;
pub use unclaimed::{MAX_UNCLAIMED, UNCLAIMED_RECHECK, UNCLAIMED_REQ_RESEND};

pub use timers::{
    iba_time, peer_rep_timers, MRA_SERVICE_TIMEOUT_MAX, PEER_ACK_TIMEOUT_MAX,
    PEER_CM_RESPONSE_TIMEOUT_MAX, PEER_HOLD_MAX,
};

/// Where a MAD comes from or goes to: the peer's GID (IPv4-mapped for RoCEv2 over IPv4) and its
/// GSI QP (1 for every CM MAD Linux sends).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct MadAddr {
    pub gid: [u8; 16],
    pub qpn: u32,
}

impl MadAddr {
    /// The GSI QP of the host with IPv4 address `ip`.
    pub fn gsi_v4(ip: Ipv4Addr) -> Self {
        MadAddr {
            gid: ipv4_to_gid(ip),
            qpn: 1,
        }
    }

    /// The GSI QP of the host with address `ip` (IPv4 or IPv6).
    pub fn gsi(ip: IpAddr) -> Self {
        MadAddr {
            gid: crate::wire::gid::gid_from_ip(ip),
            qpn: 1,
        }
    }
}

/// A connection, by its local comm ID.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// Errors of the consumer-facing calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error("private data of {len} bytes is larger than {max}")]
    PrivateDataTooLong { len: usize, max: usize },
    #[error("no such connection")]
    UnknownId,
    #[error("the connection is in state {0:?}, which does not allow this")]
    InvalidState(ConnState),
    #[error("already listening on service ID {0:#018x}")]
    AlreadyListening(u64),
    #[error("a parameter is out of range: {0}")]
    BadParam(&'static str),
}

/// States of a connection (IBA 12.9, Linux `enum ib_cm_state`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ConnState {
    ReqSent,
    MraReqRcvd,
    ReqRcvd,
    MraReqSent,
    RepSent,
    MraRepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    TimeWait,
}

/// Fixed properties of this CM endpoint.
#[derive(Clone, Copy, Debug)]
pub struct CmConfig {
    /// This port's GID (IPv4-mapped for RoCEv2 over IPv4).
    pub local_gid: [u8; 16],
    /// The node GUID put in REQ/REP "local CA GUID".
    pub local_ca_guid: u64,
    /// High half of the transaction IDs (Linux: the MAD agent's `hi_tid`).
    pub hi_tid: u32,
    /// Seed of the comm ID generator (a driver seeds it from the OS).
    pub seed: u64,
}

/// Parameters of [`CmManager::connect`].
#[derive(Clone, Debug)]
pub struct ConnectParams {
    pub service_id: u64,
    /// The passive side's GSI address.
    pub remote: MadAddr,
    pub local_qpn: u32,
    /// The PSN this side will receive first (its QP's `rq_psn`).
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 0..=7.
    pub retry_count: u8,
    /// 0..=7 (7: infinite).
    pub rnr_retry_count: u8,
    pub path_mtu: Mtu,
    pub srq: bool,
    pub flow_control: bool,
    /// The rdma_cm IP header put in front of the private data (`None` for a plain IB CM REQ).
    pub cma: Option<CmaHdr>,
    /// The consumer's private data: at most 56 bytes with a `cma` header, 92 without.
    pub private_data: Vec<u8>,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    /// IBA time exponent; rdma_cm over RoCE uses 18 (`CMA_IBOE_PACKET_LIFETIME`).
    pub packet_life_time: u8,
    /// rdma_cm: 20 (`CMA_CM_RESPONSE_TIMEOUT`).
    pub cm_response_timeout: u8,
    /// rdma_cm: 15 (`CMA_MAX_CM_RETRIES`).
    pub max_cm_retries: u8,
    /// The primary path's local GID (the address the connection is made from); `None`: the
    /// endpoint's ([`CmConfig::local_gid`]).
    pub local_gid: Option<[u8; 16]>,
}

impl ConnectParams {
    /// What rdma_cm sends for an RC id in the TCP port space from `src` to `dst`, including the
    /// flow label it derives from the ports (`cma_get_roce_udp_flow_label`).
    pub fn rdma_cm_tcp(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        local_qpn: u32,
        starting_psn: u32,
    ) -> Self {
        ConnectParams {
            local_gid: None,
            ..Self::rdma_cm_tcp_ip(src.into(), dst.into(), local_qpn, starting_psn)
        }
    }

    /// [`ConnectParams::rdma_cm_tcp`] for IPv4 or IPv6 (both addresses of one family): the
    /// rdma_cm header of that family, the REQ's path from `src`'s GID to `dst`'s.
    pub fn rdma_cm_tcp_ip(
        src: SocketAddr,
        dst: SocketAddr,
        local_qpn: u32,
        starting_psn: u32,
    ) -> Self {
        let hash = (src.port() as u32) * 31 + dst.port() as u32;
        let cma = match (src, dst.ip()) {
            (SocketAddr::V6(s), IpAddr::V6(d)) => CmaHdr::v6(s, d),
            (SocketAddr::V4(s), IpAddr::V4(d)) => CmaHdr::v4(s, d),
            // Mixed families are the caller's mistake: the destination's family wins.
            (s, IpAddr::V6(d)) => CmaHdr::v6(
                std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, s.port(), 0, 0),
                d,
            ),
            (s, IpAddr::V4(d)) => CmaHdr::v4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, s.port()), d),
        };
        ConnectParams {
            service_id: PortSpace::Tcp.service_id(dst.port()),
            remote: MadAddr::gsi(dst.ip()),
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: Mtu::Mtu1024,
            srq: false,
            flow_control: false,
            cma: Some(cma),
            private_data: Vec::new(),
            flow_label: hash & 0xf_ffff,
            hop_limit: 64,
            traffic_class: 0,
            packet_life_time: 18,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            local_gid: Some(crate::wire::gid::gid_from_ip(src.ip())),
        }
    }
}

/// Parameters of [`CmManager::accept`].
#[derive(Clone, Debug)]
pub struct AcceptParams {
    pub local_qpn: u32,
    /// The PSN this side will receive first (its QP's `rq_psn`).
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 0..=7.
    pub rnr_retry_count: u8,
    /// rxe reports 15 (`local_ca_ack_delay`).
    pub target_ack_delay: u8,
    pub srq: bool,
    pub flow_control: bool,
    /// At most 196 bytes.
    pub private_data: Vec<u8>,
}

impl AcceptParams {
    /// The defaults rping's accept produces on rxe.
    pub fn new(local_qpn: u32, starting_psn: u32) -> Self {
        AcceptParams {
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            target_ack_delay: 15,
            srq: false,
            flow_control: false,
            private_data: Vec::new(),
        }
    }
}

/// What a REQ asked for, as [`CmEvent::ConnectRequest`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequestInfo {
    pub id: CmId,
    pub service_id: u64,
    pub peer: MadAddr,
    pub remote_comm_id: u32,
    pub remote_ca_guid: u64,
    pub remote_qpn: u32,
    /// The PSN the peer will receive first: the local QP's `sq_psn`.
    pub remote_psn: u32,
    /// The peer's responder resources (its max_dest_rd_atomic).
    pub responder_resources: u8,
    /// The peer's initiator depth (its max_rd_atomic).
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// `None` for an MTU code outside 1..=5.
    pub path_mtu: Option<Mtu>,
    pub srq: bool,
    pub flow_control: bool,
    pub primary_path: PathInfo,
    /// The rdma_cm header, when the Service ID is an rdma_cm IP one.
    pub cma: Option<CmaHdr>,
    /// The consumer's private data (after the rdma_cm header, if any).
    pub private_data: Vec<u8>,
}

/// What the peer's REP (active side) or our own REP (passive side) settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EstablishedInfo {
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    /// The PSN the peer will receive first: the local QP's `sq_psn`.
    pub remote_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// The REP's private data on the active side, the RTU's on the passive side.
    pub private_data: Vec<u8>,
}

/// Events for the consumer (rdma_cm's event names in the docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// CONNECT_REQUEST: a REQ matched a listener; answer with accept or reject.
    ConnectRequest(ConnectRequestInfo),
    /// ESTABLISHED: the active side accepted the REP (and sent the RTU), or the passive side got
    /// the RTU.
    Established { id: CmId, info: EstablishedInfo },
    /// REJECTED: the peer sent a REJ.
    Rejected {
        id: CmId,
        reason: RejReason,
        private_data: Vec<u8>,
    },
    /// UNREACHABLE: the REQ or the REP was never answered (all retries used).
    Unreachable { id: CmId },
    /// CONNECT_ERROR: the REP could not be used (it named QP 0); a REJ was sent back.
    ConnectError { id: CmId },
    /// DISCONNECTED: a DREQ arrived (answer with [`CmManager::disconnect`]), our DREQ was
    /// answered, or it was never answered.
    Disconnected { id: CmId, private_data: Vec<u8> },
    /// TIMEWAIT_EXIT: the connection's timewait ended; its comm ID is free again.
    TimewaitExit { id: CmId },
    /// A SIDR_REQ matched a listener; answer with [`CmManager::sidr_reply`].
    SidrRequest(SidrRequestInfo),
    /// Our SIDR_REQ was answered (rdma_cm: ESTABLISHED with the UD QPN/Q_Key on success,
    /// UNREACHABLE otherwise).
    SidrReply {
        id: CmId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    },
    /// Our SIDR_REQ was never answered (rdma_cm: UNREACHABLE).
    SidrTimeout { id: CmId },
    /// A [`CmEvent::SidrRequest`] was not answered within
    /// [`super::sidr_manager::SIDR_REQUEST_LIFETIME`] and is forgotten; answering it now fails.
    SidrRequestExpired { id: CmId },
}

/// A snapshot of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    pub state: ConnState,
    pub passive: bool,
    pub peer: MadAddr,
    pub remote_comm_id: u32,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    pub tid: u64,
}

#[derive(Clone)]
struct Retry {
    dest: MadAddr,
    mad: [u8; MAD_LEN],
    timeout: Duration,
    deadline: Instant,
    left: u8,
}

#[derive(Clone)]
struct Conn {
    state: ConnState,
    passive: bool,
    peer: MadAddr,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    local_qpn: u32,
    remote_qpn: u32,
    /// The connection's TID (REQ's), used by REP, RTU, REJ and MRA.
    tid: u64,
    /// The DREQ's TID the DREP must echo.
    dreq_tid: u64,
    /// Message timeout and retry count for our own requests (REP, DREQ).
    timeout: Duration,
    max_retries: u8,
    /// Timewait length (the path's ACK timeout).
    timewait: Duration,
    retry: Option<Retry>,
    timewait_until: Option<Instant>,
    /// The last answer sent (RTU, MRA, DREP), resent on duplicates.
    last_reply: Option<[u8; MAD_LEN]>,
    /// Passive side: when an unanswered REP is given up whatever its retries and MRAs say
    /// ([`PEER_HOLD_MAX`] after the accept).
    give_up_at: Option<Instant>,
    /// Active side: until when a REJ "invalid Service ID" (nobody listens yet) sends the REQ
    /// again instead of ending the attempt (`unclaimed.rs`).
    unclaimed_until: Option<Instant>,
}

/// The backlog of [`CmManager::listen`] (as Linux's `net.rdma_ucm.max_backlog` default): how
/// many SIDR requests of one listener may wait for an answer at a time.
pub const DEFAULT_LISTEN_BACKLOG: usize = 1024;

/// Counters of what the hostile-traffic limits did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmStats {
    /// REJs not sent because of the rate limit ([`super::ratelimit`]).
    pub rej_suppressed: u64,
    /// Other rate-limited answers not sent: SIDR_REP (unsupported, over backlog, lingering
    /// reply), DREP, and MRA/REP/RTU resent for a duplicate.
    pub answers_suppressed: u64,
    /// SIDR_REQs refused because the listener's backlog of unanswered requests was full.
    pub sidr_over_backlog: u64,
    /// Unanswered SIDR requests forgotten after
    /// [`super::sidr_manager::SIDR_REQUEST_LIFETIME`].
    pub sidr_expired: u64,
    /// Lingering SIDR_REPs forgotten early because the linger list was full.
    pub sidr_linger_evicted: u64,
    /// Duplicate SIDR_REQs (same peer and request ID) seen.
    pub sidr_duplicates: u64,
    /// Passive connections given up because their REP was not answered within
    /// [`PEER_HOLD_MAX`].
    pub rep_given_up: u64,
    /// REQs that found no listener in time and got REJ reason 8 after waiting
    /// ([`CmManager::set_unclaimed_wait`]).
    pub unclaimed_rejected: u64,
    /// REQs that found no listener here and were handed to another process that listens.
    pub unclaimed_forwarded: u64,
    /// Our REQs sent again after a REJ "invalid Service ID" (the peer did not listen yet).
    pub req_resent_after_rej: u64,
}

/// The IB CM endpoint of one port.
pub struct CmManager {
    pub(super) cfg: CmConfig,
    rng: u64,
    /// Listened Service IDs and their backlog.
    pub(super) listeners: HashMap<u64, usize>,
    conns: HashMap<u32, Conn>,
    pub(super) tx: VecDeque<(MadAddr, [u8; MAD_LEN])>,
    pub(super) events: VecDeque<CmEvent>,
    pub(super) sidr: SidrTable,
    pub(super) limiter: RefusalLimiter,
    /// MADs dropped because they did not parse or matched nothing.
    pub dropped: u64,
    /// The top byte of every local ID, if set ([`CmManager::set_id_prefix`]).
    id_prefix: Option<u8>,
    /// What the hostile-traffic limits did.
    pub stats: CmStats,
    /// REQs that found no listener, waiting for one (`unclaimed.rs`).
    unclaimed: Vec<unclaimed::Unclaimed>,
    unclaimed_wait: Duration,
    /// The MAD being handled was handed over by another process.
    handling_forwarded: bool,
}

fn pd<const N: usize>(data: &[u8]) -> Result<PrivateData<N>, CmError> {
    PrivateData::from_slice(data).map_err(|_| CmError::PrivateDataTooLong {
        len: data.len(),
        max: N,
    })
}

fn emit<F: FnOnce(&mut [u8; MAD_LEN])>(f: F) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    f(&mut b);
    b
}

impl CmManager {
    pub fn new(cfg: CmConfig) -> Self {
        CmManager {
            cfg,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            sidr: SidrTable::default(),
            limiter: RefusalLimiter::new(),
            dropped: 0,
            id_prefix: None,
            stats: CmStats::default(),
            unclaimed: Vec::new(),
            unclaimed_wait: Duration::ZERO,
            handling_forwarded: false,
        }
    }

    /// Make every local communication ID and SIDR request ID start with byte `prefix`: a
    /// device address shared by several processes steers CM replies by it (`driver::share`).
    pub fn set_id_prefix(&mut self, prefix: u8) {
        self.id_prefix = Some(prefix);
    }

    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    fn next_rand(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn new_comm_id(&mut self) -> u32 {
        loop {
            let mut id = self.next_rand() as u32;
            if let Some(p) = self.id_prefix {
                id = (p as u32) << 24 | id & 0x00ff_ffff;
            }
            if id != 0 && !self.conns.contains_key(&id) && !self.sidr.has(id) {
                return id;
            }
        }
    }

    /// Accept REQs for `service_id` (rdma_cm: `PortSpace::service_id(port)`), with
    /// [`DEFAULT_LISTEN_BACKLOG`].
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listen_with_backlog(service_id, DEFAULT_LISTEN_BACKLOG)
    }

    /// Accept REQs and SIDR_REQs for `service_id`; at most `backlog` (at least 1) SIDR
    /// requests wait for [`CmManager::sidr_reply`] at a time, more get SIDR_REP "reject".
    pub fn listen_with_backlog(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        self.listeners.insert(service_id, backlog.max(1));
        Ok(())
    }

    /// Stop accepting REQs for `service_id`; connections already made are unaffected.
    pub fn unlisten(&mut self, service_id: u64) -> bool {
        self.listeners.remove(&service_id).is_some()
    }

    /// A snapshot of a connection.
    pub fn conn_info(&self, id: CmId) -> Option<ConnInfo> {
        self.conns.get(&id.0).map(|c| ConnInfo {
            state: c.state,
            passive: c.passive,
            peer: c.peer,
            remote_comm_id: c.remote_comm_id,
            local_qpn: c.local_qpn,
            remote_qpn: c.remote_qpn,
            tid: c.tid,
        })
    }

    /// Destinations the REJ/answer rate limit tracks a bucket for (bounded by
    /// [`super::ratelimit::REFUSAL_DESTS_MAX`]).
    pub fn rate_limited_dests(&self) -> usize {
        self.limiter.tracked()
    }

    /// Number of connections held (any state, timewait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn send(&mut self, dest: MadAddr, mad: [u8; MAD_LEN]) {
        self.tx.push_back((dest, mad));
    }

    /// Send an answer that holds no state or repeats one (see [`super::ratelimit`]); false and
    /// counted if the rate limit suppressed it.
    pub(super) fn send_limited(&mut self, now: Instant, dest: MadAddr, mad: [u8; MAD_LEN]) -> bool {
        if self.limiter.allow(now, &dest.gid) {
            self.tx.push_back((dest, mad));
            true
        } else {
            if mad[16..18] == attr::REJ.to_be_bytes() {
                self.stats.rej_suppressed += 1;
            } else {
                self.stats.answers_suppressed += 1;
            }
            false
        }
    }

    /// The next MAD to send: its destination and the 256 bytes (wrap it with [`gsi_packet`]).
    pub fn poll_transmit(&mut self) -> Option<(MadAddr, [u8; MAD_LEN])> {
        self.tx.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// A UD packet received on QP1 from `src_gid`: checks that it is a UD SEND to QP1 with the
    /// GSI Q_Key carrying a 256-byte MAD, then [`CmManager::handle_mad`]. Returns false if the
    /// packet was not a GSI MAD.
    pub fn handle_gsi_packet(&mut self, now: Instant, src_gid: [u8; 16], pkt: &Packet<'_>) -> bool {
        let Some(deth) = pkt.deth else { return false };
        if pkt.bth.opcode != Opcode::UD_SEND_ONLY
            || pkt.bth.dest_qpn != 1
            || deth.qkey != GSI_QKEY
            || pkt.payload.len() != MAD_LEN
        {
            self.dropped += 1;
            return false;
        }
        let src = MadAddr {
            gid: src_gid,
            qpn: deth.src_qpn,
        };
        self.handle_mad(now, src, pkt.payload);
        true
    }

    /// A CM MAD from `src`. Anything malformed, of another class version, or matching no
    /// connection is dropped (counted in `dropped`), never a panic.
    pub fn handle_mad(&mut self, now: Instant, src: MadAddr, mad: &[u8]) {
        let Ok(m) = CmMad::parse(mad) else {
            self.dropped += 1;
            return;
        };
        let h = *m.hdr();
        if h.class_version != mad::CLASS_VERSION || h.method != mad::method::SEND {
            self.dropped += 1;
            return;
        }
        let handled = match m {
            CmMad::Req(r) => self.on_req(now, src, &r, mad),
            CmMad::Rep(r) => self.on_rep(now, src, &r),
            CmMad::Rtu(r) => self.on_rtu(&r),
            CmMad::Rej(r) => self.on_rej(now, &r),
            CmMad::Mra(r) => self.on_mra(now, &r),
            CmMad::Dreq(r) => self.on_dreq(now, src, &r),
            CmMad::Drep(r) => self.on_drep(now, &r),
            CmMad::SidrReq(r) => self.on_sidr_req(now, src, &r),
            CmMad::SidrRep(r) => self.on_sidr_rep(&r),
            _ => false,
        };
        if !handled {
            self.dropped += 1;
        }
    }

    /// The connection `local` whose peer is `remote`.
    fn conn_pair(&mut self, local: u32, remote: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(&local)
            .filter(|c| c.remote_comm_id == remote)
    }

    fn on_rej(&mut self, now: Instant, r: &ConnectReject) -> bool {
        let local = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&local) else {
            return false;
        };
        // A REJ of our REQ may come before we know the peer's comm ID.
        let matches = if r.message_rejected == rejected::REQ && !c.passive {
            true
        } else {
            c.remote_comm_id == r.local_comm_id
        };
        if !matches {
            return false;
        }
        match c.state {
            ConnState::ReqSent
            | ConnState::MraReqRcvd
            | ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::ReqRcvd
            | ConnState::MraReqSent => {}
            _ => return false,
        }
        if c.state == ConnState::ReqSent
            && r.reason == RejReason::InvalidServiceId
            && c.unclaimed_until.is_some_and(|t| now < t)
        {
            // The server may be about to listen: ask again soon (`unclaimed.rs`), backing off
            // (10 ms, then as long as the attempt has lasted), a last time when the wait ends.
            let until = c.unclaimed_until.expect("checked");
            let started = until - self.unclaimed_wait;
            let delay = unclaimed::UNCLAIMED_REQ_RESEND.max(now - started);
            if let Some(rt) = c.retry.as_mut() {
                rt.deadline = (now + delay).min(until);
                // The resend does not count against the REQ's retries.
                rt.left = rt.left.saturating_add(1);
            }
            self.stats.req_resent_after_rej += 1;
            return true;
        }
        if r.reason == RejReason::StaleConn {
            Self::enter_timewait(c, now);
        } else {
            self.conns.remove(&local);
        }
        self.events.push_back(CmEvent::Rejected {
            id: CmId(local),
            reason: r.reason,
            private_data: r.private_data.0.to_vec(),
        });
        true
    }
}

/// Wrap a MAD in the UD packet Linux sends it in: SEND_ONLY from QP1 to `dest.qpn` with the
/// GSI Q_Key, PSN `psn`. Returns BTH to ICRC (ICRC zero, for the driver to fill).
pub fn gsi_packet(dest: &MadAddr, mad: &[u8; MAD_LEN], psn: u32) -> Vec<u8> {
    let bth = Bth::new(Opcode::UD_SEND_ONLY, dest.qpn, Psn::new(psn));
    let mut pkt = Packet::new(bth, mad);
    pkt.deth = Some(Deth {
        qkey: GSI_QKEY,
        resv8: 0,
        src_qpn: 1,
    });
    let mut out = vec![0u8; pkt.buffer_len()];
    let n = pkt.emit(&mut out).expect("sized");
    out.truncate(n);
    out
}
