//! The sans-IO device: one endpoint per open device (QPN demultiplexing, the ICRC check, counters,
//! the GSI QP1 feeding the IB CM), fed datagrams and time, writing the packets it sends into a
//! sink; and the device's objects its QPs complete into (CQs, channels, SRQs, async events, the
//! memory table). No sockets here: `driver` moves the datagrams.

pub(crate) mod channel;
pub(crate) mod cq;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod gids;
pub(crate) mod hash;
pub(crate) mod memory;
pub(crate) mod quota;
pub(crate) mod srq;

pub use error::EndpointError;
pub(crate) mod qp;
pub(crate) mod receive;
#[cfg(test)]
mod sim;
pub(crate) mod stats;
pub(crate) mod transmit;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::Instant;

use crate::cm::endpoint::{CmEndpoint, GsiAgent, ModifyQp};
use crate::transport::QpAttr;
use crate::wire::icrc;
use qp::{QpSlot, QpTransport};
pub use stats::Stats;

/// First QPN handed out within a slot's range, as rxe's first (0 and 1 are the special QPs).
const FIRST_QPN: u32 = 0x11;
/// QPNs of one slot: the low 16 bits (the top 8 are the slot, see `driver::share`).
const QPN_MASK: u32 = 0xffff;
/// The GSI QP (QP1): CM MADs. Never an application UD QP.
pub(crate) const GSI_QPN: u32 = 1;

/// Where a context starts numbering its QPs: at random, so that a slot freed by one context
/// and taken by another does not hand out the QPN whose old peer may still be retransmitting
/// to it (rdma_rxe avoids reuse the same way, by counting up across the whole 24 bits).
fn first_qpn() -> u32 {
    let mut b = [0u8; 2];
    let _ = getrandom::getrandom(&mut b);
    (u16::from_ne_bytes(b) as u32).max(FIRST_QPN)
}

/// One device's endpoint: its QPs by number, QP1 and the CM behind it, the ICRC gate and the
/// counters. Fed datagrams ([`Endpoint::handle_datagram`]) and time
/// ([`Endpoint::handle_timeout`]); writes what it sends into a [`transmit::TxSink`].
pub(crate) struct Endpoint {
    qps: HashMap<u32, QpSlot, hash::LocalKeys>,
    /// This endpoint's slot on its (shared) address: the top byte of its QPNs.
    slot: u8,
    next_qpn: u32,
    /// QPs that received, timed out or changed state since the last
    /// [`Endpoint::transmit_dirty`].
    dirty: Vec<u32>,
    pub stats: Stats,
    /// The length and ICRC check of received datagrams, with the last IP ID of each source.
    icrc_gate: icrc::IcrcGate,
    /// The CM endpoint of the device's GSI QP1 and what uses it (rdma_cm's core, once a
    /// process uses rdma_cm on the device): see [`Endpoint::with_gsi`].
    gsi: Box<dyn GsiAgent>,
    /// A GSI packet or a CM timer made work for [`Endpoint::transmit_gsi`].
    gsi_pending: bool,
    /// QPs with a timer armed as of their last transmit (see [`Endpoint::handle_qp_timeouts`]):
    /// a busy round looks at these, not at every QP of the device.
    timed: HashSet<u32, hash::LocalKeys>,
    /// When the timers of every QP are next looked at (and `timed` rebuilt).
    next_timer_sweep: Instant,
}

/// How often every QP's timers are looked at, not only those of the QPs known to have one.
const TIMER_SWEEP: std::time::Duration = std::time::Duration::from_millis(1);

impl Endpoint {
    /// The endpoint of a device on `v4` (`0.0.0.0`: none), with node GUID `node_guid`, in
    /// `slot` of its shared address (the top byte of its QPNs and CM IDs).
    pub fn new(v4: Ipv4Addr, node_guid: u64, slot: u8) -> Endpoint {
        Endpoint {
            qps: HashMap::default(),
            slot,
            next_qpn: first_qpn(),
            dirty: Vec::with_capacity(64),
            stats: Stats::default(),
            icrc_gate: icrc::IcrcGate::new(),
            gsi: Box::new(CmEndpoint::new(v4, node_guid, slot)),
            gsi_pending: false,
            timed: HashSet::default(),
            next_timer_sweep: Instant::now(),
        }
    }

    /// The remote accesses the live RC QPs refused, by reason.
    pub fn access_refusals(&self) -> crate::transport::AccessRefusals {
        let mut r = crate::transport::AccessRefusals::default();
        for s in self.qps.values() {
            if let QpTransport::Rc(rc) = &s.qp {
                r.add(&rc.stats().refused);
            }
        }
        r
    }

