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
    /// The operation and transport service of the packet (OpCode).
    pub opcode: Opcode,
    /// Solicited event (SE).
    pub solicited: bool,
    /// MigReq (M).
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3).
    pub pad_count: u8,
    /// Transport header version; 0 is the only one defined.
    pub tver: u8,
    /// Partition key (P_Key).
    pub pkey: u16,
    /// Forward explicit congestion notification (F).
    pub fecn: bool,
    /// Backward explicit congestion notification (B).
    pub becn: bool,
    /// The 6 reserved bits of byte 4, kept so re-emitting reproduces the bytes.
    pub resv6: u8,
    /// Destination queue pair number (DestQP, 24 bits).
    pub dest_qpn: u32,
    /// AckReq (A).
    pub ack_req: bool,
    /// The 7 reserved bits of byte 8.
    pub resv7: u8,
    /// Packet sequence number (PSN).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// BTH of frame 4 of tests/data/rxe-basic.pcap: rping's RC SEND_ONLY to QP 0x11, AckReq set.
    const SEND_ONLY: [u8; LEN] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x2a, 0x3e, 0x9b,
    ];
    /// BTH of frame 45 of rxe-basic.pcap: a 2-byte perftest SEND_ONLY, PadCnt 2.
    const SEND_ONLY_PAD2: [u8; LEN] = [
        0x04, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0xa4, 0x5c, 0x97,
    ];
    /// BTH of frame 1 of rxe-basic.pcap: a CM MAD, UD SEND_ONLY to QP1 with PSN 0.
    const UD_QP1: [u8; LEN] = [
        0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x80, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn parse_capture_bths() {
        let b = Bth::parse(&SEND_ONLY).unwrap();
        let mut want = Bth::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(0x2a3e9b));
        want.ack_req = true;
        assert_eq!(b, want);
        assert_eq!(b.pkey, DEFAULT_PKEY);
        assert!(!b.solicited && !b.mig_req && !b.fecn && !b.becn);

        let b = Bth::parse(&SEND_ONLY_PAD2).unwrap();
        assert_eq!(b.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(b.pad_count, 2);
        assert_eq!(b.pad_count, Bth::pad_for(2));
        assert_eq!(
            (b.dest_qpn, b.psn.value(), b.ack_req),
            (0x12, 0xa45c97, true)
        );

        let b = Bth::parse(&UD_QP1).unwrap();
        assert_eq!(b.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!((b.dest_qpn, b.psn.value(), b.ack_req), (1, 0, true));
    }

    #[test]
    fn emit_reproduces_capture_bytes() {
        for bytes in [SEND_ONLY, SEND_ONLY_PAD2, UD_QP1] {
            let mut out = [0u8; LEN];
            Bth::parse(&bytes).unwrap().emit(&mut out);
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn every_bit_of_every_field_round_trips() {
        // One field set to all ones at a time, then everything: no bit is lost or leaks.
        let cases: [(Bth, [u8; LEN]); 4] = [
            (
                Bth {
                    solicited: true,
                    mig_req: true,
                    pad_count: 3,
                    tver: 0xf,
                    ..Bth::new(Opcode(0xff), 0, Psn::new(0))
                },
                [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                Bth {
                    fecn: true,
                    becn: true,
                    resv6: 0x3f,
                    pkey: 0,
                    ..Bth::new(Opcode(0), 0, Psn::new(0))
                },
                [0, 0, 0, 0, 0xff, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                Bth {
                    ack_req: true,
                    resv7: 0x7f,
                    pkey: 0,
                    ..Bth::new(Opcode(0), 0xff_ffff, Psn::new(0xff_ffff))
                },
                [0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            ),
            (
                Bth {
                    pkey: 0x8001,
                    resv6: 0x15,
                    resv7: 0x2a,
                    ..Bth::new(Opcode(0x11), 0x123456, Psn::new(0xabcdef))
                },
                [
                    0x11, 0x00, 0x80, 0x01, 0x15, 0x12, 0x34, 0x56, 0x2a, 0xab, 0xcd, 0xef,
                ],
            ),
        ];
        for (bth, bytes) in cases {
            let mut out = [0u8; LEN];
            bth.emit(&mut out);
            assert_eq!(out, bytes, "{bth:?}");
            assert_eq!(Bth::parse(&bytes).unwrap(), bth);
        }
    }

    #[test]
    fn truncated() {
        for n in 0..LEN {
            assert_eq!(Bth::parse(&SEND_ONLY[..n]), Err(WireError::Truncated));
        }
        assert_eq!(
            Bth::new(Opcode::RC_ACKNOWLEDGE, 0x1ff_ffff, Psn::new(0)).dest_qpn,
            0xff_ffff
        );
        assert_eq!(
            [
                Bth::pad_for(0),
                Bth::pad_for(1),
                Bth::pad_for(2),
                Bth::pad_for(3)
            ],
            [0, 3, 2, 1]
        );
    }
}
