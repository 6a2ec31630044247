//! A whole InfiniBand transport packet as carried in a RoCEv2 UDP payload:
//! BTH, the extension headers the opcode calls for, payload, pad, ICRC.

use super::{
    aeth::Aeth, atomic_ack_eth::AtomicAckEth, atomic_eth::AtomicEth, bth, bth::Bth, deth::Deth,
    ieth, immdt, reth::Reth, OpInfo, WireError,
};

/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// A parsed packet. `payload` excludes pad and ICRC.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Packet<'a> {
    pub bth: Bth,
    pub deth: Option<Deth>,
    pub reth: Option<Reth>,
    pub atomic_eth: Option<AtomicEth>,
    pub aeth: Option<Aeth>,
    pub atomic_ack_eth: Option<AtomicAckEth>,
    pub immdt: Option<u32>,
    pub ieth: Option<u32>,
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
        let info = bth.opcode.info().ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
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
        let info = self.info().ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
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
            let a = self.aeth.unwrap_or(Aeth { syndrome: super::aeth::Syndrome::Ack { credits: 0 }, msn: 0 });
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
