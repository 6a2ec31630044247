//! The completer (rxe_comp.c): handles ACKs, NAKs, READ responses and atomic ACKs; retires send
//! WQEs in order and produces their completions; keeps the retry and RNR retry counters. It
//! never touches timers or QP state itself: it returns a [`CompAction`] for the QP to carry out.

use crate::transport::memory::{scatter, MemoryAccess};
use crate::transport::types::*;
use crate::wire::{Kind, NakCode, OpInfo, Packet, Psn, Syndrome};

use super::requester::{Requester, SendEntry};

/// What the QP must do after the completer handled a packet or a timeout.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CompAction {
    None,
    /// Go back and retransmit from this PSN now.
    Retry(Psn),
    /// Wait this many microseconds (RNR NAK), then retransmit from the PSN.
    RnrWait(Psn, u64),
    /// The oldest WQE fails with this status; the QP goes to ERR and the rest is flushed.
    Fatal(WcStatus),
}

/// The result of one completer step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct CompResult {
    /// Some PSN was acknowledged (the retransmit timer restarts, retry counters reset).
    pub progress: bool,
    pub action: CompAction,
}

impl CompResult {
    const NOTHING: CompResult = CompResult {
        progress: false,
        action: CompAction::None,
    };
}

/// Where a completer step's results go: the completions of the send WQEs it retires
/// (signaled ones, or all with `sig_all`), and whether it acknowledged any PSN.
struct Sink<'a> {
    sig_all: bool,
    out: &'a mut dyn FnMut(Completion),
    progress: bool,
}

/// The completer's errors (rxe `COMPST_ERROR`): each fails the oldest send WQE.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CompError {
    /// A NAK from the responder (IBA 9.7.5.2.2..4).
    Nak(NakCode),
    /// A READ response or atomic result the local buffer cannot take.
    LocalProt,
    /// The RNR retry count ran out (IBA C9-148).
    RnrRetryExceeded,
    /// The retry count ran out on local ACK timeouts (IBA C9-141).
    RetryExceeded,
}

impl CompError {
    /// The one table from error to the status the WQE fails with; `None` for a NAK that fails
    /// nothing (a PSN sequence error goes back instead; a reserved code is ignored).
    fn status(self) -> Option<WcStatus> {
        use NakCode::*;
        Some(match self {
            CompError::Nak(InvalidRequest) => WcStatus::RemInvReqErr,
            CompError::Nak(RemoteAccessError) => WcStatus::RemAccessErr,
            CompError::Nak(RemoteOperationalError) => WcStatus::RemOpErr,
            CompError::Nak(InvalidRdRequest) => WcStatus::RemInvRdReqErr,
            CompError::Nak(PsnSequenceError | Reserved(_)) => return None,
            CompError::LocalProt => WcStatus::LocProtErr,
            CompError::RnrRetryExceeded => WcStatus::RnrRetryExcErr,
            CompError::RetryExceeded => WcStatus::RetryExcErr,
        })
    }

    /// The QP fails the oldest WQE with [`CompError::status`] and goes to ERR.
    fn action(self) -> CompAction {
        self.status().map_or(CompAction::None, CompAction::Fatal)
    }
}

/// Retry counters and go-back state.
#[derive(Debug, Default)]
pub(crate) struct Completer {
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    retry_left: u8,
    rnr_left: u8,
    /// The PSN of the last sequence-error go-back, until progress: a duplicated NAK for the
    /// same PSN must not start a second go-back.
    goback: Option<Psn>,
}

impl Completer {
    pub(crate) fn set_counters(&mut self, retry_cnt: u8, rnr_retry: u8) {
        self.retry_cnt = retry_cnt;
        self.rnr_retry = rnr_retry;
        self.reset_counters();
    }

    fn reset_counters(&mut self) {
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.goback = None;
    }

    fn on_progress(&mut self, o: &mut Sink<'_>) {
        o.progress = true;
        self.reset_counters();
    }

    /// The local ACK timer expired (IBA 9.7.6.1.3): retransmit from the oldest unacknowledged
    /// PSN, or fail with RETRY_EXC_ERR when the retry count is exhausted (IBA C9-141).
    pub(crate) fn on_timeout(&mut self, req: &Requester) -> CompAction {
        if !req.outstanding() {
            return CompAction::None;
        }
        if self.retry_left == 0 {
            return CompError::RetryExceeded.action();
        }
        self.retry_left -= 1;
        self.goback = None;
        CompAction::Retry(req.una)
    }

