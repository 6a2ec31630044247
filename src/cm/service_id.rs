//! rdma_cm Service IDs.
//!
//! An rdma_cm listener on an IP port is found through the IB Service ID
//! `port_space << 16 | port`, where the port spaces (`enum rdma_ucm_port_space`) already carry
//! the `0x01` of the IETF-assigned IP-based prefix `0x0000_0000_01xx_xxxx` (IBA Annex A11):
//! rping's default port 7174 in the TCP space is `0x0000_0000_0106_1C06` on the wire.

/// The rdma_cm port spaces.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`
    Ipoib,
    /// `RDMA_PS_TCP`: reliable connected (RC) rdma_cm ids.
    Tcp,
    /// `RDMA_PS_UDP`: UD ids, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IB`: native IB addressing; accepts TCP- and UDP-space IDs too.
    Ib,
}

pub const RDMA_PS_IPOIB: u16 = 0x0002;
pub const RDMA_PS_TCP: u16 = 0x0106;
pub const RDMA_PS_UDP: u16 = 0x0111;
pub const RDMA_PS_IB: u16 = 0x013F;

/// Masks of the two halves of an IP-based Service ID (`RDMA_IB_IP_PS_MASK`, `_PORT_MASK`).
pub const PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
pub const PORT_MASK: u64 = 0x0000_0000_0000_FFFF;

impl PortSpace {
    /// The port-space number as rdma_cm numbers it.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::Ipoib => RDMA_PS_IPOIB,
            PortSpace::Tcp => RDMA_PS_TCP,
            PortSpace::Udp => RDMA_PS_UDP,
            PortSpace::Ib => RDMA_PS_IB,
        }
    }

    pub const fn from_code(code: u16) -> Option<Self> {
        match code {
            RDMA_PS_IPOIB => Some(PortSpace::Ipoib),
            RDMA_PS_TCP => Some(PortSpace::Tcp),
            RDMA_PS_UDP => Some(PortSpace::Udp),
            RDMA_PS_IB => Some(PortSpace::Ib),
            _ => None,
        }
    }

    /// The Service ID of `port` in this space.
    pub const fn service_id(self, port: u16) -> u64 {
        (self.code() as u64) << 16 | port as u64
    }
}

/// The Service ID of `port` in port space `ps`.
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    ps.service_id(port)
}

/// Split an rdma_cm IP-based Service ID into its port space and port; `None` if the ID is not in
/// one of the known spaces.
pub const fn split(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    match PortSpace::from_code((sid >> 16) as u16) {
        Some(ps) => Some((ps, sid as u16)),
        None => None,
    }
}
