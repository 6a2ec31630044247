//! Service ID Resolution (IBA 12.11) in the sans-IO [`CmManager`], as Linux `ib_cm`
//! (`ib_send_cm_sidr_req`, `cm_sidr_req_handler`, `ib_send_cm_sidr_rep`, `cm_sidr_rep_handler`)
//! and rdma_cm's UDP port space (`cma_resolve_ib_udp`, `cma_send_sidr_rep`) use it.
//!
//! * Active: [`CmManager::sidr_request`] sends a SIDR_REQ whose request ID is the new id and whose
//!   TID is `linux_tid(hi_tid, id)`; it is resent every `timeout` up to `max_retries` times, then
//!   [`CmEvent::SidrTimeout`] (rdma_cm: UNREACHABLE). A SIDR_REP with the same request ID and TID
//!   ends it with [`CmEvent::SidrReply`]; any other SIDR_REP is dropped.
//! * Passive: a SIDR_REQ for a listened Service ID is reported as [`CmEvent::SidrRequest`] and
//!   answered with [`CmManager::sidr_reply`]; nobody listening → SIDR_REP status
//!   [`status::UNSUPPORTED`] at once. A duplicate (same peer, request ID) while the consumer has
//!   not answered is ignored; after the answer, the same SIDR_REP is sent again for
//!   [`SIDR_REPLY_LINGER`].
//!
//! Limits on the passive side (forged SIDR_REQs cost nothing to send):
//! * At most the listener's backlog ([`CmManager::listen_with_backlog`]) of requests wait for
//!   the consumer at a time. Another one is answered with SIDR_REP status
//!   [`status::REJECT`] and not reported, as Linux does: the ucma event handler fails with
//!   `-ENOMEM` when the listener's backlog is used up, and `cm_sidr_req_handler` then destroys
//!   the new id, whose `cm_destroy_id` answers a request in `IB_CM_SIDR_REQ_RCVD` with
//!   `IB_SIDR_REJECT` (for a REQ the same `-ENOMEM` drops it silently instead). That answer,
//!   like every stateless one, goes through the rate limit of [`super::ratelimit`].
//! * A request the consumer does not answer within [`SIDR_REQUEST_LIFETIME`] is forgotten
//!   ([`CmEvent::SidrRequestExpired`]); a later [`CmManager::sidr_reply`] on it fails with
//!   [`CmError::UnknownId`].
//! * Sent replies linger for duplicates at most [`SIDR_LINGER_MAX`] at a time (the oldest goes
//!   first).
//! * Duplicates are found by a hash map keyed by (peer, request ID); expiry walks queues in
//!   deadline order, so nothing scans the whole table.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::mad::{attr, linux_tid, MadHdr, MAD_LEN};
use super::manager::{iba_time, CmError, CmEvent, CmId, CmManager, MadAddr};
use super::private_data::{CmaHdr, CMA_HDR_LEN};
use super::service_id::{self, PortSpace};
use super::sidr::{self, status, SidrReply, SidrRequest};
use super::PrivateData;

/// rdma_cm's Q_Key for the UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// How long a passive side keeps a sent SIDR_REP to answer duplicates (a timewait-like delay:
/// rdma_cm's CM response timeout 20, about 4 s).
pub const SIDR_REPLY_LINGER: Duration = Duration::from_millis(4096);

/// How long a SIDR request may wait for the consumer's answer before it is forgotten: 16 s,
/// four of rdma_cm's SIDR_REQ retransmission intervals (`iba_time(20)`), a quarter of its whole
/// retry budget (16 sends over 66 s). Long enough for a busy consumer; short enough that a
/// flood that filled the backlog stops denying service 16 s after it ends. Linux keeps an
/// unanswered request until the consumer destroys its id.
pub const SIDR_REQUEST_LIFETIME: Duration = Duration::from_secs(16);

/// The most sent SIDR_REPs kept for duplicates at a time; a new one pushes out the oldest.
pub const SIDR_LINGER_MAX: usize = 1024;

/// SIDR_REP status (IBA Table 121).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SidrStatus {
    Ok,
    Unsupported,
    Reject,
    NoQp,
    Redirect,
    UnsupportedVersion,
    /// A value outside the table.
    Other(u8),
}

impl SidrStatus {
    pub fn code(self) -> u8 {
        match self {
            SidrStatus::Ok => status::SUCCESS,
            SidrStatus::Unsupported => status::UNSUPPORTED,
            SidrStatus::Reject => status::REJECT,
            SidrStatus::NoQp => status::NO_QP,
            SidrStatus::Redirect => status::REDIRECT,
            SidrStatus::UnsupportedVersion => status::UNSUPPORTED_VERSION,
            SidrStatus::Other(c) => c,
        }
    }

