//! A whole InfiniBand transport packet as carried in a RoCEv2 UDP payload:
//! BTH, the extension headers the opcode calls for, payload, pad, ICRC.

use super::{
    aeth::Aeth, atomic_ack_eth::AtomicAckEth, atomic_eth::AtomicEth, bth, bth::Bth, deth::Deth,
    ieth, immdt, reth::Reth, OpInfo, WireError,
};

/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// The largest path MTU (IBA 4096 bytes; the largest softrdma and Linux rdma_rxe support).
pub const MAX_MTU: usize = 4096;

/// The shortest transport packet (UDP payload): a BTH and the ICRC.
pub const MIN_PACKET_LEN: usize = bth::LEN + ICRC_LEN;

/// The longest transport packet (UDP payload) softrdma or rxe can send: [`MAX_MTU`] bytes of
/// payload behind the longest header set of any opcode that carries a payload (RDMA WRITE Only
/// with Immediate: BTH 12 + RETH 16 + ImmDt 4), the pad (none: 4096 is a multiple of 4) and the
/// ICRC. 4132 bytes.
pub const MAX_PACKET_LEN: usize = super::opcode::max_len_without_icrc(MAX_MTU) + ICRC_LEN;

/// Every transport packet is a multiple of this long: headers, payload plus pad, and ICRC are
/// each whole 4-byte words (IBA 9.3.3: the pad brings the payload to a multiple of 4).
pub const PACKET_ALIGN: usize = 4;

/// Whether `len` can be the length of a RoCEv2 transport packet (a UDP payload) softrdma or rxe
/// sends: [`MIN_PACKET_LEN`]`..=`[`MAX_PACKET_LEN`] and a multiple of [`PACKET_ALIGN`]. Checked
/// before any CRC is computed.
pub const fn possible_len(len: usize) -> bool {
    len >= MIN_PACKET_LEN && len <= MAX_PACKET_LEN && len % PACKET_ALIGN == 0
}

/// A parsed packet. `payload` excludes pad and ICRC.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Packet<'a> {
    /// The Base Transport Header.
    pub bth: Bth,
    /// The DETH, if the opcode has one (UD).
    pub deth: Option<Deth>,
    /// The RETH, if the opcode has one (RDMA WRITE First/Only, RDMA READ Request).
    pub reth: Option<Reth>,
    /// The AtomicETH, if the opcode has one (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEth>,
    /// The AETH, if the opcode has one (Acknowledge, Atomic Acknowledge, READ responses but
    /// Middle).
    pub aeth: Option<Aeth>,
    /// The AtomicAckETH, if the opcode has one (Atomic Acknowledge).
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// The immediate data (ImmDt), if the opcode has one; see [`super::immdt`].
    pub immdt: Option<u32>,
    /// The R_Key to invalidate (IETH), if the opcode has one (SEND with Invalidate).
    pub ieth: Option<u32>,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC as carried on the wire (little-endian CRC32 bytes read as `u32::from_le_bytes`).
    pub icrc: u32,
}

impl<'a> Packet<'a> {
    /// A packet with only a BTH and a payload; fill in extension headers as the opcode needs.
    pub fn new(bth: Bth, payload: &'a [u8]) -> Self {
        Packet {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
            icrc: 0,
        }
    }

