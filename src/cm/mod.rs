//! InfiniBand Communication Manager (CM) MADs, as Linux `ib_cm`/`rdma_cm` send them on QP1.
//!
//! Over RoCEv2 a CM message is a UD SEND_ONLY to QP1 (DETH Q_Key [`crate::wire::deth::GSI_QKEY`])
//! whose 256-byte payload is a MAD: the 24-byte common MAD header ([`mad::MadHdr`], management
//! class 0x07, class version 2) followed by 232 bytes laid out as IBA Vol 1 chapter 12.6 says for
//! the attribute. One module per message; each message type has
//! `parse(&[u8]) -> Result<Self, CmWireError>` (takes the whole 256-byte MAD, never panics) and
//! `emit(&self, &mut [u8; 256])`, and keeps every reserved bit it was given, so
//! `emit(parse(bytes)) == bytes` for any MAD that parses. [`CmMad`] dispatches on the attribute ID.
//!
//! rdma_cm specifics live in [`service_id`] (port spaces folded into the 64-bit Service ID) and
//! [`private_data`] (the `cma_hdr` carrying IP addresses at the front of REQ / SIDR_REQ private
//! data).

pub mod apr;
pub mod drep;
pub mod dreq;
pub(crate) mod endpoint;
pub mod lap;
pub mod mad;
pub mod manager;
pub mod mra;
pub mod private_data;
pub mod ratelimit;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod service_id;
pub mod sidr;
pub mod sidr_manager;

pub use apr::AlternatePathResponse;
pub use drep::DisconnectReply;
pub use dreq::DisconnectRequest;
pub use lap::LoadAlternatePath;
pub use mad::{MadHdr, RawCmMad};
pub use mra::MessageReceiptAck;
pub use private_data::{CmaHdr, PrivateData};
pub use rej::{ConnectReject, RejReason};
pub use rep::ConnectReply;
pub use req::{ConnectRequest, PathInfo};
pub use rtu::ReadyToUse;
pub use service_id::PortSpace;
pub use sidr::{SidrReply, SidrRequest};

/// Why a CM MAD (or a piece of one) could not be parsed or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmWireError {
    #[error("a CM MAD is 256 bytes, got {0}")]
    Length(usize),
    #[error("MAD base version {0}, expected 1")]
    BadBaseVersion(u8),
    #[error("management class {0:#04x} is not CM (0x07)")]
    NotCm(u8),
    #[error("attribute ID {found:#06x}, expected {expected:#06x}")]
    WrongAttribute { expected: u16, found: u16 },
    #[error("field truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall { need: usize, have: usize },
    #[error("private data of {len} bytes does not fit in {max}")]
    PrivateDataTooLong { len: usize, max: usize },
}

/// A message type of the CM class: its attribute ID, and its parse/emit pair.
pub trait CmMessage: Sized {
    /// The MAD attribute ID of this message (IBA Table 104).
    const ATTR_ID: u16;
    /// Parse a whole 256-byte MAD. Never panics.
    fn parse(buf: &[u8]) -> Result<Self, CmWireError>;
    /// Write the whole 256-byte MAD; the header's attribute ID is always [`Self::ATTR_ID`].
    fn emit(&self, buf: &mut [u8; mad::MAD_LEN]);
    /// The common MAD header.
    fn hdr(&self) -> &MadHdr;
}

macro_rules! impl_cm_message {
    ($t:ty, $attr:expr) => {
        impl $crate::cm::CmMessage for $t {
            const ATTR_ID: u16 = $attr;
            fn parse(buf: &[u8]) -> Result<Self, $crate::cm::CmWireError> {
                <$t>::parse(buf)
            }
            fn emit(&self, buf: &mut [u8; $crate::cm::mad::MAD_LEN]) {
                <$t>::emit(self, buf)
            }
            fn hdr(&self) -> &$crate::cm::MadHdr {
                &self.hdr
            }
        }
    };
}
pub(crate) use impl_cm_message;

/// Any CM MAD, by attribute ID. Attributes without a typed decoder (ClassPortInfo, or IDs this
/// crate does not know) are kept whole in [`CmMad::Other`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMad {
    Req(ConnectRequest),
    Mra(MessageReceiptAck),
    Rej(ConnectReject),
    Rep(ConnectReply),
    Rtu(ReadyToUse),
    Dreq(DisconnectRequest),
    Drep(DisconnectReply),
    SidrReq(SidrRequest),
    SidrRep(SidrReply),
    Lap(LoadAlternatePath),
    Apr(AlternatePathResponse),
    Other(RawCmMad),
}