    /// Acknowledge every PSN up to and including `n` (IBA 9.7.5.1.4: ACKs are cumulative).
    /// Returns the PSN to retry from if `n` passes a READ or atomic whose response never came
    /// (IBA 9.7.5.1.3 implied NAK; rxe check_psn).
    fn ack_through(&mut self, req: &mut Requester, n: Psn, o: &mut Sink<'_>) -> Option<Psn> {
        loop {
            let e = match req.sq.front() {
                Some(e) if e.started && !e.first_psn.after(n) => e,
                _ => return None,
            };
            if e.is_rd_atomic() {
                let resume = e.first_psn.add(e.resp_pkts);
                if !n.before(resume) {
                    return Some(resume);
                }
                return None;
            }
            if e.last_psn().after(n) {
                // Part of a multi-packet message acknowledged.
                let next = n.add(1);
                if next.after(req.una) {
                    req.una = next;
                    self.on_progress(o);
                }
                return None;
            }
            req.una = e.last_psn().add(1);
            self.on_progress(o);
            retire_front(req, o);
        }
    }

    /// A response-kind packet (ACK, READ response, atomic ACK) for this QP.
    ///
    /// The steps of rxe's completer: get the ACK (only a PSN that was sent can be
    /// acknowledged), [`Completer::check_psn`] for NAKs and responses, then per kind of ACK
    /// [`Completer::ack`], [`Completer::rnr_nak`], [`Completer::nak`], or [`read_data`] or
    /// [`atomic_data`] then [`Completer::complete_response`]; what completes is retired by
    /// [`retire_front`]. Errors fail the oldest WQE with the status of
    /// [`CompError::status`].
    pub(crate) fn on_packet(
        &mut self,
        req: &mut Requester,
        pkt: &Packet<'_>,
        mtu: usize,
        sig_all: bool,
        mem: &dyn MemoryAccess,
        out: &mut dyn FnMut(Completion),
    ) -> CompResult {
        let Some(info) = pkt.info() else {
            return CompResult::NOTHING;
        };
        let psn = pkt.bth.psn;
        // Only PSNs that were sent can be acknowledged.
        if !psn.before(req.sent_max) {
            return CompResult::NOTHING;
        }
        let o = &mut Sink {
            sig_all,
            out,
            progress: false,
        };
        let step = match (info.kind, pkt.aeth.map(|a| a.syndrome)) {
            (Kind::Ack, Some(Syndrome::Ack { .. })) => Ok(self.ack(req, psn, o)),
            (Kind::Ack, Some(Syndrome::RnrNak { timer })) => self
                .check_psn(req, psn, o)
                .map(|()| self.rnr_nak(req, psn, timer)),
            (Kind::Ack, Some(Syndrome::Nak(code))) => self
                .check_psn(req, psn, o)
                .map(|()| self.nak(req, psn, code, o.progress)),
            (Kind::ReadResponse, _) => self
                .check_psn(req, psn, o)
                .and_then(|()| read_data(req, pkt, info, mtu, mem))
                .map(|done| self.complete_response(req, psn, done, o)),
            (Kind::AtomicAck, _) => self
                .check_psn(req, psn, o)
                .and_then(|()| atomic_data(req, pkt, mem))
                .map(|()| self.complete_response(req, psn, true, o)),
            _ => Ok(CompAction::None),
        };
        CompResult {
            progress: o.progress,
            action: match step {
                Ok(a) | Err(a) => a,
            },
        }
    }

    /// rxe `check_psn` for a NAK or a response: one for a PSN before the oldest unacknowledged
    /// one is stale; one after it acknowledges every PSN before it (IBA 9.7.5.1.2, 9.7.5.1.4),
    /// which may show a READ or atomic whose response never came (implied NAK). `Err`: stop,
    /// with that action.
    fn check_psn(
        &mut self,
        req: &mut Requester,
        psn: Psn,
        o: &mut Sink<'_>,
    ) -> Result<(), CompAction> {
        if psn.before(req.una) {
            return Err(CompAction::None);
        }
        if psn.after(req.una) {
            if let Some(from) = self.ack_through(req, psn.sub(1), o) {
                return Err(self.implied_nak(from));
            }
        }
        Ok(())
    }

