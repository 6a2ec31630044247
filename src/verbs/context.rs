//! A device context (`ibv_open_device`): the endpoint's socket, its engine and progress thread.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV6};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::channel::{ChannelShared, CompletionChannel};
use super::cq::{CompletionQueue, CqShared};
use super::device::*;
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use crate::driver::engine::{Engine, Stats};
use crate::driver::runtime::Runtime;
use crate::driver::socket::Io;
use crate::endpoint::events::AsyncEvent;
use crate::endpoint::quota::Quota;

/// An open device as the verbs see it: the runtime (dereferenced to) and what the API itself
/// keeps: the device, the ids it hands out and the limits it enforces.
pub(crate) struct Shared {
    pub rt: Arc<Runtime>,
    pub device: Device,
    /// The IPv4 address the endpoint is bound to (`0.0.0.0`: none).
    pub addr: Ipv4Addr,
    next_id: AtomicU32,
    /// `max_pd`, `max_cq` and `max_srq`, enforced.
    pub(crate) pd_quota: Arc<Quota>,
    pub(crate) cq_quota: Arc<Quota>,
    pub(crate) srq_quota: Arc<Quota>,
}

impl Shared {
    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

impl std::ops::Deref for Shared {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.rt
    }
}

/// Options of [`Device::open_with`](super::Device::open_with).
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Write every datagram sent and received to this pcap file (default: `$SOFTRDMA_PCAP`).
    pub pcap: Option<PathBuf>,
}

