//! DREQ, DisconnectRequest (IBA 12.6.10, Table 112).
//! ```text
//!  0 local comm ID   4 remote comm ID   8 remote QPN/EECN (24) | rsvd8   12 private data (220)
//! ```

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of DREQ private data.
pub const PRIVATE_DATA_LEN: usize = 220;

/// A DREQ message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DisconnectRequest {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the QPN (or EECN) of the *receiver* of this DREQ.
    pub remote_qpn_eecn: u32,
    /// Byte 11, reserved.
    pub rsvd11: u8,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl DisconnectRequest {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::DREQ)?;
        Ok(DisconnectRequest {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            remote_qpn_eecn: be::u24(&d[8..]),
            rsvd11: d[11],
            private_data: PrivateData::read(d, 12),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::DREQ, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        be::put_u24(&mut d[8..], self.remote_qpn_eecn);
        d[11] = self.rsvd11;
        self.private_data.write(d, 12);
    }
}

impl_cm_message!(DisconnectRequest, mad::attr::DREQ);
