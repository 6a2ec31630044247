//! Atomic Acknowledge Extended Transport Header (IBA 9.3.6): the original remote value.

use super::{be, WireError};

/// Length of the AtomicAckETH.
pub const LEN: usize = 8;

/// A parsed AtomicAckETH.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AtomicAckEth {
    /// The value the remote 8-byte location held before the atomic operation (Orig Remote Data).
    pub orig: u64,
}

impl AtomicAckEth {
    /// Parse the first [`LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(AtomicAckEth {
            orig: be::u64(&buf[0..8]),
        })
    }

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AtomicAckETH of frame 361 of tests/data/rxe-basic.pcap: the original value returned for
    /// ib_atomic_bw's FETCH_ADD (whatever the responder's buffer held).
    const ATOMIC_ACK: [u8; LEN] = [0xed, 0xa4, 0x96, 0xe4, 0x0e, 0x55, 0x18, 0xbf];

    #[test]
    fn parse_and_emit_capture_atomic_ack() {
        let a = AtomicAckEth::parse(&ATOMIC_ACK).unwrap();
        assert_eq!(a.orig, 0xeda4_96e4_0e55_18bf);
        let mut out = [0u8; LEN];
        a.emit(&mut out);
        assert_eq!(out, ATOMIC_ACK);
        for n in 0..LEN {
            assert_eq!(
                AtomicAckEth::parse(&ATOMIC_ACK[..n]),
                Err(WireError::Truncated)
            );
        }
    }
}
