//! APR, AlternatePathResponse (IBA 12.8.2, Table 116).
//! ```text
//!  0 local comm ID   4 remote comm ID   8 additional info length   9 AP status   10 rsvd16
//! 12 additional info (72)   84 private data (148)
//! ```

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of the APR additional information.
pub const ADDITIONAL_INFO_LEN: usize = 72;
/// Size of APR private data.
pub const PRIVATE_DATA_LEN: usize = 148;

/// AP status values (IBA Table 117, Linux `enum ib_cm_apr_status`).
pub mod status {
    pub const SUCCESS: u8 = 0;
    pub const INVALID_COMM_ID: u8 = 1;
    pub const UNSUPPORTED: u8 = 2;
    pub const REJECT: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const IS_CURRENT: u8 = 5;
    pub const INVALID_QPN_EECN: u8 = 6;
    pub const INVALID_LID: u8 = 7;
    pub const INVALID_GID: u8 = 8;
    pub const INVALID_FLOW_LABEL: u8 = 9;
    pub const INVALID_TCLASS: u8 = 10;
    pub const INVALID_HOP_LIMIT: u8 = 11;
    pub const INVALID_PACKET_RATE: u8 = 12;
    pub const INVALID_SL: u8 = 13;
}

/// An APR message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AlternatePathResponse {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub additional_info_length: u8,
    /// See [`status`].
    pub ap_status: u8,
    pub rsvd10: u16,
    pub additional_info: PrivateData<ADDITIONAL_INFO_LEN>,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl AlternatePathResponse {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::APR)?;
        Ok(AlternatePathResponse {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            additional_info_length: d[8],
            ap_status: d[9],
            rsvd10: be::u16(&d[10..]),
            additional_info: PrivateData::read(d, 12),
            private_data: PrivateData::read(d, 84),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::APR, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        d[8] = self.additional_info_length;
        d[9] = self.ap_status;
        be::put_u16(&mut d[10..], self.rsvd10);
        self.additional_info.write(d, 12);
        self.private_data.write(d, 84);
    }
}

impl_cm_message!(AlternatePathResponse, mad::attr::APR);
