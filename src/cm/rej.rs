//! REJ, Reject (IBA 12.6.7, Table 108).
//! ```text
//!  0 local comm ID   4 remote comm ID   8 message rejected (2) rsvd (6)
//!  9 rejected info length (7) rsvd (1)  10 reason (16)   12 ARI (72)   84 private data (148)
//! ```
//! rdma_cm rejects with reason 28 (consumer defined) and the consumer's private data; the kernel
//! CM itself uses e.g. 8 (invalid service ID, nobody listening) or 1 (no QP).

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of the Additional Rejection Information area.
pub const ARI_LEN: usize = 72;
/// Size of REJ private data.
pub const PRIVATE_DATA_LEN: usize = 148;

/// Values of [`ConnectReject::message_rejected`].
pub mod rejected {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
}

macro_rules! rej_reasons {
    ($($name:ident = $code:literal,)*) => {
        /// REJ reason codes (IBA Table 109, Linux `enum ib_cm_rej_reason`).
        #[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
        pub enum RejReason {
            $($name,)*
            /// A code this crate has no name for, kept as is.
            Other(u16),
        }

        impl RejReason {
            pub const fn from_code(code: u16) -> Self {
                match code {
                    $($code => RejReason::$name,)*
                    c => RejReason::Other(c),
                }
            }

            pub const fn code(self) -> u16 {
                match self {
                    $(RejReason::$name => $code,)*
                    RejReason::Other(c) => c,
                }
            }
        }
    };
}

rej_reasons! {
    NoQp = 1,
    NoEec = 2,
    NoResources = 3,
    Timeout = 4,
    Unsupported = 5,
    InvalidCommId = 6,
    InvalidCommInstance = 7,
    InvalidServiceId = 8,
    InvalidTransportType = 9,
    StaleConn = 10,
    RdcNotExist = 11,
    InvalidGid = 12,
    InvalidLid = 13,
    InvalidSl = 14,
    InvalidTrafficClass = 15,
    InvalidHopLimit = 16,
    InvalidPacketRate = 17,
    InvalidAltGid = 18,
    InvalidAltLid = 19,
    InvalidAltSl = 20,
    InvalidAltTrafficClass = 21,
    InvalidAltHopLimit = 22,
    InvalidAltPacketRate = 23,
    PortCmRedirect = 24,
    PortRedirect = 25,
    InvalidMtu = 26,
    InsufficientRespResources = 27,
    ConsumerDefined = 28,
    InvalidRnrRetry = 29,
    DuplicateLocalCommId = 30,
    InvalidClassVersion = 31,
    InvalidFlowLabel = 32,
    InvalidAltFlowLabel = 33,
    VendorOptionNotSupported = 35,
}

#[allow(clippy::derivable_impls)]
impl Default for RejReason {
    fn default() -> Self {
        RejReason::ConsumerDefined
    }
}

/// A REJ message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConnectReject {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits, see [`rejected`].
    pub message_rejected: u8,
    /// Low 6 bits of byte 8, reserved.
    pub rsvd8: u8,
    /// 7 bits: how many bytes of [`ConnectReject::ari`] are meaningful.
    pub rejected_info_length: u8,
    /// Low bit of byte 9, reserved.
    pub rsvd9: u8,
    pub reason: RejReason,
    /// Additional Rejection Information, whose meaning depends on the reason.
    pub ari: PrivateData<ARI_LEN>,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl ConnectReject {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::REJ)?;
        Ok(ConnectReject {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            message_rejected: d[8] >> 6,
            rsvd8: d[8] & 0x3f,
            rejected_info_length: d[9] >> 1,
            rsvd9: d[9] & 0x01,
            reason: RejReason::from_code(be::u16(&d[10..])),
            ari: PrivateData::read(d, 12),
            private_data: PrivateData::read(d, 84),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::REJ, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        d[8] = (self.message_rejected & 0x03) << 6 | (self.rsvd8 & 0x3f);
        d[9] = (self.rejected_info_length & 0x7f) << 1 | (self.rsvd9 & 0x01);
        be::put_u16(&mut d[10..], self.reason.code());
        self.ari.write(d, 12);
        self.private_data.write(d, 84);
    }

    /// The meaningful part of the ARI (its declared length, capped at the area's size).
    pub fn ari_bytes(&self) -> &[u8] {
        &self.ari.0[..(self.rejected_info_length as usize).min(ARI_LEN)]
    }
}

impl_cm_message!(ConnectReject, mad::attr::REJ);
