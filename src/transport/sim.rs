//! Test support: [`VecMemory`], a [`MemoryAccess`] over in-process vectors with keys, access
//! rights and bounds checks; and a deterministic two-QP link simulator ([`Sim`]) with seeded
//! loss, duplication and reordering, driven by a fake clock, for RC QPs ([`Sim::new`]) and UC
//! QPs ([`Sim::new_uc`]). No threads, no wall clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::memory::{MemError, MemoryAccess};
use super::rc::RcQp;
use super::types::*;
use super::uc::UcQp;
use crate::wire::Packet;

// ---------------------------------------------------------------------------------------------
// Memory

#[derive(Debug)]
struct Region {
    key: u32,
    addr: u64,
    access: AccessFlags,
    data: Vec<u8>,
}

/// A registered region, as `ibv_reg_mr` returns it (lkey and rkey are equal, as in rxe).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemRegion {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub rkey: u32,
}

impl MemRegion {
    /// An SGE covering `len` bytes at offset `off` of the region.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }
}

#[derive(Debug, Default)]
struct MemInner {
    regions: Vec<Option<Region>>,
    next_addr: u64,
    next_key: u32,
}

/// The memory of one protection domain, backed by vectors. Every access checks the key, the
/// region's access rights and the bounds; atomics check 8-byte alignment.
#[derive(Debug)]
pub struct VecMemory {
    inner: Mutex<MemInner>,
}

impl Default for VecMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl VecMemory {
    pub fn new() -> Self {
        VecMemory {
            inner: Mutex::new(MemInner {
                regions: Vec::new(),
                next_addr: 0x1000_0000,
                next_key: 0,
            }),
        }
    }

    /// Register `len` zeroed bytes at a fresh, page-aligned address.
    pub fn register(&self, len: usize, access: AccessFlags) -> MemRegion {
        let (addr, key) = {
            let mut g = self.inner.lock().unwrap();
            let addr = g.next_addr;
            g.next_addr = (addr + len as u64 + 0x2000) & !0xfff;
            g.next_key += 1;
            (addr, (g.next_key << 8) | 0x5a)
        };
        self.register_at(addr, len, key, access)
    }

    /// Register `len` zeroed bytes at a given address under a given key (to mirror another
    /// host's memory layout, e.g. when replaying a capture). Replaces a region with that key.
    pub fn register_at(&self, addr: u64, len: usize, key: u32, access: AccessFlags) -> MemRegion {
        let mut g = self.inner.lock().unwrap();
        g.regions
            .retain(|r| r.as_ref().is_some_and(|r| r.key != key));
        g.regions.push(Some(Region {
            key,
            addr,
            access,
            data: vec![0; len],
        }));
        MemRegion {
            addr,
            len: len as u64,
            lkey: key,
            rkey: key,
        }
    }

    /// Remove a region; its key becomes invalid.
    pub fn deregister(&self, key: u32) {
        let mut g = self.inner.lock().unwrap();
        if let Some(slot) = g
            .regions
            .iter_mut()
            .find(|r| r.as_ref().is_some_and(|r| r.key == key))
        {
            *slot = None;
        }
    }

    /// Test helper: the bytes at `addr` (panics if not inside one region).
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let g = self.inner.lock().unwrap();
        let r = g
            .regions
            .iter()
            .flatten()
            .find(|r| addr >= r.addr && addr + len as u64 <= r.addr + r.data.len() as u64)
            .expect("address not registered");
        let o = (addr - r.addr) as usize;
        r.data[o..o + len].to_vec()
    }

    /// Test helper: store bytes at `addr` without any access check.
    pub fn write(&self, addr: u64, src: &[u8]) {
        let mut g = self.inner.lock().unwrap();
        let r = g
            .regions
            .iter_mut()
            .flatten()
            .find(|r| addr >= r.addr && addr + src.len() as u64 <= r.addr + r.data.len() as u64)
            .expect("address not registered");
        let o = (addr - r.addr) as usize;
        r.data[o..o + src.len()].copy_from_slice(src);
    }

    fn with<T>(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, MemError> {
        let mut g = self.inner.lock().unwrap();
        let r = g
            .regions
            .iter_mut()
            .flatten()
            .find(|r| r.key == key)
            .ok_or(MemError::InvalidKey)?;
        if !r.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.data.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        let o = (addr - r.addr) as usize;
        Ok(f(&mut r.data[o..o + len as usize]))
    }
}

