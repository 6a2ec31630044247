//! Typed queue pairs ([`Qp<Rc>`](Qp), [`Qp<Uc>`](Qp), [`Qp<Ud>`](Qp)): the operations each
//! transport has, as methods that build work requests from buffers ([`LocalSlice`],
//! [`RemoteSlice`]), signaled by default; a UD send on an RC QP, or an RDMA READ on a UC QP,
//! does not compile. Each derefs to the untyped [`QueuePair`], whose raw `post_send` /
//! `modify` keep libibverbs' shape.

use std::marker::PhantomData;
use std::ops::Deref;

use super::ah::AddressHandle;
use super::buf::{LocalSlice, RemoteSlice};
use super::cq::CompletionQueue;
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use super::qp::{QpInitAttr, QpType, QueuePair, RecvWr, SendWr, UdSendWr};
use crate::transport::{SendFlags, SendOp, Sge};

mod sealed {
    pub trait Sealed {}
}

/// A transport: [`Rc`], [`Uc`] or [`Ud`].
pub trait QpKind: sealed::Sealed + Send + Sync + 'static {
    /// Its `ibv_qp_type`.
    const TYPE: QpType;
}

/// Connected transports ([`Rc`], [`Uc`]): SEND and RDMA WRITE to the one peer the QP is
/// connected to.
pub trait Connected: QpKind {}

/// Reliable Connected: SEND, RDMA WRITE, RDMA READ, atomics; acknowledged and retransmitted.
#[derive(Debug)]
pub enum Rc {}
/// Unreliable Connected: SEND and RDMA WRITE, unacknowledged.
#[derive(Debug)]
pub enum Uc {}
/// Unreliable Datagram: SEND of one packet to any QP named per work request.
#[derive(Debug)]
pub enum Ud {}

impl sealed::Sealed for Rc {}
impl sealed::Sealed for Uc {}
impl sealed::Sealed for Ud {}
impl QpKind for Rc {
    const TYPE: QpType = QpType::Rc;
}
impl QpKind for Uc {
    const TYPE: QpType = QpType::Uc;
}
impl QpKind for Ud {
    const TYPE: QpType = QpType::Ud;
}
impl Connected for Rc {}
impl Connected for Uc {}

/// A queue pair of transport `K`: the operations it has, as methods that build work requests
/// from buffers, signaled by default; it derefs to the untyped [`QueuePair`]. Dropping it
/// destroys it.
///
/// ```
/// # use softrdma::verbs::*;
/// # let ctx = devices()?.last().unwrap().open()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16, None)?;
/// let qp: Qp<Rc> = pd.create_rc_qp(&cq)?;
/// assert_eq!(qp.qp_type(), QpType::Rc);
/// # Ok::<(), VerbsError>(())
/// ```
pub struct Qp<K: QpKind> {
    pub(crate) qp: QueuePair,
    /// The first PSN this QP sends (its [`super::QpEndpoint`] says it to the peer).
    pub(crate) psn: u32,
    _k: PhantomData<K>,
}

impl<K: QpKind> Deref for Qp<K> {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        &self.qp
    }
}

impl<K: QpKind> std::fmt::Debug for Qp<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Qp<{:?}>({:#x})", K::TYPE, self.qp.qp_num())
    }
}

/// A random 24-bit PSN.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::getrandom(&mut b);
    u32::from_ne_bytes(b) & 0x00ff_ffff
}

impl<K: QpKind> Qp<K> {
    /// A typed handle on `qp`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if `qp` is of another transport than `K`.
    pub fn from_queue_pair(qp: QueuePair) -> Result<Qp<K>> {
        if qp.qp_type() != K::TYPE {
            return Err(VerbsError::InvalidArgument(
                "the queue pair is of another transport than the type asked for",
            ));
        }
        Ok(Qp {
            qp,
            psn: random_psn(),
            _k: PhantomData,
        })
    }

    /// The untyped queue pair.
    pub fn into_inner(self) -> QueuePair {
        self.qp
    }

    /// The first PSN this QP sends (chosen at random when it was made).
    pub fn initial_psn(&self) -> u32 {
        self.psn
    }

