//! The passive side of a connection: a REQ received (duplicates answered with MRA, REJ or the
//! REP again), [`CmManager::accept`], [`CmManager::reject`] / [`CmManager::refuse`], and the RTU
//! or the first packet that establishes it.

use super::timers::MRA_SERVICE_TIMEOUT;
use super::*;

impl CmManager {
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
    /// listener any more): the REJ goes through the rate limit ([`crate::cm::ratelimit`]), so a
    /// REQ flood does not make us a reflector. The connection is forgotten either way.
    pub fn refuse(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        self.reject_inner(Some(now), id, &[])
    }

    pub(super) fn reject_inner(
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
        let info = Self::establish_passive(c, Vec::new());
        self.events.push_back(CmEvent::Established { id, info });
        Ok(())
    }

    /// REP_SENT (or MRA_REP_RCVD) to ESTABLISHED: what the passive side reports. The REP's
    /// values are the consumer's own, so only the peer's IDs and `private_data` are filled in.
    fn establish_passive(c: &mut Conn, private_data: Vec<u8>) -> EstablishedInfo {
        c.state = ConnState::Established;
        c.retry = None;
        EstablishedInfo {
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            remote_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 0,
            srq: false,
            private_data,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue_rej(
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

    pub(super) fn on_req(
        &mut self,
        now: Instant,
        src: MadAddr,
        r: &ConnectRequest,
        raw: &[u8],
    ) -> bool {
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
            if self.park_unclaimed(now, src, r, raw) {
                return true;
            }
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
                unclaimed_until: None,
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

    pub(super) fn on_rtu(&mut self, r: &ReadyToUse) -> bool {
        let Some(c) = self.conn_pair(r.remote_comm_id, r.local_comm_id) else {
            return false;
        };
        if !c.passive || !matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd) {
            return false;
        }
        let info = Self::establish_passive(c, r.private_data.0.to_vec());
        self.events.push_back(CmEvent::Established {
            id: CmId(r.remote_comm_id),
            info,
        });
        true
    }
}
