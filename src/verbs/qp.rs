//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send`, `ibv_post_recv`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::ah::AddressHandle;
use super::context::Shared;
use super::cq::CompletionQueue;
use super::device::{MAX_INLINE, MAX_QP, MAX_QP_WR, MAX_SGE};
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use super::srq::{SharedReceiveQueue, SrqShared};
use crate::endpoint::qp::{QpSlot, QpTransport};
use crate::transport::memory::gather_all;
use crate::transport::ud::{UdDest, UdQp};
use crate::transport::{
    MemoryAccess, PostError, QpAttr, QpCaps, QpState, RcQp, RecvWqe, SendFlags, SendOp, SendWqe,
    SgList, Sge, UcQp,
};

/// `enum ibv_qp_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QpType {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected: connected like RC (address vector, remote QPN, PSNs), with SEND,
    /// SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM only (READ and atomics are refused at
    /// post). No acknowledgements: a send completes once its packets are on the wire, and a
    /// message that loses a packet is dropped whole at the receiver, with no completion.
    Uc,
    /// Unreliable Datagram: one packet per message (at most the port's active MTU), sent to
    /// the address handle, QPN and Q_Key named in each [`UdSendWr`]; receive buffers start with
    /// [`GRH_LEN`](super::GRH_LEN) bytes that receive the GRH area.
    Ud,
}

/// `struct ibv_qp_init_attr`.
pub struct QpInitAttr<'a> {
    /// Where send completions go.
    pub send_cq: &'a CompletionQueue,
    /// Where receive completions go.
    pub recv_cq: &'a CompletionQueue,
    /// Queue capacities asked for.
    pub cap: QpCaps,
    /// The transport.
    pub qp_type: QpType,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
    /// A shared receive queue of the same protection domain to take receive WQEs from (RC, UC
    /// and UD): the QP then has no receive queue of its own (`cap.max_recv_wr` and `max_recv_sge`
    /// are ignored and granted as 0, and [`QueuePair::post_recv`] fails with EINVAL); its
    /// receive completions still go to `recv_cq`, with its own `qp_num`.
    pub srq: Option<&'a SharedReceiveQueue>,
}

impl<'a> QpInitAttr<'a> {
    /// A QP of `qp_type` whose sends and receives both complete into `cq`, with default
    /// capacities ([`QpCaps::default`]: 128 work requests and 4 SGEs each way), completions
    /// only for signaled sends, and no SRQ. Change what you need:
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.last().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(256, None)?;
    /// let attr = QpInitAttr { sq_sig_all: true, ..QpInitAttr::new(QpType::Rc, &cq) };
    /// let qp = pd.create_qp(&attr)?;
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn new(qp_type: QpType, cq: &'a CompletionQueue) -> Self {
        QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCaps::default(),
            qp_type,
            sq_sig_all: false,
            srq: None,
        }
    }
}

/// `struct ibv_send_wr` (one of a list).
#[derive(Clone, Debug)]
pub struct SendWr<'a> {
    /// Carried by the completion.
    pub wr_id: u64,
    /// The operation and its remote address, key, immediate or atomic operands.
    pub op: SendOp,
    /// The local buffers: gathered from (sends, writes) or scattered into (reads, atomics).
    pub sg_list: &'a [Sge],
    /// Signaled, solicited, fence, inline.
    pub flags: SendFlags,
}

/// `struct ibv_send_wr` for a UD QP: a SEND or SEND_WITH_IMM and its `wr.ud` destination.
#[derive(Clone, Debug)]
pub struct UdSendWr<'a> {
    /// Carried by the completion.
    pub wr_id: u64,
    /// `Send` or `SendWithImm`.
    pub op: SendOp,
    /// The local buffers gathered from.
    pub sg_list: &'a [Sge],
    /// Signaled, solicited, inline.
    pub flags: SendFlags,
    /// `wr.ud.ah`: an address handle of the QP's protection domain.
    pub ah: &'a AddressHandle,
    /// `wr.ud.remote_qpn`.
    pub remote_qpn: u32,
    /// `wr.ud.remote_qkey`; with the high bit set the QP's own Q_Key is sent instead.
    pub remote_qkey: u32,
}

