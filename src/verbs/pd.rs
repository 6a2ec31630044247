//! Protection domains (`ibv_alloc_pd`): what MRs and QPs belong to.

use std::sync::Arc;

use super::context::Shared;
use super::error::Result;
use super::mr::MemoryRegion;
use super::qp::{QpInitAttr, QueuePair};
use crate::transport::AccessFlags;

pub struct ProtectionDomain {
    pub(crate) id: u32,
    pub(crate) shared: Arc<Shared>,
}

impl ProtectionDomain {
    /// Allocate `len` zeroed bytes and register them (`ibv_reg_mr` over fresh memory).
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        self.register(vec![0u8; len], access)
    }

    /// Register a buffer, taking ownership of it, so it stays alive while reachable.
    pub fn register(&self, buf: Vec<u8>, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::register(&self.shared, self.id, buf.into_boxed_slice(), access)
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, attr)
    }
}
