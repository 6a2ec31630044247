//! Devices: one user-space RoCEv2 endpoint per network interface, shared by every process.

use std::ffi::CStr;
use std::net::Ipv4Addr;

use super::context::{Context, ContextOptions};
use super::error::{Result, VerbsError};
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

/// An RDMA device (`struct ibv_device`): a RoCEv2 endpoint on one local IPv4 address.
#[derive(Clone, Debug)]
pub struct Device {
    name: String,
    ifname: String,
    addr: Ipv4Addr,
    if_mtu: u32,
    /// Bind exactly `addr` (`SOFTRDMA_ADDR`, or an rdma_cm bind to one 127.x address): when it
    /// is taken, opening fails instead of moving to the next free loopback address.
    pinned: bool,
}

/// `ibv_get_device_list`: one device per network interface with an IPv4 address, named `srxe0`,
/// `srxe1`, …: first the interface of the default route (so the first device, the one programs
/// open by default, reaches other hosts), then the other interfaces, the loopback device last.
/// Any number of processes open a device at once (`driver::share`). With
/// `SOFTRDMA_ADDR=a.b.c.d` set, exactly one device, pinned to that address.
pub fn devices() -> Result<Vec<Device>> {
    if let Ok(a) = std::env::var("SOFTRDMA_ADDR") {
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| VerbsError::InvalidArgument("SOFTRDMA_ADDR is not an IPv4 address"))?;
        // The interface with that address, else the one whose subnet holds it (127.0.0.9 is on
        // `lo`, whose address is 127.0.0.1/8).
        let ifs = interfaces()?;
        let (ifname, if_mtu) = ifs
            .iter()
            .find(|i| i.addr == addr)
            .or_else(|| ifs.iter().find(|i| i.contains(addr)))
            .map(|i| (i.name.clone(), i.mtu))
            .unwrap_or_else(|| (String::from("?"), 1500));
        return Ok(vec![Device {
            name: "srxe0".into(),
            ifname,
            addr,
            if_mtu,
            pinned: true,
        }]);
    }
    let mut ifs = interfaces()?;
    // One device per interface, on its first IPv4 address, as rdma_rxe has one per netdev.
    let mut seen = std::collections::HashSet::new();
    ifs.retain(|i| seen.insert(i.name.clone()));
    // The first device is one a peer on another host reaches (programs take the first, as
    // ibv_rc_pingpong and perftest do): the default route's interface, then the other running
    // ones; the loopback device last.
    let default_if = default_route_interface();
    ifs.sort_by_key(|i| {
        (
            i.addr.is_loopback(),
            Some(&i.name) != default_if.as_ref(),
            !i.running,
        )
    });
    Ok(ifs
        .into_iter()
        .enumerate()
        .map(|(i, f)| Device {
            name: format!("srxe{i}"),
            ifname: f.name,
            addr: f.addr,
            if_mtu: f.mtu,
            pinned: false,
        })
        .collect())
}

/// The interface of the IPv4 default route (`/proc/net/route`), if there is one.
fn default_route_interface() -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    })
}

/// One local IPv4 interface address.
struct Interface {
    name: String,
    addr: Ipv4Addr,
    mask: Ipv4Addr,
    mtu: u32,
    /// IFF_RUNNING: up with a carrier.
    running: bool,
}

impl Interface {
    fn contains(&self, a: Ipv4Addr) -> bool {
        let m = u32::from(self.mask);
        m != 0 && u32::from(a) & m == u32::from(self.addr) & m
    }
}

/// Local IPv4 interface addresses with their netmasks and MTUs (getifaddrs).
fn interfaces() -> Result<Vec<Interface>> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`; we free it with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of at least sa_family's size.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family != libc::AF_INET || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: for AF_INET the address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        let mask = if ifa.ifa_netmask.is_null() {
            Ipv4Addr::UNSPECIFIED
        } else {
            // SAFETY: for an AF_INET address the netmask, when present, is a sockaddr_in too.
            let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in) };
            Ipv4Addr::from(u32::from_be(m.sin_addr.s_addr))
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1500);
        out.push(Interface {
            name,
            addr,
            mask,
            mtu,
            running: ifa.ifa_flags & libc::IFF_RUNNING as u32 != 0,
        });
    }
    // SAFETY: `ifap` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
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
    /// The IPv4 address the device binds (on loopback, the first free 127.x address is used,
    /// unless the address is pinned).
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }
    /// Whether opening binds exactly [`Device::addr`] or fails ([`VerbsError::AddrInUse`]):
    /// true for the device `SOFTRDMA_ADDR` names.
    pub fn pinned(&self) -> bool {
        self.pinned
    }
    /// Node GUID derived from the address, as rxe derives it from the MAC (an EUI-64 with the
    /// address in place of the MAC's low bytes). A context opened on a busy loopback address
    /// derives its GUID from the address it got instead ([`Context::node_guid`]).
    pub fn guid(&self) -> u64 {
        guid_from_ipv4(self.addr)
    }
    /// The interface MTU.
    pub fn if_mtu(&self) -> u32 {
        self.if_mtu
    }
    /// The largest IB MTU that fits the interface with RoCEv2 headers (as rxe computes it).
    pub fn active_mtu(&self) -> Mtu {
        let usable = self.if_mtu.saturating_sub(80) as usize;
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
            .into_iter()
            .find(|m| m.bytes() <= usable)
            .unwrap_or(Mtu::Mtu256)
    }
    /// `ibv_open_device`: bind the endpoint (UDP `addr:4791`; on loopback, if that is taken,
    /// the next free 127.0.0.x, unless the device is [pinned](Device::pinned)) and start its
    /// progress thread.
    pub fn open(&self) -> Result<Context> {
        Context::open(self.clone(), &ContextOptions::default())
    }
    /// [`Device::open`] with options (packet capture).
    pub fn open_with(&self, opts: &ContextOptions) -> Result<Context> {
        Context::open(self.clone(), opts)
    }

    /// The same device pinned to another address of its interface (another 127.x on `lo`).
    pub(crate) fn at(&self, addr: Ipv4Addr) -> Device {
        Device {
            addr,
            pinned: true,
            ..self.clone()
        }
    }
}

/// `struct ibv_device_attr`, the fields that mean something here.
#[derive(Clone, Debug)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    /// `IBV_ATOMIC_HCA`: atomics are atomic with respect to this device's other atomics.
    pub atomic_cap: AtomicCap,
    pub phys_port_cnt: u8,
    pub max_pkeys: u16,
}

/// `enum ibv_atomic_cap`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AtomicCap {
    None,
    Hca,
    Glob,
}

/// `enum ibv_port_state`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PortState {
    Down = 1,
    Init = 2,
    Armed = 3,
    Active = 4,
}

/// `struct ibv_port_attr`, the fields that mean something for RoCE.
#[derive(Clone, Debug)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub max_msg_sz: u64,
    pub pkey_tbl_len: u16,
    /// 0 on Ethernet, as with rxe.
    pub lid: u16,
    pub link_layer_ethernet: bool,
}