impl MemoryAccess for VecMemory {
    fn local_read(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.with(lkey, addr, dst.len() as u64, AccessFlags::NONE, |m| {
            dst.copy_from_slice(m)
        })
    }
    fn local_write(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        self.with(
            lkey,
            addr,
            src.len() as u64,
            AccessFlags::LOCAL_WRITE,
            |m| m.copy_from_slice(src),
        )
    }
    fn remote_check(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError> {
        self.with(rkey, addr, len, access, |_| ())
    }
    fn remote_read(&self, rkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.with(
            rkey,
            addr,
            dst.len() as u64,
            AccessFlags::REMOTE_READ,
            |m| dst.copy_from_slice(m),
        )
    }
    fn remote_write(&self, rkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        self.with(
            rkey,
            addr,
            src.len() as u64,
            AccessFlags::REMOTE_WRITE,
            |m| m.copy_from_slice(src),
        )
    }
    fn remote_atomic(&self, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if addr % 8 != 0 {
            // Key and rights first, as a real HCA checks them before alignment.
            self.with(rkey, addr, 8, AccessFlags::REMOTE_ATOMIC, |_| ())?;
            return Err(MemError::Misaligned);
        }
        self.with(rkey, addr, 8, AccessFlags::REMOTE_ATOMIC, |m| {
            let mut b = [0u8; 8];
            b.copy_from_slice(m);
            let orig = u64::from_ne_bytes(b);
            m.copy_from_slice(&op.apply(orig).to_ne_bytes());
            orig
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness

/// xorshift64*: a tiny deterministic PRNG for simulations.
#[derive(Clone, Debug)]
pub struct XorShift64(u64);

impl XorShift64 {
    pub fn new(seed: u64) -> Self {
        // Avoid the all-zero state; mix the seed a little (splitmix64 step).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        XorShift64((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `p` (0.0..=1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Link

/// Impairments of the simulated link (applied independently to each packet, both ways).
#[derive(Clone, Copy, Debug)]
pub struct LinkConfig {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub dup: f64,
    /// Probability a packet gets an extra random delay (up to `reorder_delay`), reordering it.
    pub reorder: f64,
    /// One-way delay.
    pub delay: Duration,
    pub reorder_delay: Duration,
    /// Bandwidth of each direction in bytes per second (`None`: infinite). Packets leave one
    /// after another: a packet's arrival is its departure from the end of the queue of that
    /// direction, after [`LinkConfig::overhead`] + its length at this rate, plus `delay`.
    pub rate: Option<u64>,
    /// Bytes each packet costs on the wire besides its RoCE bytes (Ethernet, IPv4 and UDP
    /// headers, FCS, preamble and gap: 14 + 20 + 8 + 4 + 20).
    pub overhead: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            delay: Duration::from_micros(5),
            reorder_delay: Duration::from_micros(50),
            rate: None,
            overhead: 66,
        }
    }
}

impl LinkConfig {
    /// A link that drops, duplicates and reorders.
    pub fn lossy(loss: f64, dup: f64, reorder: f64) -> Self {
        LinkConfig {
            loss,
            dup,
            reorder,
            ..Self::default()
        }
    }

    /// A link of `rate` bytes per second each way and `delay` one way, dropping `loss` of the
    /// packets each way (no duplication, no reordering): a modelled Ethernet path under netem.
    pub fn path(rate: u64, delay: Duration, loss: f64) -> Self {
        LinkConfig {
            loss,
            delay,
            rate: Some(rate),
            ..Self::default()
        }
    }
}

/// Decides, per packet, whether to drop it: `(destination side, packet bytes) -> drop?`.
pub type DropFilter = Box<dyn FnMut(usize, &[u8]) -> bool>;

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    data: Vec<u8>,
}

/// Link statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkStats {
    pub sent: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delivered: u64,
}

/// A two-ended packet pipe with seeded impairments.
pub struct Link {
    pub cfg: LinkConfig,
    pub rng: XorShift64,
    queue: Vec<InFlight>,
    seq: u64,
    pub stats: LinkStats,
    /// Drop every packet heading to side `i` (the peer is gone).
    pub blackhole: [bool; 2],
    /// Extra per-packet drop decision for targeted tests.
    pub filter: Option<DropFilter>,
    /// When each direction (toward side `i`) has finished sending what it was given.
    busy_until: [Option<Instant>; 2],
}

impl Link {
    pub fn new(seed: u64, cfg: LinkConfig) -> Self {
        Link {
            cfg,
            rng: XorShift64::new(seed),
            queue: Vec::new(),
            seq: 0,
            stats: LinkStats::default(),
            blackhole: [false; 2],
            filter: None,
            busy_until: [None; 2],
        }
    }

    fn enqueue(&mut self, now: Instant, to: usize, data: &[u8]) {
        let mut at = now;
        if let Some(rate) = self.cfg.rate {
            let start = self.busy_until[to].map_or(now, |b| b.max(now));
            let bytes = (data.len() as u64 + self.cfg.overhead as u64) as u128;
            let done = start + Duration::from_nanos((bytes * 1_000_000_000 / rate as u128) as u64);
            self.busy_until[to] = Some(done);
            at = done;
        }
        at += self.cfg.delay;
        if self.rng.chance(self.cfg.reorder) {
            let extra = self
                .rng
                .below(self.cfg.reorder_delay.as_nanos().max(1) as u64);
            at += Duration::from_nanos(extra);
        }
        self.seq += 1;
        self.queue.push(InFlight {
            at,
            seq: self.seq,
            to,
            data: data.to_vec(),
        });
    }

    /// Hand a packet to the link, toward side `to`.
    pub fn send(&mut self, now: Instant, to: usize, data: &[u8]) {
        self.stats.sent += 1;
        if self.blackhole[to]
            || self.filter.as_mut().is_some_and(|f| f(to, data))
            || self.rng.chance(self.cfg.loss)
        {
            self.stats.dropped += 1;
            return;
        }
        self.enqueue(now, to, data);
        if self.rng.chance(self.cfg.dup) {
            self.stats.duplicated += 1;
            self.enqueue(now, to, data);
        }
    }

    /// When the next packet arrives.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.iter().map(|p| p.at).min()
    }

    /// The earliest packet due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(usize, Vec<u8>)> {
        let i = self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, p)| p.at <= now)
            .min_by_key(|(_, p)| (p.at, p.seq))
            .map(|(i, _)| i)?;
        let p = self.queue.swap_remove(i);
        self.stats.delivered += 1;
        Some((p.to, p.data))
    }

    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

