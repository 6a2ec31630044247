//! Immediate Data Extended Transport Header (IBA 9.3.7).
//!
//! The value is kept as the host-order integer of the four wire bytes (big-endian), so that
//! `imm_data` in a completion equals what the sender posted, as with libibverbs' `htobe32` usage.

use super::{be, WireError};

/// Length of the ImmDt header.
pub const LEN: usize = 4;

/// The immediate data in the first [`LEN`] bytes of `buf`.
pub fn parse(buf: &[u8]) -> Result<u32, WireError> {
    if buf.len() < LEN {
        return Err(WireError::Truncated);
    }
    Ok(be::u32(&buf[0..4]))
}

/// Write `imm` into the first [`LEN`] bytes of `buf`.
///
/// # Panics
/// If `buf` is shorter than [`LEN`].
pub fn emit(imm: u32, buf: &mut [u8]) {
    be::put_u32(&mut buf[0..4], imm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_on_the_wire() {
        // No immediate data in the captures; IBA 9.3.7: 4 bytes, as posted (network order).
        let bytes = [0x12, 0x34, 0x56, 0x78];
        assert_eq!(parse(&bytes), Ok(0x1234_5678));
        let mut out = [0u8; LEN];
        emit(0x1234_5678, &mut out);
        assert_eq!(out, bytes);
        for n in 0..LEN {
            assert_eq!(parse(&bytes[..n]), Err(WireError::Truncated));
        }
    }
}
