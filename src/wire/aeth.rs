//! ACK Extended Transport Header (IBA 9.3.5): syndrome and MSN.

use super::{be, WireError};

/// Length of the AETH.
pub const LEN: usize = 4;

/// NAK codes (IBA Table 45).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// A reserved code, kept as received.
    Reserved(u8),
}

impl NakCode {
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
    Ack { credits: u8 },
    /// Receiver not ready, with the encoded RNR timer (IBA Table 45).
    RnrNak { timer: u8 },
    Nak(NakCode),
    /// Syndromes with the reserved bit pattern 0b10, kept as received.
    Reserved(u8),
}

/// Credit code meaning "no end-to-end flow control credits are advertised" (IBA 9.7.7.2.5).
pub const CREDITS_INVALID: u8 = 0x1f;

impl Syndrome {
    pub const fn from_bits(s: u8) -> Self {
        match (s >> 5) & 0x3 {
            0 => Syndrome::Ack { credits: s & 0x1f },
            1 => Syndrome::RnrNak { timer: s & 0x1f },
            3 => Syndrome::Nak(NakCode::from_bits(s & 0x1f)),
            _ => Syndrome::Reserved(s),
        }
    }
    pub const fn bits(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.bits(),
            Syndrome::Reserved(s) => s,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Aeth {
    pub syndrome: Syndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl Aeth {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Aeth { syndrome: Syndrome::from_bits(buf[0]), msn: be::u24(&buf[1..4]) })
    }

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
