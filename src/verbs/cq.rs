//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_ack_cq_events`).

use std::sync::Arc;

use super::context::Shared;
use super::error::{Result, VerbsError};
pub(crate) use crate::endpoint::cq::CqShared;
use crate::transport::Completion;

/// A work completion (`struct ibv_wc`).
pub type WorkCompletion = Completion;

/// A completion queue. Cloning gives another handle to the same CQ.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqShared>,
    pub(crate) shared: Arc<Shared>,
}

impl CompletionQueue {
    /// `ibv_poll_cq`: move up to `out.len()` completions into `out`; returns how many.
    ///
    /// An empty CQ drives the transport on the caller's thread first (receive, timers, transmit),
    /// so an application that busy-polls needs no thread hop on its latency path.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// let cq = ctx.create_cq(16, None)?;
    /// let mut wcs = [WorkCompletion::default(); 8];
    /// assert_eq!(cq.poll(&mut wcs)?, 0, "nothing yet");
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::CqOverrun`] once the CQ overran.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let n = self.inner.pop_into(out)?;
        if n > 0 || out.is_empty() {
            self.shared.note_app(std::time::Instant::now());
            return Ok(n);
        }
        self.shared.try_drive();
        Ok(self.inner.pop_into(out)?)
    }

    /// Poll one completion.
    ///
    /// # Errors
    /// [`VerbsError::CqOverrun`] once the CQ overran.
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut c = [Completion::default()];
        Ok((self.poll(&mut c)? == 1).then_some(c[0]))
    }

    /// Wait up to `timeout` for a completion: poll, driving the transport on this thread for
    /// the first millisecond and then every 100 µs. A completion channel of the CQ is left
    /// alone (its events, and whether its fd blocks, stay the application's): an application
    /// that wants to sleep on the channel arms the CQ and reads the channel itself.
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # use std::time::Duration;
    /// # let ctx = devices()?.last().unwrap().open()?;
    /// let cq = ctx.create_cq(16, None)?;
    /// assert!(matches!(cq.wait(Duration::from_millis(5)), Err(VerbsError::Timeout(_))));
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::Timeout`] if none came; what [`CompletionQueue::poll`] returns. A
    /// completion with an error status is returned as it is: [`WorkCompletion::ok`] makes it
    /// an error.
    pub fn wait(&self, timeout: std::time::Duration) -> Result<Completion> {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(c) = self.poll_one()? {
                return Ok(c);
            }
            let elapsed = t0.elapsed();
            if elapsed >= timeout {
                return Err(VerbsError::Timeout(timeout));
            }
            if elapsed < std::time::Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// The completions waiting now, polled in batches (drives the transport once when empty,
    /// as [`CompletionQueue::poll`] does). An error of the CQ (an overrun) ends the iteration.
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.pop().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64, None)?;
    /// let (a, b) = (pd.create_rc_qp(&cq)?, pd.create_rc_qp(&cq)?);
    /// a.connect(&b.endpoint(), &ConnectOptions::default())?;
    /// b.connect(&a.endpoint(), &ConnectOptions::default())?;
    /// let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// for i in 0..4 {
    ///     a.write(mr.slice(..8)?, mr.remote(8..16)?).id(i).post()?;
    /// }
    /// let mut done = 0;
    /// while done < 4 {
    ///     done += cq.drain().filter(|wc| wc.status == WcStatus::Success).count();
    /// }
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn drain(&self) -> Drain<'_> {
        Drain {
            cq: self,
            buf: [Completion::default(); DRAIN_BATCH],
            at: 0,
            n: 0,
        }
    }

    /// `ibv_req_notify_cq`: arm the CQ's channel for the next completion (or the next solicited
    /// or error one). One-shot, as in verbs.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if the CQ has no completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(VerbsError::InvalidArgument("CQ has no completion channel"));
        }
        // Arming means the application means to sleep: its progress thread takes over now.
        self.shared.app_blocking();
        self.inner.arm(solicited_only);
        Ok(())
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.inner.ack_events(n);
    }

    /// Capacity (`cq->cqe`).
    pub fn capacity(&self) -> usize {
        self.inner.cap()
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// No completion waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ibv_destroy_cq`: fails with [`VerbsError::Busy`] (EBUSY), handing the CQ back, while a
    /// QP uses it or channel events are unacknowledged. Other handles to a destroyed CQ can
    /// still poll what it holds, but no QP can be created on it.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (with the CQ back) while a QP uses it or channel events are unacknowledged.
    pub fn destroy(self) -> std::result::Result<(), (VerbsError, CompletionQueue)> {
        match self.inner.destroy() {
            Ok(()) => Ok(()),
            Err(e) => Err((e.into(), self)),
        }
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.inner.is_destroyed()
    }

    /// True once the CQ overran (then [`CompletionQueue::poll`] fails with `CqOverrun`).
    pub fn is_overrun(&self) -> bool {
        self.inner.is_overrun()
    }

    /// Identity of the CQ (stable across clones).
    pub fn id(&self) -> u32 {
        self.inner.id
    }
}

const DRAIN_BATCH: usize = 16;

/// The iterator of [`CompletionQueue::drain`].
pub struct Drain<'a> {
    cq: &'a CompletionQueue,
    buf: [Completion; DRAIN_BATCH],
    at: usize,
    n: usize,
}

impl Iterator for Drain<'_> {
    type Item = Completion;
    fn next(&mut self) -> Option<Completion> {
        if self.at == self.n {
            self.n = self.cq.poll(&mut self.buf).ok()?;
            self.at = 0;
            if self.n == 0 {
                return None;
            }
        }
        self.at += 1;
        Some(self.buf[self.at - 1])
    }
}

impl PartialEq for CompletionQueue {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CompletionQueue({}, cap {})",
            self.inner.id,
            self.inner.cap()
        )
    }
}