/// An open device: create PDs, CQs and channels from it.
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl Context {
    pub(crate) fn open(device: Device, opts: &ContextOptions) -> Result<Context> {
        let v6: Vec<SocketAddrV6> = device
            .v6()
            .iter()
            .map(|a| SocketAddrV6::new(a.ip, 0, 0, a.scope))
            .collect();
        let io = Io::bind(device.ipv4(), &v6, device.pinned()).map_err(VerbsError::from_io)?;
        let io = Arc::new(io);
        let addr = io.local_v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let pcap = opts
            .pcap
            .clone()
            .or_else(|| std::env::var_os("SOFTRDMA_PCAP").map(Into::into));
        let engine = Engine::new(pcap, &io, guid_of_io(&io))?;
        let rt = Arc::new(Runtime::new(io, engine));
        Runtime::start(&rt)?;
        let shared = Arc::new(Shared {
            rt,
            device,
            addr,
            next_id: AtomicU32::new(1),
            pd_quota: Quota::new(MAX_PD, "max_pd protection domains exist"),
            cq_quota: Quota::new(MAX_CQ, "max_cq completion queues exist"),
            srq_quota: Quota::new(MAX_SRQ, "max_srq shared receive queues exist"),
        });
        Ok(Context { shared })
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// The IPv4 address the endpoint is bound to (UDP port 4791); `0.0.0.0` when it has none
    /// (an IPv6-only device). [`Context::ip_addrs`] lists every address.
    pub fn addr(&self) -> Ipv4Addr {
        self.shared.addr
    }

    /// Every address the endpoint is bound to (UDP port 4791), in the order of the GID table:
    /// the IPv4 address first, when there is one, then the IPv6 addresses.
    pub fn ip_addrs(&self) -> Vec<IpAddr> {
        self.shared.io.socks.iter().map(|s| s.local.ip()).collect()
    }

    /// Node GUID: derived from the bound address, as rxe derives it from the MAC.
    pub fn node_guid(&self) -> u64 {
        guid_of_io(&self.shared.io)
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let guid = self.node_guid();
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: MAX_MSG,
            vendor_id: 0xffffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: MAX_QP as u32,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: MAX_CQ as u32,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR as u32,
            max_pd: MAX_PD as u32,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            max_res_rd_atom: MAX_RD_ATOM * MAX_QP as u32,
            max_srq: MAX_SRQ as u32,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SRQ_SGE,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: 1,
            max_pkeys: 1,
        }
    }

    /// `ibv_query_port`. The only port is 1.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a port other than 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(VerbsError::InvalidArgument("port number must be 1"));
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: crate::transport::Mtu::Mtu4096,
            active_mtu: self.shared.device.active_mtu(),
            gid_tbl_len: self.shared.io.gids.len() as u32,
            max_msg_sz: MAX_MSG,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer_ethernet: true,
        })
    }

    /// `ibv_query_gid`: the RoCE v2 GID of each address, as rdma_rxe lists a netdev's: indexes
    /// 0 and 1 both hold the IPv4-mapped GID (`::ffff:a.b.c.d`) when the endpoint has an IPv4
    /// address (else its first IPv6 address), and its IPv6 addresses follow (global ones, then
    /// link-local ones); `gid_tbl_len` entries in all ([`Context::query_port`]).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a port other than 1 or an index past the table.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        if port != 1 {
            return Err(VerbsError::InvalidArgument("no such GID"));
        }
        self.shared
            .io
            .gids
            .get(index as usize)
            .ok_or(VerbsError::InvalidArgument("no such GID"))
    }

    /// The endpoint's GID: index 0 of the GID table (the IPv4-mapped GID when there is one).
    pub fn gid(&self) -> [u8; 16] {
        self.shared.io.gids.get(0).unwrap_or([0; 16])
    }

    /// The first GID table index holding `gid` (`ibv_find_gid_index`), if any.
    pub fn gid_index(&self, gid: &[u8; 16]) -> Option<u8> {
        self.shared.io.gids.index_of(gid).map(|i| i as u8)
    }

    /// The GID index a path to `dgid` starts from (see `GidTable::source_for`).
    pub(crate) fn source_gid_index(&self, dgid: &[u8; 16]) -> Option<u8> {
        self.shared.io.gids.source_for(dgid)
    }

    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    /// [`VerbsError::NoResources`] beyond `max_pd`.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
            _slot: self.shared.pd_quota.take()?,
            id: self.shared.next_id(),
            shared: self.shared.clone(),
        })
    }

    /// `ibv_create_comp_channel`.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # use std::os::fd::AsRawFd;
    /// # use std::time::Duration;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// let ch = ctx.create_comp_channel()?;
    /// let cq = ctx.create_cq(16, Some(&ch))?;
    /// // Its fd goes in epoll/poll; CompletionQueue::wait sleeps on it for you.
    /// assert!(ch.as_raw_fd() >= 0);
    /// assert!(matches!(cq.wait(Duration::from_millis(10)), Err(VerbsError::Timeout(_))));
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::Io`] if no eventfd can be made.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        Ok(CompletionChannel {
            inner: Arc::new(ChannelShared::new()?),
            shared: self.shared.clone(),
        })
    }

    /// `ibv_create_cq` with at least `cqe` entries.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for 0 or more than `max_cqe` entries, or a channel of another context; [`VerbsError::NoResources`] beyond `max_cq`.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(VerbsError::InvalidArgument("cqe out of range"));
        }
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.shared, &self.shared) {
                return Err(VerbsError::InvalidArgument(
                    "completion channel belongs to another context",
                ));
            }
        }
        let slot = self.shared.cq_quota.take()?;
        let inner = Arc::new(CqShared::new(
            slot,
            self.shared.next_id(),
            cqe as usize,
            channel.map(|c| c.inner.clone()),
            self.shared.async_events.clone(),
        ));
        Ok(CompletionQueue {
            inner,
            shared: self.shared.clone(),
        })
    }

    /// Drive the transport once on this thread (receive, timers, transmit). Polling a CQ does
    /// this already; a progress thread does it when nobody polls.
    pub fn drive(&self) {
        self.shared.drive(crate::driver::engine::Round::Full);
    }

    /// Packet counters of the endpoint.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] on a thread holding a [`MrGuard`](super::MrGuard).
    pub fn stats(&self) -> Result<Stats> {
        let e = self.shared.lock_engine_for_verb()?;
        let mut s = e.stats;
        s.refused = e.access_refusals();
        Ok(s)
    }

    /// `ibv_get_async_event` without waiting: the oldest unread async event, if any. (No
    /// acknowledgement is needed: the event is a copy.)
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// assert!(ctx.poll_async_event().is_none(), "nothing happened yet");
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared.async_events.pop()
    }

    /// An eventfd (`ibv_context.async_fd`) that is readable while an async event is
    /// queued: put it in `poll`/`epoll`, then take the events with
    /// [`Context::poll_async_event`]. Do not read it yourself.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        self.shared.async_events.fd()
    }
}

/// The async-event fd ([`Context::async_fd`]): readable while an async event is queued.
impl std::os::fd::AsFd for Context {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the eventfd is the context's own, open as long as `self` (which borrows it).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.shared.async_events.fd()) }
    }
}

impl std::os::fd::AsRawFd for Context {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.shared.async_events.fd()
    }
}

/// A context that does not keep its device open (rdma_cm's per-device core holds one: the
/// device closes with the application's last handle).
#[derive(Clone)]
pub(crate) struct WeakContext(std::sync::Weak<Shared>);

impl WeakContext {
    pub(crate) fn upgrade(&self) -> Option<Context> {
        self.0.upgrade().map(|shared| Context { shared })
    }
}

impl Context {
    pub(crate) fn downgrade(&self) -> WeakContext {
        WeakContext(Arc::downgrade(&self.shared))
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Context({} on {:?})",
            self.shared.device.name(),
            self.ip_addrs()
        )
    }
}

/// The node GUID of an endpoint: from its IPv4 address, else its first IPv6 address.
fn guid_of_io(io: &Io) -> u64 {
    let v6 = io.socks.iter().find_map(|s| match s.local.ip() {
        IpAddr::V6(a) => Some(a),
        IpAddr::V4(_) => None,
    });
    super::device::guid_of(io.local_v4(), v6)
}
