//! RDMA Extended Transport Header (IBA 9.3.3): virtual address, R_Key, DMA length.

use super::{be, WireError};

/// Length of the RETH.
pub const LEN: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Reth {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Reth { va: be::u64(&buf[0..8]), rkey: be::u32(&buf[8..12]), dma_len: be::u32(&buf[12..16]) })
    }

    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u64(&mut buf[0..8], self.va);
        be::put_u32(&mut buf[8..12], self.rkey);
        be::put_u32(&mut buf[12..16], self.dma_len);
    }
}