    pub fn from_code(c: u8) -> Self {
        match c {
            status::SUCCESS => SidrStatus::Ok,
            status::UNSUPPORTED => SidrStatus::Unsupported,
            status::REJECT => SidrStatus::Reject,
            status::NO_QP => SidrStatus::NoQp,
            status::REDIRECT => SidrStatus::Redirect,
            status::UNSUPPORTED_VERSION => SidrStatus::UnsupportedVersion,
            c => SidrStatus::Other(c),
        }
    }
}

/// Parameters of [`CmManager::sidr_request`].
#[derive(Clone, Debug)]
pub struct SidrParams {
    pub service_id: u64,
    /// The passive side's GSI address.
    pub remote: MadAddr,
    /// rdma_cm's IP header, put at the front of the private data.
    pub cma: Option<CmaHdr>,
    /// At most 216 bytes, 180 with `cma`.
    pub private_data: Vec<u8>,
    /// Time to wait for the SIDR_REP before resending (rdma_cm: `iba_time(20)`).
    pub timeout: Duration,
    /// Resends before giving up (rdma_cm: 15).
    pub max_retries: u8,
}

impl SidrParams {
    /// rdma_cm's UDP port space resolution (`cma_resolve_ib_udp`) of `dst_port` on `remote`.
    pub fn rdma_cm_udp(remote: MadAddr, cma: CmaHdr, dst_port: u16, private_data: Vec<u8>) -> Self {
        SidrParams {
            service_id: PortSpace::Udp.service_id(dst_port),
            remote,
            cma: Some(cma),
            private_data,
            timeout: iba_time(20),
            max_retries: 15,
        }
    }
}

/// A SIDR_REQ that matched a listener, as [`CmEvent::SidrRequest`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRequestInfo {
    /// Answer with [`CmManager::sidr_reply`] on this id.
    pub id: CmId,
    pub service_id: u64,
    pub peer: MadAddr,
    pub request_id: u32,
    /// The rdma_cm header, when the Service ID is an rdma_cm IP one and the header is valid.
    pub cma: Option<CmaHdr>,
    /// The consumer's private data (after the rdma_cm header, if any).
    pub private_data: Vec<u8>,
    pub pkey: u16,
}

struct ActiveSidr {
    dest: MadAddr,
    tid: u64,
    mad: [u8; MAD_LEN],
    timeout: Duration,
    deadline: Instant,
    left: u8,
}

struct PassiveSidr {
    peer: MadAddr,
    request_id: u32,
    tid: u64,
    service_id: u64,
    /// When an unanswered request is forgotten, or a sent reply stops lingering.
    until: Instant,
    /// The SIDR_REP sent.
    reply: Option<[u8; MAD_LEN]>,
}

/// SIDR state a [`CmManager`] owns.
#[derive(Default)]
pub(super) struct SidrTable {
    active: HashMap<u32, ActiveSidr>,
    passive: HashMap<u32, PassiveSidr>,
    /// (peer, request ID) → local id, for duplicates.
    by_peer: HashMap<(MadAddr, u32), u32>,
    /// Unanswered requests per Service ID (checked against the listener's backlog).
    pending_by_sid: HashMap<u64, usize>,
    /// Unanswered requests, oldest first: (until, id). Entries answered since are skipped.
    pending_q: VecDeque<(Instant, u32)>,
    /// Lingering replies, oldest first: (until, id).
    linger_q: VecDeque<(Instant, u32)>,
    /// Lingering replies (≤ [`SIDR_LINGER_MAX`]).
    lingering: usize,
}

impl SidrTable {
    pub(super) fn has(&self, id: u32) -> bool {
        self.active.contains_key(&id) || self.passive.contains_key(&id)
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let a = self.active.values().map(|a| a.deadline);
        // The queue fronts may name entries gone since: an early wake-up, never a late one.
        let p = self.pending_q.front().map(|e| e.0);
        let l = self.linger_q.front().map(|e| e.0);
        a.chain(p).chain(l).min()
    }

    fn pending_dec(&mut self, sid: u64) {
        if let Some(n) = self.pending_by_sid.get_mut(&sid) {
            *n -= 1;
            if *n == 0 {
                self.pending_by_sid.remove(&sid);
            }
        }
    }

    /// Forget a passive entry entirely.
    fn remove_passive(&mut self, id: u32) -> Option<PassiveSidr> {
        let p = self.passive.remove(&id)?;
        self.by_peer.remove(&(p.peer, p.request_id));
        if p.reply.is_none() {
            self.pending_dec(p.service_id);
        } else {
            self.lingering -= 1;
        }
        Some(p)
    }
}

impl CmManager {
    /// SIDR requests received and not answered yet (all listeners).
    pub fn sidr_pending_len(&self) -> usize {
        self.sidr.passive.len() - self.sidr.lingering
    }