// ---------------------------------------------------------------------------------------------
// Two QPs over a link

/// What [`Sim`] needs of a connected QP: the sans-IO calls of [`RcQp`] and [`UcQp`].
pub trait SimQp {
    fn transmit(&mut self, now: Instant, mem: &VecMemory, buf: &mut [u8]) -> Option<usize>;
    fn receive(&mut self, now: Instant, pkt: &Packet<'_>, mem: &VecMemory);
    fn completion(&mut self) -> Option<Completion>;
    fn timeout(&self) -> Option<Instant>;
    fn fire(&mut self, now: Instant);
}

impl SimQp for RcQp {
    fn transmit(&mut self, now: Instant, mem: &VecMemory, buf: &mut [u8]) -> Option<usize> {
        self.poll_transmit(now, mem, buf)
    }
    fn receive(&mut self, now: Instant, pkt: &Packet<'_>, mem: &VecMemory) {
        self.handle_packet(now, pkt, mem)
    }
    fn completion(&mut self) -> Option<Completion> {
        self.poll_completion()
    }
    fn timeout(&self) -> Option<Instant> {
        self.poll_timeout()
    }
    fn fire(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
}

/// UC has no timers.
impl SimQp for UcQp {
    fn transmit(&mut self, _now: Instant, mem: &VecMemory, buf: &mut [u8]) -> Option<usize> {
        self.poll_transmit(mem, buf)
    }
    fn receive(&mut self, _now: Instant, pkt: &Packet<'_>, mem: &VecMemory) {
        self.handle_packet(pkt, mem)
    }
    fn completion(&mut self) -> Option<Completion> {
        self.poll_completion()
    }
    fn timeout(&self) -> Option<Instant> {
        None
    }
    fn fire(&mut self, _now: Instant) {}
}

/// One side: its QP, its memory, and the completions polled so far.
pub struct Endpoint<Q = RcQp> {
    pub qp: Q,
    pub mem: VecMemory,
    pub completions: Vec<Completion>,
}

impl<Q> Endpoint<Q> {
    /// Completions of one side taken out.
    pub fn take(&mut self, side: CqSide) -> Vec<Completion> {
        let (a, b): (Vec<_>, Vec<_>) = self.completions.drain(..).partition(|c| c.side == side);
        self.completions = b;
        a
    }
}

/// Connection parameters for [`Sim::connect`].
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    pub mtu: Mtu,
    pub access: AccessFlags,
    pub psn: [u32; 2],
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            mtu: Mtu::Mtu1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn: [0x100, 0x200],
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// Two QPs (side 0 and side 1) joined by a [`Link`], with a fake clock: RC QPs by default
/// ([`Sim::new`], [`Sim::connect`]), UC QPs with [`Sim::new_uc`] and [`Sim::connect_uc`].
pub struct Sim<Q = RcQp> {
    pub base: Instant,
    pub now: Instant,
    pub ends: [Endpoint<Q>; 2],
    pub link: Link,
    buf: Vec<u8>,
    /// Steps taken by [`Sim::step`].
    pub steps: u64,
}

/// The QP numbers of side 0 and side 1 ([`Sim::QPN`], for UC QPs too).
const SIM_QPN: [u32; 2] = [0x11, 0x22];

impl<Q> Sim<Q> {
    /// Two QPs made by `mk` from their QP numbers ([`Sim::QPN`]), in RESET.
    pub fn with_qps(seed: u64, cfg: LinkConfig, mk: impl Fn(u32) -> Q) -> Self {
        let base = Instant::now();
        let end = |qpn| Endpoint {
            qp: mk(qpn),
            mem: VecMemory::new(),
            completions: Vec::new(),
        };
        Sim {
            base,
            now: base,
            ends: [end(SIM_QPN[0]), end(SIM_QPN[1])],
            link: Link::new(seed, cfg),
            buf: vec![0; 4096 + 128],
            steps: 0,
        }
    }
}

impl Sim<UcQp> {
    /// Two UC QPs in RESET.
    pub fn new_uc(seed: u64, cfg: LinkConfig, caps: QpCaps) -> Self {
        Self::with_qps(seed, cfg, |qpn| UcQp::new(qpn, caps, false))
    }

