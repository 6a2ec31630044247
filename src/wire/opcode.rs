//! BTH opcodes and the table that says, for each, which extension headers follow (IBA 9.2, Table 38).
//!
//! Like rxe's `rxe_opcode.c`, parsing and building are driven by this table; unlike it, header
//! offsets are computed from the header list instead of being written by hand.

use super::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth};

/// Transport service encoded in the top three bits of the opcode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Service {
    /// Reliable Connection (0b000).
    Rc,
    /// Unreliable Connection (0b001).
    Uc,
    /// Reliable Datagram (0b010); no opcode of the table uses it.
    Rd,
    /// Unreliable Datagram (0b011).
    Ud,
    /// Congestion Notification Packet of RoCEv2 (0b100; only opcode 0x81).
    Cnp,
    /// Extended Reliable Connection (0b101); no opcode of the table uses it.
    Xrc,
}

/// What an opcode does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// SEND (with or without immediate data or invalidate).
    Send,
    /// RDMA WRITE (with or without immediate data).
    RdmaWrite,
    /// RDMA READ Request.
    ReadRequest,
    /// RDMA READ Response.
    ReadResponse,
    /// Acknowledge (ACK or NAK).
    Ack,
    /// Atomic Acknowledge, carrying the original remote value.
    AtomicAck,
    /// CmpSwap: atomic compare & swap request.
    CompareSwap,
    /// FetchAdd: atomic fetch & add request.
    FetchAdd,
    /// Congestion Notification Packet.
    Cnp,
}

/// Place of a packet within its message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Position {
    /// The first packet of a message of several.
    First,
    /// Neither the first nor the last packet of a message.
    Middle,
    /// The last packet of a message of several.
    Last,
    /// The only packet of a message.
    Only,
}

impl Position {
    /// First or Only: the packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// Last or Only: the packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Extension headers present after the BTH, in wire order (IBA 5.2: RDETH, DETH, RETH, AtomicETH,
/// AETH, AtomicAckETH, ImmDt, IETH).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Headers {
    /// A DETH (UD: Q_Key and source QP).
    pub deth: bool,
    /// A RETH (remote address, R_Key, length).
    pub reth: bool,
    /// An AtomicETH (atomic request operands).
    pub atomic_eth: bool,
    /// An AETH (ACK syndrome and MSN).
    pub aeth: bool,
    /// An AtomicAckETH (original remote value).
    pub atomic_ack_eth: bool,
    /// An ImmDt (immediate data).
    pub immdt: bool,
    /// An IETH (R_Key to invalidate).
    pub ieth: bool,
}

impl Headers {
    const NONE: Headers = Headers {
        deth: false,
        reth: false,
        atomic_eth: false,
        aeth: false,
        atomic_ack_eth: false,
        immdt: false,
        ieth: false,
    };

    /// Total length of the extension headers.
    pub const fn len(&self) -> usize {
        (self.deth as usize) * deth::LEN
            + (self.reth as usize) * reth::LEN
            + (self.atomic_eth as usize) * atomic_eth::LEN
            + (self.aeth as usize) * aeth::LEN
            + (self.atomic_ack_eth as usize) * atomic_ack_eth::LEN
            + (self.immdt as usize) * immdt::LEN
            + (self.ieth as usize) * ieth::LEN
    }

    /// True if the opcode has no extension headers, only the BTH.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything the table knows about one opcode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OpInfo {
    /// The transport service (top three bits of the opcode).
    pub service: Service,
    /// The operation.
    pub kind: Kind,
    /// Where the packet sits in its message.
    pub position: Position,
    /// The extension headers between the BTH and the payload.
    pub headers: Headers,
    /// Whether the packet may carry a payload.
    pub payload: bool,
}

impl OpInfo {
    /// Length of BTH plus extension headers.
    pub const fn header_len(&self) -> usize {
        bth::LEN + self.headers.len()
    }
}

