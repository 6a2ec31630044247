//! Invalidate Extended Transport Header (IBA 9.3.8): the R_Key to invalidate.

use super::{be, WireError};

/// Length of the IETH.
pub const LEN: usize = 4;

/// The R_Key in the first [`LEN`] bytes of `buf`.
pub fn parse(buf: &[u8]) -> Result<u32, WireError> {
    if buf.len() < LEN {
        return Err(WireError::Truncated);
    }
    Ok(be::u32(&buf[0..4]))
}

/// Write `rkey` into the first [`LEN`] bytes of `buf`.
///
/// # Panics
/// If `buf` is shorter than [`LEN`].
pub fn emit(rkey: u32, buf: &mut [u8]) {
    be::put_u32(&mut buf[0..4], rkey);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rkey_big_endian() {
        // No SEND_WITH_INVALIDATE in the captures; IBA 9.3.8: the 32-bit R_Key.
        let bytes = [0x00, 0x00, 0x04, 0xd7];
        assert_eq!(parse(&bytes), Ok(0x4d7));
        let mut out = [0u8; LEN];
        emit(0x4d7, &mut out);
        assert_eq!(out, bytes);
        for n in 0..LEN {
            assert_eq!(parse(&bytes[..n]), Err(WireError::Truncated));
        }
    }
}
