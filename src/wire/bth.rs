//! Base Transport Header (IBA 9.2).
//!
//! ```text
//!  0       | 1                | 2 3    | 4           | 5 6 7    | 8          | 9 10 11
//!  opcode  | SE M PadCnt TVer | P_Key  | F B resv6   | DestQP   | A resv7    | PSN
//! ```

use super::{be, Opcode, Psn, WireError};

/// Length of the BTH.
pub const LEN: usize = 12;

/// The default partition key (full membership).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A parsed BTH.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Bth {
    pub opcode: Opcode,
    /// Solicited event (SE).
    pub solicited: bool,
    /// MigReq (M).
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3).
    pub pad_count: u8,
    /// Transport header version; 0 is the only one defined.
    pub tver: u8,
    pub pkey: u16,
    /// Explicit congestion notification bits (FECN, BECN).
    pub fecn: bool,
    pub becn: bool,
    /// The 6 reserved bits of byte 4, kept so re-emitting reproduces the bytes.
    pub resv6: u8,
    pub dest_qpn: u32,
    /// AckReq (A).
    pub ack_req: bool,
    /// The 7 reserved bits of byte 8.
    pub resv7: u8,
    pub psn: Psn,
}

impl Bth {
    /// A BTH with the defaults rxe uses: default P_Key, TVer 0, no reserved bits.
    pub fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Self {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qpn: dest_qpn & 0x00ff_ffff,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Pad bytes needed after a payload of `len` bytes to reach a 4-byte boundary.
    pub const fn pad_for(len: usize) -> u8 {
        ((4 - (len % 4)) % 4) as u8
    }

    /// Parse the first [`LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Bth {
            opcode: Opcode(buf[0]),
            solicited: buf[1] & 0x80 != 0,
            mig_req: buf[1] & 0x40 != 0,
            pad_count: (buf[1] >> 4) & 0x3,
            tver: buf[1] & 0x0f,
            pkey: be::u16(&buf[2..4]),
            fecn: buf[4] & 0x80 != 0,
            becn: buf[4] & 0x40 != 0,
            resv6: buf[4] & 0x3f,
            dest_qpn: be::u24(&buf[5..8]),
            ack_req: buf[8] & 0x80 != 0,
            resv7: buf[8] & 0x7f,
            psn: Psn::new(be::u24(&buf[9..12])),
        })
    }

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.opcode.0;
        buf[1] = (self.solicited as u8) << 7
            | (self.mig_req as u8) << 6
            | (self.pad_count & 3) << 4
            | (self.tver & 0x0f);
        be::put_u16(&mut buf[2..4], self.pkey);
        buf[4] = (self.fecn as u8) << 7 | (self.becn as u8) << 6 | (self.resv6 & 0x3f);
        be::put_u24(&mut buf[5..8], self.dest_qpn);
        buf[8] = (self.ack_req as u8) << 7 | (self.resv7 & 0x7f);
        be::put_u24(&mut buf[9..12], self.psn.value());
    }
}