/// A BTH opcode byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($($(#[$doc:meta])* $name:ident = $v:expr;)*) => {
        impl Opcode { $($(#[$doc])* pub const $name: Opcode = Opcode($v);)* }
    };
}

opcodes! {
    /// RC SEND First.
    RC_SEND_FIRST = 0x00;
    /// RC SEND Middle.
    RC_SEND_MIDDLE = 0x01;
    /// RC SEND Last.
    RC_SEND_LAST = 0x02;
    /// RC SEND Last with Immediate.
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    /// RC SEND Only.
    RC_SEND_ONLY = 0x04;
    /// RC SEND Only with Immediate.
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    /// RC RDMA WRITE First.
    RC_RDMA_WRITE_FIRST = 0x06;
    /// RC RDMA WRITE Middle.
    RC_RDMA_WRITE_MIDDLE = 0x07;
    /// RC RDMA WRITE Last.
    RC_RDMA_WRITE_LAST = 0x08;
    /// RC RDMA WRITE Last with Immediate.
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    /// RC RDMA WRITE Only.
    RC_RDMA_WRITE_ONLY = 0x0a;
    /// RC RDMA WRITE Only with Immediate.
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b;
    /// RC RDMA READ Request.
    RC_RDMA_READ_REQUEST = 0x0c;
    /// RC RDMA READ Response First.
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d;
    /// RC RDMA READ Response Middle.
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e;
    /// RC RDMA READ Response Last.
    RC_RDMA_READ_RESPONSE_LAST = 0x0f;
    /// RC RDMA READ Response Only.
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    /// RC Acknowledge.
    RC_ACKNOWLEDGE = 0x11;
    /// RC Atomic Acknowledge.
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    /// RC CmpSwap.
    RC_COMPARE_SWAP = 0x13;
    /// RC FetchAdd.
    RC_FETCH_ADD = 0x14;
    /// RC SEND Last with Invalidate.
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    /// RC SEND Only with Invalidate.
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    /// UC SEND First.
    UC_SEND_FIRST = 0x20;
    /// UC SEND Middle.
    UC_SEND_MIDDLE = 0x21;
    /// UC SEND Last.
    UC_SEND_LAST = 0x22;
    /// UC SEND Last with Immediate.
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    /// UC SEND Only.
    UC_SEND_ONLY = 0x24;
    /// UC SEND Only with Immediate.
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    /// UC RDMA WRITE First.
    UC_RDMA_WRITE_FIRST = 0x26;
    /// UC RDMA WRITE Middle.
    UC_RDMA_WRITE_MIDDLE = 0x27;
    /// UC RDMA WRITE Last.
    UC_RDMA_WRITE_LAST = 0x28;
    /// UC RDMA WRITE Last with Immediate.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    /// UC RDMA WRITE Only.
    UC_RDMA_WRITE_ONLY = 0x2a;
    /// UC RDMA WRITE Only with Immediate.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b;
    /// UD SEND Only.
    UD_SEND_ONLY = 0x64;
    /// UD SEND Only with Immediate.
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
    /// Congestion Notification Packet (RoCEv2).
    CNP = 0x81;
}

const fn info(
    service: Service,
    kind: Kind,
    position: Position,
    h: Headers,
    payload: bool,
) -> Option<OpInfo> {
    Some(OpInfo {
        service,
        kind,
        position,
        headers: h,
        payload,
    })
}

/// Look an opcode up. The low five bits are the operation, shared by RC and UC (IBA Table 38).
const fn lookup(op: u8) -> Option<OpInfo> {
    use Kind::*;
    use Position::*;
    let n = Headers::NONE;
    let service = match op >> 5 {
        0 => Service::Rc,
        1 => Service::Uc,
        2 => Service::Rd,
        3 => Service::Ud,
        4 => Service::Cnp,
        5 => Service::Xrc,
        _ => return None,
    };
    let imm = Headers { immdt: true, ..n };
    let reth = Headers { reth: true, ..n };
    let aeth = Headers { aeth: true, ..n };
    match service {
        Service::Rc | Service::Uc => {
            let rc_only = matches!(service, Service::Rc);
            match op & 0x1f {
                0x00 => info(service, Send, First, n, true),
                0x01 => info(service, Send, Middle, n, true),
                0x02 => info(service, Send, Last, n, true),
                0x03 => info(service, Send, Last, imm, true),
                0x04 => info(service, Send, Only, n, true),
                0x05 => info(service, Send, Only, imm, true),
                0x06 => info(service, RdmaWrite, First, reth, true),
                0x07 => info(service, RdmaWrite, Middle, n, true),
                0x08 => info(service, RdmaWrite, Last, n, true),
                0x09 => info(service, RdmaWrite, Last, imm, true),
                0x0a => info(service, RdmaWrite, Only, reth, true),
                0x0b => info(
                    service,
                    RdmaWrite,
                    Only,
                    Headers {
                        reth: true,
                        immdt: true,
                        ..n
                    },
                    true,
                ),
                0x0c if rc_only => info(service, ReadRequest, Only, reth, false),
                0x0d if rc_only => info(service, ReadResponse, First, aeth, true),
                0x0e if rc_only => info(service, ReadResponse, Middle, n, true),
                0x0f if rc_only => info(service, ReadResponse, Last, aeth, true),
                0x10 if rc_only => info(service, ReadResponse, Only, aeth, true),
                0x11 if rc_only => info(service, Ack, Only, aeth, false),
                0x12 if rc_only => info(
                    service,
                    AtomicAck,
                    Only,
                    Headers {
                        aeth: true,
                        atomic_ack_eth: true,
                        ..n
                    },
                    false,
                ),
                0x13 if rc_only => info(
                    service,
                    CompareSwap,
                    Only,
                    Headers {
                        atomic_eth: true,
                        ..n
                    },
                    false,
                ),
                0x14 if rc_only => info(
                    service,
                    FetchAdd,
                    Only,
                    Headers {
                        atomic_eth: true,
                        ..n
                    },
                    false,
                ),
                0x16 if rc_only => info(service, Send, Last, Headers { ieth: true, ..n }, true),
                0x17 if rc_only => info(service, Send, Only, Headers { ieth: true, ..n }, true),
                _ => None,
            }
        }
        Service::Ud => match op & 0x1f {
            0x04 => info(service, Send, Only, Headers { deth: true, ..n }, true),
            0x05 => info(
                service,
                Send,
                Only,
                Headers {
                    deth: true,
                    immdt: true,
                    ..n
                },
                true,
            ),
            _ => None,
        },
        // CNP (0x81) carries 16 reserved bytes after the BTH; modelled as a payload.
        Service::Cnp if op == 0x81 => info(service, Cnp, Only, n, true),
        _ => None,
    }
}

const TABLE: [Option<OpInfo>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = lookup(i as u8);
        i += 1;
    }
    t
};

