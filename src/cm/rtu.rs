//! RTU, ReadyToUse (IBA 12.6.9, Table 111): the active side confirms the REP.
//! ```text
//!  0 local comm ID   4 remote comm ID   8 private data (224)
//! ```

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of RTU private data.
pub const PRIVATE_DATA_LEN: usize = 224;

/// An RTU message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReadyToUse {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl ReadyToUse {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::RTU)?;
        Ok(ReadyToUse {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            private_data: PrivateData::read(d, 8),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::RTU, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        self.private_data.write(d, 8);
    }
}

impl_cm_message!(ReadyToUse, mad::attr::RTU);
