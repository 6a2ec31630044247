//! Devices: one user-space RoCEv2 endpoint per network interface, shared by every process.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::context::{Context, ContextOptions};
use super::error::{Result, VerbsError};
use super::netif::{default_route_interface, interfaces, Interface, V6Addr};
use crate::transport::Mtu;
pub(crate) use crate::wire::gid::guid_from_ipv4;
pub use crate::wire::gid::{gid_from_ipv4, ipv4_from_gid};

pub(crate) const MAX_QP: usize = 16 * 1024;
pub(crate) const MAX_QP_WR: u32 = 16 * 1024;
pub(crate) const MAX_SGE: u32 = 32;
pub(crate) const MAX_CQ: usize = 16 * 1024;
pub(crate) const MAX_PD: usize = 64 * 1024;
pub(crate) const MAX_CQE: u32 = 1 << 20;
pub(crate) const MAX_MR: usize = 256 * 1024;
pub(crate) const MAX_INLINE: u32 = 256;
pub(crate) const MAX_RD_ATOM: u32 = 128;
pub(crate) const MAX_MSG: u64 = crate::transport::MAX_MSG_LEN;
/// Shared receive queues, as rdma_rxe reports them (`RXE_MAX_SRQ`, `RXE_MAX_SRQ_WR`,
/// `RXE_MAX_SRQ_SGE`).
pub(crate) const MAX_SRQ: usize = 0x1000;
pub(crate) const MAX_SRQ_WR: u32 = 0x4000;
pub(crate) const MAX_SRQ_SGE: u32 = 27;

/// An RDMA device (`struct ibv_device`): a RoCEv2 endpoint on the IP addresses of one network
/// interface (its IPv4 address and its IPv6 addresses, as rdma_rxe's GID table lists them).
#[derive(Clone, Debug)]
pub struct Device {
    name: String,
    ifname: String,
    v4: Option<Ipv4Addr>,
    /// Global addresses first, then link-local ones.
    v6: Vec<V6Addr>,
    if_mtu: u32,
    /// Bind exactly these addresses (`SOFTRDMA_ADDR`, or an rdma_cm bind to one 127.x address):
    /// when an IPv6 one is taken, opening fails instead of going on without it.
    pinned: bool,
}

/// `ibv_get_device_list`: one device per network interface with an IP address, named `srxe0`,
/// `srxe1`, …: first the interface of the default route (so the first device, the one programs
/// open by default, reaches other hosts), then the other interfaces, the loopback device last.
/// A device has the interface's first IPv4 address and its IPv6 addresses (an interface with
/// only IPv6 addresses gets a device too). Any number of processes open a device at once
/// (`driver::share`). With `SOFTRDMA_ADDR=a.b.c.d` (or an IPv6 address, `fe80::1%eth0` for a
/// link-local one) set, exactly one device, pinned to that one address.
///
/// # Errors
/// [`VerbsError::InvalidArgument`] if `SOFTRDMA_ADDR` is no address; [`VerbsError::Io`] if the interfaces cannot be listed.
pub fn devices() -> Result<Vec<Device>> {
    if let Ok(a) = std::env::var("SOFTRDMA_ADDR") {
        return pinned_device(&a).map(|d| vec![d]);
    }
    Ok(devices_from(interfaces()?, default_route_interface()))
}

/// The device list of these interfaces. The first device is one a peer on another host reaches
/// (programs take the first, as ibv_rc_pingpong and perftest do): the default route's
/// interface, then the other running ones; the loopback device last.
fn devices_from(mut ifs: Vec<Interface>, default_if: Option<String>) -> Vec<Device> {
    ifs.sort_by_key(|i| {
        (
            i.loopback || i.v4.is_some_and(|(a, _)| a.is_loopback()),
            Some(&i.name) != default_if.as_ref(),
            !i.running,
        )
    });
    ifs.into_iter()
        .enumerate()
        .map(|(i, f)| Device {
            name: format!("srxe{i}"),
            ifname: f.name,
            v4: f.v4.map(|(a, _)| a),
            v6: f.v6,
            if_mtu: f.mtu,
            pinned: false,
        })
        .collect()
}