/// The longest transport packet without its ICRC (BTH, extension headers, payload and pad) that
/// any opcode of the table allows at path MTU `mtu`: an opcode that carries a payload carries at
/// most `mtu` bytes of it, padded to a multiple of 4 (IBA 9.3.3, 9.4).
pub const fn max_len_without_icrc(mtu: usize) -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < 256 {
        if let Some(info) = &TABLE[i] {
            let mut len = info.header_len();
            if info.payload {
                len += (mtu + 3) & !3;
            }
            if len > max {
                max = len;
            }
        }
        i += 1;
    }
    max
}

/// Every header set of the table is a multiple of 4 bytes long, so with the pad every packet is.
const _: () = {
    let mut i = 0;
    while i < 256 {
        if let Some(info) = &TABLE[i] {
            assert!(info.header_len() % 4 == 0);
        }
        i += 1;
    }
};

impl Opcode {
    /// What the table says about this opcode; `None` for reserved or unsupported opcodes.
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }
}

impl core::fmt::Debug for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.info() {
            Some(i) => write!(
                f,
                "{:?}_{:?}_{:?}({:#04x})",
                i.service, i.kind, i.position, self.0
            ),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_ibta_table() {
        // (opcode, BTH + extension header bytes) from IBA Table 38.
        let cases = [
            (Opcode::RC_SEND_ONLY, 12),
            (Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 16),
            (Opcode::RC_RDMA_WRITE_FIRST, 28),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 32),
            (Opcode::RC_RDMA_READ_REQUEST, 28),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 16),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 12),
            (Opcode::RC_ACKNOWLEDGE, 16),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 24),
            (Opcode::RC_COMPARE_SWAP, 40),
            (Opcode::RC_FETCH_ADD, 40),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 16),
            (Opcode::UD_SEND_ONLY, 20),
            (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 24),
            (Opcode::UC_RDMA_WRITE_ONLY, 28),
        ];
        for (op, len) in cases {
            assert_eq!(op.info().unwrap().header_len(), len, "{op:?}");
        }
    }

    #[test]
    fn reserved_opcodes_are_unknown() {
        for op in [
            0x15u8, 0x18, 0x1f, 0x2c, 0x30, 0x60, 0x66, 0x80, 0x82, 0xc0, 0xff,
        ] {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
        }
        let known = (0..=255u8).filter(|&o| Opcode(o).info().is_some()).count();
        // 23 RC + 12 UC + 2 UD + CNP
        assert_eq!(known, 23 + 12 + 2 + 1);
    }
}
