//! REQs that arrive before anybody listens for their Service ID.
//!
//! Linux answers such a REQ at once with REJ reason 8 (invalid Service ID). But a server and
//! its client often start together after an out-of-band sync (perftest's `-R` mode syncs over
//! one rdma_cm connection, then the server creates, binds and listens on a second id while the
//! client connects to it), and softrdma's active side resolves and connects in microseconds,
//! where the kernel's takes a few workqueue hops: the REQ could beat the server's
//! `rdma_listen`. And on an address shared by several processes, a REQ for a port nobody
//! listens on yet reaches whichever process the kernel's hash picks, not the one about to
//! listen.
//!
//! The same wait holds on the active side, for a peer that rejects at once (Linux): a REJ
//! "invalid Service ID" within the wait sends the REQ again [`UNCLAIMED_REQ_RESEND`] later,
//! then after as long as the attempt has lasted (7 REQs in 250 ms, within what a peer's REJ
//! rate limit allows), and only a REJ after the wait ends the attempt (REJECTED). Either way a client sees REJECTED for
//! a port nobody listens on after the wait, whatever the server's stack.
//!
//! So a REQ that finds no listener waits here, for at most [`CmManager::set_unclaimed_wait`]:
//! a listener for its Service ID that appears meanwhile gets it (as if it had just arrived),
//! the driver may hand it to the process that listens now ([`CmManager::forward_unclaimed`]),
//! and when the wait is over it gets the REJ reason 8 it would have got at once. Only a few
//! wait at a time ([`MAX_UNCLAIMED`]); beyond that a REQ is rejected at once, so a flood of
//! REQs to closed ports costs no memory. A repeated REQ (same comm ID and CA) is not counted
//! twice.

use super::*;

/// REQs waiting for a listener at once, at most.
pub const MAX_UNCLAIMED: usize = 32;

/// How soon the active side sends its REQ again after its first REJ "invalid Service ID".
pub const UNCLAIMED_REQ_RESEND: Duration = Duration::from_millis(10);

/// How often the driver may look for another process that listens for a waiting REQ.
pub const UNCLAIMED_RECHECK: Duration = Duration::from_millis(2);

pub(super) struct Unclaimed {
    src: MadAddr,
    mad: [u8; MAD_LEN],
    service_id: u64,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    reject_at: Instant,
    /// When the driver may next look for a listener elsewhere.
    check_at: Instant,
    /// False for a REQ another process handed over: it is never handed on again.
    forwardable: bool,
}

impl CmManager {
    /// How long a REQ for a Service ID nobody listens on waits for a listener before it is
    /// rejected (zero, the default: rejected at once, as Linux does).
    pub fn set_unclaimed_wait(&mut self, wait: Duration) {
        self.unclaimed_wait = wait;
    }

    /// Keep a REQ nobody listens for. False: reject it now.
    pub(super) fn park_unclaimed(
        &mut self,
        now: Instant,
        src: MadAddr,
        r: &ConnectRequest,
        raw: &[u8],
    ) -> bool {
        if self.unclaimed_wait.is_zero() {
            return false;
        }
        if self
            .unclaimed
            .iter()
            .any(|u| u.remote_comm_id == r.local_comm_id && u.remote_ca_guid == r.local_ca_guid)
        {
            // A retransmission of one already waiting.
            return true;
        }
        let Ok(mad) = <[u8; MAD_LEN]>::try_from(raw) else {
            return false;
        };
        if self.unclaimed.len() >= MAX_UNCLAIMED {
            return false;
        }
        self.unclaimed.push(Unclaimed {
            src,
            mad,
            service_id: r.service_id,
            remote_comm_id: r.local_comm_id,
            remote_ca_guid: r.local_ca_guid,
            reject_at: now + self.unclaimed_wait,
            check_at: now,
            forwardable: !self.handling_forwarded,
        });
        true
    }

    /// REQs waiting for a listener.
    pub fn unclaimed_len(&self) -> usize {
        self.unclaimed.len()
    }

    /// When [`CmManager::handle_timeout`] has unclaimed REQs to deliver or reject: at once for
    /// one whose Service ID is listened on now.
    pub(super) fn unclaimed_timeout(&self) -> Option<Instant> {
        self.unclaimed
            .iter()
            .map(|u| {
                if self.listeners.contains_key(&u.service_id) {
                    u.check_at.min(u.reject_at)
                } else {
                    u.reject_at
                }
            })
            .min()
    }

    /// Deliver the REQs whose Service ID is listened on now; reject those that waited long
    /// enough.
    pub(super) fn unclaimed_handle_timeout(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.unclaimed.len() {
            let u = &self.unclaimed[i];
            if self.listeners.contains_key(&u.service_id) {
                let u = self.unclaimed.swap_remove(i);
                self.handle_mad(now, u.src, &u.mad);
            } else if u.reject_at <= now {
                let u = self.unclaimed.swap_remove(i);
                self.stats.unclaimed_rejected += 1;
                self.reject_unclaimed(now, &u);
            } else {
                i += 1;
            }
        }
    }

    fn reject_unclaimed(&mut self, now: Instant, u: &Unclaimed) {
        // As `cm_issue_rej` does: the REJ's comm IDs are the REQ's first two words swapped.
        let word1 = u32::from_be_bytes([u.mad[28], u.mad[29], u.mad[30], u.mad[31]]);
        let tid = u64::from_be_bytes(u.mad[8..16].try_into().expect("8 bytes"));
        self.issue_rej(
            now,
            u.src,
            tid,
            u.remote_comm_id,
            word1,
            RejReason::InvalidServiceId,
            rejected::REQ,
        );
    }

    /// Hand over waiting REQs: `target` is asked, at most every [`UNCLAIMED_RECHECK`], for
    /// each REQ that arrived from the network (not one handed over itself) whether someone
    /// else listens for its Service ID now; those it names leave this manager and are returned
    /// with where they go, their source and the MAD, for the driver to pass on.
    pub fn forward_unclaimed<T>(
        &mut self,
        now: Instant,
        mut target: impl FnMut(u64, &MadAddr) -> Option<T>,
    ) -> Vec<(T, MadAddr, [u8; MAD_LEN])> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.unclaimed.len() {
            let u = &mut self.unclaimed[i];
            if !u.forwardable || u.check_at > now {
                i += 1;
                continue;
            }
            u.check_at = now + UNCLAIMED_RECHECK;
            match target(u.service_id, &u.src) {
                Some(t) => {
                    let u = self.unclaimed.swap_remove(i);
                    self.stats.unclaimed_forwarded += 1;
                    out.push((t, u.src, u.mad));
                }
                None => i += 1,
            }
        }
        out
    }

    /// The earliest time [`CmManager::forward_unclaimed`] has a REQ to ask about.
    pub fn unclaimed_check_at(&self) -> Option<Instant> {
        self.unclaimed
            .iter()
            .filter(|u| u.forwardable)
            .map(|u| u.check_at)
            .min()
    }

    /// A CM MAD another process on this address received and handed over (see
    /// [`CmManager::forward_unclaimed`]): handled as if it had arrived here, except that a REQ
    /// nobody listens for is not handed on again.
    pub fn handle_forwarded_mad(&mut self, now: Instant, src: MadAddr, mad: &[u8]) {
        self.handling_forwarded = true;
        self.handle_mad(now, src, mad);
        self.handling_forwarded = false;
    }
}