    /// An ACK: everything through `psn` is acknowledged.
    fn ack(&mut self, req: &mut Requester, psn: Psn, o: &mut Sink<'_>) -> CompAction {
        // Duplicate or stale: nothing newer than what is already acknowledged.
        if !psn.add(1).after(req.una) {
            return CompAction::None;
        }
        match self.ack_through(req, psn, o) {
            Some(from) => self.implied_nak(from),
            None => CompAction::None,
        }
    }

    /// An RNR NAK for the oldest WQE: wait and retry, as long as the RNR retry count lasts.
    fn rnr_nak(&mut self, req: &Requester, psn: Psn, timer: u8) -> CompAction {
        // Already waiting (a duplicated RNR NAK): one wait per NAK'd attempt.
        if req.rnr_paused || !req.sq.front().is_some_and(|e| e.contains(psn)) {
            return CompAction::None;
        }
        // IBA 9.7.5.2.8 / C9-148: RNR retry counter, 7 = infinite.
        if self.rnr_left == 0 {
            return CompError::RnrRetryExceeded.action();
        }
        if self.rnr_retry != 7 {
            self.rnr_left -= 1;
        }
        CompAction::RnrWait(psn, crate::wire::aeth::rnr_timer_micros(timer))
    }

    /// A NAK for the oldest WQE: a PSN sequence error goes back (once per PSN until
    /// progress, `progress`: this packet made some); the others fail the WQE.
    fn nak(&mut self, req: &Requester, psn: Psn, code: NakCode, progress: bool) -> CompAction {
        if !req.sq.front().is_some_and(|e| e.contains(psn)) {
            return CompAction::None;
        }
        if code != NakCode::PsnSequenceError {
            return CompError::Nak(code).action();
        }
        // IBA 9.7.5.1.2 / C9-110: go back N from the NAK'd PSN.
        if self.goback == Some(psn) && !progress {
            return CompAction::None;
        }
        self.goback = Some(psn);
        CompAction::Retry(psn)
    }

    /// A READ response or atomic ACK placed: the oldest unacknowledged PSN moves past `psn`,
    /// and the WQE completes if `done` (rxe `do_complete`).
    fn complete_response(
        &mut self,
        req: &mut Requester,
        psn: Psn,
        done: bool,
        o: &mut Sink<'_>,
    ) -> CompAction {
        req.una = psn.add(1);
        self.on_progress(o);
        if done {
            retire_front(req, o);
        }
        CompAction::None
    }

    /// A lost READ/atomic response was detected: retry from it (rxe COMPST_ERROR_RETRY).
    fn implied_nak(&mut self, from: Psn) -> CompAction {
        if self.goback == Some(from) {
            return CompAction::None;
        }
        self.goback = Some(from);
        CompAction::Retry(from)
    }
}

/// rxe `read_data`: a READ response packet, the one expected next, into the oldest WQE's
/// local buffers. Returns whether it was the READ's last; `Err`: stop, with that action.
fn read_data(
    req: &mut Requester,
    pkt: &Packet<'_>,
    info: &OpInfo,
    mtu: usize,
    mem: &dyn MemoryAccess,
) -> Result<bool, CompAction> {
    let e = match req.sq.front_mut() {
        Some(e) if e.is_read() && e.started && e.first_psn.add(e.resp_pkts) == pkt.bth.psn => e,
        // Not the response PSN expected: drop; the timer or a later ACK recovers.
        _ => return Err(CompAction::None),
    };
    let off = e.resp_pkts as usize * mtu;
    let remaining = (e.len as usize).saturating_sub(off);
    let want = remaining.min(mtu);
    let last = e.resp_pkts + 1 == e.npkts;
    let pos_ok = if last {
        info.position.ends()
    } else {
        !info.position.ends()
    };
    if pkt.payload.len() != want || !pos_ok {
        return Err(CompAction::None);
    }
    let SendEntry { wqe, .. } = &*e;
    if scatter(&wqe.sg_list, off, pkt.payload, mem).is_err() {
        return Err(CompError::LocalProt.action());
    }
    e.resp_pkts += 1;
    Ok(last)
}