impl CmMad {
    /// Parse a 256-byte CM MAD of any attribute. Never panics.
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let hdr = MadHdr::parse(buf)?;
        if buf.len() != mad::MAD_LEN {
            return Err(CmWireError::Length(buf.len()));
        }
        Ok(match hdr.attr_id {
            mad::attr::REQ => CmMad::Req(ConnectRequest::parse(buf)?),
            mad::attr::MRA => CmMad::Mra(MessageReceiptAck::parse(buf)?),
            mad::attr::REJ => CmMad::Rej(ConnectReject::parse(buf)?),
            mad::attr::REP => CmMad::Rep(ConnectReply::parse(buf)?),
            mad::attr::RTU => CmMad::Rtu(ReadyToUse::parse(buf)?),
            mad::attr::DREQ => CmMad::Dreq(DisconnectRequest::parse(buf)?),
            mad::attr::DREP => CmMad::Drep(DisconnectReply::parse(buf)?),
            mad::attr::SIDR_REQ => CmMad::SidrReq(SidrRequest::parse(buf)?),
            mad::attr::SIDR_REP => CmMad::SidrRep(SidrReply::parse(buf)?),
            mad::attr::LAP => CmMad::Lap(LoadAlternatePath::parse(buf)?),
            mad::attr::APR => CmMad::Apr(AlternatePathResponse::parse(buf)?),
            _ => CmMad::Other(RawCmMad::parse(buf)?),
        })
    }

    /// Write the MAD.
    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        match self {
            CmMad::Req(m) => m.emit(buf),
            CmMad::Mra(m) => m.emit(buf),
            CmMad::Rej(m) => m.emit(buf),
            CmMad::Rep(m) => m.emit(buf),
            CmMad::Rtu(m) => m.emit(buf),
            CmMad::Dreq(m) => m.emit(buf),
            CmMad::Drep(m) => m.emit(buf),
            CmMad::SidrReq(m) => m.emit(buf),
            CmMad::SidrRep(m) => m.emit(buf),
            CmMad::Lap(m) => m.emit(buf),
            CmMad::Apr(m) => m.emit(buf),
            CmMad::Other(m) => m.emit(buf),
        }
    }

    /// The common MAD header.
    pub fn hdr(&self) -> &MadHdr {
        match self {
            CmMad::Req(m) => &m.hdr,
            CmMad::Mra(m) => &m.hdr,
            CmMad::Rej(m) => &m.hdr,
            CmMad::Rep(m) => &m.hdr,
            CmMad::Rtu(m) => &m.hdr,
            CmMad::Dreq(m) => &m.hdr,
            CmMad::Drep(m) => &m.hdr,
            CmMad::SidrReq(m) => &m.hdr,
            CmMad::SidrRep(m) => &m.hdr,
            CmMad::Lap(m) => &m.hdr,
            CmMad::Apr(m) => &m.hdr,
            CmMad::Other(m) => &m.hdr,
        }
    }

    /// A short name for logs: "REQ", "REP", ...
    pub fn name(&self) -> &'static str {
        match self {
            CmMad::Req(_) => "REQ",
            CmMad::Mra(_) => "MRA",
            CmMad::Rej(_) => "REJ",
            CmMad::Rep(_) => "REP",
            CmMad::Rtu(_) => "RTU",
            CmMad::Dreq(_) => "DREQ",
            CmMad::Drep(_) => "DREP",
            CmMad::SidrReq(_) => "SIDR_REQ",
            CmMad::SidrRep(_) => "SIDR_REP",
            CmMad::Lap(_) => "LAP",
            CmMad::Apr(_) => "APR",
            CmMad::Other(_) => "other",
        }
    }
}

/// The IPv4-mapped GID of an IPv4 address.
pub use crate::wire::gid::gid_from_ipv4 as ipv4_to_gid;
/// The IPv4 address in an IPv4-mapped GID (`::ffff:a.b.c.d`, as RoCEv2 uses for IPv4), if it is one.
pub use crate::wire::gid::ipv4_from_gid as gid_to_ipv4;

pub(crate) use crate::wire::be;

/// A mask of the low `bits` bits.
pub(crate) const fn mask(bits: u32) -> u32 {
    (1u32 << bits) - 1
}