    /// A receive into `local` (more buffers with [`PostRecv::also`]); post it with
    /// [`PostRecv::post`].
    pub fn recv<'a>(&'a self, local: impl Into<LocalSlice<'a>>) -> PostRecv<'a> {
        let mut r = PostRecv {
            qp: &self.qp,
            wr_id: 0,
            sges: Sges::default(),
            error: None,
        };
        r.sges.push(local.into().sge(), &mut r.error);
        r
    }
}

impl<K: Connected> Qp<K> {
    /// A SEND of `local` to the connected peer.
    pub fn send<'a>(&'a self, local: impl Into<LocalSlice<'a>>) -> PostSend<'a> {
        PostSend::new(&self.qp, SendOp::Send, local.into())
    }

    /// An RDMA WRITE of `local` into the peer's `remote` (which must be at least as long).
    pub fn write<'a>(
        &'a self,
        local: impl Into<LocalSlice<'a>>,
        remote: RemoteSlice,
    ) -> PostSend<'a> {
        let local = local.into();
        let mut p = PostSend::new(
            &self.qp,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            local,
        );
        p.remote = Some(remote);
        p
    }
}

impl Qp<Rc> {
    /// An RDMA READ of the peer's `remote` into `local` (`local`'s length is read; `remote`
    /// must be at least as long).
    pub fn read<'a>(
        &'a self,
        local: impl Into<LocalSlice<'a>>,
        remote: RemoteSlice,
    ) -> PostSend<'a> {
        let mut p = PostSend::new(
            &self.qp,
            SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            local.into(),
        );
        p.remote = Some(remote);
        p
    }

    /// An atomic fetch-and-add of `add` on the 8 bytes at the start of `remote`; the old value
    /// lands in `local` (8 bytes).
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # use std::time::Duration;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// # let cq = ctx.create_cq(16, None)?;
    /// # let (a, b) = (pd.create_rc_qp(&cq)?, pd.create_rc_qp(&cq)?);
    /// # a.connect(&b.endpoint(), &ConnectOptions::default())?;
    /// # b.connect(&a.endpoint(), &ConnectOptions::default())?;
    /// let counter = pd.alloc_mr(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
    /// let old = pd.alloc_mr(8, AccessFlags::LOCAL_WRITE)?;
    /// for _ in 0..3 {
    ///     a.fetch_add(&old, counter.remote(..)?, 5).post()?;
    ///     cq.wait(Duration::from_secs(5))?.ok()?;
    /// }
    /// let mut v = [0u8; 8];
    /// counter.read(0, &mut v)?;
    /// assert_eq!(u64::from_ne_bytes(v), 15);
    /// old.read(0, &mut v)?;
    /// assert_eq!(u64::from_ne_bytes(v), 10, "the value before the last add");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fetch_add<'a>(
        &'a self,
        local: impl Into<LocalSlice<'a>>,
        remote: RemoteSlice,
        add: u64,
    ) -> PostSend<'a> {
        let op = SendOp::FetchAdd {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            add,
        };
        PostSend::new(&self.qp, op, local.into()).atomic(remote)
    }

    /// An atomic compare-and-swap on the 8 bytes at the start of `remote`: `swap` is written
    /// if they hold `compare`; the old value lands in `local` (8 bytes).
    pub fn compare_swap<'a>(
        &'a self,
        local: impl Into<LocalSlice<'a>>,
        remote: RemoteSlice,
        compare: u64,
        swap: u64,
    ) -> PostSend<'a> {
        let op = SendOp::CompareSwap {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            compare,
            swap,
        };
        PostSend::new(&self.qp, op, local.into()).atomic(remote)
    }
}

impl Qp<Ud> {
    /// A SEND of `local` (at most one MTU) to QP `remote_qpn` with Q_Key `qkey` at the address
    /// of `ah`.
    pub fn send_to<'a>(
        &'a self,
        local: impl Into<LocalSlice<'a>>,
        ah: &'a AddressHandle,
        remote_qpn: u32,
        qkey: u32,
    ) -> PostSend<'a> {
        let mut p = PostSend::new(&self.qp, SendOp::Send, local.into());
        p.ud = Some((ah, remote_qpn, qkey));
        p
    }
}