    /// Bring both UC QPs RESET -> INIT -> RTR -> RTS, connected to each other (`o.mtu`,
    /// `o.access`, `o.psn`; the RC-only fields are not used).
    pub fn connect_uc(&mut self, o: ConnectOpts) {
        for i in 0..2 {
            let qp = &mut self.ends[i].qp;
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qp_access_flags: Some(o.access),
                ..Default::default()
            })
            .expect("RESET->INIT");
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ah_attr: Some(AddressVector {
                    port_num: 1,
                    ..Default::default()
                }),
                path_mtu: Some(o.mtu),
                dest_qp_num: Some(SIM_QPN[1 - i]),
                rq_psn: Some(o.psn[1 - i]),
                ..Default::default()
            })
            .expect("INIT->RTR");
            qp.modify(&QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(o.psn[i]),
                ..Default::default()
            })
            .expect("RTR->RTS");
        }
    }
}

impl Sim<RcQp> {
    /// The QP numbers of side 0 and side 1 (the same for a UC simulation).
    pub const QPN: [u32; 2] = SIM_QPN;

    /// Two RC QPs in RESET.
    pub fn new(seed: u64, cfg: LinkConfig, caps: QpCaps) -> Self {
        Self::with_qps(seed, cfg, |qpn| RcQp::new(qpn, caps, false))
    }

