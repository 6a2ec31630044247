//! A device context (`ibv_open_device`): the endpoint's socket, its engine and progress thread.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV6};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

use super::channel::{ChannelShared, CompletionChannel};
use super::cq::{CompletionQueue, CqShared};
use super::device::*;
use super::error::{Result, VerbsError};
use super::event::{AsyncEvent, AsyncQueue};
use super::mr::MrTable;
use super::pd::ProtectionDomain;
use super::quota::Quota;
use crate::driver::engine::{Engine, Stats};
use crate::driver::socket::Io;

pub(crate) struct Shared {
    pub device: Device,
    /// The IPv4 address the endpoint is bound to (`0.0.0.0`: none).
    pub addr: Ipv4Addr,
    pub mrs: MrTable,
    pub engine: Mutex<Engine>,
    pub io: Arc<Io>,
    next_id: AtomicU32,
    /// When an application thread last busy-polled (µs since `epoch`); while it polls, the
    /// progress thread stays out of its way.
    last_app_poll: AtomicU64,
    /// The progress thread is standing aside for a busy-polling application.
    progress_yielding: AtomicBool,
    /// When the progress thread means to wake next (µs since `epoch`; `u64::MAX`: it is not
    /// asleep on a timer, or there is none). Written and compared under the engine lock, so a
    /// new, earlier deadline always wakes it.
    planned_wake: AtomicU64,
    epoch: Instant,
    pub async_events: Arc<AsyncQueue>,
    /// QPs dropped while the engine was busy (see `QueuePair`'s drop).
    deferred_removals: Mutex<Vec<u32>>,
    /// `max_pd` and `max_cq`, enforced.
    pub(crate) pd_quota: Arc<Quota>,
    pub(crate) cq_quota: Arc<Quota>,
    pub(crate) srq_quota: Arc<Quota>,
}

impl Shared {
    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn lock_engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine, for a verb called by the application. A thread that holds a memory-region
    /// guard gets [`VerbsError::Busy`] instead: the engine's holder may be waiting for that
    /// very region (a deadlock otherwise).
    pub(crate) fn lock_engine_for_verb(&self) -> Result<std::sync::MutexGuard<'_, Engine>> {
        if super::mr::guards_held() {
            return Err(VerbsError::Busy(
                "this thread holds a MemoryRegion::lock guard; drop it before calling this verb",
            ));
        }
        Ok(self.lock_engine())
    }

    /// Drive the transport once, now, on this thread (unless it holds a memory-region guard:
    /// then the progress thread does it).
    pub(crate) fn drive(&self) {
        if super::mr::guards_held() {
            self.io.wake();
            return;
        }
        let mut e = self.lock_engine();
        e.drive(&self.io, &self.mrs, &self.async_events, Instant::now());
        self.kick_if_earlier(e.next_deadline());
    }

    /// Drive once, reading the forward sockets too (something arrived on one: see
    /// `driver::forward`).
    pub(crate) fn drive_forwarded(&self) {
        if super::mr::guards_held() {
            self.io.wake();
            return;
        }
        let mut e = self.lock_engine();
        e.force_fwd_check();
        e.drive(&self.io, &self.mrs, &self.async_events, Instant::now());
        self.kick_if_earlier(e.next_deadline());
    }

    /// Drive once unless another thread is driving already (the busy-poll path).
    pub(crate) fn try_drive(&self) {
        if super::mr::guards_held() {
            // This thread may not drive (see `MrGuard`); nor may it keep the progress thread
            // standing aside.
            return;
        }
        let t = self.epoch.elapsed().as_micros() as u64;
        self.last_app_poll.store(t, Ordering::Relaxed);
        let mut e = match self.engine.try_lock() {
            Ok(e) => e,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        self.remove_deferred(&mut e);
        e.app_driving = true;
        e.drive(&self.io, &self.mrs, &self.async_events, Instant::now());
        e.app_driving = false;
        self.kick_if_earlier(e.next_deadline());
    }

    pub(crate) fn defer_qp_removal(&self, qpn: u32) {
        self.deferred_removals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qpn);
        self.io.wake();
    }

    fn remove_deferred(&self, e: &mut Engine) {
        let mut d = self
            .deferred_removals
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for qpn in d.drain(..) {
            e.remove_qp(qpn);
        }
    }

    fn micros(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// Called by the progress thread under the engine lock before it sleeps until `deadline`.
    pub(crate) fn plan_wake(&self, deadline: Instant) {
        self.planned_wake
            .store(self.micros(deadline).max(1), Ordering::Relaxed);
    }

    /// Called by the progress thread under the engine lock when it woke up.
    pub(crate) fn woke(&self) {
        self.planned_wake.store(u64::MAX, Ordering::Relaxed);
    }

    /// Under the engine lock: wake the progress thread if a timer is now due before it planned
    /// to look (so retransmission and RNR waits run on time while the application sleeps).
    pub(crate) fn kick_if_earlier(&self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            let planned = self.planned_wake.load(Ordering::Relaxed);
            if planned != u64::MAX && self.micros(d) < planned {
                self.io.wake();
            }
        }
    }
}

