//! Memory regions. A region either owns its memory ([`ProtectionDomain::alloc_mr`],
//! [`ProtectionDomain::register`]) or names memory its caller owns
//! ([`ProtectionDomain::register_raw`], `unsafe`: what `ibv_reg_mr` does for a C program).
//!
//! Either way the transport reaches a region only by key, through the device's memory table
//! (`driver::memory`), which also makes deregistration wait for the copies under way.
//!
//! [`ProtectionDomain::alloc_mr`]: super::ProtectionDomain::alloc_mr
//! [`ProtectionDomain::register`]: super::ProtectionDomain::register
//! [`ProtectionDomain::register_raw`]: super::ProtectionDomain::register_raw

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::{Result, VerbsError};
use crate::endpoint::memory::{guard_released, guard_taken, lock_buf, Backing, MrInner, RawBase};
use crate::transport::AccessFlags;

/// A registered memory region (`struct ibv_mr`): over a buffer it owns, or over the caller's
/// memory ([`ProtectionDomain::register_raw`](super::ProtectionDomain::register_raw)).
///
/// Dropping it (or [`MemoryRegion::deregister`]) removes its key, then waits for the copies
/// into or out of it that are under way: after that a peer's access fails with a remote access
/// error, a local work request that names it with a protection error, and nothing touches its
/// memory again.
pub struct MemoryRegion {
    inner: Arc<MrInner>,
    shared: Arc<super::context::Shared>,
}

/// The system's page size (a raw region's iova keeps its address's offset in a page).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

impl MemoryRegion {
    /// A region over `buf[start..start + len]`, which it owns.
    pub(crate) fn register(
        shared: &Arc<super::context::Shared>,
        pd: u32,
        buf: Box<[u8]>,
        start: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        // The heap block of a `Box<[u8]>` never moves, so its address names the region for its
        // whole life; it is only a number here (never dereferenced).
        let addr = buf.as_ptr() as u64 + start as u64;
        let buf = Mutex::new(buf);
        Self::new(shared, pd, access, addr, len, Backing::Owned { buf, start })
    }

    /// A region over `len` bytes at `base`, the caller's, with virtual address `iova`.
    ///
    /// # Safety
    /// [`ProtectionDomain::register_raw`](super::ProtectionDomain::register_raw)'s contract.
    pub(crate) unsafe fn register_raw(
        shared: &Arc<super::context::Shared>,
        pd: u32,
        base: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Self> {
        if len as u64 > super::device::MAX_MSG {
            return Err(VerbsError::InvalidArgument("length above max_mr_size"));
        }
        if base.is_null() && len != 0 {
            return Err(VerbsError::InvalidArgument("null address"));
        }
        if (base as usize).checked_add(len).is_none() || iova.checked_add(len as u64).is_none() {
            return Err(VerbsError::InvalidArgument("address + length overflows"));
        }
        // As ib_uverbs_reg_mr: the iova keeps the address's offset inside its page.
        let page = page_size() - 1;
        if (base as u64 & page) != (iova & page) {
            return Err(VerbsError::InvalidArgument(
                "iova and address differ in their offset within a page",
            ));
        }
        Self::new(shared, pd, access, iova, len, Backing::Raw(RawBase(base)))
    }

    fn new(
        shared: &Arc<super::context::Shared>,
        pd: u32,
        access: AccessFlags,
        addr: u64,
        len: usize,
        mem: Backing,
    ) -> Result<Self> {
        // IBA 10.6.3.1 / ibv_reg_mr(3): remote write or atomic access needs local write.
        let needs_local = AccessFlags::REMOTE_WRITE.bits() | AccessFlags::REMOTE_ATOMIC.bits();
        if access.bits() & needs_local != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        if access.bits() & !0xf != 0 {
            return Err(VerbsError::InvalidArgument("unknown access flags"));
        }
        if shared.mrs.count() >= super::device::MAX_MR {
            return Err(VerbsError::NoResources("too many memory regions"));
        }
        let inner = shared.mrs.insert(|key| MrInner {
            pd,
            key,
            access,
            addr,
            len,
            mem,
        });
        Ok(MemoryRegion {
            inner,
            shared: shared.clone(),
        })
    }

    /// Virtual address of the first byte (what goes in SGEs and is advertised to peers): the
    /// buffer's address, or the `iova` of [`register_raw`](super::ProtectionDomain::register_raw).
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// The local key: what this side's scatter/gather entries name.
    pub fn lkey(&self) -> u32 {
        self.inner.key
    }
    /// The remote key: what peers name to reach the region (see [`MemoryRegion::remote`]).
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }
    /// The access it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// The end of `[offset, offset + n)` if it lies inside the region.
    fn range_end(&self, offset: usize, n: usize) -> Result<usize> {
        offset
            .checked_add(n)
            .filter(|&e| e <= self.inner.len)
            .ok_or(VerbsError::InvalidArgument(
                "range outside the memory region",
            ))
    }