impl ProtectionDomain {
    /// An RC queue pair whose sends and receives complete into `cq`, with default capacities
    /// (128 work requests and 4 SGEs each way).
    ///
    /// # Errors
    /// What [`ProtectionDomain::create_qp`] returns.
    pub fn create_rc_qp(&self, cq: &CompletionQueue) -> Result<Qp<Rc>> {
        self.create_typed_qp(&QpInitAttr::new(QpType::Rc, cq))
    }

    /// A UC queue pair, as [`ProtectionDomain::create_rc_qp`].
    ///
    /// # Errors
    /// What [`ProtectionDomain::create_qp`] returns.
    pub fn create_uc_qp(&self, cq: &CompletionQueue) -> Result<Qp<Uc>> {
        self.create_typed_qp(&QpInitAttr::new(QpType::Uc, cq))
    }

    /// A UD queue pair, as [`ProtectionDomain::create_rc_qp`].
    ///
    /// # Errors
    /// What [`ProtectionDomain::create_qp`] returns.
    pub fn create_ud_qp(&self, cq: &CompletionQueue) -> Result<Qp<Ud>> {
        self.create_typed_qp(&QpInitAttr::new(QpType::Ud, cq))
    }

    /// A queue pair of transport `K` with these attributes (`attr.qp_type` must be `K`'s).
    ///
    /// # Errors
    /// What [`ProtectionDomain::create_qp`] returns; [`VerbsError::InvalidArgument`] if
    /// `attr.qp_type` is not `K`'s.
    pub fn create_typed_qp<K: QpKind>(&self, attr: &QpInitAttr<'_>) -> Result<Qp<K>> {
        if attr.qp_type != K::TYPE {
            return Err(VerbsError::InvalidArgument(
                "attr.qp_type is not the transport asked for",
            ));
        }
        Qp::from_queue_pair(self.create_qp(attr)?)
    }
}

/// Up to [`Sges::MAX`] scatter/gather entries, kept in place (no allocation per request).
#[derive(Clone, Copy, Default)]
struct Sges {
    list: [Sge; Sges::MAX],
    n: usize,
}

impl Sges {
    const MAX: usize = 8;

    fn push(&mut self, s: Sge, error: &mut Option<VerbsError>) {
        if self.n == Self::MAX {
            error.get_or_insert(VerbsError::InvalidArgument(
                "more than 8 buffers in one work request (use QueuePair::post_send)",
            ));
            return;
        }
        self.list[self.n] = s;
        self.n += 1;
    }

    fn as_slice(&self) -> &[Sge] {
        &self.list[..self.n]
    }

    fn total(&self) -> u64 {
        self.as_slice().iter().map(|s| s.length as u64).sum()
    }
}

/// A send work request being built (from [`Qp::send`], [`Qp::write`], [`Qp::read`],
/// [`Qp::fetch_add`], [`Qp::compare_swap`], [`Qp::send_to`]): signaled, `wr_id` 0, until said
/// otherwise. Nothing happens until [`PostSend::post`].
///
/// ```
/// # use softrdma::verbs::*;
/// # fn f(qp: &Qp<Rc>, mr: &MemoryRegion, peer: RemoteSlice) -> Result<()> {
/// qp.write(mr.slice(..4096)?, peer).imm(7).id(42).post()?;
/// qp.read(mr.slice(4096..8192)?, peer.slice(4096..8192)?).fence().post()?;
/// qp.send(mr.slice(..16)?).unsignaled().inline().post()?;
/// # Ok(()) }
/// ```
#[must_use = "a work request does nothing until .post()"]
pub struct PostSend<'a> {
    qp: &'a QueuePair,
    op: SendOp,
    sges: Sges,
    wr_id: u64,
    flags: SendFlags,
    remote: Option<RemoteSlice>,
    ud: Option<(&'a AddressHandle, u32, u32)>,
    error: Option<VerbsError>,
}

