//! One-call connections: a queue pair's [`QpEndpoint`] (QPN, first PSN, GID, MTU) is what its
//! peer needs; [`Qp::connect`] takes the peer's and does RESET → INIT → RTR → RTS with defaults
//! that let every operation of the transport work ([`ConnectOptions`]).

use super::error::{Result, VerbsError};
use super::typed::{Connected, Qp, QpKind, Rc, Ud};
use super::QpType;
use crate::transport::{AccessFlags, AddressVector, Mtu, QpAttr, QpState};

/// What a peer needs to connect to a queue pair (send it over any channel: a TCP socket, a
/// file, rdma_cm's private data). 26 bytes as [`QpEndpoint::to_bytes`]; with the `serde`
/// feature, any format serde speaks.
///
/// ```
/// use softrdma::verbs::QpEndpoint;
/// let me = QpEndpoint { qpn: 0x10002, psn: 77, gid: [0; 16], mtu: 4096 };
/// assert_eq!(QpEndpoint::from_bytes(&me.to_bytes())?, me);
/// # Ok::<(), softrdma::verbs::VerbsError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpEndpoint {
    /// The queue pair number.
    pub qpn: u32,
    /// The first packet sequence number it sends.
    pub psn: u32,
    /// The GID it sends from (its IP address as a GID).
    pub gid: [u8; 16],
    /// The largest path MTU it can use, in bytes (256 to 4096).
    pub mtu: u32,
}

impl QpEndpoint {
    /// Bytes in [`QpEndpoint::to_bytes`]'s form.
    pub const WIRE_LEN: usize = 26;

    /// QPN, PSN (u32 each, little endian), GID, MTU (u16).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..24].copy_from_slice(&self.gid);
        b[24..].copy_from_slice(&(self.mtu.min(u16::MAX as u32) as u16).to_le_bytes());
        b
    }

    /// Read [`QpEndpoint::to_bytes`]'s form from the front of `b`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if `b` is shorter than [`QpEndpoint::WIRE_LEN`] or its
    /// QPN or PSN does not fit 24 bits.
    pub fn from_bytes(b: &[u8]) -> Result<QpEndpoint> {
        let b = b.get(..Self::WIRE_LEN).ok_or(VerbsError::InvalidArgument(
            "a QP endpoint needs 26 bytes (QpEndpoint::to_bytes)",
        ))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let e = QpEndpoint {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid: b[8..24].try_into().expect("16 bytes"),
            mtu: u16::from_le_bytes([b[24], b[25]]) as u32,
        };
        if e.qpn > 0x00ff_ffff || e.psn > 0x00ff_ffff {
            return Err(VerbsError::InvalidArgument(
                "a QPN or PSN has 24 bits (not a QP endpoint?)",
            ));
        }
        Ok(e)
    }
}

/// How [`Qp::connect`] connects. The defaults are what rping and perftest use, and let RDMA
/// READ and atomics work both ways (`max_rd_atomic` and `max_dest_rd_atomic` 16: with 0, as
/// on a NIC, this side could issue or serve none).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Path MTU; `None`: the smaller of this side's and the peer's.
    pub mtu: Option<Mtu>,
    /// What the peer may do to this side's memory through this QP (RC: every remote access;
    /// UC: RDMA WRITE).
    pub access: Option<AccessFlags>,
    /// RC: outstanding RDMA READs and atomics this side issues, and accepts from the peer.
    pub max_rd_atomic: u8,
    /// RC: local ACK timeout, 4.096 µs × 2^timeout (14: 67 ms).
    pub timeout: u8,
    /// RC: retransmissions before the QP fails with `RetryExcErr` (0..=7).
    pub retry_cnt: u8,
    /// RC: retries after receiver-not-ready NAKs (7: for ever).
    pub rnr_retry: u8,
    /// RC: the RNR NAK timer this side sends when it has no receive posted (IBA table 45; 12:
    /// 0.64 ms).
    pub min_rnr_timer: u8,
    /// The local GID index to send from; `None`: the first of the peer's address family.
    pub sgid_index: Option<u8>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: None,
            access: None,
            max_rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            sgid_index: None,
        }
    }
}

impl<K: QpKind> Qp<K> {
    /// What the peer needs to connect to this QP: its number, first PSN, the device's first
    /// GID (the IPv4 address when it has one) and active MTU.
    pub fn endpoint(&self) -> QpEndpoint {
        let ctx = self.context();
        QpEndpoint {
            qpn: self.qp_num(),
            psn: self.psn,
            gid: ctx.gid(),
            mtu: ctx.device().active_mtu().bytes() as u32,
        }
    }