    /// Copy `dst.len()` bytes from `offset`. (On a raw region this reads the caller's memory,
    /// as the transport does: a peer's WRITE landing meanwhile gives unspecified bytes.)
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if the range is outside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range_end(offset, dst.len())?;
        self.inner.read_at(offset, dst);
        Ok(())
    }

    /// Copy `src` to `offset`. An owned region takes it whatever its access flags (they are
    /// about what work requests and peers may do); a raw region needs LOCAL_WRITE, since its
    /// memory may be read-only without it.
    ///
    ///
    /// ```
    /// # use softrdma::verbs::*;
    /// # let pd = devices()?.pop().unwrap().open()?.alloc_pd()?;
    /// let mr = pd.alloc_mr(16, AccessFlags::LOCAL_WRITE)?;
    /// mr.write(4, b"abcd")?;
    /// let mut b = [0u8; 8];
    /// mr.read(0, &mut b)?;
    /// assert_eq!(&b, b"\0\0\0\0abcd");
    /// assert!(mr.write(14, b"too long").is_err());
    /// # Ok::<(), VerbsError>(())
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if the range is outside the region, or the region is raw and lacks `LOCAL_WRITE`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range_end(offset, src.len())?;
        if matches!(self.inner.mem, Backing::Raw(_))
            && !self.inner.access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::InvalidArgument(
                "raw region without LOCAL_WRITE: its memory may be read-only",
            ));
        }
        self.inner.write_at(offset, src);
        Ok(())
    }

    /// Lock the memory for direct access: the guard derefs to the region's bytes. The transport
    /// waits while the guard lives, so keep it short, and do not call into the library (poll a
    /// CQ, post, ...) while holding it: the transport may need this very lock to progress.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] on a region from
    /// [`register_raw`](super::ProtectionDomain::register_raw): its memory is the caller's, and
    /// the transport reaches it without a lock (use [`MemoryRegion::read`],
    /// [`MemoryRegion::write`] or the caller's own pointer).
    pub fn lock(&self) -> Result<MrGuard<'_>> {
        let Backing::Owned { buf, start } = &self.inner.mem else {
            return Err(VerbsError::InvalidArgument(
                "a raw region (register_raw) has no lock: use read/write or your own pointer",
            ));
        };
        let guard = lock_buf(buf);
        let id = Arc::as_ptr(&self.inner) as usize;
        guard_taken(id);
        Ok(MrGuard {
            guard,
            range: *start..start + self.inner.len,
            id,
        })
    }

    /// Deregister the region and give its memory back: the buffer
    /// [`register`](super::ProtectionDomain::register) took (the same allocation), or a copy of
    /// an [`alloc_mr`](super::ProtectionDomain::alloc_mr) region's bytes.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] (with the region back) for a raw region: its memory is
    /// the caller's already.
    pub fn into_inner(mut self) -> std::result::Result<Vec<u8>, (VerbsError, MemoryRegion)> {
        if matches!(self.inner.mem, Backing::Raw(_)) {
            return Err((
                VerbsError::InvalidArgument("a raw region's memory is the caller's already"),
                self,
            ));
        }
        self.shared.mrs.deregister(&mut self.inner);
        // Deregistration returns once no copy holds the region: this is the only handle.
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            unreachable!("deregister waits until the region is held here alone")
        };
        let len = inner.len;
        // What is left behind owns nothing (the drop that follows deregisters nothing more).
        inner.len = 0;
        let mem = std::mem::replace(&mut inner.mem, Backing::Raw(RawBase(std::ptr::null_mut())));
        let Backing::Owned { buf, start } = mem else {
            unreachable!("checked above")
        };
        let buf = buf.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(if start == 0 && buf.len() == len {
            buf.into_vec()
        } else {
            buf[start..start + len].to_vec()
        })
    }

    /// `ibv_dereg_mr`: remove the key, then wait for the copies under way (see the type's
    /// documentation). Work requests and peers that name it afterwards fail (local protection
    /// error, remote access error).
    pub fn deregister(self) {}
}