/// The one device `SOFTRDMA_ADDR` names.
fn pinned_device(a: &str) -> Result<Device> {
    const BAD: &str = "SOFTRDMA_ADDR is not an IPv4 or IPv6 address";
    let (ip, zone) = match a.split_once('%') {
        Some((ip, zone)) => (ip, Some(zone)),
        None => (a, None),
    };
    let ip: IpAddr = ip.parse().map_err(|_| VerbsError::InvalidArgument(BAD))?;
    let ifs = interfaces()?;
    // The interface with that address, else the one whose subnet holds it (127.0.0.9 is on
    // `lo`, whose address is 127.0.0.1/8).
    let found = match ip {
        IpAddr::V4(v4) => ifs
            .iter()
            .find(|i| i.v4.is_some_and(|(a, _)| a == v4))
            .or_else(|| ifs.iter().find(|i| i.contains(v4))),
        IpAddr::V6(v6) => ifs
            .iter()
            .find(|i| i.v6.iter().any(|a| a.ip == v6) && zone.map_or(true, |z| z == i.name)),
    };
    let (ifname, if_mtu) = found
        .map(|i| (i.name.clone(), i.mtu))
        .unwrap_or_else(|| (String::from("?"), 1500));
    let (v4, v6) = match ip {
        IpAddr::V4(a) => (Some(a), Vec::new()),
        IpAddr::V6(v6) => {
            let scope = found
                .and_then(|i| i.v6.iter().find(|a| a.ip == v6))
                .map_or(0, |a| a.scope);
            (None, vec![V6Addr { ip: v6, scope }])
        }
    };
    Ok(Device {
        name: "srxe0".into(),
        ifname,
        v4,
        v6,
        if_mtu,
        pinned: true,
    })
}

