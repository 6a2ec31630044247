//! The active side of a connection: the REQ ([`CmManager::connect`]) and the REP that answers
//! it, accepted with an RTU.

use super::*;

impl CmManager {
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
        let data =
            PrivateData::<{ req::PRIVATE_DATA_LEN }>::with_cma(p.cma.as_ref(), &p.private_data)
                .map_err(|_| CmError::BadParam("cma"))?;
        let id = self.new_comm_id();
        let tid = linux_tid(self.cfg.hi_tid, id);
        let ack_timeout = p.packet_life_time + 1;
        let path = PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: p.local_gid.unwrap_or(self.cfg.local_gid),
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
            private_data: data,
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
                unclaimed_until: (!self.unclaimed_wait.is_zero())
                    .then(|| now + self.unclaimed_wait),
            },
        );
        let bytes = emit(|b| m.emit(b));
        self.send_with_retry(now, id, p.remote, bytes, timeout, p.max_cm_retries);
        Ok(CmId(id))
    }

    pub(super) fn on_rep(&mut self, now: Instant, _src: MadAddr, r: &ConnectReply) -> bool {
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
}
