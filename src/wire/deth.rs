//! Datagram Extended Transport Header (IBA 9.3.2): Q_Key and source QP.

use super::{be, WireError};

/// Length of the DETH.
pub const LEN: usize = 8;

/// The well-known Q_Key of the General Services Interface, QP1 (IBA 13.5.3.3).
pub const GSI_QKEY: u32 = 0x8001_0000;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Deth {
    pub qkey: u32,
    /// The reserved byte 4, kept so re-emitting reproduces the bytes.
    pub resv8: u8,
    pub src_qpn: u32,
}

impl Deth {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Deth { qkey: be::u32(&buf[0..4]), resv8: buf[4], src_qpn: be::u24(&buf[5..8]) })
    }

    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u32(&mut buf[0..4], self.qkey);
        buf[4] = self.resv8;
        be::put_u24(&mut buf[5..8], self.src_qpn);
    }
}
