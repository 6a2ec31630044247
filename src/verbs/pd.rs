//! Protection domains (`ibv_alloc_pd`): what MRs and QPs belong to.

use std::sync::Arc;

use super::ah::{AddressHandle, AhAttr};
use super::context::Shared;
use super::error::{Result, VerbsError};

/// Alignment of regions from [`ProtectionDomain::alloc_mr`] (a cache line).
const MR_ALIGN: usize = 64;
use super::mr::MemoryRegion;
use super::qp::{QpInitAttr, QueuePair};
use super::srq::{SharedReceiveQueue, SrqInitAttr};
use crate::endpoint::quota::QuotaSlot;
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
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let pd = devices()?.pop().unwrap().open()?.alloc_pd()?;
    /// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// assert_eq!((mr.len(), mr.addr() % 64), (4096, 0));
    /// // Remote write needs local write too, as on a NIC.
    /// assert!(pd.alloc_mr(64, AccessFlags::REMOTE_WRITE).is_err());
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] above `max_mr_size`, or for `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE`; [`VerbsError::NoResources`] beyond `max_mr`.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        if len > super::device::MAX_MSG as usize {
            return Err(VerbsError::InvalidArgument("length above max_mr_size"));
        }
        let buf = vec![0u8; len + MR_ALIGN - 1].into_boxed_slice();
        let start = buf.as_ptr().align_offset(MR_ALIGN).min(MR_ALIGN - 1);
        MemoryRegion::register(&self.shared, self.id, buf, start, len, access)
    }

    /// Register a buffer (`Vec<u8>`, `Box<[u8]>`), taking ownership of it, so it stays alive
    /// while a work request or a remote key can reach it. Its address is the region's `addr()`;
    /// [`MemoryRegion::into_inner`] gives it back.
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`].
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: AccessFlags) -> Result<MemoryRegion> {
        let buf = buf.into();
        let len = buf.len();
        if len as u64 > super::device::MAX_MSG {
            return Err(VerbsError::InvalidArgument("length above max_mr_size"));
        }
        MemoryRegion::register(&self.shared, self.id, buf, 0, len, access)
    }

    /// `ibv_reg_mr`: register `len` bytes of memory the caller owns, at `addr` (which is also
    /// the region's virtual address). [`register_raw_iova`](Self::register_raw_iova) with
    /// `iova = addr`; see it for the checks and the contract.
    ///
    /// # Errors
    /// As [`register_raw_iova`](Self::register_raw_iova).
    ///
    /// # Safety
    /// [`register_raw_iova`](Self::register_raw_iova)'s contract.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        // SAFETY: the contract is this function's, passed on unchanged.
        unsafe { self.register_raw_iova(addr, len, addr as u64, access) }
    }

    /// Register `buf`, which the caller keeps, for the time of `f`: `f` gets the region
    /// (post work requests with it, hand its [`remote`](MemoryRegion::remote) slices to peers)
    /// and the region is deregistered when `f` returns or unwinds, so nothing touches `buf`
    /// after this returns. Safe: the borrow keeps `buf` alive and out of reach meanwhile.
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let ctx = devices()?.last().unwrap().open()?;
    /// # let pd = ctx.alloc_pd()?;
    /// let mut buf = vec![0u8; 4096];
    /// let lkey = pd.register_borrowed(&mut buf, AccessFlags::LOCAL_WRITE, |mr| {
    ///     mr.write(0, b"hello")?;
    ///     Ok(mr.lkey())
    /// })?;
    /// assert_eq!(&buf[..5], b"hello");
    /// # let _ = lkey;
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// As [`register_raw_iova`](Self::register_raw_iova), or what `f` returns.
    pub fn register_borrowed<R>(
        &self,
        buf: &mut [u8],
        access: AccessFlags,
        f: impl FnOnce(&MemoryRegion) -> Result<R>,
    ) -> Result<R> {
        // SAFETY: `buf` is borrowed mutably for this whole call, so it stays valid and nothing
        // else reaches it; the region is dropped (deregistered, copies waited for) before the
        // borrow ends, on return or unwind, and `f` only gets a reference (it cannot keep or
        // leak the region).
        let mr = unsafe { self.register_raw(buf.as_mut_ptr(), buf.len(), access) }?;
        let r = f(&mr);
        drop(mr);
        r
    }

    /// `ibv_reg_mr_iova2`: register `len` bytes of memory the caller owns, at `addr`, as a region
    /// whose virtual address is `iova` (what SGEs, RDMA READ/WRITE remote addresses and atomics
    /// name, and what [`MemoryRegion::addr`] returns; bounds are checked against it).
    /// `ibv_reg_mr` is `iova = addr as u64`.
    ///
    /// The checks are [`register`](Self::register)'s (access flags, `max_mr_size`, `max_mr`),
    /// plus the kernel's for user memory: `addr` + `len` and `iova` + `len` must not overflow,
    /// `iova` must have `addr`'s offset within a page (else `InvalidArgument`, as
    /// `ib_uverbs_reg_mr` refuses it with `EINVAL`), and `addr` must not be null unless `len` is
    /// 0. A zero-length region is allowed, as rdma_rxe allows it.
    ///
    /// Atomics on the region are 64-bit atomic instructions on the caller's memory, atomic with
    /// respect to atomics from any QP and to the application's own atomic operations on the word.
    ///
    /// # Safety
    /// Until the returned [`MemoryRegion`] is dropped or deregistered:
    /// - `[addr, addr + len)` stays valid: mapped, not freed, not unmapped, and writable if
    ///   `access` contains `LOCAL_WRITE` (every remote write or atomic access requires it);
    ///   without `LOCAL_WRITE` it is only ever read.
    /// - The transport may read and write that memory at any time, from any thread (the progress
    ///   thread, or an application thread that polls or posts), concurrently with the
    ///   application, as a NIC's DMA would: a peer's RDMA WRITE or atomic, a received message,
    ///   an RDMA READ response, or a gather for a send. The application must treat it as memory
    ///   shared with a device: hold no Rust references (`&`/`&mut`) into it across a time the
    ///   transport may write it, and order its own accesses after the transport's by
    ///   completions (or use atomics on words peers update with atomics); bytes the application
    ///   reads while a peer writes them are unspecified.
    ///
    /// Dropping or deregistering the region removes its key and then returns only once no copy
    /// into or out of the memory is in flight; from then on nothing touches it, and the memory
    /// may be freed or unmapped.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for the checks above, or as [`ProtectionDomain::alloc_mr`].
    pub unsafe fn register_raw_iova(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        // SAFETY: the contract is this function's, passed on unchanged.
        unsafe { MemoryRegion::register_raw(&self.shared, self.id, addr, len, iova, access) }
    }

    /// Identity of the PD within its context.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `ibv_create_qp`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for capacities above the device's, a CQ or SRQ of another context or PD, or no queue at all; [`VerbsError::NoResources`] beyond `max_qp`.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, attr)
    }

    /// `ibv_create_srq`: a shared receive queue for the QPs of this PD. EINVAL for `max_wr` 0
    /// or above `max_srq_wr`, `max_sge` above `max_srq_sge`, `srq_limit` above `max_wr`;
    /// ENOMEM beyond `max_srq`. [`SharedReceiveQueue::query`] reports what was granted.
    ///
    /// # Errors
    /// See above (`EINVAL`, `ENOMEM`).
    pub fn create_srq(&self, attr: SrqInitAttr) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::create(self, attr)
    }

    /// `ibv_create_ah`: an address handle for the UD QPs of this PD.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a GID index out of the table or a destination the device has no address family for.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        AddressHandle::create(self, attr)
    }

    /// `ibv_create_ah_from_wc`: an AH that answers the sender of a received UD message.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a completion without a GRH (not a UD receive).
    pub fn create_ah_from_wc(
        &self,
        port_num: u8,
        wc: &crate::transport::Completion,
    ) -> Result<AddressHandle> {
        AddressHandle::from_completion(self, port_num, wc)
    }
}
