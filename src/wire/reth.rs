//! RDMA Extended Transport Header (IBA 9.3.3): virtual address, R_Key, DMA length.

use super::{be, WireError};

/// Length of the RETH.
pub const LEN: usize = 16;

/// A parsed RETH: the remote buffer of an RDMA WRITE or READ.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Reth {
    /// Remote virtual address of the first byte of the message (VA).
    pub va: u64,
    /// Remote key of the target memory region (R_Key).
    pub rkey: u32,
    /// Length in bytes of the message this packet starts, not of this packet (DMA Length).
    pub dma_len: u32,
}

impl Reth {
    /// Parse the first [`LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Reth {
            va: be::u64(&buf[0..8]),
            rkey: be::u32(&buf[8..12]),
            dma_len: be::u32(&buf[12..16]),
        })
    }

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.va);
        be::put_u32(&mut buf[8..12], self.rkey);
        be::put_u32(&mut buf[12..16], self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RETH of frame 12 of tests/data/rxe-basic.pcap: rping's 64-byte RDMA WRITE_ONLY.
    const WRITE_ONLY: [u8; LEN] = [
        0x00, 0x00, 0x56, 0x32, 0x0f, 0xb6, 0x25, 0x50, 0x00, 0x00, 0x04, 0xd7, 0x00, 0x00, 0x00,
        0x40,
    ];
    /// RETH of frame 146: the first packet of ib_write_bw's 5000-byte WRITE.
    const WRITE_FIRST: [u8; LEN] = [
        0x00, 0x00, 0x55, 0xe4, 0x87, 0x4b, 0x43, 0x88, 0x00, 0x00, 0x08, 0x2d, 0x00, 0x00, 0x13,
        0x88,
    ];

    #[test]
    fn parse_and_emit_capture_reths() {
        let cases = [
            (WRITE_ONLY, 0x0000_5632_0fb6_2550, 0x4d7, 64),
            (WRITE_FIRST, 0x0000_55e4_874b_4388, 0x82d, 5000),
        ];
        for (bytes, va, rkey, dma_len) in cases {
            let r = Reth::parse(&bytes).unwrap();
            assert_eq!(r, Reth { va, rkey, dma_len });
            let mut out = [0u8; LEN];
            r.emit(&mut out);
            assert_eq!(out, bytes);
        }
        for n in 0..LEN {
            assert_eq!(Reth::parse(&WRITE_ONLY[..n]), Err(WireError::Truncated));
        }
    }
}
