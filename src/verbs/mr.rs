//! Memory regions. A region either owns its memory ([`ProtectionDomain::alloc_mr`],
//! [`ProtectionDomain::register`]) or names memory its caller owns
//! ([`ProtectionDomain::register_raw`], `unsafe`: what `ibv_reg_mr` does for a C program).
//!
//! Either way the transport reaches a region only by key, through the table, holding the region
//! (an `Arc`) for the length of one copy. That `Arc` is the in-flight mark: deregistration removes
//! the key first, so no new copy can start, then waits until the `MemoryRegion`'s own `Arc` is
//! the last one, so no copy is still running. After it returns, nothing touches the memory again.
//!
//! [`ProtectionDomain::alloc_mr`]: super::ProtectionDomain::alloc_mr
//! [`ProtectionDomain::register`]: super::ProtectionDomain::register
//! [`ProtectionDomain::register_raw`]: super::ProtectionDomain::register_raw

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use super::error::{Result, VerbsError};
use crate::transport::{AccessFlags, AtomicOp, MemError, MemoryAccess};

pub(crate) struct MrInner {
    pd: u32,
    key: u32,
    access: AccessFlags,
    /// The region's virtual address: what SGEs, remote addresses and atomics name. For an owned
    /// region the address of its buffer (as with `ibv_reg_mr`); for a raw one the `iova` it was
    /// registered with (as with `ibv_reg_mr_iova2`).
    addr: u64,
    len: usize,
    mem: Backing,
}

/// Where a region's bytes are.
enum Backing {
    /// The region is `buf[start..start + len]` (`start` aligns freshly allocated regions). The
    /// transport and the application ([`MrGuard`]) take the same lock.
    Owned { buf: Mutex<Box<[u8]>>, start: usize },
    /// `len` bytes at this address, owned by whoever called `register_raw`. No lock: the
    /// transport copies with raw pointers, as a NIC's DMA would.
    Raw(RawBase),
}

/// The first byte of a raw region's memory.
struct RawBase(*mut u8);

// SAFETY: the pointer is only dereferenced by `MrInner`'s copies, inside the region, before its
// `MemoryRegion`'s drop returns (the drop waits for them); `register_raw`'s contract makes that
// memory valid for those accesses from any thread (the transport runs on the progress thread and
// on application threads).
unsafe impl Send for RawBase {}
// SAFETY: as for `Send`: shared access only ever copies through the pointer under that contract.
unsafe impl Sync for RawBase {}

thread_local! {
    /// Regions whose [`MrGuard`] this thread holds (by `MrInner` address).
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// True if this thread holds an application guard ([`MemoryRegion::lock`]) on any region: it
/// must not drive the transport, which could need that very lock (a self-deadlock).
pub(crate) fn guards_held() -> bool {
    HELD.with(|h| !h.borrow().is_empty())
}

fn lock_buf(buf: &Mutex<Box<[u8]>>) -> MutexGuard<'_, Box<[u8]>> {
    buf.lock().unwrap_or_else(|e| e.into_inner())
}

impl MrInner {
    /// Offset of `[addr, addr + len)` inside the region, if it lies inside.
    fn offset(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.checked_sub(self.addr).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok(off as usize)
    }