    /// The opcode's table entry. Always `Some` for a packet that [`Packet::parse`] returned.
    pub fn info(&self) -> Option<&'static OpInfo> {
        self.bth.opcode.info()
    }

    /// Parse a UDP payload. Checks that the opcode is known, every header the opcode needs is
    /// present, the pad fits, and that packets that carry no payload have none. Never panics.
    /// The ICRC is read but not verified (that needs the IP header: see [`super::icrc`]).
    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        let bth = Bth::parse(buf)?;
        if bth.tver != 0 {
            return Err(WireError::BadVersion(bth.tver));
        }
        let info = bth
            .opcode
            .info()
            .ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        let hlen = info.header_len();
        if buf.len() < hlen + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let h = info.headers;
        let mut at = bth::LEN;
        let mut pkt = Packet::new(bth, &[]);
        // Wire order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH (IBA 5.2.1).
        if h.deth {
            pkt.deth = Some(Deth::parse(&buf[at..])?);
            at += super::deth::LEN;
        }
        if h.reth {
            pkt.reth = Some(Reth::parse(&buf[at..])?);
            at += super::reth::LEN;
        }
        if h.atomic_eth {
            pkt.atomic_eth = Some(AtomicEth::parse(&buf[at..])?);
            at += super::atomic_eth::LEN;
        }
        if h.aeth {
            pkt.aeth = Some(Aeth::parse(&buf[at..])?);
            at += super::aeth::LEN;
        }
        if h.atomic_ack_eth {
            pkt.atomic_ack_eth = Some(AtomicAckEth::parse(&buf[at..])?);
            at += super::atomic_ack_eth::LEN;
        }
        if h.immdt {
            pkt.immdt = Some(immdt::parse(&buf[at..])?);
            at += immdt::LEN;
        }
        if h.ieth {
            pkt.ieth = Some(ieth::parse(&buf[at..])?);
            at += ieth::LEN;
        }
        debug_assert_eq!(at, hlen);
        let end = buf.len() - ICRC_LEN;
        let body = &buf[at..end];
        let pad = bth.pad_count as usize;
        if pad > body.len() {
            return Err(WireError::BadPad);
        }
        if !info.payload && body.len() != pad {
            return Err(WireError::UnexpectedPayload);
        }
        pkt.payload = &body[..body.len() - pad];
        let mut icrc = [0u8; 4];
        icrc.copy_from_slice(&buf[end..]);
        pkt.icrc = u32::from_le_bytes(icrc);
        Ok(pkt)
    }

    /// Bytes [`Packet::emit`] writes: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        let hlen = self.info().map_or(bth::LEN, |i| i.header_len());
        hlen + self.payload.len() + self.bth.pad_count as usize + ICRC_LEN
    }

    /// Write the packet into `buf`, which must hold [`Packet::buffer_len`] bytes; returns that
    /// length. Pad bytes are zero; the ICRC field gets `self.icrc` (compute it afterwards with
    /// [`super::icrc`] over the finished bytes). Headers the opcode does not call for are not
    /// written; a header it calls for but that is `None` is written as zeros.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let info = self
            .info()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::BufferTooSmall);
        }
        let buf = &mut buf[..len];
        self.bth.emit(buf);
        let h = info.headers;
        let mut at = bth::LEN;
        if h.deth {
            self.deth.unwrap_or_default().emit(&mut buf[at..]);
            at += super::deth::LEN;
        }
        if h.reth {
            self.reth.unwrap_or_default().emit(&mut buf[at..]);
            at += super::reth::LEN;
        }
        if h.atomic_eth {
            self.atomic_eth.unwrap_or_default().emit(&mut buf[at..]);
            at += super::atomic_eth::LEN;
        }
        if h.aeth {
            let a = self.aeth.unwrap_or(Aeth {
                syndrome: super::aeth::Syndrome::Ack { credits: 0 },
                msn: 0,
            });
            a.emit(&mut buf[at..]);
            at += super::aeth::LEN;
        }
        if h.atomic_ack_eth {
            self.atomic_ack_eth.unwrap_or_default().emit(&mut buf[at..]);
            at += super::atomic_ack_eth::LEN;
        }
        if h.immdt {
            immdt::emit(self.immdt.unwrap_or(0), &mut buf[at..]);
            at += immdt::LEN;
        }
        if h.ieth {
            ieth::emit(self.ieth.unwrap_or(0), &mut buf[at..]);
            at += ieth::LEN;
        }
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        let pad = self.bth.pad_count as usize;
        buf[at..at + pad].fill(0);
        at += pad;
        buf[at..at + ICRC_LEN].copy_from_slice(&self.icrc.to_le_bytes());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::aeth::{NakCode, Syndrome, CREDITS_INVALID};
    use crate::wire::{icrc, Opcode, Psn};

    #[test]
    fn length_limits() {
        assert_eq!(MIN_PACKET_LEN, 16);
        // RDMA WRITE Only with Immediate at MTU 4096: 12 + 16 + 4 + 4096 + 4.
        assert_eq!(MAX_PACKET_LEN, 4132);
        assert_eq!(MAX_MTU, crate::transport::Mtu::Mtu4096.bytes());
        // Every opcode's longest packet at every MTU is a possible length.
        for op in 0..=255u8 {
            let Some(info) = Opcode(op).info() else {
                continue;
            };
            for mtu in [256, 512, 1024, 2048, 4096] {
                let len = info.header_len() + if info.payload { mtu } else { 0 } + ICRC_LEN;
                assert!(possible_len(len), "{op:#x} at {mtu}: {len}");
                assert!(len <= MAX_PACKET_LEN);
            }
        }
        assert!(!possible_len(MIN_PACKET_LEN - 4));
        assert!(!possible_len(MAX_PACKET_LEN + 4));
        assert!(!possible_len(MIN_PACKET_LEN + 2));
        assert!(!possible_len(0));
    }

    // Whole UDP payloads (BTH to ICRC) and their IPv4+UDP headers from tests/data/rxe-basic.pcap.

    /// Frame 45: a perftest 2-byte SEND_ONLY, PadCnt 2.
    const SEND_PAD2_IP: [u8; 28] = [
        0x45, 0x00, 0x00, 0x30, 0xe8, 0x52, 0x40, 0x00, 0x40, 0x11, 0x3d, 0xcc, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x03, 0xce, 0x3c, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00,
    ];
    const SEND_PAD2: [u8; 20] = [
        0x04, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0xa4, 0x5c, 0x97, // BTH
        0x33, 0x00, 0x00, 0x00, // payload 0x33 0x00, pad 2
        0x06, 0xc8, 0x7c, 0xbc, // ICRC
    ];
    /// Frame 5: rxe's ACK of rping's SEND.
    const ACK_IP: [u8; 28] = [
        0x45, 0x00, 0x00, 0x30, 0xee, 0x68, 0x40, 0x00, 0x40, 0x11, 0x37, 0xb6, 0x0a, 0x4d, 0x00,
        0x03, 0x0a, 0x4d, 0x00, 0x02, 0xcb, 0x97, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00,
    ];
    const ACK: [u8; 20] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x2a, 0x3e, 0x9b, // BTH
        0x1f, 0x00, 0x00, 0x01, // AETH
        0xa2, 0x78, 0x9e, 0xd3, // ICRC
    ];
    /// Frame 6: rping's 64-byte RDMA READ request.
    const READ_REQ_IP: [u8; 28] = [
        0x45, 0x00, 0x00, 0x3c, 0xee, 0x69, 0x40, 0x00, 0x40, 0x11, 0x37, 0xa9, 0x0a, 0x4d, 0x00,
        0x03, 0x0a, 0x4d, 0x00, 0x02, 0xcb, 0x97, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
    ];
    const READ_REQ: [u8; 32] = [
        0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x22, 0xc9, 0x7c, // BTH
        0x00, 0x00, 0x56, 0x32, 0x0f, 0xb6, 0x23, 0x70, 0x00, 0x00, 0x05, 0x87, 0x00, 0x00, 0x00,
        0x40, // RETH
        0x11, 0x53, 0x61, 0x84, // ICRC
    ];
    /// Frame 356: ib_atomic_bw's FETCH_ADD.
    const FETCH_ADD_IP: [u8; 28] = [
        0x45, 0x00, 0x00, 0x48, 0xed, 0x99, 0x40, 0x00, 0x40, 0x11, 0x38, 0x6d, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x03, 0xdc, 0x6d, 0x12, 0xb7, 0x00, 0x34, 0x00, 0x00,
    ];
    const FETCH_ADD: [u8; 44] = [
        0x14, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x19, 0x80, 0xd1, 0xdc, 0xdb, // BTH
        0x00, 0x00, 0x56, 0x03, 0xe0, 0x7a, 0xf0, 0x00, 0x00, 0x00, 0x0c, 0xa8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, // AtomicETH
        0x85, 0xf4, 0xe0, 0x77, // ICRC
    ];
    /// Frame 361: the ATOMIC_ACKNOWLEDGE of that FETCH_ADD.
    const ATOMIC_ACK_IP: [u8; 28] = [
        0x45, 0x00, 0x00, 0x38, 0xf5, 0xf1, 0x40, 0x00, 0x40, 0x11, 0x30, 0x25, 0x0a, 0x4d, 0x00,
        0x03, 0x0a, 0x4d, 0x00, 0x02, 0xdc, 0x6d, 0x12, 0xb7, 0x00, 0x24, 0x00, 0x00,
    ];
    const ATOMIC_ACK: [u8; 28] = [
        0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x19, 0x00, 0xd1, 0xdc, 0xdb, // BTH
        0x1f, 0x00, 0x00, 0x01, // AETH
        0xed, 0xa4, 0x96, 0xe4, 0x0e, 0x55, 0x18, 0xbf, // AtomicAckETH
        0xe2, 0x28, 0x4b, 0xe2, // ICRC
    ];

    fn fixtures() -> [(&'static [u8; 28], &'static [u8]); 5] {
        [
            (&SEND_PAD2_IP, &SEND_PAD2),
            (&ACK_IP, &ACK),
            (&READ_REQ_IP, &READ_REQ),
            (&FETCH_ADD_IP, &FETCH_ADD),
            (&ATOMIC_ACK_IP, &ATOMIC_ACK),
        ]
    }

    #[test]
    fn parse_capture_packets() {
        let p = Packet::parse(&SEND_PAD2).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(p.bth.pad_count, 2);
        assert_eq!(p.payload, [0x33, 0x00]);
        assert_eq!(p.icrc, u32::from_le_bytes([0x06, 0xc8, 0x7c, 0xbc]));
        assert_eq!((p.deth, p.reth, p.aeth, p.immdt), (None, None, None, None));

        let p = Packet::parse(&ACK).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!((p.bth.dest_qpn, p.bth.psn.value()), (0x11, 0x2a3e9b));
        let aeth = p.aeth.unwrap();
        assert_eq!(
            aeth.syndrome,
            Syndrome::Ack {
                credits: CREDITS_INVALID
            }
        );
        assert_eq!(aeth.msn, 1);
        assert!(p.payload.is_empty());

        let p = Packet::parse(&READ_REQ).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
        let reth = p.reth.unwrap();
        assert_eq!(
            (reth.va, reth.rkey, reth.dma_len),
            (0x5632_0fb6_2370, 0x587, 64)
        );
        assert!(p.payload.is_empty());

        let p = Packet::parse(&FETCH_ADD).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_FETCH_ADD);
        let a = p.atomic_eth.unwrap();
        assert_eq!(
            (a.va, a.rkey, a.swap_add, a.compare),
            (0x5603_e07a_f000, 0xca8, 1, 0)
        );

        let p = Packet::parse(&ATOMIC_ACK).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(p.aeth.unwrap().msn, 1);
        assert_eq!(p.atomic_ack_eth.unwrap().orig, 0xeda4_96e4_0e55_18bf);
    }

    #[test]
    fn emit_reproduces_capture_packets_and_icrc() {
        for (ip, bytes) in fixtures() {
            icrc::verify_v4(ip, bytes).unwrap();
            let p = Packet::parse(bytes).unwrap();
            assert_eq!(p.buffer_len(), bytes.len());
            let mut out = [0u8; 64];
            assert_eq!(p.emit(&mut out), Ok(bytes.len()));
            assert_eq!(&out[..bytes.len()], bytes);
            // Built from scratch with a zero ICRC, filled in afterwards.
            let mut q = p;
            q.icrc = 0;
            let mut out = [0u8; 64];
            let n = q.emit(&mut out).unwrap();
            icrc::fill_v4(ip, &mut out[..n]);
            assert_eq!(&out[..n], bytes);
            assert_eq!(
                p.emit(&mut out[..bytes.len() - 1]),
                Err(WireError::BufferTooSmall)
            );
        }
    }

    #[test]
    fn build_ack_like_rxe() {
        let mut bth = Bth::new(Opcode::RC_ACKNOWLEDGE, 0x11, Psn::new(0x2a3e9b));
        bth.ack_req = false;
        let mut p = Packet::new(bth, &[]);
        p.aeth = Some(Aeth {
            syndrome: Syndrome::Ack {
                credits: CREDITS_INVALID,
            },
            msn: 1,
        });
        let mut out = [0u8; 20];
        assert_eq!(p.emit(&mut out), Ok(20));
        icrc::fill_v4(&ACK_IP, &mut out);
        assert_eq!(out, ACK);

        p.aeth = Some(Aeth {
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: 0,
        });
        p.emit(&mut out).unwrap();
        assert_eq!(out[12..16], [0x60, 0, 0, 0]);
    }

    #[test]
    fn rejects_malformed_packets() {
        for (_, bytes) in fixtures() {
            // Shorter than headers + pad + ICRC. (Longer prefixes may parse, as a shorter payload:
            // only the UDP length tells where a packet ends.)
            let p = Packet::parse(bytes).unwrap();
            let min = p.info().unwrap().header_len() + p.bth.pad_count as usize + ICRC_LEN;
            for n in 0..min {
                assert!(Packet::parse(&bytes[..n]).is_err(), "{n}");
            }
        }
        let mut b = SEND_PAD2;
        b[0] = 0x15; // reserved RC opcode
        assert_eq!(Packet::parse(&b), Err(WireError::UnknownOpcode(0x15)));
        let mut b = SEND_PAD2;
        b[1] |= 1; // TVer 1
        assert_eq!(Packet::parse(&b), Err(WireError::BadVersion(1)));
        let mut b = [0u8; 17];
        b[..12].copy_from_slice(&SEND_PAD2[..12]);
        b[1] = 0x30; // pad 3, but 1 byte of body
        assert_eq!(Packet::parse(&b), Err(WireError::BadPad));
        let mut b = [0u8; 24];
        b[..16].copy_from_slice(&ACK[..16]);
        assert_eq!(Packet::parse(&b), Err(WireError::UnexpectedPayload));
        // An ACK may carry pad bytes only if its pad count says so.
        b[1] = 0x20;
        assert_eq!(Packet::parse(&b), Err(WireError::UnexpectedPayload));
        let mut p = Packet::parse(&ACK).unwrap();
        p.bth.opcode = Opcode(0xff);
        assert_eq!(p.emit(&mut [0u8; 64]), Err(WireError::UnknownOpcode(0xff)));
    }
}
