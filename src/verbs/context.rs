//! A device context (`ibv_open_device`): the endpoint's socket, its engine and progress thread.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

use super::channel::{ChannelShared, CompletionChannel};
use super::cq::{CompletionQueue, CqShared};
use super::device::*;
use super::error::{Result, VerbsError};
use super::mr::MrTable;
use super::pd::ProtectionDomain;
use crate::driver::engine::{Engine, Stats};
use crate::driver::socket::Io;

pub(crate) struct Shared {
    pub device: Device,
    pub addr: Ipv4Addr,
    pub mrs: MrTable,
    pub engine: Mutex<Engine>,
    pub io: Arc<Io>,
    next_id: AtomicU32,
    /// When an application thread last busy-polled (µs since `epoch`); while it polls, the
    /// progress thread stays out of its way.
    last_app_poll: AtomicU64,
    epoch: Instant,
}

impl Shared {
    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Drive the transport once, now, on this thread.
    pub(crate) fn drive(&self) {
        let mut e = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        e.drive(&self.io, &self.mrs, self.addr, Instant::now());
    }

    /// Drive once unless another thread is driving already (the busy-poll path).
    pub(crate) fn try_drive(&self) {
        let t = self.epoch.elapsed().as_micros() as u64;
        self.last_app_poll.store(t, Ordering::Relaxed);
        if let Ok(mut e) = self.engine.try_lock() {
            e.drive(&self.io, &self.mrs, self.addr, Instant::now());
        }
    }
}

impl Shared {
    /// True while an application thread has busy-polled within `window`.
    pub(crate) fn app_polling(&self, window: Duration) -> bool {
        let last = self.last_app_poll.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_micros() as u64;
        last != 0 && now.saturating_sub(last) < window.as_micros() as u64
    }
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
    pub(crate) fn open(device: Device) -> Result<Context> {
        let io = Arc::new(Io::bind(device.addr())?);
        let addr = io.local_addr();
        let engine = Engine::new(std::env::var_os("SOFTRDMA_PCAP").map(Into::into))?;
        let shared = Arc::new(Shared {
            device,
            addr,
            mrs: MrTable::default(),
            engine: Mutex::new(engine),
            io: io.clone(),
            next_id: AtomicU32::new(1),
            last_app_poll: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        crate::driver::progress::spawn(Arc::downgrade(&shared), io)?;
        Ok(Context { shared })
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// The IPv4 address the endpoint is bound to (UDP port 4791).
    pub fn addr(&self) -> Ipv4Addr {
        self.shared.addr
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let guid = self.shared.device.guid();
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
            max_pd: 1 << 16,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            max_res_rd_atom: MAX_RD_ATOM * MAX_QP as u32,
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
            gid_tbl_len: 2,
            max_msg_sz: MAX_MSG,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer_ethernet: true,
        })
    }

    /// `ibv_query_gid`: indexes 0 and 1 both hold the RoCEv2 IPv4-mapped GID of the endpoint.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        if port != 1 || index > 1 {
            return Err(VerbsError::InvalidArgument("no such GID"));
        }
        Ok(gid_from_ipv4(self.shared.addr))
    }

    /// The endpoint's GID.
    pub fn gid(&self) -> [u8; 16] {
        gid_from_ipv4(self.shared.addr)
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
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
        let inner = Arc::new(CqShared::new(
            self.shared.next_id(),
            cqe as usize,
            channel.map(|c| c.inner.clone()),
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
    pub fn stats(&self) -> Stats {
        self.shared.engine.lock().unwrap().stats
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Context({} on {})",
            self.shared.device.name(),
            self.shared.addr
        )
    }
}
