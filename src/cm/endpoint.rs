//! The IB CM endpoint of one device's GSI QP1 (the kernel's `cm.c` per device): the CM state
//! machines ([`CmManager`]), the local address each peer's MADs come to, and the GSI packets to
//! send. Sans-IO: fed GSI packets (and MADs other processes hand over) and time, it returns
//! packets to send.
//!
//! What uses the connections — rdma_cm's core (`rdma_cm::core`) — is a [`GsiAgent`] that owns
//! the endpoint. The engine holds the agent without knowing rdma_cm: until a process uses
//! rdma_cm, the agent is the bare endpoint, which still answers the wire (it holds REQs that
//! nobody listens for yet, rejects them after the wait, answers DREQs for unknown ids, ...).

use std::any::Any;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::mad::MAD_LEN;
use super::manager::{CmConfig, CmManager, MadAddr};
use super::service_id;
use crate::transport::QpAttr;
use crate::wire::gid::gid_from_ipv4;
use crate::wire::Packet;

/// A QP state change the CM asks the engine to make: `(qpn, attributes)`; false if it failed.
pub(crate) type ModifyQp<'a> = &'a mut dyn FnMut(u32, &QpAttr) -> bool;

/// How long a REQ for a port nobody listens on waits for a listener before REJ reason 8
/// (`cm/manager/unclaimed.rs`): long enough for a server that syncs with its client out of band
/// and then listens (perftest `-R`) on a loaded machine, short enough that connecting to a
/// closed port still fails promptly.
pub const UNCLAIMED_REQ_WAIT: Duration = Duration::from_millis(250);

/// Peers whose local address is remembered (see [`CmEndpoint::local_toward`]) before the table
/// is started again.
const MAX_ROUTES: usize = 4096;

/// A GSI packet to send: to the host with GID `to`, from the local GID `from` if known.
pub(crate) struct GsiOut {
    pub to: [u8; 16],
    pub from: Option<[u8; 16]>,
    pub packet: Vec<u8>,
}

pub(crate) struct CmEndpoint {
    pub cm: CmManager,
    /// The endpoint's IPv4 address (`0.0.0.0`: none).
    pub local: Ipv4Addr,
    /// The local GID each peer GID talks to (the address its MADs come to, or that this side
    /// connects from): MADs to the peer go out from there.
    routes: HashMap<[u8; 16], [u8; 16]>,
    /// PSN of the next GSI packet.
    psn: u32,
}

pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::getrandom(&mut b);
    u64::from_ne_bytes(b)
}

impl CmEndpoint {
    /// The endpoint of the device on `local`, whose CM IDs start with `slot` (the device's
    /// slot on its shared address: the kernel steers CM replies to it by that byte).
    pub fn new(local: Ipv4Addr, node_guid: u64, slot: u8) -> Self {
        let r = random_u64();
        let mut cm = CmManager::new(CmConfig {
            local_gid: gid_from_ipv4(local),
            local_ca_guid: node_guid,
            hi_tid: (r >> 32) as u32 | 1,
            seed: random_u64(),
        });
        cm.set_id_prefix(slot);
        // A REQ may beat the server's rdma_listen by microseconds (see cm/manager/unclaimed.rs).
        cm.set_unclaimed_wait(UNCLAIMED_REQ_WAIT);
        CmEndpoint {
            cm,
            local,
            routes: HashMap::new(),
            psn: r as u32 & 0x00ff_ffff,
        }
    }

    /// A packet to QP1 from the host with GID `src`, to the local address with GID `local`.
    pub fn on_gsi_packet(
        &mut self,
        now: Instant,
        src: [u8; 16],
        local: [u8; 16],
        pkt: &Packet<'_>,
    ) {
        if self.cm.handle_gsi_packet(now, src, pkt) {
            self.set_route(src, local);
        }
    }

    /// A CM MAD that another process on the address `local` received from `src` and handed
    /// over, because this process listens for it (see `driver::forward`).
    pub fn on_forwarded_mad(&mut self, now: Instant, src: MadAddr, local: [u8; 16], mad: &[u8]) {
        self.cm.handle_forwarded_mad(now, src, mad);
        self.set_route(src.gid, local);
    }