    /// Bring both QPs RESET -> INIT -> RTR -> RTS, connected to each other.
    pub fn connect(&mut self, o: ConnectOpts) {
        for i in 0..2 {
            let now = self.now;
            let qp = &mut self.ends[i].qp;
            qp.modify(
                &QpAttr {
                    qp_state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port_num: Some(1),
                    qp_access_flags: Some(o.access),
                    ..Default::default()
                },
                now,
            )
            .expect("RESET->INIT");
            qp.modify(
                &QpAttr {
                    qp_state: Some(QpState::Rtr),
                    ah_attr: Some(AddressVector {
                        port_num: 1,
                        ..Default::default()
                    }),
                    path_mtu: Some(o.mtu),
                    dest_qp_num: Some(Self::QPN[1 - i]),
                    rq_psn: Some(o.psn[1 - i]),
                    max_dest_rd_atomic: Some(o.max_dest_rd_atomic),
                    min_rnr_timer: Some(o.min_rnr_timer),
                    ..Default::default()
                },
                now,
            )
            .expect("INIT->RTR");
            qp.modify(
                &QpAttr {
                    qp_state: Some(QpState::Rts),
                    sq_psn: Some(o.psn[i]),
                    timeout: Some(o.timeout),
                    retry_cnt: Some(o.retry_cnt),
                    rnr_retry: Some(o.rnr_retry),
                    max_rd_atomic: Some(o.max_rd_atomic),
                    ..Default::default()
                },
                now,
            )
            .expect("RTR->RTS");
        }
    }
}

impl<Q: SimQp> Sim<Q> {
    /// One step: transmit what both QPs have, deliver what is due; if nothing happened, move
    /// the clock to the next event and fire due timers. Returns false when fully idle.
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        let mut busy = false;
        for i in 0..2 {
            let e = &mut self.ends[i];
            let mut guard = 0;
            while let Some(n) = e.qp.transmit(self.now, &e.mem, &mut self.buf) {
                self.link.send(self.now, 1 - i, &self.buf[..n]);
                busy = true;
                guard += 1;
                if guard > 100_000 {
                    panic!("poll_transmit never stops");
                }
            }
            while let Some(c) = e.qp.completion() {
                e.completions.push(c);
            }
        }
        while let Some((to, data)) = self.link.pop_due(self.now) {
            busy = true;
            if let Ok(pkt) = Packet::parse(&data) {
                let e = &mut self.ends[to];
                e.qp.receive(self.now, &pkt, &e.mem);
            }
        }
        for e in &mut self.ends {
            while let Some(c) = e.qp.completion() {
                e.completions.push(c);
            }
        }
        if busy {
            return true;
        }
        let next = [
            self.link.next_delivery(),
            self.ends[0].qp.timeout(),
            self.ends[1].qp.timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { return false };
        if next > self.now {
            self.now = next;
        }
        for e in &mut self.ends {
            if e.qp.timeout().is_some_and(|t| t <= self.now) {
                e.qp.fire(self.now);
            }
        }
        true
    }

    /// Step until `done` holds; false if `max_steps` pass first (a livelock) or all goes idle
    /// without `done`.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Step until nothing is in flight and no timer runs; false on livelock.
    pub fn run_idle(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Time simulated so far.
    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }
}

/// A signaled send WQE over `sg_list`.
pub fn send_wr(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> SendWqe {
    SendWqe {
        wr_id,
        op,
        flags: SendFlags::SIGNALED,
        sg_list: sg_list.into(),
        inline_data: Vec::new(),
    }
}

/// A receive WQE over `sg_list`.
pub fn recv_wr(wr_id: u64, sg_list: Vec<Sge>) -> RecvWqe {
    RecvWqe {
        wr_id,
        sg_list: sg_list.into(),
    }
}

/// `n` bytes of a recognizable pattern.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut r = XorShift64::new(seed);
    let mut v = vec![0; n];
    r.fill(&mut v);
    v
}

// ---------------------------------------------------------------------------------------------
// A stream of WRITEs, as perftest's ib_write_bw runs it

/// What [`write_stream`] measured.
#[derive(Clone, Debug)]
pub struct StreamReport {
    /// WRITEs completed (all successfully, in order, or the run panics).
    pub messages: u64,
    /// Simulated time from the first post to the last completion.
    pub elapsed: Duration,
    /// Simulated time during which nothing was on the link and a QP timer was awaited.
    pub idle: Duration,
    /// The sender's and the receiver's counters.
    pub sender: crate::transport::RcStats,
    pub receiver: crate::transport::RcStats,
    pub link: LinkStats,
    /// The sender's QP state at the end.
    pub state: QpState,
}

