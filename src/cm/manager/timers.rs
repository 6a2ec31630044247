//! Time: IBA timeouts, the clamps on timers a peer sets, retransmission of the messages that
//! wait for an answer, MRAs that extend the wait, and timewait's end.

use super::*;

/// `cm_convert_to_ms`: 4.096 µs × 2^t, approximated as 2^(t-8) ms.
pub fn iba_time(t: u8) -> Duration {
    Duration::from_millis(1u64 << (t as u32).saturating_sub(8).min(31))
}

/// rdma_cm's delayed MRA service timeout (`CMA_CM_MRA_SETTING` without the delay flag).
pub(super) const MRA_SERVICE_TIMEOUT: u8 = 24;

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

/// The REP retransmission timeout and retry count a REQ's fields give, clamped
/// ([`PEER_CM_RESPONSE_TIMEOUT_MAX`], [`PEER_HOLD_MAX`]).
pub fn peer_rep_timers(local_cm_response_timeout: u8, max_cm_retries: u8) -> (Duration, u8) {
    let timeout = iba_time(local_cm_response_timeout.min(PEER_CM_RESPONSE_TIMEOUT_MAX));
    let sends = (PEER_HOLD_MAX.as_millis() / timeout.as_millis().max(1)).max(1);
    let retries = (max_cm_retries.min(15) as u128).min(sends - 1) as u8;
    (timeout, retries)
}

impl CmManager {
    pub(super) fn send_with_retry(
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
            .chain(self.unclaimed_timeout())
            .min()
    }

    /// Retransmit MADs whose timeout passed, give up on those out of retries, end timewaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.sidr_handle_timeout(now);
        self.unclaimed_handle_timeout(now);
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

    pub(super) fn on_mra(&mut self, now: Instant, m: &MessageReceiptAck) -> bool {
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
}
