//! Protection domains (`ibv_alloc_pd`): what MRs and QPs belong to.

use std::sync::Arc;

use super::ah::{AddressHandle, AhAttr};
use super::context::Shared;
use super::error::{Result, VerbsError};

/// Alignment of regions from [`ProtectionDomain::alloc_mr`] (a cache line).
const MR_ALIGN: usize = 64;
use super::mr::MemoryRegion;
use super::qp::{QpInitAttr, QueuePair};
use super::quota::QuotaSlot;
use super::srq::{SharedReceiveQueue, SrqInitAttr};
use crate::transport::AccessFlags;

/// A protection domain (`struct ibv_pd`): memory regions and QPs of one PD see each other's
/// keys; a key from another PD is invalid.
pub struct ProtectionDomain {
    /// This PD's share of `max_pd`.
    pub(crate) _slot: QuotaSlot,
    pub(crate) id: u32,
    pub(crate) shared: Arc<Shared>,
}

impl ProtectionDomain {
    /// Allocate `len` zeroed bytes, 64-byte aligned, and register them (`ibv_reg_mr` over fresh
    /// memory).
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        if len > super::device::MAX_MSG as usize {
            return Err(VerbsError::InvalidArgument("length above max_mr_size"));
        }
        let buf = vec![0u8; len + MR_ALIGN - 1].into_boxed_slice();
        let start = buf.as_ptr().align_offset(MR_ALIGN).min(MR_ALIGN - 1);
        MemoryRegion::register(&self.shared, self.id, buf, start, len, access)
    }

    /// Register a buffer (`Vec<u8>`, `Box<[u8]>`), taking ownership of it, so it stays alive
    /// while a work request or a remote key can reach it. Its address is the region's `addr()`.
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: AccessFlags) -> Result<MemoryRegion> {
        let buf = buf.into();
        let len = buf.len();
        if len as u64 > super::device::MAX_MSG {
            return Err(VerbsError::InvalidArgument("length above max_mr_size"));
        }
        MemoryRegion::register(&self.shared, self.id, buf, 0, len, access)
    }

    /// Identity of the PD within its context.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, attr)
    }

    /// `ibv_create_srq`: a shared receive queue for the QPs of this PD. EINVAL for `max_wr` 0
    /// or above `max_srq_wr`, `max_sge` above `max_srq_sge`, `srq_limit` above `max_wr`;
    /// ENOMEM beyond `max_srq`. [`SharedReceiveQueue::query`] reports what was granted.
    pub fn create_srq(&self, attr: SrqInitAttr) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::create(self, attr)
    }

    /// `ibv_create_ah`: an address handle for the UD QPs of this PD.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        AddressHandle::create(self, attr)
    }

    /// `ibv_create_ah_from_wc`: an AH that answers the sender of a received UD message.
    pub fn create_ah_from_wc(
        &self,
        port_num: u8,
        wc: &crate::transport::Completion,
    ) -> Result<AddressHandle> {
        AddressHandle::from_completion(self, port_num, wc)
    }
}
