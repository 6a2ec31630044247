//! Memory regions. softrdma's MRs own their memory, so nothing a peer or a work request does can
//! reach freed or unregistered memory: the transport reaches a region only by key, through the
//! table, and holds the region alive (an `Arc`) only for the length of one copy.

use std::collections::HashMap;
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
    buf: Mutex<Box<[u8]>>,
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
}

/// The context's key table: every registered region by key (lkey == rkey, as in rxe).
#[derive(Default)]
pub(crate) struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrInner>>>,
}

impl MrTable {
    fn insert(&self, pd: u32, access: AccessFlags, buf: Box<[u8]>) -> Arc<MrInner> {
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
            addr: buf.as_ptr() as u64,
            len: buf.len(),
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
        let off = mr.offset(addr, dst.len() as u64)?;
        dst.copy_from_slice(&mr.buf.lock().unwrap()[off..off + dst.len()]);
        Ok(())
    }

    fn local_write(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(lkey)?;
        if !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)?;
        mr.buf.lock().unwrap()[off..off + src.len()].copy_from_slice(src);
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
        dst.copy_from_slice(&mr.buf.lock().unwrap()[off..off + dst.len()]);
        Ok(())
    }

    fn remote_write(&self, rkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let mr = self.lookup(rkey)?;
        if !mr.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let off = mr.offset(addr, src.len() as u64)?;
        mr.buf.lock().unwrap()[off..off + src.len()].copy_from_slice(src);
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
        let mut buf = mr.buf.lock().unwrap();
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
        let inner = shared.mrs.insert(pd, access, buf);
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

    /// Lock the memory for direct access. The transport waits while the guard lives, so keep
    /// it short.
    pub fn lock(&self) -> MutexGuard<'_, Box<[u8]>> {
        self.inner.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `ibv_dereg_mr`: remove the key now.
    pub fn deregister(self) {}
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