impl StreamReport {
    /// Payload bytes per simulated second, in MB/s (10^6).
    pub fn mbps(&self, msg_len: usize) -> f64 {
        self.messages as f64 * msg_len as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// Parameters of [`write_stream`].
#[derive(Clone, Copy, Debug)]
pub struct StreamOpts {
    pub msg_len: usize,
    pub messages: u64,
    /// WRITEs outstanding (perftest's `--tx-depth`, 128 by default).
    pub depth: u32,
    pub mtu: Mtu,
    /// Local ACK timeout exponent (perftest: 14, 67 ms) and retry count (7).
    pub timeout: u8,
    pub retry_cnt: u8,
    /// Each WRITE goes to its own slot of the receiver's memory with its own data, and all
    /// of it is compared at the end (costs memory: `messages * msg_len` on each side).
    pub verify: bool,
    /// The requester sends each packet of a WRITE as a message of its own
    /// ([`RcQp::set_split_writes`], what a device that batches with UDP GSO does).
    pub split_writes: bool,
}

impl Default for StreamOpts {
    fn default() -> Self {
        StreamOpts {
            msg_len: 64 << 10,
            messages: 500,
            depth: 128,
            mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            verify: false,
            split_writes: false,
        }
    }
}

/// Side 0 WRITEs `o.messages` messages of `o.msg_len` bytes to side 1, keeping `o.depth`
/// outstanding, over a link configured by `cfg` (seeded by `seed`), until the last completes
/// or `max_steps` pass. Panics if a completion fails or comes out of order, or (with
/// `o.verify`) if the receiver's memory is not exactly what was written.
pub fn write_stream(seed: u64, cfg: LinkConfig, o: StreamOpts, max_steps: u64) -> StreamReport {
    let caps = QpCaps {
        max_send_wr: o.depth.max(1),
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut s = Sim::with_qps(seed, cfg, |qpn| {
        let mut qp = RcQp::new(qpn, caps, false);
        qp.set_split_writes(o.split_writes);
        qp
    });
    s.connect(ConnectOpts {
        mtu: o.mtu,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        ..Default::default()
    });
    let slots = if o.verify { o.messages as usize } else { 1 };
    let all = AccessFlags::all();
    let src = s.ends[0].mem.register(slots * o.msg_len, all);
    let dst = s.ends[1].mem.register(slots * o.msg_len, all);
    if o.verify {
        for i in 0..slots {
            let d = pattern(seed ^ (i as u64) << 20, o.msg_len);
            s.ends[0].mem.write(src.addr + (i * o.msg_len) as u64, &d);
        }
    }
    let wr = |i: u64| {
        let off = if o.verify { i * o.msg_len as u64 } else { 0 };
        send_wr(
            i,
            SendOp::RdmaWrite {
                remote_addr: dst.addr + off,
                rkey: dst.rkey,
            },
            vec![src.sge(off, o.msg_len as u32)],
        )
    };
    let mut posted = 0u64;
    let mut done = 0u64;
    while posted < o.messages && posted < o.depth as u64 {
        s.ends[0].qp.post_send(wr(posted)).expect("post");
        posted += 1;
    }
    let mut idle = Duration::ZERO;
    let mut end = s.now;
    for _ in 0..max_steps {
        if done == o.messages {
            break;
        }
        let before = s.now;
        let empty = s.link.in_flight() == 0;
        let more = s.step();
        if s.now > before && empty {
            idle += s.now - before;
        }
        for c in s.ends[0].completions.drain(..) {
            assert_eq!(c.status, WcStatus::Success, "seed {seed}: {c:?}");
            assert_eq!(c.wr_id, done, "seed {seed}: completion order");
            done += 1;
            end = s.now;
        }
        while posted < o.messages && posted - done < o.depth as u64 {
            s.ends[0].qp.post_send(wr(posted)).expect("post");
            posted += 1;
        }
        if !more && done < o.messages {
            break;
        }
    }
    if o.verify && done == o.messages {
        for i in 0..slots {
            let d = pattern(seed ^ (i as u64) << 20, o.msg_len);
            let got = s.ends[1]
                .mem
                .read(dst.addr + (i * o.msg_len) as u64, o.msg_len);
            assert!(got == d, "seed {seed}: WRITE {i} did not land intact");
        }
    }
    StreamReport {
        messages: done,
        elapsed: end - s.base,
        idle,
        sender: s.ends[0].qp.stats(),
        receiver: s.ends[1].qp.stats(),
        link: s.link.stats,
        state: s.ends[0].qp.state(),
    }
}
