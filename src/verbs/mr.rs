//! Memory regions. softrdma's MRs own their memory, so nothing a peer or a work request does can
//! reach freed or unregistered memory: the transport reaches a region only by key, through the
//! table, and holds the region alive (an `Arc`) only for the length of one copy.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::error::{Result, VerbsError};
use crate::transport::{AccessFlags, AtomicOp, MemError, MemoryAccess};

pub(crate) struct MrInner {
    pub pd: u32,
    pub key: u32,
    pub access: AccessFlags,
    /// The region's virtual address: the address of its buffer, as with `ibv_reg_mr`.
    pub addr: u64,
    pub len: usize,
    /// The region is `buf[start..start + len]` (`start` aligns freshly allocated regions).
    start: usize,
    buf: Mutex<Box<[u8]>>,
}

thread_local! {
    /// Regions whose [`MrGuard`] this thread holds (by `MrInner` address).
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// True if this thread holds an application guard ([`MemoryRegion::lock`]) on any region: it
/// must not drive the transport, which could need that very lock (a self-deadlock).
pub(crate) fn guards_held() -> bool {
    HELD.with(|h| !h.borrow().is_empty())
}

impl MrInner {
    /// The region's bytes, locked (the transport and the application take the same lock).
    fn bytes(&self) -> MutexGuard<'_, Box<[u8]>> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }

    /// Offset of `[addr, addr + len)` inside the region, if it lies inside.
    fn offset(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.checked_sub(self.addr).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok(off as usize)
    }
}

/// The context's key table: every registered region by key (lkey == rkey, as in rxe).
#[derive(Default)]
pub(crate) struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrInner>>>,
}

impl MrTable {
    fn insert(
        &self,
        pd: u32,
        access: AccessFlags,
        buf: Box<[u8]>,
        start: usize,
        len: usize,
    ) -> Arc<MrInner> {
        let mut map = self.map.write().unwrap();
        let key = loop {
            let mut b = [0u8; 4];
            getrandom::getrandom(&mut b).expect("getrandom");
            let k = u32::from_ne_bytes(b);
            // Keys 0 and all-ones are avoided: peers use them as "no key".
            if k != 0 && k != u32::MAX && !map.contains_key(&k) {
                break k;
            }
        };
        let inner = Arc::new(MrInner {
            pd,
            key,
            access,
            // The heap block of a `Box<[u8]>` never moves, so its address names the region for
            // its whole life; it is only a number here (never dereferenced).
            addr: buf.as_ptr() as u64 + start as u64,
            len,
            start,
            buf: Mutex::new(buf),
        });
        map.insert(key, inner.clone());
        inner
    }

    fn remove(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map.write().unwrap().remove(&key)
    }

    fn get(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map.read().unwrap().get(&key).cloned()
    }

    pub fn count(&self) -> usize {
        self.map.read().unwrap().len()
    }

    /// A [`MemoryAccess`] view limited to protection domain `pd`.
    pub fn for_pd(&self, pd: u32) -> PdMemory<'_> {
        PdMemory { table: self, pd }
    }
}

/// Key-checked access to the regions of one protection domain (IBA 10.6.3: a key from another
/// PD is invalid).
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
        let off = mr.offset(addr, dst.len() as u64)? + mr.start;
        dst.copy_from_slice(&mr.bytes()[off..off + dst.len()]);
        Ok(())
    }

    fn local_write(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(lkey)?;
        if !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)? + mr.start;
        mr.bytes()[off..off + src.len()].copy_from_slice(src);
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
        let off = mr.offset(addr, dst.len() as u64)? + mr.start;
        dst.copy_from_slice(&mr.bytes()[off..off + dst.len()]);
        Ok(())
    }

    fn remote_write(&self, rkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)? + mr.start;
        mr.bytes()[off..off + src.len()].copy_from_slice(src);
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
        let off = mr.offset(addr, 8)? + mr.start;
        let mut buf = mr.bytes();
        let cell = &mut buf[off..off + 8];
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
}

/// A registered memory region (`struct ibv_mr`) that owns its buffer.
///
/// Dropping it (or [`MemoryRegion::deregister`]) removes its key: a later access by a peer fails
/// with a remote access error, a local work request that names it with a protection error.
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
    pub(crate) table: Arc<super::context::Shared>,
}

impl MemoryRegion {
    pub(crate) fn register(
        shared: &Arc<super::context::Shared>,
        pd: u32,
        buf: Box<[u8]>,
        start: usize,
        len: usize,
        access: AccessFlags,
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
        let inner = shared.mrs.insert(pd, access, buf, start, len);
        Ok(MemoryRegion {
            inner,
            table: shared.clone(),
        })
    }

    /// Virtual address of the first byte (what goes in SGEs and is advertised to peers).
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

    /// Copy `dst.len()` bytes from `offset`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(dst.len())
            .filter(|&e| e <= self.inner.len);
        let end = end.ok_or(VerbsError::InvalidArgument(
            "range outside the memory region",
        ))?;
        dst.copy_from_slice(&self.lock()[offset..end]);
        Ok(())
    }

    /// Copy `src` to `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let end = offset
            .checked_add(src.len())
            .filter(|&e| e <= self.inner.len);
        let end = end.ok_or(VerbsError::InvalidArgument(
            "range outside the memory region",
        ))?;
        self.lock()[offset..end].copy_from_slice(src);
        Ok(())
    }

    /// Lock the memory for direct access: the guard derefs to the region's bytes. The transport
    /// waits while the guard lives, so keep it short, and do not call into the library (poll a
    /// CQ, post, ...) while holding it: the transport may need this very lock to progress.
    pub fn lock(&self) -> MrGuard<'_> {
        let guard = self.inner.bytes();
        HELD.with(|h| h.borrow_mut().push(Arc::as_ptr(&self.inner) as usize));
        MrGuard {
            guard,
            range: self.inner.range(),
            id: Arc::as_ptr(&self.inner) as usize,
        }
    }

    /// `ibv_dereg_mr`: remove the key now. Work requests and peers that name it afterwards fail
    /// (local protection error, remote access error); the memory is freed when nothing uses it.
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
    fn drop(&mut self) {
        self.table.mrs.remove(self.inner.key);
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("lkey", &format_args!("{:#x}", self.inner.key))
            .field("access", &self.inner.access)
            .finish()
    }
}
