//! The runtime of an open device (what `ibv_open_device` sets up under the verbs): the engine
//! and the lock around it, the sockets, the memory table, the async event queue, and the wake
//! planning between the application's threads and the progress thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::engine::{Engine, Round};
use super::socket::Io;
use crate::endpoint::error::EndpointError;
use crate::endpoint::events::AsyncQueue;
use crate::endpoint::memory::{guards_held, MrTable};

/// The runtime of one open device: its sockets, its engine (under a lock taken by whichever
/// thread drives it: a busy-polling application or the progress thread), its memory table and
/// async events, and the bookkeeping that keeps the progress thread out of a busy application's
/// way and wakes it when a timer comes due earlier than it planned.
pub(crate) struct Runtime {
    pub mrs: MrTable,
    pub engine: Mutex<Engine>,
    pub io: Arc<Io>,
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
    /// The last round held acknowledgements back for the application's answer (see
    /// `TxBatch::hold_acks`): whoever drives next sends them; the progress thread does if the
    /// application stops calling in.
    acks_held: AtomicBool,
    /// QPs dropped while the engine was busy (see `QueuePair`'s drop).
    deferred_removals: Mutex<Vec<u32>>,
}

impl Runtime {
    /// The runtime of the device whose sockets are `io`, driven by `engine`; its progress
    /// thread is started by [`Runtime::start`].
    pub(crate) fn new(io: Arc<Io>, engine: Engine) -> Runtime {
        Runtime {
            mrs: MrTable::default(),
            engine: Mutex::new(engine),
            io,
            last_app_poll: AtomicU64::new(0),
            progress_yielding: AtomicBool::new(false),
            planned_wake: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            async_events: Arc::new(AsyncQueue::default()),
            acks_held: AtomicBool::new(false),
            deferred_removals: Mutex::new(Vec::new()),
        }
    }

    /// Start the progress thread of `rt` (it ends when the runtime is dropped).
    pub(crate) fn start(rt: &Arc<Runtime>) -> std::io::Result<()> {
        super::progress::spawn(Arc::downgrade(rt), rt.io.clone())
    }

    pub(crate) fn lock_engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine, for a verb called by the application. A thread that holds a memory-region
    /// guard gets [`VerbsError::Busy`] instead: the engine's holder may be waiting for that
    /// very region (a deadlock otherwise).
    pub(crate) fn lock_engine_for_verb(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Engine>, EndpointError> {
        if guards_held() {
            return Err(EndpointError::Busy(
                "this thread holds a MemoryRegion::lock guard; drop it before calling this verb",
            ));
        }
        Ok(self.lock_engine())
    }

    /// Drive the transport once, now, on this thread (unless it holds a memory-region guard:
    /// then the progress thread does it).
    pub(crate) fn drive(&self, round: Round) {
        if guards_held() {
            self.io.wake();
            return;
        }
        let mut e = self.lock_engine();
        self.run(&mut e, Instant::now(), round);
    }

    /// Drive once, reading the sockets in `ready` (just found readable), unless another thread
    /// holds the engine; false if it did not drive.
    pub(crate) fn try_drive_ready(&self, ready: u32) -> bool {
        let Some(mut e) = self.try_lock_engine() else {
            return false;
        };
        self.run(&mut e, Instant::now(), Round::Ready(ready));
        true
    }

    /// Drive once unless another thread is driving already (the busy-poll path).
    pub(crate) fn try_drive(&self) {
        if guards_held() {
            // This thread may not drive (see `MrGuard`); nor may it keep the progress thread
            // standing aside.
            return;
        }
        // One clock read for the note and the round (see `Runtime::note_app`).
        let now = Instant::now();
        self.last_app_poll
            .store(self.micros(now), Ordering::Relaxed);
        let Some(mut e) = self.try_lock_engine() else {
            return;
        };
        self.remove_deferred(&mut e);
        self.run(&mut e, now, Round::App);
    }

    /// One round of the engine, then wake the progress thread if a timer now comes earlier.
    fn run(&self, e: &mut Engine, now: Instant, round: Round) {
        e.drive(&self.io, &self.mrs, &self.async_events, now, round);
        self.acks_held.store(e.holding(), Ordering::Relaxed);
        // Only a progress thread asleep on a timer can need waking (`planned_wake` is written
        // under the engine lock, which this thread holds): while it stands aside for a polling
        // application, the deadline (a walk over every QP and the CM) is not needed.
        if self.planned_wake.load(Ordering::Relaxed) != u64::MAX {
            self.kick_if_earlier(e.next_deadline());
        }
    }

    fn try_lock_engine(&self) -> Option<std::sync::MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(e) => Some(e),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Disconnect the rdma_cm connections of dead contexts of the address in their name.
    pub(crate) fn disconnect_orphans(&self, recs: &[super::share::ConnRecord]) {
        let mut e = self.lock_engine();
        e.disconnect_orphans(&self.io, recs, Instant::now());
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
            e.remove_qp(qpn, &self.io);
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

impl Runtime {
    /// An application thread is at work with the device at `now` (it polled a CQ or posted):
    /// the progress thread stands aside (see `driver::progress`). The caller passes the time it
    /// read anyway: a clock read is a system call where the clock source is no TSC (qemu's
    /// guests read an HPET), and a busy poll must not make two.
    pub(crate) fn note_app(&self, now: Instant) {
        if guards_held() {
            // This thread may not drive (see `MrGuard`): the progress thread must not stand
            // aside for it.
            return;
        }
        self.last_app_poll
            .store(self.micros(now), Ordering::Relaxed);
    }

    /// True while an application thread has busy-polled within `window`.
    pub(crate) fn app_polling(&self, window: Duration) -> bool {
        let last = self.last_app_poll.load(Ordering::SeqCst);
        last != 0 && self.micros(Instant::now()).saturating_sub(last) < window.as_micros() as u64
    }

    /// The application is about to sleep (it armed a CQ or blocks on a channel): the progress
    /// thread must not stand aside any longer. (SeqCst pairs with [`Runtime::set_yielding`]: one
    /// of the two sides sees the other's store.)
    pub(crate) fn app_blocking(&self) {
        self.last_app_poll.store(0, Ordering::SeqCst);
        if self.progress_yielding.load(Ordering::SeqCst) {
            self.io.wake();
        }
        if self.acks_held() {
            // No answer is coming from this thread for a while: the ACKs go now.
            self.drive(Round::Ready(0));
        }
    }

    /// Acknowledgements may be held for the application's answer (see `TxBatch::hold_acks`).
    pub(crate) fn acks_held(&self) -> bool {
        self.acks_held.load(Ordering::Relaxed)
    }

    /// The progress thread stands aside (`true`) or resumes (`false`).
    pub(crate) fn set_yielding(&self, on: bool) {
        self.progress_yielding.store(on, Ordering::SeqCst);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // What the application's last polls acknowledged goes out before the sockets close.
        self.lock_engine().flush_held(&self.io);
        self.io.shutdown();
    }
}
