//! Disconnection: DREQ and DREP, sent and received, and timewait.

use super::*;

impl CmManager {
    /// What Linux does for a process's connections when it exits without tearing them down
    /// (its rdma_cm fd is closed and every id destroyed): a DREQ for each established one, a
    /// DREP for each whose DREQ is unanswered. Sent once each; returns how many.
    pub fn disconnect_all(&mut self, now: Instant) -> usize {
        let mut ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.state, ConnState::Established | ConnState::DreqRcvd))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter(|&id| self.disconnect(now, CmId(id), &[]).is_ok())
            .count()
    }

    /// The established connections: (local comm ID, remote comm ID, remote QPN, peer), in comm
    /// ID order. A context sharing its address records them, so that a survivor can
    /// disconnect them in its name if it dies (`driver::share::conns`).
    pub fn established(&self) -> Vec<(u32, u32, u32, MadAddr)> {
        let mut v: Vec<(u32, u32, u32, MadAddr)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == ConnState::Established)
            .map(|(&id, c)| (id, c.remote_comm_id, c.remote_qpn, c.peer))
            .collect();
        v.sort_unstable_by_key(|c| c.0);
        v
    }

    /// Send a DREQ for a connection of another context on this address that died without
    /// tearing it down (its comm ID `local_comm_id`, the peer's `remote_comm_id` and
    /// `remote_qpn`), as Linux does when a process's rdma_cm file closes. Nothing is kept: the
    /// peer's DREP goes to the dead context's comm ID, which nobody owns.
    pub fn disconnect_for_dead(
        &mut self,
        peer: MadAddr,
        local_comm_id: u32,
        remote_comm_id: u32,
        remote_qpn: u32,
    ) {
        let m = DisconnectRequest {
            hdr: MadHdr::cm(attr::DREQ, linux_tid(self.cfg.hi_tid, local_comm_id)),
            local_comm_id,
            remote_comm_id,
            remote_qpn_eecn: remote_qpn,
            ..Default::default()
        };
        self.send(peer, emit(|b| m.emit(b)));
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

    pub(super) fn enter_timewait(c: &mut Conn, now: Instant) {
        c.state = ConnState::TimeWait;
        c.retry = None;
        c.timewait_until = Some(now + c.timewait);
    }

    pub(super) fn on_dreq(&mut self, now: Instant, src: MadAddr, d: &DisconnectRequest) -> bool {
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

    pub(super) fn on_drep(&mut self, now: Instant, d: &DisconnectReply) -> bool {
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