    /// This endpoint's slot on its address.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// A free QPN of this endpoint's slot: `slot << 16 | n`.
    pub fn alloc_qpn(&mut self) -> Result<u32, EndpointError> {
        for _ in 0..=QPN_MASK {
            let n = self.next_qpn;
            self.next_qpn = if n >= QPN_MASK { 0 } else { n + 1 };
            let q = (self.slot as u32) << 16 | n;
            if !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
        Err(EndpointError::NoResources("no free QP number"))
    }

    pub fn insert_qp(&mut self, qpn: u32, slot: QpSlot) {
        self.qps.insert(qpn, slot);
    }

    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    pub fn remove_qp(&mut self, qpn: u32) {
        self.timed.remove(&qpn);
        if let Some(slot) = self.qps.remove(&qpn) {
            // SOFTRDMA_RC_STATS=1: an RC QP's loss-recovery counters on stderr when it goes.
            if let QpTransport::Rc(q) = &slot.qp {
                if std::env::var_os("SOFTRDMA_RC_STATS").is_some() {
                    eprintln!("softrdma: QP {qpn:#x}: {:?}", q.stats());
                }
            }
        }
    }

    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut QpSlot> {
        self.qps.get_mut(&qpn)
    }

    /// The earliest timer of any QP or of the CM.
    pub fn next_deadline(&self) -> Option<Instant> {
        let ep = self.gsi.endpoint();
        self.qps
            .values()
            .filter_map(|s| s.qp.poll_timeout())
            .chain(ep.poll_timeout())
            .chain(ep.cm.unclaimed_check_at())
            .min()
    }

    /// Fire the QP and CM timers due at `now`. True if REQs nobody here listens for are due
    /// to be handed over or rejected ([`CmEndpoint::forward_unclaimed`]). (The engine calls
    /// the two halves itself, the CM's less often; the simulator calls this.)
    #[cfg(test)]
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        self.handle_qp_timeouts(now);
        self.handle_cm_timeouts(now)
    }

    /// Fire the QP timers due at `now`. A busy application drives a round every microsecond
    /// or so, and a device may have a thousand QPs, most of them idle: a round looks only at
    /// the QPs that had a timer armed when they last transmitted (a timer is armed or stopped
    /// only by sending, receiving or a timeout, and each of those ends in
    /// [`Endpoint::transmit_qp`]); every [`TIMER_SWEEP`] it looks at all of them.
    pub fn handle_qp_timeouts(&mut self, now: Instant) {
        let Endpoint {
            qps,
            timed,
            dirty,
            next_timer_sweep,
            ..
        } = self;
        let mut fire = |qpn: u32, slot: &mut QpSlot| {
            if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                slot.qp.handle_timeout(now);
                if !dirty.contains(&qpn) {
                    dirty.push(qpn);
                }
            }
        };
        if now >= *next_timer_sweep {
            *next_timer_sweep = now + TIMER_SWEEP;
            timed.clear();
            for (&qpn, slot) in qps.iter_mut() {
                if slot.qp.poll_timeout().is_some() {
                    timed.insert(qpn);
                }
                fire(qpn, slot);
            }
        } else {
            for &qpn in timed.iter() {
                if let Some(slot) = qps.get_mut(&qpn) {
                    fire(qpn, slot);
                }
            }
        }
    }

    /// Fire the CM timers due at `now` (see [`Endpoint::handle_timeout`]).
    pub fn handle_cm_timeouts(&mut self, now: Instant) -> bool {
        let ep = self.gsi.endpoint_mut();
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.cm.handle_timeout(now);
            self.gsi_pending = true;
        }
        ep.cm.unclaimed_check_at().is_some_and(|t| t <= now)
    }

    /// The CM has something to do ([`Endpoint::transmit_gsi`]): a GSI packet or a timer came,
    /// or its user has work of its own.
    pub fn gsi_due(&self) -> bool {
        self.gsi_pending || self.gsi.work_pending()
    }

    /// The device's CM endpoint (QP1).
    pub fn cm_endpoint(&mut self) -> &mut CmEndpoint {
        self.gsi.endpoint_mut()
    }

    /// Run `f` on the device's GSI agent of type `A` — made by `adopt` from the CM endpoint the
    /// first time (rdma_cm's core) — with a way to change QP states (the changed QPs are
    /// flushed by the next [`Endpoint::transmit_dirty`]).
    pub fn with_gsi<A: GsiAgent + 'static, R>(
        &mut self,
        now: Instant,
        adopt: impl FnOnce(CmEndpoint) -> A,
        f: impl FnOnce(&mut A, ModifyQp<'_>, Instant) -> R,
    ) -> R {
        if self.gsi.as_any_mut().downcast_mut::<A>().is_none() {
            let vacant = Box::new(CmEndpoint::new(Ipv4Addr::UNSPECIFIED, 0, self.slot));
            let ep = std::mem::replace(&mut self.gsi, vacant).into_endpoint();
            self.gsi = Box::new(adopt(ep));
        }
        let Endpoint {
            gsi, qps, dirty, ..
        } = self;
        let agent = gsi
            .as_any_mut()
            .downcast_mut::<A>()
            .expect("the agent was made an A above");
        let mut modify = |qpn: u32, a: &QpAttr| modify_qp(qps, dirty, qpn, a, now);
        f(agent, &mut modify, now)
    }
}

/// A QP state change the CM asked for (see [`ModifyQp`]); the QP is flushed by the next
/// [`Endpoint::transmit_dirty`].
fn modify_qp(
    qps: &mut HashMap<u32, QpSlot, hash::LocalKeys>,
    dirty: &mut Vec<u32>,
    qpn: u32,
    a: &QpAttr,
    now: Instant,
) -> bool {
    let Some(s) = qps.get_mut(&qpn) else {
        return false;
    };
    let ok = match &mut s.qp {
        QpTransport::Rc(q) => q.modify(a, now).is_ok(),
        QpTransport::Uc(q) => q.modify(a).is_ok(),
        QpTransport::Ud(q) => q.modify(a).is_ok(),
    };
    // A change the CM asked for is not a fatal error of the transport.
    s.last_state = s.qp.state();
    if !dirty.contains(&qpn) {
        dirty.push(qpn);
    }
    ok
}
