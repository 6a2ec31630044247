//! The device's memory table: every registered region by key, and the key-checked copies the
//! transport makes into and out of them ([`PdMemory`], its `MemoryAccess`). A region either owns
//! its memory or names memory its registrant owns (`ibv_reg_mr` from C, `register_raw`).
//!
//! The transport reaches a region only by key, through the table, holding the region (an `Arc`)
//! for the length of one copy. That `Arc` is the in-flight mark: [`MrTable::deregister`] removes
//! the key first, so no new copy can start, then waits until the registrant's own `Arc` is the
//! last one, so no copy is still running. After it returns, nothing touches the memory again.

use std::collections::HashMap;

use super::hash::LocalKeys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::transport::{AccessFlags, AtomicOp, MemError, MemoryAccess};

pub(crate) struct MrInner {
    pub pd: u32,
    pub key: u32,
    pub access: AccessFlags,
    /// The region's virtual address: what SGEs, remote addresses and atomics name. For an owned
    /// region the address of its buffer (as with `ibv_reg_mr`); for a raw one the `iova` it was
    /// registered with (as with `ibv_reg_mr_iova2`).
    pub addr: u64,
    pub len: usize,
    pub mem: Backing,
}

/// Where a region's bytes are.
pub(crate) enum Backing {
    /// The region is `buf[start..start + len]` (`start` aligns freshly allocated regions). The
    /// transport and the application ([`MrGuard`]) take the same lock.
    Owned { buf: Mutex<Box<[u8]>>, start: usize },
    /// `len` bytes at this address, owned by whoever called `register_raw`. No lock: the
    /// transport copies with raw pointers, as a NIC's DMA would.
    Raw(RawBase),
}

/// The first byte of a raw region's memory.
pub(crate) struct RawBase(pub *mut u8);

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

/// This thread took the application guard of the region at address `id`.
pub(crate) fn guard_taken(id: usize) {
    HELD.with(|h| h.borrow_mut().push(id));
}

/// This thread let go of the application guard of the region at address `id`.
pub(crate) fn guard_released(id: usize) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|&x| x == id) {
            h.swap_remove(i);
        }
    });
}

pub(crate) fn lock_buf(buf: &Mutex<Box<[u8]>>) -> MutexGuard<'_, Box<[u8]>> {
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
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) {
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
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) {
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
                cell.copy_from_slice(&op.apply(orig).to_ne_bytes());
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
    map: RwLock<HashMap<u32, Arc<MrInner>, LocalKeys>>,
    /// The keys deregistered last (at most [`RECENT_KEYS`]), so that a peer still using one is
    /// told apart from one that never had it (`MemError::Deregistered`).
    recent: std::sync::Mutex<std::collections::VecDeque<u32>>,
}

/// How many deregistered keys [`MrTable`] remembers.
const RECENT_KEYS: usize = 64;

impl MrTable {
    /// Insert the region `make` builds around a fresh random key.
    pub(crate) fn insert(&self, make: impl FnOnce(u32) -> MrInner) -> Arc<MrInner> {
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
        let gone = self
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if gone.is_some() {
            let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if r.len() == RECENT_KEYS {
                r.pop_front();
            }
            r.push_back(key);
        }
        gone
    }

    /// Why `key` names no region: deregistered lately, or never known here.
    fn missing(&self, key: u32) -> MemError {
        let r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if r.contains(&key) {
            MemError::Deregistered
        } else {
            MemError::InvalidKey
        }
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

    /// Deregister `inner`: remove its key, so no new copy can start (a lookup clones the
    /// region's `Arc` under the table's read lock; the removal takes its write lock), then wait
    /// until `inner` is the last `Arc`: every copy under way has finished (`Arc::get_mut`
    /// synchronizes with the copiers' drops of theirs), so nothing reads or writes the memory
    /// after this returns.
    ///
    /// The wait cannot deadlock: a copier holds the region only inside one `MemoryAccess` call,
    /// which takes no lock but an owned region's own (whose application guard borrows the
    /// registrant's handle, so it is not held by the thread deregistering) and never calls back
    /// into the application, so it does not wait for this thread; and this thread is not inside
    /// such a call (the transport never deregisters: it holds no region).
    pub(crate) fn deregister(&self, inner: &mut Arc<MrInner>) {
        drop(self.remove(inner.key));
        let mut round = 0u32;
        while Arc::get_mut(inner).is_none() {
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
            Some(_) => Err(MemError::InvalidKey),
            None => Err(self.table.missing(key)),
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