impl<'a> PostSend<'a> {
    fn new(qp: &'a QueuePair, op: SendOp, local: LocalSlice<'a>) -> PostSend<'a> {
        let mut p = PostSend {
            qp,
            op,
            sges: Sges::default(),
            wr_id: 0,
            flags: SendFlags::SIGNALED,
            remote: None,
            ud: None,
            error: None,
        };
        p.sges.push(local.sge(), &mut p.error);
        p
    }

    /// Atomics: 8 bytes each side, the remote word 8-byte aligned.
    fn atomic(mut self, remote: RemoteSlice) -> Self {
        if self.sges.total() != 8 {
            self.error.get_or_insert(VerbsError::InvalidArgument(
                "an atomic's local buffer is 8 bytes",
            ));
        }
        if remote.len < 8 || remote.addr % 8 != 0 {
            self.error.get_or_insert(VerbsError::InvalidArgument(
                "an atomic's remote buffer is 8 bytes, 8-byte aligned",
            ));
        }
        self
    }

    /// The work request's id, which its completion carries (`wr_id`).
    pub fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Carry 32 bits of immediate data (SEND and RDMA WRITE only): the peer gets them in its
    /// receive completion.
    pub fn imm(mut self, imm: u32) -> Self {
        self.op = match self.op {
            SendOp::Send | SendOp::SendWithImm { .. } => SendOp::SendWithImm { imm },
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            op => {
                self.error.get_or_insert(VerbsError::InvalidArgument(
                    "immediate data goes only with SEND or RDMA WRITE",
                ));
                op
            }
        };
        self
    }

    /// Gather more: `local` follows what is there already.
    pub fn also(mut self, local: impl Into<LocalSlice<'a>>) -> Self {
        self.sges.push(local.into().sge(), &mut self.error);
        self
    }

    /// No completion if it succeeds (on a QP created with `sq_sig_all = false`); errors still
    /// complete.
    pub fn unsignaled(mut self) -> Self {
        self.flags.remove(SendFlags::SIGNALED);
        self
    }

    /// Set the solicited-event bit (wakes a peer armed for solicited completions only).
    pub fn solicited(mut self) -> Self {
        self.flags.insert(SendFlags::SOLICITED);
        self
    }

    /// Start only once every earlier READ and atomic of the QP has completed.
    pub fn fence(mut self) -> Self {
        self.flags.insert(SendFlags::FENCE);
        self
    }

    /// Copy the data at post time (at most the QP's `max_inline_data`): the buffer may be
    /// reused at once.
    pub fn inline(mut self) -> Self {
        self.flags.insert(SendFlags::INLINE);
        self
    }

    /// Post it.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for what the builder found wrong (a local buffer longer
    /// than the remote one, a wrong atomic size, immediate data on a READ); otherwise what
    /// [`QueuePair::post_send`] returns.
    pub fn post(self) -> Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some(r) = self.remote {
            if self.sges.total() > r.len {
                return Err(VerbsError::InvalidArgument(
                    "the local buffer is longer than the remote one",
                ));
            }
        }
        match self.ud {
            None => self.qp.post_send(&[SendWr {
                wr_id: self.wr_id,
                op: self.op,
                sg_list: self.sges.as_slice(),
                flags: self.flags,
            }]),
            Some((ah, remote_qpn, remote_qkey)) => self.qp.post_send_ud(&[UdSendWr {
                wr_id: self.wr_id,
                op: self.op,
                sg_list: self.sges.as_slice(),
                flags: self.flags,
                ah,
                remote_qpn,
                remote_qkey,
            }]),
        }
    }
}

/// A receive work request being built ([`Qp::recv`]). Nothing happens until
/// [`PostRecv::post`].
#[must_use = "a work request does nothing until .post()"]
pub struct PostRecv<'a> {
    qp: &'a QueuePair,
    wr_id: u64,
    sges: Sges,
    error: Option<VerbsError>,
}

impl<'a> PostRecv<'a> {
    /// The work request's id, which its completion carries.
    pub fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Scatter into `local` too, after what is there already.
    pub fn also(mut self, local: impl Into<LocalSlice<'a>>) -> Self {
        self.sges.push(local.into().sge(), &mut self.error);
        self
    }

    /// Post it.
    ///
    /// # Errors
    /// What [`QueuePair::post_recv`] returns.
    pub fn post(self) -> Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.qp.post_recv(&[RecvWr {
            wr_id: self.wr_id,
            sg_list: self.sges.as_slice(),
        }])
    }
}
