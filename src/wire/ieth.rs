//! Invalidate Extended Transport Header (IBA 9.3.8): the R_Key to invalidate.

use super::{be, WireError};

/// Length of the IETH.
pub const LEN: usize = 4;

pub fn parse(buf: &[u8]) -> Result<u32, WireError> {
    if buf.len() < LEN {
        return Err(WireError::Truncated);
    }
    Ok(be::u32(&buf[0..4]))
}

pub fn emit(rkey: u32, buf: &mut [u8]) {
    be::put_u32(&mut buf[0..4], rkey);
}
