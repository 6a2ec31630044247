//! Atomic Extended Transport Header (IBA 9.3.4).

use super::{be, WireError};

/// Length of the AtomicETH.
pub const LEN: usize = 28;

/// A parsed AtomicETH: the target and operands of a compare & swap or fetch & add.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AtomicEth {
    /// Remote virtual address of the 8-byte target (VA).
    pub va: u64,
    /// Remote key of the target's memory region (R_Key).
    pub rkey: u32,
    /// Swap value (compare & swap) or add value (fetch & add).
    pub swap_add: u64,
    /// Compare value (compare & swap only).
    pub compare: u64,
}

impl AtomicEth {
    /// Parse the first [`LEN`] bytes of `buf`.
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

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.va);
        be::put_u32(&mut buf[8..12], self.rkey);
        be::put_u64(&mut buf[12..20], self.swap_add);
        be::put_u64(&mut buf[20..28], self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AtomicETH of frame 356 of tests/data/rxe-basic.pcap: ib_atomic_bw's FETCH_ADD of 1.
    const FETCH_ADD: [u8; LEN] = [
        0x00, 0x00, 0x56, 0x03, 0xe0, 0x7a, 0xf0, 0x00, // VA
        0x00, 0x00, 0x0c, 0xa8, // R_Key
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // add value
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare (unused)
    ];

    #[test]
    fn parse_and_emit_capture_fetch_add() {
        let a = AtomicEth::parse(&FETCH_ADD).unwrap();
        assert_eq!(
            a,
            AtomicEth {
                va: 0x0000_5603_e07a_f000,
                rkey: 0xca8,
                swap_add: 1,
                compare: 0,
            }
        );
        let mut out = [0u8; LEN];
        a.emit(&mut out);
        assert_eq!(out, FETCH_ADD);
    }

    #[test]
    fn compare_swap_field_order() {
        // No CMP_SWAP in the captures (ib_atomic_bw defaults to FETCH_ADD): IBA 9.3.4 order is
        // VA, R_Key, Swap (or Add) Data, Compare Data.
        let a = AtomicEth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x090a_0b0c,
            swap_add: 0x1112_1314_1516_1718,
            compare: 0x2122_2324_2526_2728,
        };
        let mut out = [0u8; LEN];
        a.emit(&mut out);
        assert_eq!(
            out,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
                0x18, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28
            ]
        );
        assert_eq!(AtomicEth::parse(&out).unwrap(), a);
        for n in 0..LEN {
            assert_eq!(AtomicEth::parse(&out[..n]), Err(WireError::Truncated));
        }
    }
}