    /// Copy `dst.len()` bytes from region offset `off` (`off + dst.len() <= len`, checked by the
    /// caller).
    fn read_at(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.len);
        match &self.mem {
            Backing::Owned { buf, start } => {
                let at = start + off;
                dst.copy_from_slice(&lock_buf(buf)[at..at + dst.len()]);
            }
            Backing::Raw(base) => {
                if dst.is_empty() {
                    return; // a zero-length region may have any address, null included
                }
                // SAFETY: `[off, off + dst.len())` lies inside the region (checked by the caller),
                // and `register_raw`'s contract makes a raw region's memory valid for reads,
                // from any thread, until its `MemoryRegion` is dropped, which waits for this copy
                // (the caller holds an `Arc` of the region: see `MemoryRegion::drop`). `dst` is
                // an exclusive borrow, so it does not overlap the region (the contract has the
                // application hold no references into registered memory).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        base.0.wrapping_add(off),
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
            }
        }
    }

    /// Copy `src` to region offset `off` (in bounds, checked by the caller). Callers write a raw
    /// region only if it has LOCAL_WRITE (which any remote write access requires).
    fn write_at(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.len);
        match &self.mem {
            Backing::Owned { buf, start } => {
                let at = start + off;
                lock_buf(buf)[at..at + src.len()].copy_from_slice(src);
            }
            Backing::Raw(base) => {
                if src.is_empty() {
                    return;
                }
                // SAFETY: in bounds as above; the region has LOCAL_WRITE (every caller checks
                // it, or a remote write access, which `MemoryRegion::new` grants only with
                // LOCAL_WRITE), and `register_raw`'s contract makes the memory of such a region
                // valid for writes, from any thread, until the `MemoryRegion` is dropped, which
                // waits for this copy (the caller holds an `Arc` of the region). `src` is a
                // borrow the transport or the application holds, not the region's memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), base.0.wrapping_add(off), src.len())
                };
            }
        }
    }

    /// The atomic on the 8 bytes at region offset `off` (in bounds, `addr` 8-byte aligned:
    /// checked by the caller); returns the original value.
    fn atomic_at(&self, off: usize, op: AtomicOp) -> Result<u64, MemError> {
        debug_assert!(off + 8 <= self.len);
        match &self.mem {
            Backing::Owned { buf, start } => {
                // Every access to an owned region takes its lock, so this is atomic with respect
                // to every other access (atomics from any QP included).
                let mut buf = lock_buf(buf);
                let cell = &mut buf[start + off..start + off + 8];
                // Atomics operate on host-order 64-bit words, as on the hosts rxe runs on.
                let orig = u64::from_ne_bytes(cell.try_into().expect("8 bytes"));
                let new = match op {
                    AtomicOp::CompareSwap { compare, swap } => {
                        if orig == compare {
                            swap
                        } else {
                            orig
                        }
                    }
                    AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
                };
                cell.copy_from_slice(&new.to_ne_bytes());
                Ok(orig)
            }
            Backing::Raw(base) => {
                let p = base.0.wrapping_add(off);
                // `register_raw` keeps a raw region's page offsets (its iova and address agree
                // modulo the page size), so an aligned iova is an aligned address; checked
                // anyway, since a misaligned `AtomicU64` would be undefined behaviour.
                if p as usize % std::mem::align_of::<AtomicU64>() != 0 {
                    return Err(MemError::Misaligned);
                }
                // SAFETY: the 8 bytes lie inside the region, `p` is aligned for `AtomicU64`
                // (checked just above), and the region grants REMOTE_ATOMIC, hence LOCAL_WRITE, so by
                // `register_raw`'s contract the word is valid for reads and writes, from any
                // thread, until the `MemoryRegion` is dropped — which waits for this operation
                // (the caller holds an `Arc` of the region). The contract also has the
                // application access the memory as a NIC's DMA target; its own atomics on the
                // word are atomic with ours.
                let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
                Ok(match op {
                    AtomicOp::CompareSwap { compare, swap } => {
                        match word.compare_exchange(
                            compare,
                            swap,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        ) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
                })
            }
        }
    }
}

/// The context's key table: every registered region by key (lkey == rkey, as in rxe).
#[derive(Default)]
pub(crate) struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrInner>>>,
}

impl MrTable {
    /// Insert the region `make` builds around a fresh random key.
    fn insert(&self, make: impl FnOnce(u32) -> MrInner) -> Arc<MrInner> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let key = loop {
            let mut b = [0u8; 4];
            getrandom::getrandom(&mut b).expect("getrandom");
            let k = u32::from_ne_bytes(b);
            // Keys 0 and all-ones are avoided: peers use them as "no key".
            if k != 0 && k != u32::MAX && !map.contains_key(&k) {
                break k;
            }
        };
        let inner = Arc::new(make(key));
        map.insert(key, inner.clone());
        inner
    }

    fn remove(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
    }

    /// The region with `key`. The `Arc` returned marks a copy in flight: hold it for one copy
    /// only (deregistration waits until it is dropped), never store it.
    fn get(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    pub fn count(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A [`MemoryAccess`] view limited to protection domain `pd`.
    pub fn for_pd(&self, pd: u32) -> PdMemory<'_> {
        PdMemory { table: self, pd }
    }
}

/// Key-checked access to the regions of one protection domain (IBA 10.6.3: a key from another
/// PD is invalid). Each call looks its key up once and holds the region for that one copy.
pub(crate) struct PdMemory<'a> {
    table: &'a MrTable,
    pd: u32,
}

