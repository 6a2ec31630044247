//! The RC QP's timers, quinn-proto style: a small fixed table indexed by an enum. The QP
//! reports the earliest deadline through `poll_timeout`; the driver calls `handle_timeout`.

use std::time::Instant;

/// One kind of timer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Timer {
    /// Local ACK timeout (IBA 9.7.6.1.3): no response for the oldest outstanding request.
    Retransmit = 0,
    /// RNR NAK wait (IBA 9.7.5.2.8): resume sending when it expires.
    Rnr = 1,
    /// Tail-loss probe: no response for a few round trips, well before the local ACK timeout.
    Probe = 2,
}

/// Deadlines of all timers; `None` means stopped.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimerTable {
    data: [Option<Instant>; 3],
}

impl TimerTable {
    pub(crate) fn set(&mut self, t: Timer, at: Instant) {
        self.data[t as usize] = Some(at);
    }
    pub(crate) fn stop(&mut self, t: Timer) {
        self.data[t as usize] = None;
    }
    pub(crate) fn stop_all(&mut self) {
        self.data = [None; 3];
    }
    pub(crate) fn is_armed(&self, t: Timer) -> bool {
        self.data[t as usize].is_some()
    }
    /// The earliest deadline of any running timer.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.data.iter().flatten().min().copied()
    }
    /// Stop and return `t` if it is due at `now`.
    pub(crate) fn take_expired(&mut self, t: Timer, now: Instant) -> bool {
        match self.data[t as usize] {
            Some(at) if at <= now => {
                self.data[t as usize] = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_deadline_and_expiry() {
        let base = Instant::now();
        let mut t = TimerTable::default();
        assert_eq!(t.next_timeout(), None);
        t.set(Timer::Retransmit, base + Duration::from_millis(5));
        t.set(Timer::Rnr, base + Duration::from_millis(2));
        assert_eq!(t.next_timeout(), Some(base + Duration::from_millis(2)));
        assert!(!t.take_expired(Timer::Rnr, base + Duration::from_millis(1)));
        assert!(t.take_expired(Timer::Rnr, base + Duration::from_millis(2)));
        assert!(!t.is_armed(Timer::Rnr));
        assert_eq!(t.next_timeout(), Some(base + Duration::from_millis(5)));
        t.stop_all();
        assert_eq!(t.next_timeout(), None);
    }
}
