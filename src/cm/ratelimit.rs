//! A rate limit on the answers a [`super::manager::CmManager`] sends without holding state: the
//! REJ to a REQ nobody listens for, the SIDR_REP "unsupported" / "reject", the DREP to an unknown
//! DREQ, and the resends triggered by duplicates (MRA, REP, RTU, DREP, lingering SIDR_REP). Any
//! local process can send CM MADs with a forged source address; without a limit each one makes
//! us send a MAD of the same size to that address, so we would serve as a reflector.
//!
//! Two token buckets must both have a token for an answer to go out: one per destination GID
//! (at most [`REFUSAL_DESTS_MAX`] of them are tracked; destinations beyond that share one
//! bucket), and one for the whole endpoint. The model is Linux's ICMP error limit
//! (`icmp_ratelimit`, `icmp_msgs_per_sec`/`icmp_msgs_burst`): a peer that retries a REQ a few
//! times a second still gets every REJ, a flood gets [`REFUSAL_BURST_PER_DEST`] answers and
//! then [`REFUSAL_RATE_PER_DEST`] per second. Answers over the limit are not sent and are
//! counted ([`super::manager::CmStats`]); the peer's own retransmission covers a legitimate
//! loss.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Answers one destination may receive back to back.
pub const REFUSAL_BURST_PER_DEST: u32 = 10;
/// Answers per second one destination may receive once its burst is used.
pub const REFUSAL_RATE_PER_DEST: u32 = 10;
/// Answers the whole endpoint may send back to back.
pub const REFUSAL_BURST_GLOBAL: u32 = 100;
/// Answers per second the whole endpoint may send once its burst is used.
pub const REFUSAL_RATE_GLOBAL: u32 = 100;
/// Destinations with a bucket of their own; the map never grows beyond this.
pub const REFUSAL_DESTS_MAX: usize = 256;

/// How often a full map is swept for buckets that refilled (and so carry no information).
const PRUNE_EVERY: Duration = Duration::from_millis(100);

/// Tokens in thousandths, refilled from the time since `last`.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli: u64,
    last: Instant,
}

impl Bucket {
    fn full(now: Instant, burst: u32) -> Self {
        Bucket {
            milli: burst as u64 * 1000,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: u32, burst: u32) {
        let us = now.saturating_duration_since(self.last).as_micros();
        // rate tokens/s = rate milli-tokens/ms = rate/1000 milli-tokens/µs.
        let add = (us.saturating_mul(rate as u128) / 1000).min(u64::MAX as u128) as u64;
        if add > 0 {
            // Only move `last` when something was added, so sub-token intervals accumulate.
            self.milli = self.milli.saturating_add(add).min(burst as u64 * 1000);
            self.last = now;
        }
    }

    fn is_full(&self, burst: u32) -> bool {
        self.milli >= burst as u64 * 1000
    }

    fn take(&mut self, now: Instant, rate: u32, burst: u32) -> bool {
        self.refill(now, rate, burst);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// Per-destination and global token buckets (see the module docs).
#[derive(Debug)]
pub(super) struct RefusalLimiter {
    per_dest: HashMap<[u8; 16], Bucket>,
    /// Shared by destinations that found the map full.
    overflow: Option<Bucket>,
    global: Option<Bucket>,
    last_prune: Option<Instant>,
}

impl RefusalLimiter {
    pub(super) fn new() -> Self {
        RefusalLimiter {
            per_dest: HashMap::new(),
            overflow: None,
            global: None,
            last_prune: None,
        }
    }

    /// Number of destinations with a bucket of their own (≤ [`REFUSAL_DESTS_MAX`]).
    pub(super) fn tracked(&self) -> usize {
        self.per_dest.len()
    }

    /// May an answer go to `dest` at `now`? Takes a token from both buckets if so.
    pub(super) fn allow(&mut self, now: Instant, dest: &[u8; 16]) -> bool {
        let (rate, burst) = (REFUSAL_RATE_PER_DEST, REFUSAL_BURST_PER_DEST);
        if !self.per_dest.contains_key(dest) && self.per_dest.len() >= REFUSAL_DESTS_MAX {
            let due = self.last_prune.map_or(true, |t| now >= t + PRUNE_EVERY);
            if due {
                self.last_prune = Some(now);
                self.per_dest.retain(|_, b| {
                    b.refill(now, rate, burst);
                    !b.is_full(burst)
                });
            }
        }
        // Check the global bucket first without spending, so a refused answer costs the
        // destination nothing.
        let g = self
            .global
            .get_or_insert_with(|| Bucket::full(now, REFUSAL_BURST_GLOBAL));
        g.refill(now, REFUSAL_RATE_GLOBAL, REFUSAL_BURST_GLOBAL);
        if g.milli < 1000 {
            return false;
        }
        let b = if let Some(b) = self.per_dest.get_mut(dest) {
            b
        } else if self.per_dest.len() < REFUSAL_DESTS_MAX {
            self.per_dest
                .entry(*dest)
                .or_insert(Bucket::full(now, burst))
        } else {
            self.overflow
                .get_or_insert_with(|| Bucket::full(now, burst))
        };
        if !b.take(now, rate, burst) {
            return false;
        }
        let g = self.global.as_mut().expect("set above");
        g.milli -= 1000;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut l = RefusalLimiter::new();
        let a = [1u8; 16];
        let n = (0..1000).filter(|_| l.allow(t0, &a)).count();
        assert_eq!(n, REFUSAL_BURST_PER_DEST as usize);
        // One second later: `rate` more, in steps of 1 ms.
        let mut n = 0;
        for ms in 1..=1000u64 {
            if l.allow(t0 + Duration::from_millis(ms), &a) {
                n += 1;
            }
        }
        assert_eq!(n, REFUSAL_RATE_PER_DEST as usize);
    }

    #[test]
    fn global_limit_and_bounded_map() {
        let t0 = Instant::now();
        let mut l = RefusalLimiter::new();
        let mut n = 0;
        for i in 0..10_000u32 {
            let mut g = [0u8; 16];
            g[..4].copy_from_slice(&i.to_be_bytes());
            if l.allow(t0, &g) {
                n += 1;
            }
        }
        assert_eq!(n, REFUSAL_BURST_GLOBAL as usize);
        assert!(l.tracked() <= REFUSAL_DESTS_MAX);
        // Much later the full buckets are pruned and new destinations get their own.
        let t1 = t0 + Duration::from_secs(60);
        for i in 20_000..30_000u32 {
            let mut g = [0u8; 16];
            g[..4].copy_from_slice(&i.to_be_bytes());
            l.allow(t1, &g);
        }
        assert!(l.tracked() <= REFUSAL_DESTS_MAX);
    }
}