impl PdMemory<'_> {
    fn lookup(&self, key: u32) -> Result<Arc<MrInner>, MemError> {
        match self.table.get(key) {
            Some(mr) if mr.pd == self.pd => Ok(mr),
            _ => Err(MemError::InvalidKey),
        }
    }
}

impl MemoryAccess for PdMemory<'_> {
    fn local_read(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let mr = self.lookup(lkey)?;
        let off = mr.offset(addr, dst.len() as u64)?;
        mr.read_at(off, dst);
        Ok(())
    }

    fn local_write(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(lkey)?;
        if !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)?;
        mr.write_at(off, src);
        Ok(())
    }

    fn remote_check(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        mr.offset(addr, len).map(|_| ())
    }

    fn remote_read(&self, rkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(AccessFlags::REMOTE_READ) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, dst.len() as u64)?;
        mr.read_at(off, dst);
        Ok(())
    }

    fn remote_write(&self, rkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)?;
        mr.write_at(off, src);
        Ok(())
    }

    fn remote_atomic(&self, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(AccessFlags::REMOTE_ATOMIC) {
            return Err(MemError::AccessDenied);
        }
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let off = mr.offset(addr, 8)?;
        mr.atomic_at(off, op)
    }
}

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
    pub fn len(&self) -> usize {
        self.inner.len
    }
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    pub fn lkey(&self) -> u32 {
        self.inner.key
    }
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }
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
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range_end(offset, dst.len())?;
        self.inner.read_at(offset, dst);
        Ok(())
    }

    /// Copy `src` to `offset`. An owned region takes it whatever its access flags (they are
    /// about what work requests and peers may do); a raw region needs LOCAL_WRITE, since its
    /// memory may be read-only without it.
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
    /// # Panics
    /// On a region from [`register_raw`](super::ProtectionDomain::register_raw): its memory is
    /// the caller's, and the transport reaches it without a lock (use [`MemoryRegion::read`],
    /// [`MemoryRegion::write`] or the caller's own pointer).
    pub fn lock(&self) -> MrGuard<'_> {
        let Backing::Owned { buf, start } = &self.inner.mem else {
            panic!("MemoryRegion::lock on a raw region (register_raw): it has no lock");
        };
        let guard = lock_buf(buf);
        let id = Arc::as_ptr(&self.inner) as usize;
        HELD.with(|h| h.borrow_mut().push(id));
        MrGuard {
            guard,
            range: *start..start + self.inner.len,
            id,
        }
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
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&x| x == self.id) {
                h.swap_remove(i);
            }
        });
    }
}

impl Drop for MemoryRegion {
    /// Remove the key, so no new copy can start (a lookup clones the region's `Arc` under the
    /// table's read lock; the removal takes its write lock), then wait until this `Arc` is the
    /// last: every copy under way has finished (`Arc::get_mut` synchronizes with the copiers'
    /// drops of theirs), so nothing reads or writes the memory after this returns.
    ///
    /// The wait cannot deadlock: a copier holds the region only inside one `MemoryAccess` call,
    /// which takes no lock but an owned region's own (whose guard borrows this `MemoryRegion`,
    /// so it is not held by the thread dropping it) and never calls back into the application,
    /// so it does not wait for this thread; and this thread is not inside such a call (the
    /// transport never drops a `MemoryRegion`: it holds none).
    fn drop(&mut self) {
        drop(self.shared.mrs.remove(self.inner.key));
        let mut round = 0u32;
        while Arc::get_mut(&mut self.inner).is_none() {
            // A copy is short (a packet's payload at most) but its thread may be descheduled:
            // spin a little, then yield, then sleep.
            round = round.saturating_add(1);
            if round < 64 {
                std::hint::spin_loop();
            } else if round < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
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

    const ALL: AccessFlags = AccessFlags(
        AccessFlags::LOCAL_WRITE.0
            | AccessFlags::REMOTE_WRITE.0
            | AccessFlags::REMOTE_READ.0
            | AccessFlags::REMOTE_ATOMIC.0,
    );

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
                                    matches!(e, MemError::InvalidKey | MemError::OutOfBounds),
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
            let mr = unsafe { pd.register_raw(p.cast(), len, p as u64, ALL) }.unwrap();
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