/// rxe `atomic_data`: the atomic ACK of the oldest WQE; the original remote value lands in
/// its local 8-byte buffer (IBA 9.4.5). `Err`: stop, with that action.
fn atomic_data(
    req: &Requester,
    pkt: &Packet<'_>,
    mem: &dyn MemoryAccess,
) -> Result<(), CompAction> {
    let (e, orig) = match (req.sq.front(), pkt.atomic_ack_eth) {
        (Some(e), Some(a)) if e.is_atomic() && e.started && e.first_psn == pkt.bth.psn => {
            (e, a.orig)
        }
        _ => return Err(CompAction::None),
    };
    let ok = match e.wqe.sg_list.first() {
        Some(sge) => mem
            .local_write(sge.lkey, sge.addr, &orig.to_ne_bytes())
            .is_ok(),
        None => false,
    };
    if !ok {
        return Err(CompError::LocalProt.action());
    }
    Ok(())
}

/// The oldest send WQE is done: it leaves the send queue and completes successfully.
fn retire_front(req: &mut Requester, o: &mut Sink<'_>) {
    if let Some(e) = req.pop_front() {
        complete(&e, WcStatus::Success, o.sig_all, o.out);
    }
}

/// Queue the completion of a retired send WQE (signaled ones on success; all on error).
pub(crate) fn complete(
    e: &SendEntry,
    status: WcStatus,
    sig_all: bool,
    out: &mut dyn FnMut(Completion),
) {
    if status == WcStatus::Success && !(e.signaled || sig_all) {
        return;
    }
    let byte_len = if status == WcStatus::Success {
        e.len
    } else {
        0
    };
    out(Completion::send(
        e.wqe.wr_id,
        status,
        e.wc_opcode(),
        byte_len,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sim::{send_wr, VecMemory};
    use crate::wire::{Aeth, Bth, Opcode};

    fn req_with(ops: &[(SendOp, u32, bool)]) -> Requester {
        let mut req = Requester::default();
        req.reset(Psn::new(100));
        for (i, (op, len, sig)) in ops.iter().enumerate() {
            let mut w = send_wr(
                i as u64,
                *op,
                vec![Sge {
                    addr: 0,
                    length: *len,
                    lkey: 1,
                }],
            );
            w.flags.set(SendFlags::SIGNALED, *sig);
            req.sq.push_back(SendEntry::new(w, *sig, 256));
        }
        // Pretend everything was sent.
        let mut psn = req.una;
        for e in req.sq.iter_mut() {
            e.started = true;
            e.first_psn = psn;
            psn = psn.add(e.npkts);
        }
        req.max_psn = psn;
        req.sent_max = psn;
        req.next_psn = psn;
        req.idx = req.sq.len();
        req
    }

    fn ack(psn: u32, syndrome: Syndrome) -> (Bth, Aeth) {
        (
            Bth::new(Opcode::RC_ACKNOWLEDGE, 1, Psn::new(psn)),
            Aeth { syndrome, msn: 0 },
        )
    }

    fn feed(
        c: &mut Completer,
        req: &mut Requester,
        (b, a): (Bth, Aeth),
        out: &mut Vec<Completion>,
    ) -> CompResult {
        let mut p = Packet::new(b, &[]);
        p.aeth = Some(a);
        let mem = VecMemory::new();
        c.on_packet(req, &p, 256, false, &mem, &mut |x| out.push(x))
    }

    const OK: Syndrome = Syndrome::Ack { credits: 0x1f };
    const W: SendOp = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: 1,
    };

    #[test]
    fn coalesced_ack_retires_in_order() {
        // Three writes: 1, 3 and 1 packets (PSNs 100, 101..103, 104); the middle one unsignaled.
        let mut req = req_with(&[(W, 10, true), (W, 600, false), (W, 10, true)]);
        let mut c = Completer::default();
        c.set_counters(3, 3);
        let mut out = Vec::new();
        // Partial ACK inside the second message.
        let r = feed(&mut c, &mut req, ack(102, OK), &mut out);
        assert!(r.progress);
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0]);
        assert_eq!(req.una, Psn::new(103));
        // A stale ACK changes nothing.
        assert!(!feed(&mut c, &mut req, ack(101, OK), &mut out).progress);
        let r = feed(&mut c, &mut req, ack(104, OK), &mut out);
        assert!(r.progress);
        assert_eq!(
            out.iter()
                .map(|c| (c.wr_id, c.byte_len, c.opcode))
                .collect::<Vec<_>>(),
            vec![(0, 10, WcOpcode::RdmaWrite), (2, 10, WcOpcode::RdmaWrite)]
        );
        assert!(req.sq.is_empty());
        // ACKs for PSNs never sent are ignored.
        assert_eq!(
            feed(&mut c, &mut req, ack(105, OK), &mut out),
            CompResult::NOTHING
        );
    }

    #[test]
    fn ack_past_unanswered_read_retries_it() {
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        let mut req = req_with(&[(W, 10, true), (read, 600, true), (W, 10, true)]);
        let mut c = Completer::default();
        c.set_counters(3, 3);
        let mut out = Vec::new();
        // The WRITE after the READ (PSN 104) is ACKed: the READ responses (101..103) were lost.
        let r = feed(&mut c, &mut req, ack(104, OK), &mut out);
        assert_eq!(r.action, CompAction::Retry(Psn::new(101)));
        assert_eq!(out.len(), 1, "the first WRITE completes");
        // The same implied NAK again does not restart the retry.
        assert_eq!(
            feed(&mut c, &mut req, ack(104, OK), &mut out).action,
            CompAction::None
        );
    }

    #[test]
    fn naks() {
        let mut req = req_with(&[(W, 10, true), (W, 10, true), (W, 10, true)]);
        let mut c = Completer::default();
        c.set_counters(3, 1);
        let mut out = Vec::new();
        // Sequence error at 101: 100 is implicitly ACKed, go back to 101.
        let r = feed(
            &mut c,
            &mut req,
            ack(101, Syndrome::Nak(NakCode::PsnSequenceError)),
            &mut out,
        );
        assert_eq!(
            (r.progress, r.action),
            (true, CompAction::Retry(Psn::new(101)))
        );
        assert_eq!(out.len(), 1);
        assert_eq!(
            feed(
                &mut c,
                &mut req,
                ack(101, Syndrome::Nak(NakCode::PsnSequenceError)),
                &mut out
            )
            .action,
            CompAction::None
        );
        // RNR: one retry allowed, then exhausted.
        let r = feed(
            &mut c,
            &mut req,
            ack(101, Syndrome::RnrNak { timer: 1 }),
            &mut out,
        );
        assert_eq!(r.action, CompAction::RnrWait(Psn::new(101), 10));
        let r = feed(
            &mut c,
            &mut req,
            ack(101, Syndrome::RnrNak { timer: 1 }),
            &mut out,
        );
        assert_eq!(r.action, CompAction::Fatal(WcStatus::RnrRetryExcErr));
        for (code, st) in [
            (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
            (NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            (NakCode::RemoteOperationalError, WcStatus::RemOpErr),
        ] {
            let r = feed(&mut c, &mut req, ack(101, Syndrome::Nak(code)), &mut out);
            assert_eq!(r.action, CompAction::Fatal(st));
        }
    }

    #[test]
    fn timeout_counts_retries() {
        let mut req = req_with(&[(W, 10, true)]);
        let mut c = Completer::default();
        c.set_counters(2, 0);
        assert_eq!(c.on_timeout(&req), CompAction::Retry(Psn::new(100)));
        assert_eq!(c.on_timeout(&req), CompAction::Retry(Psn::new(100)));
        assert_eq!(c.on_timeout(&req), CompAction::Fatal(WcStatus::RetryExcErr));
        req.sq.clear();
        assert_eq!(c.on_timeout(&req), CompAction::None);
    }

    #[test]
    fn error_table() {
        for (e, st) in [
            (
                CompError::Nak(NakCode::InvalidRequest),
                Some(WcStatus::RemInvReqErr),
            ),
            (
                CompError::Nak(NakCode::RemoteAccessError),
                Some(WcStatus::RemAccessErr),
            ),
            (
                CompError::Nak(NakCode::RemoteOperationalError),
                Some(WcStatus::RemOpErr),
            ),
            (
                CompError::Nak(NakCode::InvalidRdRequest),
                Some(WcStatus::RemInvRdReqErr),
            ),
            (CompError::Nak(NakCode::PsnSequenceError), None),
            (CompError::Nak(NakCode::Reserved(9)), None),
            (CompError::LocalProt, Some(WcStatus::LocProtErr)),
            (CompError::RnrRetryExceeded, Some(WcStatus::RnrRetryExcErr)),
            (CompError::RetryExceeded, Some(WcStatus::RetryExcErr)),
        ] {
            assert_eq!(e.status(), st, "{e:?}");
            assert_eq!(e.action(), st.map_or(CompAction::None, CompAction::Fatal));
        }
    }
}