/// Exclusive access to a memory region's bytes (see [`MemoryRegion::lock`]).
///
/// The transport takes the same lock for each copy, so while a thread holds a guard, the library
/// does not drive the transport on that thread (polling an empty CQ just returns; the progress
/// thread does the work), and verbs that need the transport engine (post, modify, query,
/// create_qp, stats) fail with [`VerbsError::Busy`] there instead of risking a deadlock.
pub struct MrGuard<'a> {
    guard: MutexGuard<'a, Box<[u8]>>,
    range: std::ops::Range<usize>,
    id: usize,
}

impl Deref for MrGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.guard[self.range.clone()]
    }
}

impl DerefMut for MrGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.guard[self.range.clone()]
    }
}

impl Drop for MrGuard<'_> {
    fn drop(&mut self) {
        guard_released(self.id);
    }
}

impl Drop for MemoryRegion {
    /// Deregister: remove the key, then wait for the copies under way
    /// (`MrTable::deregister`), so nothing touches the memory after this returns.
    fn drop(&mut self) {
        self.shared.mrs.deregister(&mut self.inner);
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("lkey", &format_args!("{:#x}", self.inner.key))
            .field("access", &self.inner.access)
            .field("raw", &matches!(self.inner.mem, Backing::Raw(_)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::transport::{AtomicOp, MemError, MemoryAccess};

    const ALL: AccessFlags = AccessFlags::all();

    /// Deregistration waits for the copies in flight: a thread copies into and out of a raw
    /// region through the table as fast as it can (as the transport does, with any key it was
    /// given); the region is dropped and its pages made inaccessible at once. A copy still
    /// running after the drop returned would kill the process (SIGSEGV).
    #[test]
    fn deregistration_waits_for_copies_in_flight() {
        const ROUNDS: usize = 200;
        let devs = crate::verbs::devices().unwrap();
        let dev = devs.iter().find(|d| d.addr().is_loopback()).unwrap();
        let ctx = dev.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let shared = ctx.shared.clone();
        // Copies far longer than a packet's, so that the drop often lands in the middle of one.
        let len = 1 << 20;
        // The key and address the copier uses (0: none yet), and its progress.
        let target = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let copies = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let copier = {
            let (target, copies, stop) = (target.clone(), copies.clone(), stop.clone());
            let pd = pd.id;
            std::thread::spawn(move || {
                let mem = shared.mrs.for_pd(pd);
                let mut buf = vec![0x5au8; 256 << 10];
                let (mut ok, mut refused) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let key = target.0.load(Ordering::Acquire) as u32;
                    let addr = target.1.load(Ordering::Acquire);
                    for (i, r) in [
                        mem.remote_write(key, addr + 1000, &buf),
                        mem.remote_read(key, addr + 300_000, &mut buf),
                        mem.local_write(key, addr + 600_000, &buf),
                        mem.remote_atomic(key, addr + 64, AtomicOp::FetchAdd { add: 1 })
                            .map(|_| ()),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        match r {
                            Ok(()) => ok += 1,
                            Err(e) => {
                                // The key is gone (or, read apart from it, the address is of
                                // another round's region).
                                assert!(
                                    matches!(
                                        e,
                                        MemError::InvalidKey
                                            | MemError::Deregistered
                                            | MemError::OutOfBounds
                                    ),
                                    "op {i}: {e}"
                                );
                                refused += 1;
                            }
                        }
                    }
                    copies.fetch_add(1, Ordering::Release);
                }
                (ok, refused)
            })
        };
        for _ in 0..ROUNDS {
            // SAFETY: a fresh anonymous mapping.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the mapping stays mapped (and accessible) until the region is dropped.
            let mr = unsafe { pd.register_raw(p.cast(), len, ALL) }.unwrap();
            target.1.store(mr.addr(), Ordering::Release);
            target.0.store(mr.rkey() as u64, Ordering::Release);
            // Let the copier reach this region (a bounded wait on its progress, not a timing).
            let seen = copies.load(Ordering::Acquire);
            let t0 = Instant::now();
            while copies.load(Ordering::Acquire) < seen + 3 {
                assert!(t0.elapsed() < Duration::from_secs(30), "copier stalled");
                std::thread::yield_now();
            }
            drop(mr);
            // SAFETY: our mapping; the region over it is gone.
            assert_eq!(unsafe { libc::mprotect(p, len, libc::PROT_NONE) }, 0);
            // SAFETY: as above.
            unsafe { libc::munmap(p, len) };
        }
        stop.store(true, Ordering::Relaxed);
        let (ok, refused) = copier.join().unwrap();
        assert!(ok > 0 && refused > 0, "{ok} {refused}");
    }
}