/// The UD part of a prepared send WQE (`wr.ud`), for [`QueuePair::post_send_wqes`].
#[derive(Clone, Copy, Debug)]
pub struct UdSend<'a> {
    /// Where to.
    pub ah: &'a AddressHandle,
    /// The destination QP.
    pub remote_qpn: u32,
    /// Its Q_Key (high bit set: the QP's own).
    pub remote_qkey: u32,
}

/// `struct ibv_recv_wr`.
#[derive(Clone, Debug)]
pub struct RecvWr<'a> {
    /// Carried by the completion.
    pub wr_id: u64,
    /// The buffers the message is scattered into.
    pub sg_list: &'a [Sge],
}

/// A queue pair. Dropping it destroys it (`ibv_destroy_qp`).
pub struct QueuePair {
    qpn: u32,
    qp_type: QpType,
    pd: u32,
    caps: QpCaps,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<Arc<SrqShared>>,
    shared: Arc<Shared>,
}

impl QueuePair {
    pub(crate) fn create(pd: &ProtectionDomain, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        if let Some(srq) = attr.srq {
            if !Arc::ptr_eq(&srq.shared, &pd.shared) {
                return Err(VerbsError::InvalidArgument(
                    "SRQ belongs to another context",
                ));
            }
            if srq.inner.pd != pd.id {
                return Err(VerbsError::InvalidArgument(
                    "SRQ belongs to another protection domain",
                ));
            }
        }
        // With an SRQ the receive capacities are ignored (rxe: not checked, granted as 0).
        let c = if attr.srq.is_some() {
            QpCaps {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..attr.cap
            }
        } else {
            attr.cap
        };
        if c.max_send_wr == 0 && c.max_recv_wr == 0 && attr.srq.is_none() {
            return Err(VerbsError::InvalidArgument(
                "QP needs a send or receive queue",
            ));
        }
        if c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(VerbsError::InvalidArgument(
                "max_send_wr/max_recv_wr above device limit",
            ));
        }
        if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
            return Err(VerbsError::InvalidArgument(
                "max_send_sge/max_recv_sge above device limit",
            ));
        }
        if c.max_inline_data > MAX_INLINE {
            return Err(VerbsError::InvalidArgument(
                "max_inline_data above device limit",
            ));
        }
        for cq in [attr.send_cq, attr.recv_cq] {
            if !Arc::ptr_eq(&cq.shared, &pd.shared) {
                return Err(VerbsError::InvalidArgument("CQ belongs to another context"));
            }
            if cq.is_destroyed() {
                return Err(VerbsError::InvalidArgument("CQ was destroyed"));
            }
        }
        // As rxe does, report the inline capacity the device gives, not less than asked.
        let caps = QpCaps {
            max_inline_data: c.max_inline_data.max(MAX_INLINE),
            ..c
        };
        let mut engine = pd.shared.lock_engine_for_verb()?;
        if engine.qp_count() >= MAX_QP {
            return Err(VerbsError::NoResources("too many QPs"));
        }
        let qpn = engine.alloc_qpn()?;
        let mtu = pd.shared.device.active_mtu();
        let mut qp = match (attr.qp_type, attr.srq.is_some()) {
            (QpType::Rc, false) => QpTransport::Rc(RcQp::new(qpn, caps, attr.sq_sig_all)),
            (QpType::Rc, true) => QpTransport::Rc(RcQp::with_srq(qpn, caps, attr.sq_sig_all)),
            (QpType::Uc, false) => QpTransport::Uc(UcQp::new(qpn, caps, attr.sq_sig_all)),
            (QpType::Uc, true) => QpTransport::Uc(UcQp::with_srq(qpn, caps, attr.sq_sig_all)),
            (QpType::Ud, false) => QpTransport::Ud(UdQp::new(qpn, caps, attr.sq_sig_all, mtu)),
            (QpType::Ud, true) => QpTransport::Ud(UdQp::with_srq(qpn, caps, attr.sq_sig_all, mtu)),
        };
        if let QpTransport::Rc(rc) = &mut qp {
            rc.set_split_writes(engine.batches_equal_lengths());
        }
        let srq = attr.srq.map(|s| s.inner.clone());
        engine.insert_qp(
            qpn,
            QpSlot {
                qp,
                send_cq: attr.send_cq.inner.clone(),
                recv_cq: attr.recv_cq.inner.clone(),
                pd: pd.id,
                last_state: QpState::Reset,
                srq: srq.clone(),
                last_wqe_reported: false,
            },
        );
        drop(engine);
        attr.send_cq.inner.qp_refs.fetch_add(1, Ordering::AcqRel);
        attr.recv_cq.inner.qp_refs.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &srq {
            s.qp_refs.fetch_add(1, Ordering::AcqRel);
        }
        Ok(QueuePair {
            qpn,
            qp_type: attr.qp_type,
            pd: pd.id,
            caps,
            send_cq: attr.send_cq.clone(),
            recv_cq: attr.recv_cq.clone(),
            srq,
            shared: pd.shared.clone(),
        })
    }

    /// The context (device) the QP belongs to.
    pub fn context(&self) -> super::Context {
        super::Context {
            shared: self.shared.clone(),
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Capacities as granted (`ibv_query_qp` with `IBV_QP_CAP`).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The QP takes its receive WQEs from a shared receive queue.
    pub fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// Run `f` on the QP under the engine lock, then transmit what it has to send on this
    /// thread and hand its completions to the CQs.
    /// Fails with `Busy` on a thread holding a memory-region guard (see
    /// [`MrGuard`](super::MrGuard)).
    fn with<R>(&self, f: impl FnOnce(&mut QpSlot) -> R) -> Result<R> {
        self.with_posting(false, f)
    }

    /// [`QueuePair::with`]; `posting`: the verb posts work requests, so acknowledgements held
    /// for the application's answer stay held unless this QP sends (see
    /// `driver::batch::TxBatch::hold_acks`).
    fn with_posting<R>(&self, posting: bool, f: impl FnOnce(&mut QpSlot) -> R) -> Result<R> {
        let mut e = self.shared.lock_engine_for_verb()?;
        let now = Instant::now();
        // Posting is the application at work: the progress thread stays out of its way.
        self.shared.note_app(now);
        let slot = e
            .qp_mut(self.qpn)
            .expect("a live QueuePair has an engine slot");
        let r = f(slot);
        // A state change made by a verb is no async event.
        slot.last_state = slot.qp.state();
        e.flush_qp(self.qpn, &self.shared.io, &self.shared.mrs, now, posting);
        if let Some(slot) = e.qp_mut(self.qpn) {
            // Transmitting can fail the QP (a local protection error, say): that is the
            // transport's doing.
            let st = slot.qp.state();
            if st == QpState::Err && slot.last_state != QpState::Err {
                self.shared
                    .async_events
                    .push(super::AsyncEvent::QpFatal { qp_num: self.qpn });
            }
            slot.last_state = st;
            slot.check_last_wqe(self.qpn, &self.shared.async_events);
            let deadline = slot.qp.poll_timeout();
            self.shared.kick_if_earlier(deadline);
        }
        Ok(r)
    }

    /// `ibv_modify_qp`: the attributes that are `Some` are in the mask. An address vector's
    /// `sgid_index` must be in the GID table, and the device must have an address of the
    /// `dgid`'s family (IPv4-mapped or IPv6).
    ///
    /// # Errors
    /// [`VerbsError::Qp`] for a transition or attribute the state machine refuses (IBA 11.2.1.5's table, as libibverbs' `EINVAL`); [`VerbsError::InvalidArgument`] for an address vector the GID table cannot serve.
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        if let Some(av) = &attr.ah_attr {
            self.shared
                .io
                .gids
                .check(&av.dgid, av.sgid_index)
                .map_err(VerbsError::InvalidArgument)?;
        }
        self.with(|s| match &mut s.qp {
            QpTransport::Rc(q) => q.modify(attr, Instant::now()).map(|_| ()),
            QpTransport::Uc(q) => q.modify(attr),
            QpTransport::Ud(q) => q.modify(attr),
        })??;
        Ok(())
    }

    /// `ibv_query_qp`.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] on a thread holding a [`MrGuard`](super::MrGuard).
    pub fn query(&self) -> Result<QpAttr> {
        self.with(|s| match &s.qp {
            QpTransport::Rc(q) => q.query(),
            QpTransport::Uc(q) => q.query(),
            QpTransport::Ud(q) => q.query(),
        })
    }

    /// Current state.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] on a thread holding a [`MrGuard`](super::MrGuard).
    pub fn state(&self) -> Result<QpState> {
        self.with(|s| s.qp.state())
    }

    /// `ibv_post_send`: queue the WRs in order and start sending on this thread. Stops at the
    /// first WR that cannot be posted and returns its index, like `bad_wr`. RC and UC QPs (UC
    /// refuses RDMA READ and atomics with [`PostError::UnsupportedOp`], `EINVAL`). A UD QP takes
    /// [`QueuePair::post_send_ud`] instead (its WRs name a destination).
    ///
    /// # Errors
    /// [`VerbsError::Post`] with the index of the first work request not posted and why (the QP's state, a full queue, too many SGEs, an operation the transport lacks); [`VerbsError::InvalidArgument`] on a UD QP.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Err(VerbsError::InvalidArgument(
                "UD QP: post with post_send_ud (a WR needs an AH, QPN and Q_Key)",
            ));
        }
        let mem = self.shared.mrs.for_pd(self.pd);
        let r = self.with_posting(true, |s| {
            for (index, wr) in wrs.iter().enumerate() {
                let wqe = self.wqe(&mem, index, wr.wr_id, wr.op, wr.sg_list, wr.flags)?;
                match &mut s.qp {
                    QpTransport::Rc(q) => q.post_send(wqe),
                    QpTransport::Uc(q) => q.post_send(wqe),
                    QpTransport::Ud(_) => unreachable!("checked above"),
                }
                .map_err(|error| VerbsError::Post { index, error })?;
            }
            Ok(())
        })?;
        r
    }

    /// `ibv_post_send` on a UD QP: each WR is one message of at most the port's active MTU
    /// (a longer one is refused here, as rdma_rxe refuses it with EINVAL), to its own AH.
    ///
    /// # Errors
    /// [`VerbsError::Post`] as [`QueuePair::post_send`]; [`VerbsError::InvalidArgument`] on a connected QP or for an AH of another PD.
    pub fn post_send_ud(&self, wrs: &[UdSendWr<'_>]) -> Result<()> {
        if self.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidArgument(
                "post_send_ud needs a UD QP (use post_send)",
            ));
        }
        for wr in wrs {
            if wr.ah.pd != self.pd || !Arc::ptr_eq(&wr.ah.shared, &self.shared) {
                return Err(VerbsError::InvalidArgument(
                    "AH belongs to another protection domain",
                ));
            }
        }
        let mem = self.shared.mrs.for_pd(self.pd);
        let r = self.with_posting(true, |s| {
            let QpTransport::Ud(ud) = &mut s.qp else {
                unreachable!("checked above")
            };
            for (index, wr) in wrs.iter().enumerate() {
                let wqe = self.wqe(&mem, index, wr.wr_id, wr.op, wr.sg_list, wr.flags)?;
                let dest = UdDest {
                    av: wr.ah.av(),
                    remote_qpn: wr.remote_qpn,
                    remote_qkey: wr.remote_qkey,
                };
                ud.post_send(wqe, dest)
                    .map_err(|error| VerbsError::Post { index, error })?;
            }
            Ok(())
        })?;
        r
    }

    /// `ibv_post_send` with the WQEs already built, inline data included: the entry point of
    /// the C ABI, whose inline data comes from application memory that no MR covers. Each WQE
    /// goes to the QP's connected peer (RC/UC) or, on a UD QP, to the destination beside it
    /// (`None` there is a bad WR). Stops at the first WQE that cannot be posted and returns its
    /// index, like `bad_wr`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`].
    pub fn post_send_wqes<'a>(
        &self,
        wqes: impl IntoIterator<Item = (SendWqe, Option<UdSend<'a>>)>,
    ) -> Result<()> {
        self.with_posting(true, |s| {
            for (index, (wqe, ud)) in wqes.into_iter().enumerate() {
                if wqe.flags.contains(SendFlags::INLINE)
                    && wqe.inline_data.len() > self.caps.max_inline_data as usize
                {
                    return Err(VerbsError::Post {
                        index,
                        error: PostError::InlineTooLong {
                            got: wqe.inline_data.len(),
                            max: self.caps.max_inline_data,
                        },
                    });
                }
                let posted = match (&mut s.qp, ud) {
                    (QpTransport::Rc(q), None) => q.post_send(wqe),
                    (QpTransport::Uc(q), None) => q.post_send(wqe),
                    (QpTransport::Ud(q), Some(ud)) => {
                        if ud.ah.pd != self.pd || !Arc::ptr_eq(&ud.ah.shared, &self.shared) {
                            return Err(VerbsError::InvalidArgument(
                                "AH belongs to another protection domain",
                            ));
                        }
                        let dest = UdDest {
                            av: ud.ah.av(),
                            remote_qpn: ud.remote_qpn,
                            remote_qkey: ud.remote_qkey,
                        };
                        q.post_send(wqe, dest)
                    }
                    (QpTransport::Ud(_), None) => {
                        return Err(VerbsError::InvalidArgument(
                            "UD work request without an address handle",
                        ))
                    }
                    (_, Some(_)) => {
                        return Err(VerbsError::InvalidArgument(
                            "an address handle on a connected QP's work request",
                        ))
                    }
                };
                posted.map_err(|error| VerbsError::Post { index, error })?;
            }
            Ok(())
        })?
    }

    /// The send WQE of one WR; inline data is copied now.
    fn wqe(
        &self,
        mem: &dyn MemoryAccess,
        index: usize,
        wr_id: u64,
        op: SendOp,
        sg_list: &[Sge],
        flags: SendFlags,
    ) -> Result<SendWqe> {
        let mut inline_data = Vec::new();
        if flags.contains(SendFlags::INLINE) {
            let total: usize = sg_list.iter().map(|s| s.length as usize).sum();
            if total > self.caps.max_inline_data as usize {
                return Err(VerbsError::Post {
                    index,
                    error: PostError::InlineTooLong {
                        got: total,
                        max: self.caps.max_inline_data,
                    },
                });
            }
            inline_data.resize(total, 0);
            // Inline data is copied now; an SGE outside any MR is a bad WR.
            gather_all(sg_list, &mut inline_data, mem)
                .map_err(|error| VerbsError::PostInline { index, error })?;
        }
        Ok(SendWqe {
            wr_id,
            op,
            flags,
            sg_list: SgList::from_slice(sg_list),
            inline_data,
        })
    }

    /// `ibv_post_recv`. A QP on a shared receive queue has no receive queue of its own:
    /// EINVAL (post to the SRQ).
    ///
    /// # Errors
    /// [`VerbsError::Post`] with the index of the first work request not posted (a full queue, too many SGEs, the QP in RESET or ERR); [`VerbsError::InvalidArgument`] on a QP with an SRQ.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "QP uses a shared receive queue: post to the SRQ",
            ));
        }
        self.with_posting(true, |s| {
            for (index, wr) in wrs.iter().enumerate() {
                let wqe = RecvWqe {
                    wr_id: wr.wr_id,
                    sg_list: SgList::from_slice(wr.sg_list),
                };
                match &mut s.qp {
                    QpTransport::Rc(q) => q.post_recv(wqe),
                    QpTransport::Uc(q) => q.post_recv(wqe),
                    QpTransport::Ud(q) => q.post_recv(wqe),
                }
                .map_err(|error| VerbsError::Post { index, error })?;
            }
            Ok(())
        })?
    }
}

impl Drop for QueuePair {
    /// `ibv_destroy_qp`: the QP stops at once; packets for it are dropped from now on.
    fn drop(&mut self) {
        if crate::endpoint::memory::guards_held() {
            // The engine's holder may be waiting for a region this thread has locked: do not
            // wait for the engine; the next drive removes the QP.
            match self.shared.engine.try_lock() {
                Ok(mut e) => e.remove_qp(self.qpn, &self.shared.io),
                Err(_) => self.shared.defer_qp_removal(self.qpn),
            }
        } else {
            self.shared
                .lock_engine()
                .remove_qp(self.qpn, &self.shared.io);
        }
        self.send_cq.inner.qp_refs.fetch_sub(1, Ordering::AcqRel);
        self.recv_cq.inner.qp_refs.fetch_sub(1, Ordering::AcqRel);
        if let Some(s) = &self.srq {
            s.qp_refs.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({:#x})", self.qpn)
    }
}