    /// Hand over REQs nobody here listens for: `target(port, local GID the REQ came to, src)`
    /// names another process that listens on that rdma_cm port now.
    pub fn forward_unclaimed<T>(
        &mut self,
        now: Instant,
        mut target: impl FnMut(u16, Option<[u8; 16]>, &MadAddr) -> Option<T>,
    ) -> Vec<(T, MadAddr, [u8; MAD_LEN])> {
        let routes = &self.routes;
        self.cm.forward_unclaimed(now, |sid, src| {
            let port = service_id::split(sid)?.1;
            target(port, routes.get(&src.gid).copied(), src)
        })
    }

    /// Send MADs to `peer` from `local`.
    pub fn set_route(&mut self, peer: [u8; 16], local: [u8; 16]) {
        if self.routes.len() >= MAX_ROUTES && !self.routes.contains_key(&peer) {
            // Only a preference (MADs to an unknown peer go out from the device's first
            // address of its family): start again rather than grow without bound.
            self.routes.clear();
        }
        self.routes.insert(peer, local);
    }

    /// The local GID MADs to `peer` go out from, if known.
    pub fn local_toward(&self, peer: &[u8; 16]) -> Option<[u8; 16]> {
        self.routes.get(peer).copied()
    }

    /// The CM's next timer (retransmissions, timewait, ...).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    /// The next MAD to send as a GSI packet (BTH to ICRC, ICRC to fill).
    pub fn poll_transmit(&mut self) -> Option<GsiOut> {
        let (dest, mad) = self.cm.poll_transmit()?;
        let psn = self.psn;
        self.psn = (self.psn + 1) & 0x00ff_ffff;
        Some(GsiOut {
            to: dest.gid,
            from: self.local_toward(&dest.gid),
            packet: super::manager::gsi_packet(&dest, &mad, psn),
        })
    }
}

/// The user of a device's CM endpoint, held by the engine (rdma_cm's core, or the bare
/// endpoint before anything uses rdma_cm). Runs under the engine lock, so the QP transitions
/// it asks for and the CM state move together.
pub(crate) trait GsiAgent: Send {
    fn endpoint(&self) -> &CmEndpoint;
    fn endpoint_mut(&mut self) -> &mut CmEndpoint;
    /// Take the CM's events (moving QPs through `modify` as they say).
    fn process(&mut self, now: Instant, modify: ModifyQp<'_>);
    /// Work is waiting even though no packet or timer came (e.g. an id was destroyed).
    fn work_pending(&self) -> bool;
    /// Give the endpoint back, to be owned by another agent.
    fn into_endpoint(self: Box<Self>) -> CmEndpoint;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The bare endpoint: nothing here uses its connections (no rdma_cm). Its events are dropped;
/// the CM itself still answers the wire as the IBA says.
impl GsiAgent for CmEndpoint {
    fn endpoint(&self) -> &CmEndpoint {
        self
    }
    fn endpoint_mut(&mut self) -> &mut CmEndpoint {
        self
    }
    fn process(&mut self, _now: Instant, _modify: ModifyQp<'_>) {
        while self.cm.poll_event().is_some() {}
    }
    fn work_pending(&self) -> bool {
        false
    }
    fn into_endpoint(self: Box<Self>) -> CmEndpoint {
        *self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The slot of the context a CM MAD is for, as the steering program reads it (see
/// `driver::steer`): the top byte of the SIDR_REP's request ID, of the remote comm ID of
/// every other message but REQ and SIDR_REQ (which go by their Service ID: `None`).
pub(crate) fn mad_owner(mad: &[u8]) -> Option<u8> {
    const ATTR_REQ: u16 = 0x0010;
    const ATTR_SIDR_REQ: u16 = 0x0017;
    const ATTR_SIDR_REP: u16 = 0x0018;
    let attr = u16::from_be_bytes([*mad.get(16)?, *mad.get(17)?]);
    match attr {
        ATTR_REQ | ATTR_SIDR_REQ => None,
        ATTR_SIDR_REP => mad.get(24).copied(),
        _ => mad.get(28).copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mad_owner_reads_what_the_steering_reads() {
        let mut mad = [0u8; MAD_LEN];
        mad[16..18].copy_from_slice(&0x0013u16.to_be_bytes()); // REP
        mad[28] = 7;
        assert_eq!(mad_owner(&mad), Some(7));
        mad[16..18].copy_from_slice(&0x0018u16.to_be_bytes()); // SIDR_REP
        mad[24] = 9;
        assert_eq!(mad_owner(&mad), Some(9));
        mad[16..18].copy_from_slice(&0x0010u16.to_be_bytes()); // REQ
        assert_eq!(mad_owner(&mad), None);
        assert_eq!(mad_owner(&mad[..10]), None);
    }
}