impl Shared {
    /// True while an application thread has busy-polled within `window`.
    pub(crate) fn app_polling(&self, window: Duration) -> bool {
        let last = self.last_app_poll.load(Ordering::SeqCst);
        let now = self.epoch.elapsed().as_micros() as u64;
        last != 0 && now.saturating_sub(last) < window.as_micros() as u64
    }

    /// The application is about to sleep (it armed a CQ or blocks on a channel): the progress
    /// thread must not stand aside any longer. (SeqCst pairs with [`Shared::set_yielding`]: one
    /// of the two sides sees the other's store.)
    pub(crate) fn app_blocking(&self) {
        self.last_app_poll.store(0, Ordering::SeqCst);
        if self.progress_yielding.load(Ordering::SeqCst) {
            self.io.wake();
        }
    }

    /// The progress thread stands aside (`true`) or resumes (`false`).
    pub(crate) fn set_yielding(&self, on: bool) {
        self.progress_yielding.store(on, Ordering::SeqCst);
    }
}

/// Options of [`Device::open_with`](super::Device::open_with).
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Write every datagram sent and received to this pcap file (default: `$SOFTRDMA_PCAP`).
    pub pcap: Option<PathBuf>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.io.shutdown();
    }
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
        let io = Io::bind(device.ipv4(), &v6, device.pinned()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                let ip = match (device.ipv4(), device.v6().first()) {
                    (Some(a), _) => IpAddr::V4(a),
                    (None, Some(a)) => IpAddr::V6(a.ip),
                    (None, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                };
                VerbsError::AddrInUse(ip)
            } else {
                e.into()
            }
        })?;
        let io = Arc::new(io);
        let addr = io.local_v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let pcap = opts
            .pcap
            .clone()
            .or_else(|| std::env::var_os("SOFTRDMA_PCAP").map(Into::into));
        let engine = Engine::new(pcap, &io, guid_of_io(&io))?;
        let shared = Arc::new(Shared {
            device,
            addr,
            mrs: MrTable::default(),
            engine: Mutex::new(engine),
            io: io.clone(),
            next_id: AtomicU32::new(1),
            last_app_poll: AtomicU64::new(0),
            progress_yielding: AtomicBool::new(false),
            planned_wake: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            async_events: Arc::new(AsyncQueue::default()),
            deferred_removals: Mutex::new(Vec::new()),
            pd_quota: Quota::new(MAX_PD, "max_pd protection domains exist"),
            cq_quota: Quota::new(MAX_CQ, "max_cq completion queues exist"),
            srq_quota: Quota::new(MAX_SRQ, "max_srq shared receive queues exist"),
        });
        crate::driver::progress::spawn(Arc::downgrade(&shared), io)?;
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
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
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
    pub fn gid_index(&self, gid: &[u8; 16]) -> Option<u32> {
        self.shared.io.gids.index_of(gid).map(|i| i as u32)
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
            _slot: self.shared.pd_quota.take()?,
            id: self.shared.next_id(),
            shared: self.shared.clone(),
        })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        Ok(CompletionChannel {
            inner: Arc::new(ChannelShared::new()?),
            shared: self.shared.clone(),
        })
    }

    /// `ibv_create_cq` with at least `cqe` entries.
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
        self.shared.drive();
    }

    /// Packet counters of the endpoint.
    pub fn stats(&self) -> Result<Stats> {
        Ok(self.shared.lock_engine_for_verb()?.stats)
    }

    /// `ibv_get_async_event` without waiting: the oldest unread async event, if any. (No
    /// acknowledgement is needed: the event is a copy.)
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
