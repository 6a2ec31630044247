//! Atomic Extended Transport Header (IBA 9.3.4).

use super::{be, WireError};

/// Length of the AtomicETH.
pub const LEN: usize = 28;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    /// Swap value (compare & swap) or add value (fetch & add).
    pub swap_add: u64,
    /// Compare value (compare & swap only).
    pub compare: u64,
}

impl AtomicEth {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(AtomicEth {
            va: be::u64(&buf[0..8]),
            rkey: be::u32(&buf[8..12]),
            swap_add: be::u64(&buf[12..20]),
            compare: be::u64(&buf[20..28]),
        })
    }

    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.va);
        be::put_u32(&mut buf[8..12], self.rkey);
        be::put_u64(&mut buf[12..20], self.swap_add);
        be::put_u64(&mut buf[20..28], self.compare);
    }
}
