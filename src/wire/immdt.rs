//! Immediate Data Extended Transport Header (IBA 9.3.7).
//!
//! The value is kept as the host-order integer of the four wire bytes (big-endian), so that
//! `imm_data` in a completion equals what the sender posted, as with libibverbs' `htobe32` usage.

use super::{be, WireError};

/// Length of the ImmDt header.
pub const LEN: usize = 4;

pub fn parse(buf: &[u8]) -> Result<u32, WireError> {
    if buf.len() < LEN {
        return Err(WireError::Truncated);
    }
    Ok(be::u32(&buf[0..4]))
}

pub fn emit(imm: u32, buf: &mut [u8]) {
    be::put_u32(&mut buf[0..4], imm);
}
