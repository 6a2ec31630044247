//! Private data: the fixed-size consumer area at the end of every CM message, and the rdma_cm IP
//! header (`cma_hdr` in the kernel's `cma.c`) that rdma_cm puts at the front of REQ and SIDR_REQ
//! private data for the TCP, UDP and IB port spaces when addressing by IP.
//!
//! `cma_hdr` layout (36 bytes, big-endian):
//! ```text
//!  0     cma_version            (CMA_VERSION = 0; Wireshark shows it as major/minor nibbles)
//!  1     ip_version << 4 | rsvd (4 or 6 in the high nibble)
//!  2..4  source port            (the active side's port; the destination port is in the
//!                                Service ID)
//!  4..20 source address         (IPv4: 12 zero bytes then the address)
//! 20..36 destination address
//! ```
//! The consumer's own private data follows it: up to 92 - 36 = 56 bytes in a REQ.

use super::CmWireError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

/// A fixed-size private-data area. Debug-prints only up to the last non-zero byte.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        PrivateData([0; N])
    }
}

impl<const N: usize> std::fmt::Debug for PrivateData<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "PrivateData<{N}>[")?;
        for b in &self.0[..used] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "; {} zero]", N - used)
    }
}

impl<const N: usize> std::ops::Deref for PrivateData<N> {
    type Target = [u8; N];
    fn deref(&self) -> &[u8; N] {
        &self.0
    }
}

impl<const N: usize> std::ops::DerefMut for PrivateData<N> {
    fn deref_mut(&mut self) -> &mut [u8; N] {
        &mut self.0
    }
}

impl<const N: usize> PrivateData<N> {
    /// The area's size.
    pub const LEN: usize = N;

    /// `data` followed by zeros; fails if `data` is longer than the area.
    pub fn from_slice(data: &[u8]) -> Result<Self, CmWireError> {
        if data.len() > N {
            return Err(CmWireError::PrivateDataTooLong {
                len: data.len(),
                max: N,
            });
        }
        let mut p = Self::default();
        p.0[..data.len()].copy_from_slice(data);
        Ok(p)
    }

    /// The private data rdma_cm sends: the CMA header, if any, then `user` (the caller checked
    /// that both fit).
    pub(crate) fn with_cma(cma: Option<&CmaHdr>, user: &[u8]) -> Result<Self, CmWireError> {
        let mut data = [0u8; N];
        let mut at = 0;
        if let Some(h) = cma {
            h.emit(&mut data)?;
            at = CMA_HDR_LEN;
        }
        data[at..at + user.len()].copy_from_slice(user);
        Ok(PrivateData(data))
    }

    pub(crate) fn read(d: &[u8], at: usize) -> Self {
        PrivateData(super::be::arr(&d[at..]))
    }

    pub(crate) fn write(&self, d: &mut [u8], at: usize) {
        d[at..at + N].copy_from_slice(&self.0);
    }
}

/// Length of the rdma_cm IP private-data header.
pub const CMA_HDR_LEN: usize = 36;
/// The only `cma_version` Linux sends or accepts.
pub const CMA_VERSION: u8 = 0x00;

/// The rdma_cm IP private-data header (`struct cma_hdr`). Every bit is kept, so emitting a parsed
/// header reproduces it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CmaHdr {
    /// `cma_version`; [`CMA_VERSION`].
    pub cma_version: u8,
    /// IP version, 4 or 6 (the high nibble of byte 1).
    pub ip_version: u8,
    /// The low nibble of byte 1, reserved.
    pub rsvd: u8,
    /// The active side's port.
    pub src_port: u16,
    /// Source address as carried: IPv6, or for IPv4 three zero words then the address.
    pub src_addr: [u8; 16],
    /// Destination address, same encoding.
    pub dst_addr: [u8; 16],
}

fn v4_field(ip: Ipv4Addr) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[12..].copy_from_slice(&ip.octets());
    a
}

impl CmaHdr {
    /// The header an IPv4 active side sends: from `src` (address and port) to `dst`.
    pub fn v4(src: SocketAddrV4, dst: Ipv4Addr) -> Self {
        CmaHdr {
            cma_version: CMA_VERSION,
            ip_version: 4,
            rsvd: 0,
            src_port: src.port(),
            src_addr: v4_field(*src.ip()),
            dst_addr: v4_field(dst),
        }
    }

    /// The header an IPv6 active side sends.
    pub fn v6(src: SocketAddrV6, dst: Ipv6Addr) -> Self {
        CmaHdr {
            cma_version: CMA_VERSION,
            ip_version: 6,
            rsvd: 0,
            src_port: src.port(),
            src_addr: src.ip().octets(),
            dst_addr: dst.octets(),
        }
    }

    /// Parse the header at the front of `buf`; returns it and the consumer data after it.
    /// Only the length is checked; see [`CmaHdr::is_valid`]. Never panics.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), CmWireError> {
        if buf.len() < CMA_HDR_LEN {
            return Err(CmWireError::Truncated {
                need: CMA_HDR_LEN,
                have: buf.len(),
            });
        }
        let h = CmaHdr {
            cma_version: buf[0],
            ip_version: buf[1] >> 4,
            rsvd: buf[1] & 0x0f,
            src_port: super::be::u16(&buf[2..]),
            src_addr: super::be::arr(&buf[4..]),
            dst_addr: super::be::arr(&buf[20..]),
        };
        Ok((h, &buf[CMA_HDR_LEN..]))
    }

    /// Write the 36-byte header at the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), CmWireError> {
        if buf.len() < CMA_HDR_LEN {
            return Err(CmWireError::BufferTooSmall {
                need: CMA_HDR_LEN,
                have: buf.len(),
            });
        }
        buf[0] = self.cma_version;
        buf[1] = (self.ip_version << 4) | (self.rsvd & 0x0f);
        super::be::put_u16(&mut buf[2..], self.src_port);
        buf[4..20].copy_from_slice(&self.src_addr);
        buf[20..36].copy_from_slice(&self.dst_addr);
        Ok(())
    }

    /// What Linux checks before accepting the header: version 0 and IP version 4 or 6.
    pub fn is_valid(&self) -> bool {
        self.cma_version == CMA_VERSION && matches!(self.ip_version, 4 | 6)
    }

    fn addr(&self, a: &[u8; 16]) -> Option<IpAddr> {
        match self.ip_version {
            4 => Some(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
            _ => None,
        }
    }

    /// The source address, per `ip_version` (`None` for versions other than 4 and 6).
    pub fn src_ip(&self) -> Option<IpAddr> {
        self.addr(&self.src_addr)
    }

    /// The destination address, per `ip_version`.
    pub fn dst_ip(&self) -> Option<IpAddr> {
        self.addr(&self.dst_addr)
    }
}
