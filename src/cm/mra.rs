//! MRA, MessageReceiptAcknowledgement (IBA 12.6.6, Table 107): "I got your REQ/REP/LAP, give me
//! longer to answer".
//! ```text
//!  0 local comm ID   4 remote comm ID   8 message MRAed (2) rsvd (6)
//!  9 service timeout (5) rsvd (3)      10 private data (222)
//! ```

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of MRA private data.
pub const PRIVATE_DATA_LEN: usize = 222;

/// Values of [`MessageReceiptAck::message_mraed`].
pub mod mraed {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const LAP: u8 = 2;
}

/// An MRA message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MessageReceiptAck {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits, see [`mraed`].
    pub message_mraed: u8,
    /// Low 6 bits of byte 8, reserved.
    pub rsvd8: u8,
    /// 5 bits, 4.096 µs * 2^n.
    pub service_timeout: u8,
    /// Low 3 bits of byte 9, reserved.
    pub rsvd9: u8,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl MessageReceiptAck {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::MRA)?;
        Ok(MessageReceiptAck {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            message_mraed: d[8] >> 6,
            rsvd8: d[8] & 0x3f,
            service_timeout: d[9] >> 3,
            rsvd9: d[9] & 0x07,
            private_data: PrivateData::read(d, 10),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::MRA, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        d[8] = (self.message_mraed & 0x03) << 6 | (self.rsvd8 & 0x3f);
        d[9] = (self.service_timeout & 0x1f) << 3 | (self.rsvd9 & 0x07);
        self.private_data.write(d, 10);
    }
}

impl_cm_message!(MessageReceiptAck, mad::attr::MRA);
