//! ACK Extended Transport Header (IBA 9.3.5): syndrome and MSN.

use super::{be, WireError};

/// Length of the AETH.
pub const LEN: usize = 4;

/// NAK codes (IBA Table 45).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NakCode {
    /// 0: PSN sequence error; a request arrived with a PSN beyond the expected one. The
    /// requester retransmits from the NAK's PSN.
    PsnSequenceError,
    /// 1: invalid request (unsupported opcode, bad length...); completes with
    /// `IBV_WC_REM_INV_REQ_ERR`.
    InvalidRequest,
    /// 2: remote access error (R_Key, address range or access rights); completes with
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemoteAccessError,
    /// 3: remote operational error; completes with `IBV_WC_REM_OP_ERR`.
    RemoteOperationalError,
    /// 4: invalid RD request (Reliable Datagram only); completes with
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    InvalidRdRequest,
    /// A reserved code, kept as received.
    Reserved(u8),
}

impl NakCode {
    /// Decode the 5-bit NAK code field of a NAK syndrome (bits above the low 5 are ignored).
    pub const fn from_bits(v: u8) -> Self {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            v => NakCode::Reserved(v & 0x1f),
        }
    }

    /// The 5-bit NAK code field.
    pub const fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(v) => v & 0x1f,
        }
    }
}

/// The AETH syndrome (IBA Table 43).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Syndrome {
    /// Positive ACK with the end-to-end credit count code (0x1f: no credits advertised).
    Ack {
        /// The 5-bit credit count code.
        credits: u8,
    },
    /// Receiver not ready, with the encoded RNR timer (IBA Table 45).
    RnrNak {
        /// The 5-bit RNR NAK timer code; see [`rnr_timer_micros`].
        timer: u8,
    },
    /// Negative acknowledgment with its NAK code.
    Nak(NakCode),
    /// Syndromes with the reserved type 0b10 or the reserved bit 7 set, kept as received.
    Reserved(u8),
}

/// Credit code meaning "no end-to-end flow control credits are advertised" (IBA 9.7.7.2.5).
pub const CREDITS_INVALID: u8 = 0x1f;

impl Syndrome {
    /// Decode a syndrome byte. As in rxe (`AETH_TYPE_MASK` is 0xe0), a syndrome with the
    /// reserved bit 7 set is [`Syndrome::Reserved`], so every byte decodes and re-encodes to
    /// itself.
    pub const fn from_bits(s: u8) -> Self {
        match s >> 5 {
            0 => Syndrome::Ack { credits: s & 0x1f },
            1 => Syndrome::RnrNak { timer: s & 0x1f },
            3 => Syndrome::Nak(NakCode::from_bits(s & 0x1f)),
            _ => Syndrome::Reserved(s),
        }
    }

    /// Encode the syndrome byte.
    pub const fn bits(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.bits(),
            Syndrome::Reserved(s) => s,
        }
    }
}

/// A parsed AETH.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Aeth {
    /// What the ACK says: ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl Aeth {
    /// Parse the first [`LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Aeth {
            syndrome: Syndrome::from_bits(buf[0]),
            msn: be::u24(&buf[1..4]),
        })
    }

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.syndrome.bits();
        be::put_u24(&mut buf[1..4], self.msn);
    }
}

/// RNR NAK timer field to its delay in microseconds (IBA Table 45).
pub const fn rnr_timer_micros(code: u8) -> u64 {
    const TABLE: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    TABLE[(code & 0x1f) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AETH of frame 5 of tests/data/rxe-basic.pcap: rxe's ACK of rping's first SEND (rxe always
    /// sends credit code 0x1f, "invalid": no end-to-end credits).
    const ACK: [u8; LEN] = [0x1f, 0x00, 0x00, 0x01];
    /// AETH of frame 214 of tests/data/rxe-loss-mtu4096.pcap: a PSN sequence error NAK, MSN 0.
    const NAK_PSN_SEQ: [u8; LEN] = [0x60, 0x00, 0x00, 0x00];

    fn round_trip(bytes: [u8; LEN], want: Aeth) {
        let a = Aeth::parse(&bytes).unwrap();
        assert_eq!(a, want);
        let mut out = [0u8; LEN];
        a.emit(&mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn capture_ack_and_psn_sequence_nak() {
        round_trip(
            ACK,
            Aeth {
                syndrome: Syndrome::Ack {
                    credits: CREDITS_INVALID,
                },
                msn: 1,
            },
        );
        round_trip(
            NAK_PSN_SEQ,
            Aeth {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: 0,
            },
        );
    }

    #[test]
    fn rnr_nak_and_other_nak_codes() {
        // Neither capture has an RNR NAK or another NAK code: these are built from IBA Tables
        // 43-45 (syndrome 0b001_ttttt is RNR NAK with timer t; 0b011_ccccc a NAK with code c).
        round_trip(
            [0x2e, 0x00, 0x12, 0x34],
            Aeth {
                syndrome: Syndrome::RnrNak { timer: 14 },
                msn: 0x1234,
            },
        );
        assert_eq!(rnr_timer_micros(14), 1_280);
        assert_eq!(rnr_timer_micros(13), 960);
        assert_eq!(rnr_timer_micros(0), 655_360);
        assert_eq!(rnr_timer_micros(31), 491_520);
        let codes = [
            (0x61, NakCode::InvalidRequest),
            (0x62, NakCode::RemoteAccessError),
            (0x63, NakCode::RemoteOperationalError),
            (0x64, NakCode::InvalidRdRequest),
            (0x65, NakCode::Reserved(5)),
            (0x7f, NakCode::Reserved(0x1f)),
        ];
        for (s, code) in codes {
            round_trip(
                [s, 0xff, 0xff, 0xff],
                Aeth {
                    syndrome: Syndrome::Nak(code),
                    msn: 0xff_ffff,
                },
            );
        }
        round_trip(
            [0x45, 0, 0, 9],
            Aeth {
                syndrome: Syndrome::Reserved(0x45),
                msn: 9,
            },
        );
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for s in 0..=255u8 {
            assert_eq!(Syndrome::from_bits(s).bits(), s, "{s:#x}");
            let a = Aeth::parse(&[s, 1, 2, 3]).unwrap();
            let mut out = [0u8; LEN];
            a.emit(&mut out);
            assert_eq!(out, [s, 1, 2, 3], "{s:#x}");
        }
        for n in 0..LEN {
            assert_eq!(Aeth::parse(&ACK[..n]), Err(WireError::Truncated));
        }
    }
}