    /// The GID index to send to `peer` from: the first of its family (a link-local one for a
    /// link-local peer).
    fn source_index(&self, peer: &[u8; 16]) -> Result<u8> {
        self.context()
            .source_gid_index(peer)
            .ok_or(VerbsError::InvalidArgument(
                "the device has no address of the peer's family (IPv4 or IPv6)",
            ))
    }
}

impl<K: Connected> Qp<K> {
    /// RESET → INIT with `opts.access` (RC: every remote access; UC: RDMA WRITE): receives can
    /// be posted from now on, before the endpoints are exchanged (what most programs do, so
    /// that the peer's first message finds one). [`Qp::connect`] does it when it was not done.
    ///
    /// # Errors
    /// What [`QueuePair::modify`](super::QueuePair::modify) returns (a QP not in RESET, say).
    pub fn init(&self, opts: &ConnectOptions) -> Result<()> {
        let access = opts.access.unwrap_or(if K::TYPE == QpType::Rc {
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
        } else {
            AccessFlags::REMOTE_WRITE
        });
        self.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(access),
            ..Default::default()
        })
    }

    /// Connect to `peer` (its [`Qp::endpoint`], sent here by any means): RESET → INIT (unless
    /// [`Qp::init`] did it) → RTR → RTS with `opts`. The peer connects to this side's endpoint
    /// the same way.
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.last().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// # let cq = ctx.create_cq(16, None)?;
    /// let a = pd.create_rc_qp(&cq)?;
    /// let b = pd.create_rc_qp(&cq)?;
    /// a.connect(&b.endpoint(), &ConnectOptions::default())?;
    /// b.connect(&a.endpoint(), &ConnectOptions::default())?;
    /// assert_eq!(a.state()?, QpState::Rts);
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// What [`QueuePair::modify`](super::QueuePair::modify) returns at each step (a QP not in
    /// RESET, say), and [`VerbsError::InvalidArgument`] if the device has no address of the
    /// peer's family.
    pub fn connect(&self, peer: &QpEndpoint, opts: &ConnectOptions) -> Result<()> {
        let rc = K::TYPE == QpType::Rc;
        if self.state()? != QpState::Init {
            self.init(opts)?;
        }
        let sgid_index = match opts.sgid_index {
            Some(i) => i,
            None => self.source_index(&peer.gid)?,
        };
        let mine = self.context().device().active_mtu();
        let mtu = opts
            .mtu
            .unwrap_or_else(|| Mtu::largest_within(mine.bytes().min(peer.mtu as usize)));
        self.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(mtu),
            dest_qp_num: Some(peer.qpn),
            rq_psn: Some(peer.psn),
            max_dest_rd_atomic: rc.then_some(opts.max_rd_atomic),
            min_rnr_timer: rc.then_some(opts.min_rnr_timer),
            ah_attr: Some(AddressVector {
                dgid: peer.gid,
                sgid_index,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            }),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(self.psn),
            timeout: rc.then_some(opts.timeout),
            retry_cnt: rc.then_some(opts.retry_cnt),
            rnr_retry: rc.then_some(opts.rnr_retry),
            max_rd_atomic: rc.then_some(opts.max_rd_atomic),
            ..Default::default()
        })
    }
}

impl Qp<Rc> {
    /// Alias of [`Qp::connect`] with the default options.
    ///
    /// # Errors
    /// What [`Qp::connect`] returns.
    pub fn connect_to(&self, peer: &QpEndpoint) -> Result<()> {
        self.connect(peer, &ConnectOptions::default())
    }
}

impl Qp<Ud> {
    /// Make the UD QP ready to send and receive: RESET → INIT (with Q_Key `qkey`) → RTR → RTS.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # use std::time::Duration;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(16, None)?;
    /// let (a, b) = (pd.create_ud_qp(&cq)?, pd.create_ud_qp(&cq)?);
    /// a.activate(0x1111)?;
    /// b.activate(0x1111)?;
    /// let mr = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE)?;
    /// // A UD receive buffer starts with GRH_LEN bytes for the network header.
    /// b.recv(mr.slice(..GRH_LEN + 64)?).post()?;
    /// mr.write(200, b"datagram")?;
    /// let ah = pd.create_ah(&AhAttr::new(ctx.gid()))?;
    /// a.send_to(mr.slice(200..208)?, &ah, b.qp_num(), 0x1111).post()?;
    /// let mut n = 0;
    /// while n < 2 {
    ///     cq.wait(Duration::from_secs(5))?.ok()?;
    ///     n += 1;
    /// }
    /// let mut got = [0u8; 8];
    /// mr.read(GRH_LEN, &mut got)?;
    /// assert_eq!(&got, b"datagram");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// What [`QueuePair::modify`](super::QueuePair::modify) returns.
    pub fn activate(&self, qkey: u32) -> Result<()> {
        self.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qkey: Some(qkey),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(self.psn),
            ..Default::default()
        })
    }
}
