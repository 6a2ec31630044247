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

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
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
        let hash = (src.port() as u32) * 31 + dst.port() as u32;
        ConnectParams {
            service_id: PortSpace::Tcp.service_id(dst.port()),
            remote: MadAddr::gsi_v4(*dst.ip()),
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: Mtu::Mtu1024,
            srq: false,
            flow_control: false,
            cma: Some(CmaHdr::v4(src, *dst.ip())),
            private_data: Vec::new(),
            flow_label: hash & 0xf_ffff,
            hop_limit: 64,
            traffic_class: 0,
            packet_life_time: 18,
            cm_response_timeout: 20,
            max_cm_retries: 15,
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
}

/// `cm_convert_to_ms`: 4.096 µs × 2^t, approximated as 2^(t-8) ms.
pub fn iba_time(t: u8) -> Duration {
    Duration::from_millis(1u64 << (t as u32).saturating_sub(8).min(31))
}

/// rdma_cm's delayed MRA service timeout (`CMA_CM_MRA_SETTING` without the delay flag).
const MRA_SERVICE_TIMEOUT: u8 = 24;

/// The largest REP retransmission timeout a REQ's "local CM response timeout" can ask for, as
/// an IBA time exponent: 20, about 4.2 s. rdma_cm sends 20 (`CMA_CM_RESPONSE_TIMEOUT`); Linux
/// `ib_cm` takes the field as is (`cm_convert_to_ms`), so the maximum 31 would make each REP
/// wait 2.3 hours. A real active side answers a REP with an RTU at once (`cma_rep_recv`), so
/// waiting longer only helps a forged REQ hold a connection.
pub const PEER_CM_RESPONSE_TIMEOUT_MAX: u8 = 20;

/// The longest a REQ this side did not start can keep a connection's REP going: from the
/// accept until the REP is given up (UNREACHABLE), all retransmissions and MRA extensions
/// included. The REP's retries (the REQ's "max CM retries", up to 15) are cut so that
/// `(retries + 1) × timeout` fits, and a hard deadline ends the handshake at this bound. With
/// rdma_cm's defaults (timeout 20, 15 retries) Linux sends the REP 16 times over 66 s; here
/// 7 times over 29 s.
pub const PEER_HOLD_MAX: Duration = Duration::from_secs(30);

/// The largest MRA service timeout honoured, as an IBA time exponent: 24 (about 67 s), the
/// value rdma_cm itself sends (`CMA_CM_MRA_SETTING`), so a Linux peer is never cut short.
/// The field allows 31 (2.3 hours). On the passive side [`PEER_HOLD_MAX`] still applies.
pub const MRA_SERVICE_TIMEOUT_MAX: u8 = 24;

/// The largest ACK timeout a REQ's primary path can set for the passive side's timewait, as an
/// IBA time exponent: 21, about 8.4 s. rdma_cm over RoCE sends 19 (packet lifetime 18 + 1,
/// 2.1 s); Linux's `cm_ack_timeout` only caps it at 31 (2.3 hours of timewait).
pub const PEER_ACK_TIMEOUT_MAX: u8 = 21;

/// The backlog of [`CmManager::listen`] (as Linux's `net.rdma_ucm.max_backlog` default): how
/// many SIDR requests of one listener may wait for an answer at a time.
pub const DEFAULT_LISTEN_BACKLOG: usize = 1024;