    /// SIDR requests received and not answered yet for `service_id`.
    pub fn sidr_pending_for(&self, service_id: u64) -> usize {
        self.sidr
            .pending_by_sid
            .get(&service_id)
            .copied()
            .unwrap_or(0)
    }

    /// Sent SIDR_REPs kept to answer duplicates (≤ [`SIDR_LINGER_MAX`]).
    pub fn sidr_lingering_len(&self) -> usize {
        self.sidr.lingering
    }

    /// Our own SIDR requests waiting for a reply.
    pub fn sidr_active_len(&self) -> usize {
        self.sidr.active.len()
    }

    /// Send a SIDR_REQ (rdma_resolve_route + rdma_connect on a UD id). Returns the request's id,
    /// which is also its request ID on the wire.
    pub fn sidr_request(&mut self, now: Instant, p: &SidrParams) -> Result<CmId, CmError> {
        let max = if p.cma.is_some() {
            sidr::REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN
        } else {
            sidr::REQ_PRIVATE_DATA_LEN
        };
        if p.private_data.len() > max {
            return Err(CmError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        if p.max_retries > 15 {
            return Err(CmError::BadParam("max_retries is 0..=15"));
        }
        if p.timeout.is_zero() {
            return Err(CmError::BadParam("timeout"));
        }
        let data = PrivateData::<{ sidr::REQ_PRIVATE_DATA_LEN }>::with_cma(
            p.cma.as_ref(),
            &p.private_data,
        )
        .map_err(|_| CmError::BadParam("cma"))?;
        let id = self.new_comm_id();
        let tid = linux_tid(self.cfg.hi_tid, id);
        let m = SidrRequest {
            hdr: MadHdr::cm(attr::SIDR_REQ, tid),
            request_id: id,
            pkey: 0xffff,
            service_id: p.service_id,
            private_data: data,
            ..Default::default()
        };
        let mut mad = [0u8; MAD_LEN];
        m.emit(&mut mad);
        self.tx.push_back((p.remote, mad));
        self.sidr.active.insert(
            id,
            ActiveSidr {
                dest: p.remote,
                tid,
                mad,
                timeout: p.timeout,
                deadline: now + p.timeout,
                left: p.max_retries,
            },
        );
        Ok(CmId(id))
    }

    /// Answer a [`CmEvent::SidrRequest`] (rdma_accept / rdma_reject on a UD id). With
    /// [`SidrStatus::Ok`], `qpn` and `qkey` are the service's (rdma_cm: [`RDMA_UDP_QKEY`]).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: CmId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = PrivateData::<{ sidr::REP_PRIVATE_DATA_LEN }>::from_slice(private_data)
            .map_err(|_| CmError::PrivateDataTooLong {
                len: private_data.len(),
                max: sidr::REP_PRIVATE_DATA_LEN,
            })?;
        if qpn > 0x00ff_ffff {
            return Err(CmError::BadParam("qpn"));
        }
        let p = self.sidr.passive.get(&id.0).ok_or(CmError::UnknownId)?;
        if p.reply.is_some() {
            return Err(CmError::BadParam("SIDR request already answered"));
        }
        let ok = status == SidrStatus::Ok;
        let m = SidrReply {
            hdr: MadHdr::cm(attr::SIDR_REP, p.tid),
            request_id: p.request_id,
            status: status.code(),
            qpn: if ok { qpn } else { 0 },
            service_id: p.service_id,
            qkey: if ok { qkey } else { 0 },
            private_data: data,
            ..Default::default()
        };
        let mut mad = [0u8; MAD_LEN];
        m.emit(&mut mad);
        let (peer, sid) = (p.peer, p.service_id);
        // Make room in the linger list: the oldest reply goes.
        while self.sidr.lingering >= SIDR_LINGER_MAX {
            let Some((t, old)) = self.sidr.linger_q.pop_front() else {
                break;
            };
            if self
                .sidr
                .passive
                .get(&old)
                .is_some_and(|o| o.reply.is_some() && o.until == t)
            {
                self.sidr.remove_passive(old);
                self.stats.sidr_linger_evicted += 1;
            }
        }
        let until = now + SIDR_REPLY_LINGER;
        let p = self.sidr.passive.get_mut(&id.0).expect("checked");
        p.reply = Some(mad);
        p.until = until;
        self.sidr.pending_dec(sid);
        self.sidr.lingering += 1;
        self.sidr.linger_q.push_back((until, id.0));
        self.tx.push_back((peer, mad));
        Ok(())
    }

    /// Resend SIDR_REQs, give up on those out of retries, forget lingering SIDR_REPs.
    pub(super) fn sidr_handle_timeout(&mut self, now: Instant) {
        let mut ids: Vec<u32> = self.sidr.active.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(a) = self.sidr.active.get_mut(&id) else {
                continue;
            };
            if a.deadline > now {
                continue;
            }
            if a.left > 0 {
                a.left -= 1;
                a.deadline = now + a.timeout;
                self.tx.push_back((a.dest, a.mad));
            } else {
                self.sidr.active.remove(&id);
                self.events.push_back(CmEvent::SidrTimeout { id: CmId(id) });
            }
        }
        // Unanswered requests past their lifetime, oldest first.
        while let Some(&(t, id)) = self.sidr.pending_q.front() {
            if t > now {
                break;
            }
            self.sidr.pending_q.pop_front();
            let live = self
                .sidr
                .passive
                .get(&id)
                .is_some_and(|p| p.reply.is_none() && p.until == t);
            if live {
                self.sidr.remove_passive(id);
                self.stats.sidr_expired += 1;
                self.events
                    .push_back(CmEvent::SidrRequestExpired { id: CmId(id) });
            }
        }
        // Lingering replies past their linger.
        while let Some(&(t, id)) = self.sidr.linger_q.front() {
            if t > now {
                break;
            }
            self.sidr.linger_q.pop_front();
            let live = self
                .sidr
                .passive
                .get(&id)
                .is_some_and(|p| p.reply.is_some() && p.until == t);
            if live {
                self.sidr.remove_passive(id);
            }
        }
    }

