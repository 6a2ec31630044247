//! How the transport reaches registered memory: through keys; it never holds a pointer into it.
//!
//! The Verbs layer implements [`MemoryAccess`] over its memory-region table for one protection
//! domain; tests implement it over plain vectors. Every check the IBA asks of a key (it exists,
//! belongs to this PD, grants the access, covers the range) happens behind this trait, so the
//! transport cannot touch memory outside a registered region.

use super::types::{AccessFlags, AtomicOp, Sge};

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("no memory region with that key in this protection domain")]
    InvalidKey,
    /// The key named a region that was deregistered since.
    #[error("the memory region with that key was deregistered")]
    Deregistered,
    #[error("the memory region does not grant the access")]
    AccessDenied,
    #[error("the range is outside the memory region")]
    OutOfBounds,
    #[error("atomic operand not 8-byte aligned")]
    Misaligned,
}

/// Key-checked access to the memory of one protection domain.
pub trait MemoryAccess {
    /// Gather: copy `dst.len()` bytes from `addr` in the region with local key `lkey`.
    fn local_read(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError>;
    /// Scatter: copy `src` to `addr` in the region with `lkey`; needs LOCAL_WRITE.
    fn local_write(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError>;
    /// Check that `len` bytes at `addr` under `rkey` grant `access` (REMOTE_READ/WRITE/ATOMIC).
    fn remote_check(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError>;
    /// Copy from remote-readable memory (serving an RDMA READ).
    fn remote_read(&self, rkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), MemError>;
    /// Copy into remote-writable memory (serving an RDMA WRITE).
    fn remote_write(&self, rkey: u32, addr: u64, src: &[u8]) -> Result<(), MemError>;
    /// Execute an atomic on the 8 bytes at `addr` (8-byte aligned, REMOTE_ATOMIC); returns the
    /// original value. Atomic with respect to every other atomic on the same memory.
    fn remote_atomic(&self, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError>;
}

/// Copy a whole SGE list, in order, into `dst` (as long as the list's total length). Every
/// SGE's key is checked, an empty one's too.
pub(crate) fn gather_all(
    sgl: &[Sge],
    dst: &mut [u8],
    mem: &dyn MemoryAccess,
) -> Result<(), MemError> {
    let mut at = 0;
    for s in sgl {
        let n = s.length as usize;
        mem.local_read(s.lkey, s.addr, &mut dst[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// Scatter `src` into an SGE list starting at byte `off` (READ responses, receives).
pub(crate) fn scatter(
    sgl: &[Sge],
    off: usize,
    src: &[u8],
    mem: &dyn MemoryAccess,
) -> Result<(), MemError> {
    walk_sges(sgl, off, src.len(), |lkey, addr, r| {
        mem.local_write(lkey, addr, &src[r])
    })
}

/// Gather `dst.len()` bytes of an SGE list starting at byte `off` (a send's packets).
pub(crate) fn gather(
    sgl: &[Sge],
    off: usize,
    dst: &mut [u8],
    mem: &dyn MemoryAccess,
) -> Result<(), MemError> {
    walk_sges(sgl, off, dst.len(), |lkey, addr, r| {
        mem.local_read(lkey, addr, &mut dst[r])
    })
}

/// Bytes `[off, off + len)` of an SGE list, piece by piece: `f(lkey, address, range)` with the
/// piece's range in the caller's `len` bytes. `OutOfBounds` if the list is shorter.
fn walk_sges(
    sgl: &[Sge],
    off: usize,
    len: usize,
    mut f: impl FnMut(u32, u64, std::ops::Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    if len == 0 {
        return Ok(());
    }
    let mut skip = off as u64;
    let mut done = 0usize;
    for sge in sgl {
        if done == len {
            break;
        }
        let l = sge.length as u64;
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(len - done);
        f(sge.lkey, sge.addr.wrapping_add(skip), done..done + n)?;
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::OutOfBounds)
    }
}