/// The REP retransmission timeout and retry count a REQ's fields give, clamped
/// ([`PEER_CM_RESPONSE_TIMEOUT_MAX`], [`PEER_HOLD_MAX`]).
pub fn peer_rep_timers(local_cm_response_timeout: u8, max_cm_retries: u8) -> (Duration, u8) {
    let timeout = iba_time(local_cm_response_timeout.min(PEER_CM_RESPONSE_TIMEOUT_MAX));
    let sends = (PEER_HOLD_MAX.as_millis() / timeout.as_millis().max(1)).max(1);
    let retries = (max_cm_retries.min(15) as u128).min(sends - 1) as u8;
    (timeout, retries)
}

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

    fn send_with_retry(
        &mut self,
        now: Instant,
        id: u32,
        dest: MadAddr,
        mad: [u8; MAD_LEN],
        timeout: Duration,
        retries: u8,
    ) {
        self.send(dest, mad);
        if let Some(c) = self.conns.get_mut(&id) {
            c.retry = Some(Retry {
                dest,
                mad,
                timeout,
                deadline: now + timeout,
                left: retries,
            });
        }
    }

    /// Send a REQ (rdma_connect). Returns the new connection's id.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CmId, CmError> {
        let max = if p.cma.is_some() {
            req::PRIVATE_DATA_LEN - CMA_HDR_LEN
        } else {
            req::PRIVATE_DATA_LEN
        };
        if p.private_data.len() > max {
            return Err(CmError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        if p.retry_count > 7 || p.rnr_retry_count > 7 {
            return Err(CmError::BadParam("retry counts are 0..=7"));
        }
        if p.local_qpn == 0 || p.local_qpn > 0x00ff_ffff {
            return Err(CmError::BadParam("local_qpn"));
        }
        if p.max_cm_retries > 15 || p.cm_response_timeout > 31 || p.packet_life_time > 30 {
            return Err(CmError::BadParam("CM timeouts"));
        }
        let mut data = [0u8; req::PRIVATE_DATA_LEN];
        let mut at = 0;
        if let Some(h) = &p.cma {
            h.emit(&mut data).map_err(|_| CmError::BadParam("cma"))?;
            at = CMA_HDR_LEN;
        }
        data[at..at + p.private_data.len()].copy_from_slice(&p.private_data);
        let id = self.new_comm_id();
        let tid = linux_tid(self.cfg.hi_tid, id);
        let ack_timeout = p.packet_life_time + 1;
        let path = PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: self.cfg.local_gid,
            remote_gid: p.remote.gid,
            flow_label: p.flow_label & 0xf_ffff,
            traffic_class: p.traffic_class,
            hop_limit: p.hop_limit,
            local_ack_timeout: ack_timeout,
            ..Default::default()
        };
        let m = ConnectRequest {
            hdr: MadHdr::cm(attr::REQ, tid),
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.local_ca_guid,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: p.cm_response_timeout,
            transport_service_type: req::transport::RC,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn & Psn::MASK,
            local_cm_response_timeout: p.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: p.path_mtu as u8,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            primary_path: path,
            private_data: PrivateData(data),
            ..Default::default()
        };
        let timeout = iba_time(p.packet_life_time) * 2 + iba_time(p.cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: ConnState::ReqSent,
                passive: false,
                peer: p.remote,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                local_qpn: p.local_qpn,
                remote_qpn: 0,
                tid,
                dreq_tid: 0,
                timeout,
                max_retries: p.max_cm_retries,
                timewait: iba_time(ack_timeout),
                retry: None,
                timewait_until: None,
                last_reply: None,
                give_up_at: None,
            },
        );
        let bytes = emit(|b| m.emit(b));
        self.send_with_retry(now, id, p.remote, bytes, timeout, p.max_cm_retries);
        Ok(CmId(id))
    }

    /// Send a REP for a connection reported by [`CmEvent::ConnectRequest`] (rdma_accept).
    pub fn accept(&mut self, now: Instant, id: CmId, p: &AcceptParams) -> Result<(), CmError> {
        let private_data = pd::<{ rep::PRIVATE_DATA_LEN }>(&p.private_data)?;
        if p.rnr_retry_count > 7 {
            return Err(CmError::BadParam("rnr_retry_count"));
        }
        if p.local_qpn == 0 || p.local_qpn > 0x00ff_ffff {
            return Err(CmError::BadParam("local_qpn"));
        }
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        if !matches!(c.state, ConnState::ReqRcvd | ConnState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let m = ConnectReply {
            hdr: MadHdr::cm(attr::REP, c.tid),
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn & Psn::MASK,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.local_ca_guid,
            private_data,
            ..Default::default()
        };
        c.state = ConnState::RepSent;
        c.local_qpn = p.local_qpn;
        c.give_up_at = Some(now + PEER_HOLD_MAX);
        let (peer, timeout, retries) = (c.peer, c.timeout, c.max_retries);
        let bytes = emit(|b| m.emit(b));
        self.send_with_retry(now, id.0, peer, bytes, timeout, retries);
        Ok(())
    }

    /// Reject a connection request, or a connection before it is established (rdma_reject):
    /// REJ with reason 28 (consumer defined) and up to 148 bytes of private data. The connection
    /// is forgotten.
    pub fn reject(&mut self, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        self.reject_inner(None, id, private_data)
    }

    /// [`CmManager::reject`] for a request refused without the consumer (over backlog, no
    /// listener any more): the REJ goes through the rate limit ([`super::ratelimit`]), so a
    /// REQ flood does not make us a reflector. The connection is forgotten either way.
    pub fn refuse(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        self.reject_inner(Some(now), id, &[])
    }

    fn reject_inner(
        &mut self,
        limited: Option<Instant>,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = pd::<{ rej::PRIVATE_DATA_LEN }>(private_data)?;
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        let which = match c.state {
            ConnState::ReqRcvd | ConnState::MraReqSent => rejected::REQ,
            ConnState::RepSent | ConnState::MraRepRcvd => rejected::REP,
            ConnState::ReqSent | ConnState::MraReqRcvd => rejected::OTHER,
            s => return Err(CmError::InvalidState(s)),
        };
        let m = ConnectReject {
            hdr: MadHdr::cm(attr::REJ, c.tid),
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            message_rejected: which,
            reason: RejReason::ConsumerDefined,
            private_data: data,
            ..Default::default()
        };
        let peer = c.peer;
        self.conns.remove(&id.0);
        let bytes = emit(|b| m.emit(b));
        match limited {
            Some(now) => {
                self.send_limited(now, peer, bytes);
            }
            None => self.send(peer, bytes),
        }
        Ok(())
    }

    /// The passive side learned that the connection works before the RTU arrived (the first
    /// packet reached its QP: IB_EVENT_COMM_EST). Moves REP_SENT to ESTABLISHED.
    pub fn notify_established(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        if !matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd) {
            return Err(CmError::InvalidState(c.state));
        }
        c.state = ConnState::Established;
        c.retry = None;
        let info = EstablishedInfo {
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            remote_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 0,
            srq: false,
            private_data: Vec::new(),
        };
        self.events.push_back(CmEvent::Established { id, info });
        Ok(())
    }

    /// rdma_disconnect: in ESTABLISHED send a DREQ (up to 220 bytes of private data); after a
    /// DREQ was received, send the DREP (up to 224 bytes) and enter timewait.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        match c.state {
            ConnState::Established => {
                let data = pd::<{ dreq::PRIVATE_DATA_LEN }>(private_data)?;
                let tid = linux_tid(self.cfg.hi_tid, id.0);
                let m = DisconnectRequest {
                    hdr: MadHdr::cm(attr::DREQ, tid),
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_comm_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: data,
                    ..Default::default()
                };
                let (peer, timeout, retries) = (c.peer, c.timeout, c.max_retries);
                let c = self.conns.get_mut(&id.0).expect("present");
                c.state = ConnState::DreqSent;
                let bytes = emit(|b| m.emit(b));
                self.send_with_retry(now, id.0, peer, bytes, timeout, retries);
                Ok(())
            }
            ConnState::DreqRcvd => {
                let data = pd::<{ drep::PRIVATE_DATA_LEN }>(private_data)?;
                let m = DisconnectReply {
                    hdr: MadHdr::cm(attr::DREP, c.dreq_tid),
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_comm_id,
                    private_data: data,
                };
                let bytes = emit(|b| m.emit(b));
                let peer = c.peer;
                let c = self.conns.get_mut(&id.0).expect("present");
                c.last_reply = Some(bytes);
                Self::enter_timewait(c, now);
                self.send(peer, bytes);
                Ok(())
            }
            s => Err(CmError::InvalidState(s)),
        }
    }

    fn enter_timewait(c: &mut Conn, now: Instant) {
        c.state = ConnState::TimeWait;
        c.retry = None;
        c.timewait_until = Some(now + c.timewait);
    }

    /// The next MAD to send: its destination and the 256 bytes (wrap it with [`gsi_packet`]).
    pub fn poll_transmit(&mut self) -> Option<(MadAddr, [u8; MAD_LEN])> {
        self.tx.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`CmManager::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| {
                [
                    c.retry.as_ref().map(|r| r.deadline),
                    c.timewait_until,
                    c.give_up_at.filter(|_| c.retry.is_some()),
                ]
            })
            .flatten()
            .chain(self.sidr.poll_timeout())
            .min()
    }

    /// Retransmit MADs whose timeout passed, give up on those out of retries, end timewaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.sidr_handle_timeout(now);
        let mut ids: Vec<u32> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.timewait_until.is_some_and(|t| t <= now) {
                self.conns.remove(&id);
                self.events
                    .push_back(CmEvent::TimewaitExit { id: CmId(id) });
                continue;
            }
            let over = c.give_up_at.is_some_and(|t| t <= now)
                && matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd);
            let Some(r) = c.retry.as_mut() else { continue };
            if over {
                self.stats.rep_given_up += 1;
                self.conns.remove(&id);
                self.events.push_back(CmEvent::Unreachable { id: CmId(id) });
                continue;
            }
            if r.deadline > now {
                continue;
            }
            if r.left > 0 {
                r.left -= 1;
                r.deadline = now + r.timeout;
                let (d, m) = (r.dest, r.mad);
                self.tx.push_back((d, m));
                continue;
            }
            c.retry = None;
            match c.state {
                ConnState::ReqSent
                | ConnState::MraReqRcvd
                | ConnState::RepSent
                | ConnState::MraRepRcvd => {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::Unreachable { id: CmId(id) });
                }
                ConnState::DreqSent => {
                    Self::enter_timewait(c, now);
                    self.events.push_back(CmEvent::Disconnected {
                        id: CmId(id),
                        private_data: Vec::new(),
                    });
                }
                _ => {}
            }
        }
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

    #[allow(clippy::too_many_arguments)]
    fn issue_rej(
        &mut self,
        now: Instant,
        to: MadAddr,
        tid: u64,
        remote_comm_id: u32,
        local_comm_id: u32,
        reason: RejReason,
        which: u8,
    ) {
        let m = ConnectReject {
            hdr: MadHdr::cm(attr::REJ, tid),
            local_comm_id,
            remote_comm_id,
            message_rejected: which,
            reason,
            ..Default::default()
        };
        self.send_limited(now, to, emit(|b| m.emit(b)));
    }

    fn on_req(&mut self, now: Instant, src: MadAddr, r: &ConnectRequest, raw: &[u8]) -> bool {
        // Duplicate: same remote comm ID from the same CA.
        let dup = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.passive
                    && c.remote_comm_id == r.local_comm_id
                    && c.remote_ca_guid == r.local_ca_guid
            })
            .map(|(&id, _)| id);
        if let Some(id) = dup {
            let c = self.conns.get_mut(&id).expect("present");
            match c.state {
                ConnState::ReqRcvd | ConnState::MraReqSent => {
                    // Still waiting for the consumer: ask for more time (rdma_cm's delayed MRA).
                    let m = MessageReceiptAck {
                        hdr: MadHdr::cm(attr::MRA, c.tid),
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        message_mraed: mra::mraed::REQ,
                        service_timeout: MRA_SERVICE_TIMEOUT,
                        ..Default::default()
                    };
                    c.state = ConnState::MraReqSent;
                    let bytes = emit(|b| m.emit(b));
                    c.last_reply = Some(bytes);
                    let peer = c.peer;
                    self.send_limited(now, peer, bytes);
                }
                ConnState::RepSent | ConnState::MraRepRcvd => {
                    if let Some(r) = c.retry.as_ref() {
                        let (d, m) = (r.dest, r.mad);
                        self.send_limited(now, d, m);
                    }
                }
                ConnState::TimeWait => {
                    let (peer, tid, rc) = (c.peer, c.tid, c.remote_comm_id);
                    self.issue_rej(now, peer, tid, rc, id, RejReason::StaleConn, rejected::REQ);
                }
                _ => {}
            }
            return true;
        }
        if r.transport_service_type != req::transport::RC {
            self.issue_rej(
                now,
                src,
                r.hdr.tid,
                r.local_comm_id,
                0,
                RejReason::InvalidTransportType,
                rejected::REQ,
            );
            return true;
        }
        if !self.listeners.contains_key(&r.service_id) {
            // As `cm_issue_rej` does: the REJ's comm IDs are the REQ's first two words swapped.
            let word1 = u32::from_be_bytes([raw[28], raw[29], raw[30], raw[31]]);
            self.issue_rej(
                now,
                src,
                r.hdr.tid,
                r.local_comm_id,
                word1,
                RejReason::InvalidServiceId,
                rejected::REQ,
            );
            return true;
        }
        let (cma, user): (Option<CmaHdr>, Vec<u8>) = match service_id::split(r.service_id) {
            Some((PortSpace::Tcp | PortSpace::Udp | PortSpace::Ipoib, _)) => {
                let (h, rest) = r.cma_hdr();
                if !h.is_valid() {
                    // rdma_cm refuses the request: REJ consumer defined, no data.
                    self.issue_rej(
                        now,
                        src,
                        r.hdr.tid,
                        r.local_comm_id,
                        0,
                        RejReason::ConsumerDefined,
                        rejected::REQ,
                    );
                    return true;
                }
                (Some(h), rest.to_vec())
            }
            _ => (None, r.private_data.0.to_vec()),
        };
        let id = self.new_comm_id();
        let ack = r.primary_path.local_ack_timeout.min(PEER_ACK_TIMEOUT_MAX);
        let (timeout, max_retries) = peer_rep_timers(r.local_cm_response_timeout, r.max_cm_retries);
        self.conns.insert(
            id,
            Conn {
                state: ConnState::ReqRcvd,
                passive: true,
                peer: src,
                remote_comm_id: r.local_comm_id,
                remote_ca_guid: r.local_ca_guid,
                local_qpn: 0,
                remote_qpn: r.local_qpn,
                tid: r.hdr.tid,
                dreq_tid: 0,
                timeout,
                max_retries,
                timewait: iba_time(ack),
                retry: None,
                timewait_until: None,
                last_reply: None,
                give_up_at: None,
            },
        );
        let _ = now;
        self.events
            .push_back(CmEvent::ConnectRequest(ConnectRequestInfo {
                id: CmId(id),
                service_id: r.service_id,
                peer: src,
                remote_comm_id: r.local_comm_id,
                remote_ca_guid: r.local_ca_guid,
                remote_qpn: r.local_qpn,
                remote_psn: r.starting_psn,
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry_count,
                path_mtu: Mtu::from_enum(r.path_mtu as u32),
                srq: r.srq,
                flow_control: r.end_to_end_flow_control,
                primary_path: r.primary_path,
                cma,
                private_data: user,
            }));
        true
    }

    fn on_rep(&mut self, now: Instant, _src: MadAddr, r: &ConnectReply) -> bool {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else {
            return false;
        };
        if c.passive {
            return false;
        }
        match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {}
            ConnState::Established if c.remote_comm_id == r.local_comm_id => {
                // Our RTU was lost: send it again.
                if let Some(b) = c.last_reply {
                    let peer = c.peer;
                    self.send_limited(now, peer, b);
                }
                return true;
            }
            _ => return false,
        }
        let id = r.remote_comm_id;
        c.retry = None;
        c.remote_comm_id = r.local_comm_id;
        c.remote_ca_guid = r.local_ca_guid;
        c.remote_qpn = r.local_qpn;
        if r.local_qpn == 0 {
            let m = ConnectReject {
                hdr: MadHdr::cm(attr::REJ, c.tid),
                local_comm_id: id,
                remote_comm_id: r.local_comm_id,
                message_rejected: rejected::REP,
                reason: RejReason::ConsumerDefined,
                ..Default::default()
            };
            let peer = c.peer;
            self.conns.remove(&id);
            self.send(peer, emit(|b| m.emit(b)));
            self.events
                .push_back(CmEvent::ConnectError { id: CmId(id) });
            return true;
        }
        let m = ReadyToUse {
            hdr: MadHdr::cm(attr::RTU, c.tid),
            local_comm_id: id,
            remote_comm_id: r.local_comm_id,
            ..Default::default()
        };
        let bytes = emit(|b| m.emit(b));
        c.last_reply = Some(bytes);
        c.state = ConnState::Established;
        let peer = c.peer;
        let _ = now;
        self.send(peer, bytes);
        self.events.push_back(CmEvent::Established {
            id: CmId(id),
            info: EstablishedInfo {
                remote_comm_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                remote_psn: r.starting_psn,
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                rnr_retry_count: r.rnr_retry_count,
                srq: r.srq,
                private_data: r.private_data.0.to_vec(),
            },
        });
        true
    }

    /// The connection `local` whose peer is `remote`.
    fn conn_pair(&mut self, local: u32, remote: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(&local)
            .filter(|c| c.remote_comm_id == remote)
    }

    fn on_rtu(&mut self, r: &ReadyToUse) -> bool {
        let Some(c) = self.conn_pair(r.remote_comm_id, r.local_comm_id) else {
            return false;
        };
        if !c.passive || !matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd) {
            return false;
        }
        c.state = ConnState::Established;
        c.retry = None;
        let info = EstablishedInfo {
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            remote_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 0,
            srq: false,
            private_data: r.private_data.0.to_vec(),
        };
        self.events.push_back(CmEvent::Established {
            id: CmId(r.remote_comm_id),
            info,
        });
        true
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

    fn on_mra(&mut self, now: Instant, m: &MessageReceiptAck) -> bool {
        let Some(c) = self.conns.get_mut(&m.remote_comm_id) else {
            return false;
        };
        let ok = match (m.message_mraed, c.state) {
            (mra::mraed::REQ, ConnState::ReqSent) => {
                c.state = ConnState::MraReqRcvd;
                true
            }
            (mra::mraed::REP, ConnState::RepSent) if c.remote_comm_id == m.local_comm_id => {
                c.state = ConnState::MraRepRcvd;
                true
            }
            // As Linux: only the first MRA extends the wait (a stream of MRAs cannot hold
            // the connection forever).
            (mra::mraed::REQ, ConnState::MraReqRcvd) => return true,
            (mra::mraed::REP, ConnState::MraRepRcvd) if c.remote_comm_id == m.local_comm_id => {
                return true
            }
            _ => false,
        };
        if !ok {
            return false;
        }
        let extra = iba_time(m.service_timeout.min(MRA_SERVICE_TIMEOUT_MAX)) + c.timewait;
        if let Some(r) = c.retry.as_mut() {
            r.timeout = extra;
            r.deadline = now + extra;
        }
        true
    }

    fn on_dreq(&mut self, now: Instant, src: MadAddr, d: &DisconnectRequest) -> bool {
        let known = self
            .conns
            .get(&d.remote_comm_id)
            .is_some_and(|c| c.remote_comm_id == d.local_comm_id);
        if !known {
            // Answer anyway, so a peer that lost us stops retrying (`cm_issue_drep`).
            let m = DisconnectReply {
                hdr: MadHdr::cm(attr::DREP, d.hdr.tid),
                local_comm_id: d.remote_comm_id,
                remote_comm_id: d.local_comm_id,
                ..Default::default()
            };
            self.send_limited(now, src, emit(|b| m.emit(b)));
            return true;
        }
        let id = d.remote_comm_id;
        let c = self.conns.get_mut(&id).expect("present");
        if d.remote_qpn_eecn != c.local_qpn {
            return false;
        }
        match c.state {
            ConnState::Established
            | ConnState::DreqSent
            | ConnState::RepSent
            | ConnState::MraRepRcvd => {
                c.retry = None;
                c.state = ConnState::DreqRcvd;
                c.dreq_tid = d.hdr.tid;
                self.events.push_back(CmEvent::Disconnected {
                    id: CmId(id),
                    private_data: d.private_data.0.to_vec(),
                });
            }
            ConnState::TimeWait => {
                // Our DREP was lost: send it again.
                if let Some(b) = c.last_reply.filter(|b| b[17] == attr::DREP as u8) {
                    let peer = c.peer;
                    self.send_limited(now, peer, b);
                } else {
                    let m = DisconnectReply {
                        hdr: MadHdr::cm(attr::DREP, d.hdr.tid),
                        local_comm_id: id,
                        remote_comm_id: d.local_comm_id,
                        ..Default::default()
                    };
                    let peer = c.peer;
                    self.send_limited(now, peer, emit(|b| m.emit(b)));
                }
            }
            _ => {}
        }
        true
    }

    fn on_drep(&mut self, now: Instant, d: &DisconnectReply) -> bool {
        let Some(c) = self.conn_pair(d.remote_comm_id, d.local_comm_id) else {
            return false;
        };
        if c.state != ConnState::DreqSent {
            return false;
        }
        Self::enter_timewait(c, now);
        self.events.push_back(CmEvent::Disconnected {
            id: CmId(d.remote_comm_id),
            private_data: d.private_data.0.to_vec(),
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
