//! Atomic Acknowledge Extended Transport Header (IBA 9.3.6): the original remote value.

use super::{be, WireError};

/// Length of the AtomicAckETH.
pub const LEN: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AtomicAckEth {
    pub orig: u64,
}

impl AtomicAckEth {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(AtomicAckEth { orig: be::u64(&buf[0..8]) })
    }

    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.orig);
    }
}