impl Device {
    /// `ibv_get_device_name`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The network interface the device sits on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }
    /// The IPv4 address the device binds; `0.0.0.0` for a device without one (an interface
    /// with only IPv6 addresses). See [`Device::ipv4`] and [`Device::ipv6_addrs`].
    pub fn addr(&self) -> Ipv4Addr {
        self.v4.unwrap_or(Ipv4Addr::UNSPECIFIED)
    }
    /// The IPv4 address, if the device has one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.v4
    }
    /// The IPv6 addresses (global ones first, then link-local ones), each a GID of the device.
    pub fn ipv6_addrs(&self) -> Vec<Ipv6Addr> {
        self.v6.iter().map(|a| a.ip).collect()
    }
    pub(crate) fn v6(&self) -> &[V6Addr] {
        &self.v6
    }
    /// Whether opening binds exactly the device's addresses or fails
    /// ([`VerbsError::AddrInUse`]): true for the device `SOFTRDMA_ADDR` names.
    pub fn pinned(&self) -> bool {
        self.pinned
    }
    /// Whether the device is on the loopback interface.
    pub fn is_loopback(&self) -> bool {
        self.v4.is_some_and(|a| a.is_loopback())
            || self.v6.first().is_some_and(|a| a.ip.is_loopback())
    }
    /// Node GUID derived from the address, as rxe derives it from the MAC (an EUI-64 with the
    /// IPv4 address, or the last four bytes of the first IPv6 address, in place of the MAC's
    /// low bytes).
    pub fn guid(&self) -> u64 {
        guid_of(self.v4, self.v6.first().map(|a| a.ip))
    }
    /// The interface MTU.
    pub fn if_mtu(&self) -> u32 {
        self.if_mtu
    }
    /// The largest IB MTU that fits the interface with RoCEv2 headers (as rxe computes it).
    pub fn active_mtu(&self) -> Mtu {
        Mtu::largest_within(self.if_mtu.saturating_sub(80) as usize)
    }
    /// `ibv_open_device`: bind the endpoint (UDP 4791 on the IPv4 address and on each IPv6
    /// address, shared with this user's other processes) and start its progress thread.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// let ctx = devices()?.pop().expect("the loopback device").open()?;
    /// assert!(ctx.addr().is_loopback());
    /// let port = ctx.query_port(1)?;
    /// assert_eq!(port.state, PortState::Active);
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::AddrInUse`] when port 4791 of the address is held by another user, kernel
    /// rdma_rxe or a program that does not share it (the error names it; the device is never
    /// moved to another address), [`VerbsError::Share`] when the address cannot be shared
    /// safely (an unsafe state directory, another softrdma version on it).
    pub fn open(&self) -> Result<Context> {
        Context::open(self.clone(), &ContextOptions::default())
    }
    /// [`Device::open`] with options (packet capture).
    ///
    /// # Errors
    /// As [`Device::open`], and [`VerbsError::Io`] if the capture file cannot be created.
    pub fn open_with(&self, opts: &ContextOptions) -> Result<Context> {
        Context::open(self.clone(), opts)
    }

    /// The same device pinned to another IPv4 address of its interface (another 127.x on
    /// `lo`), without IPv6 addresses.
    pub(crate) fn at(&self, addr: Ipv4Addr) -> Device {
        Device {
            v4: Some(addr),
            v6: Vec::new(),
            pinned: true,
            ..self.clone()
        }
    }
}

/// The node GUID of a device or context with these addresses.
pub(crate) fn guid_of(v4: Option<Ipv4Addr>, v6: Option<Ipv6Addr>) -> u64 {
    match (v4, v6) {
        (Some(a), _) => guid_from_ipv4(a),
        (None, Some(a)) => {
            let o = a.octets();
            guid_from_ipv4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        (None, None) => guid_from_ipv4(Ipv4Addr::UNSPECIFIED),
    }
}

/// `struct ibv_device_attr`, the fields that mean something here.
#[derive(Clone, Debug)]
pub struct DeviceAttr {
    /// Firmware version: softrdma's version.
    pub fw_ver: String,
    /// Node GUID, derived from the address (as rxe derives it from the MAC).
    pub node_guid: u64,
    /// System image GUID: the node GUID.
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// IEEE vendor ID (`0xffffff`: none).
    pub vendor_id: u32,
    /// Vendor part ID (0).
    pub vendor_part_id: u32,
    /// Hardware version (0).
    pub hw_ver: u32,
    /// Queue pairs per context.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Completion queues per context.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions per context.
    pub max_mr: u32,
    /// Protection domains per context.
    pub max_pd: u32,
    /// RDMA READs and atomics a QP serves at a time (`max_dest_rd_atomic` at most).
    pub max_qp_rd_atom: u32,
    /// RDMA READs and atomics a QP issues at a time (`max_rd_atomic` at most).
    pub max_qp_init_rd_atom: u32,
    /// RDMA READ and atomic responder resources of the device.
    pub max_res_rd_atom: u32,
    /// Shared receive queues per context.
    pub max_srq: u32,
    /// Work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per shared receive queue work request.
    pub max_srq_sge: u32,
    /// `IBV_ATOMIC_HCA`: atomics are atomic with respect to this device's other atomics.
    pub atomic_cap: AtomicCap,
    /// Ports (1).
    pub phys_port_cnt: u8,
    /// Partition keys in the table (1: the default).
    pub max_pkeys: u16,
}

/// `enum ibv_atomic_cap`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: no atomics.
    None,
    /// `IBV_ATOMIC_HCA`: atomic with respect to this device's atomics.
    Hca,
    /// `IBV_ATOMIC_GLOB`: atomic with respect to every access to the memory.
    Glob,
}

/// `enum ibv_port_state`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PortState {
    /// `IBV_PORT_DOWN`.
    Down = 1,
    /// `IBV_PORT_INIT`.
    Init = 2,
    /// `IBV_PORT_ARMED`.
    Armed = 3,
    /// `IBV_PORT_ACTIVE`: the interface is up.
    Active = 4,
}

/// `struct ibv_port_attr`, the fields that mean something for RoCE.
#[derive(Clone, Debug)]
pub struct PortAttr {
    /// Whether the port (the network interface) is up.
    pub state: PortState,
    /// The largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// The largest path MTU that fits the interface's MTU with RoCEv2 headers.
    pub active_mtu: Mtu,
    /// Entries in the GID table (see `Context::query_gid`).
    pub gid_tbl_len: u32,
    /// Largest message, in bytes.
    pub max_msg_sz: u64,
    /// Entries in the partition key table.
    pub pkey_tbl_len: u16,
    /// 0 on Ethernet, as with rxe.
    pub lid: u16,
    /// `IBV_LINK_LAYER_ETHERNET`: always (RoCE).
    pub link_layer_ethernet: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, v4: Option<&str>, v6: &[&str], loopback: bool) -> Interface {
        Interface {
            name: name.into(),
            v4: v4.map(|a| (a.parse().unwrap(), Ipv4Addr::new(255, 0, 0, 0))),
            v6: v6
                .iter()
                .map(|a| V6Addr {
                    ip: a.parse().unwrap(),
                    scope: if a.starts_with("fe80") { 3 } else { 0 },
                })
                .collect(),
            mtu: 1500,
            running: true,
            loopback,
        }
    }

    #[test]
    fn one_device_per_interface_ipv6_only_ones_included() {
        let devs = devices_from(
            vec![
                iface("lo", Some("127.0.0.1"), &["::1"], true),
                iface("v6only", None, &["fd00:1::5", "fe80::1"], false),
                iface("eth0", Some("192.0.2.2"), &["fd00::2", "fe80::2"], false),
            ],
            Some("eth0".into()),
        );
        let names: Vec<(&str, &str)> = devs.iter().map(|d| (d.name(), d.ifname())).collect();
        assert_eq!(
            names,
            [("srxe0", "eth0"), ("srxe1", "v6only"), ("srxe2", "lo")]
        );
        assert_eq!(devs[0].addr(), Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(devs[0].ipv6_addrs().len(), 2);
        // The IPv6-only interface: no IPv4 address, its GUID from its first IPv6 address.
        assert_eq!(devs[1].ipv4(), None);
        assert_eq!(devs[1].addr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(devs[1].v6()[1].scope, 3);
        assert_eq!(devs[1].guid(), 0x0200_5eff_0000_0005);
        assert!(!devs[1].is_loopback());
        assert!(devs[2].is_loopback());
        assert_eq!(devs[2].ipv6_addrs(), vec![Ipv6Addr::LOCALHOST]);
        // Pinned to one IPv4 address: no IPv6 addresses.
        let at = devs[2].at(Ipv4Addr::new(127, 0, 0, 9));
        assert!(at.pinned() && at.ipv6_addrs().is_empty());
    }
}
