//! RoCEv2 wire formats: one module per header, each with `parse` and `emit`.
//!
//! The contract, after smoltcp's `wire`: `parse` validates lengths once and never panics on any
//! input; `emit` writes into a caller's buffer and never allocates. [`Packet`] is the whole
//! transport packet (BTH to ICRC) found in a UDP datagram to port [`ROCE_V2_PORT`].

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
pub mod ethernet;
pub mod gid;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod reth;

pub use aeth::{Aeth, NakCode, Syndrome};
pub use atomic_ack_eth::AtomicAckEth;
pub use atomic_eth::AtomicEth;
pub use bth::Bth;
pub use deth::Deth;
pub use ethernet::EthHeader;
pub use ipv4::Ipv4Udp;
pub use ipv6::Ipv6Udp;
pub use opcode::{Headers, Kind, OpInfo, Opcode, Position, Service};
pub use packet::Packet;
pub use psn::Psn;
pub use reth::Reth;

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCE_V2_PORT: u16 = 4791;

/// Why a packet could not be parsed or built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before a header (or the ICRC) it must hold.
    #[error("packet truncated")]
    Truncated,
    /// The BTH opcode is reserved or not one softrdma implements.
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH TVer is not 0.
    #[error("unsupported transport header version {0}")]
    BadVersion(u8),
    /// The BTH PadCnt is larger than the bytes between the headers and the ICRC.
    #[error("pad count larger than the payload")]
    BadPad,
    /// Bytes other than pad follow the headers of an opcode that carries no payload.
    #[error("payload on an opcode that carries none")]
    UnexpectedPayload,
    /// The ICRC does not match the packet.
    #[error("ICRC mismatch")]
    BadIcrc,
    /// The UDP payload length is not one a RoCEv2 sender produces ([`packet::possible_len`]).
    #[error("not a possible RoCEv2 packet length")]
    BadLength,
    /// The output buffer cannot hold what `emit` would write.
    #[error("buffer too small")]
    BufferTooSmall,
    /// An Ethernet, IP or UDP header is not what RoCEv2 needs; the text says which check failed.
    #[error("malformed lower-layer header: {0}")]
    Malformed(&'static str),
}

/// Big-endian field helpers. Callers pass slices of exactly the field's size or longer.
pub(crate) mod be {
    pub fn u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn u24(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    pub fn u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn u64(b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        u64::from_be_bytes(a)
    }
    pub fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        a
    }
    pub fn put_u16(b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u24(b: &mut [u8], v: u32) {
        b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    pub fn put_u32(b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u64(b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&v.to_be_bytes());
    }
}
