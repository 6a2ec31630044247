//! Limits the device advertises (`max_pd`, `max_cq`) enforced: each live object holds a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::error::EndpointError;

/// Live objects of one kind against the device's advertised maximum.
pub(crate) struct Quota {
    live: AtomicUsize,
    max: usize,
    /// Said in the error when the quota is used up.
    what: &'static str,
}

impl Quota {
    pub fn new(max: usize, what: &'static str) -> Arc<Quota> {
        Arc::new(Quota {
            live: AtomicUsize::new(0),
            max,
            what,
        })
    }

    /// A slot, or `NoResources` (ENOMEM, as rdma-core's providers answer) when all are taken.
    pub fn take(self: &Arc<Self>) -> Result<QuotaSlot, EndpointError> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map_err(|_| EndpointError::NoResources(self.what))?;
        Ok(QuotaSlot(self.clone()))
    }
}

/// One live object's share of a [`Quota`], given back on drop.
pub(crate) struct QuotaSlot(Arc<Quota>);

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}