    pub(super) fn on_sidr_req(&mut self, now: Instant, src: MadAddr, r: &SidrRequest) -> bool {
        if let Some(id) = self.sidr.by_peer.get(&(src, r.request_id)) {
            // Duplicate: ignored while the consumer decides, answered again afterwards.
            self.stats.sidr_duplicates += 1;
            if let Some(mad) = self.sidr.passive.get(id).and_then(|p| p.reply) {
                self.send_limited(now, src, mad);
            }
            return true;
        }
        let refuse = |st: u8| {
            let m = SidrReply {
                hdr: MadHdr::cm(attr::SIDR_REP, r.hdr.tid),
                request_id: r.request_id,
                status: st,
                service_id: r.service_id,
                ..Default::default()
            };
            let mut mad = [0u8; MAD_LEN];
            m.emit(&mut mad);
            mad
        };
        let Some(&backlog) = self.listeners.get(&r.service_id) else {
            self.send_limited(now, src, refuse(status::UNSUPPORTED));
            return true;
        };
        if self.sidr_pending_for(r.service_id) >= backlog {
            // Over the backlog: SIDR_REP "reject", as Linux (see the module docs).
            self.stats.sidr_over_backlog += 1;
            self.send_limited(now, src, refuse(status::REJECT));
            return true;
        }
        let (cma, user): (Option<CmaHdr>, Vec<u8>) = match service_id::split(r.service_id) {
            Some((PortSpace::Tcp | PortSpace::Udp | PortSpace::Ipoib, _)) => {
                let (h, rest) = r.cma_hdr();
                if h.is_valid() {
                    (Some(h), rest.to_vec())
                } else {
                    (None, r.private_data.0.to_vec())
                }
            }
            _ => (None, r.private_data.0.to_vec()),
        };
        let id = self.new_comm_id();
        let until = now + SIDR_REQUEST_LIFETIME;
        self.sidr.passive.insert(
            id,
            PassiveSidr {
                peer: src,
                request_id: r.request_id,
                tid: r.hdr.tid,
                service_id: r.service_id,
                until,
                reply: None,
            },
        );
        self.sidr.by_peer.insert((src, r.request_id), id);
        *self.sidr.pending_by_sid.entry(r.service_id).or_insert(0) += 1;
        self.sidr.pending_q.push_back((until, id));
        // Answered requests leave stale queue entries until their time; keep the queue within
        // a constant factor of the live ones.
        let live = self.sidr_pending_len();
        if self.sidr.pending_q.len() > 2 * live + 64 {
            let passive = &self.sidr.passive;
            self.sidr.pending_q.retain(|&(t, id)| {
                passive
                    .get(&id)
                    .is_some_and(|p| p.reply.is_none() && p.until == t)
            });
        }
        self.events.push_back(CmEvent::SidrRequest(SidrRequestInfo {
            id: CmId(id),
            service_id: r.service_id,
            peer: src,
            request_id: r.request_id,
            cma,
            private_data: user,
            pkey: r.pkey,
        }));
        true
    }

    pub(super) fn on_sidr_rep(&mut self, r: &SidrReply) -> bool {
        let matches = self
            .sidr
            .active
            .get(&r.request_id)
            .is_some_and(|a| a.tid == r.hdr.tid);
        if !matches {
            return false;
        }
        self.sidr.active.remove(&r.request_id);
        let st = SidrStatus::from_code(r.status);
        self.events.push_back(CmEvent::SidrReply {
            id: CmId(r.request_id),
            status: st,
            qpn: r.qpn,
            qkey: r.qkey,
            private_data: r.private_data.0.to_vec(),
        });
        true
    }
}
