//! Buffers as types: a piece of a local memory region ([`LocalSlice`], what a work request's
//! scatter/gather entry names) and a peer's buffer ([`RemoteSlice`]: address, length, rkey, the
//! three numbers every RDMA program sends its peer), both bounds-checked when cut.

use std::ops::{Bound, RangeBounds};

use super::error::{Result, VerbsError};
use super::mr::MemoryRegion;
use crate::transport::{AccessFlags, Sge};

/// `range` of a buffer of `size` bytes as (start, end), checked.
fn bounds(range: impl RangeBounds<u64>, size: u64, what: &'static str) -> Result<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => size,
    };
    if start > end || end > size {
        return Err(VerbsError::OutOfBounds {
            what,
            start,
            end,
            size,
        });
    }
    Ok((start, end))
}

fn to_u64(range: impl RangeBounds<usize>) -> (Bound<u64>, Bound<u64>) {
    let map = |b: Bound<&usize>| match b {
        Bound::Included(&x) => Bound::Included(x as u64),
        Bound::Excluded(&x) => Bound::Excluded(x as u64),
        Bound::Unbounded => Bound::Unbounded,
    };
    (map(range.start_bound()), map(range.end_bound()))
}

/// Bytes `start..end` of a local [`MemoryRegion`]: what a work request gathers from or
/// scatters into. Made by [`MemoryRegion::slice`]; borrows the region, so it cannot outlive it.
///
/// ```
/// # use softrdma::verbs::*;
/// # let ctx = devices()?.last().unwrap().open()?;
/// let pd = ctx.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let head = mr.slice(..64)?;
/// assert_eq!((head.len(), head.sge().lkey), (64, mr.lkey()));
/// assert!(mr.slice(4000..5000).is_err(), "past the end");
/// # Ok::<(), VerbsError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LocalSlice<'a> {
    mr: &'a MemoryRegion,
    start: u64,
    end: u64,
}

impl<'a> LocalSlice<'a> {
    /// The region it is cut from.
    pub fn region(&self) -> &'a MemoryRegion {
        self.mr
    }

    /// Its virtual address (the region's address plus the offset).
    pub fn addr(&self) -> u64 {
        self.mr.addr() + self.start
    }

    /// Its offset in the region.
    pub fn offset(&self) -> usize {
        self.start as usize
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The scatter/gather entry that names it.
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            length: self.len() as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// A piece of this slice (offsets relative to it).
    ///
    /// # Errors
    /// [`VerbsError::OutOfBounds`] if `range` is not inside it.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice<'a>> {
        let (s, e) = bounds(to_u64(range), self.end - self.start, "local slice")?;
        Ok(LocalSlice {
            mr: self.mr,
            start: self.start + s,
            end: self.start + e,
        })
    }
}

impl From<LocalSlice<'_>> for Sge {
    fn from(s: LocalSlice<'_>) -> Sge {
        s.sge()
    }
}

impl<'a> From<&'a MemoryRegion> for LocalSlice<'a> {
    fn from(mr: &'a MemoryRegion) -> LocalSlice<'a> {
        LocalSlice {
            mr,
            start: 0,
            end: mr.len() as u64,
        }
    }
}

impl MemoryRegion {
    /// Bytes `range` of the region, for a work request.
    ///
    /// # Errors
    /// [`VerbsError::OutOfBounds`] if `range` is not inside the region.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice<'_>> {
        let (start, end) = bounds(to_u64(range), self.len() as u64, "memory region")?;
        Ok(LocalSlice {
            mr: self,
            start,
            end,
        })
    }

    /// Bytes `range` of the region as a peer names them: send it to the peer, which reads,
    /// writes or runs atomics on it with [`Qp::read`](super::Qp::read) and friends.
    ///
    /// # Errors
    /// [`VerbsError::OutOfBounds`] if `range` is not inside the region;
    /// [`VerbsError::InvalidArgument`] if the region grants peers no access at all
    /// (`REMOTE_READ`, `REMOTE_WRITE` or `REMOTE_ATOMIC`).
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteSlice> {
        let remote =
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if !self.access().intersects(remote) {
            return Err(VerbsError::InvalidArgument(
                "the region grants peers no access (register it with REMOTE_READ, REMOTE_WRITE \
                 or REMOTE_ATOMIC)",
            ));
        }
        let (start, end) = bounds(to_u64(range), self.len() as u64, "memory region")?;
        Ok(RemoteSlice {
            addr: self.addr() + start,
            len: end - start,
            rkey: self.rkey(),
        })
    }
}

/// A peer's buffer: `len` bytes at virtual address `addr` of the region whose remote key is
/// `rkey`. Sent to the peer as 20 bytes ([`RemoteSlice::to_bytes`]) or, with the `serde`
/// feature, in any format serde speaks.
///
/// ```
/// use softrdma::verbs::RemoteSlice;
/// let buf = RemoteSlice { addr: 0x7f00_0000_1000, len: 1 << 20, rkey: 0x1234 };
/// let wire = buf.to_bytes();
/// assert_eq!(RemoteSlice::from_bytes(&wire)?, buf);
/// let chunk = buf.slice(4096..8192)?;
/// assert_eq!((chunk.addr, chunk.len, chunk.rkey), (0x7f00_0000_2000, 4096, 0x1234));
/// assert!(buf.slice(0..(2 << 20)).is_err());
/// # Ok::<(), softrdma::verbs::VerbsError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteSlice {
    /// The peer's virtual address of its first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The remote key of the peer's region.
    pub rkey: u32,
}

impl RemoteSlice {
    /// Bytes in [`RemoteSlice::to_bytes`]'s form.
    pub const WIRE_LEN: usize = 20;

    /// The 20 bytes to send to the peer: address, length (both u64) and rkey (u32), little
    /// endian.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Read [`RemoteSlice::to_bytes`]'s form from the front of `b`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] if `b` is shorter than [`RemoteSlice::WIRE_LEN`] or
    /// names a buffer that wraps around the address space.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteSlice> {
        let b: &[u8; Self::WIRE_LEN] = b
            .get(..Self::WIRE_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(VerbsError::InvalidArgument(
                "a remote buffer needs 20 bytes (RemoteSlice::to_bytes)",
            ))?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let s = RemoteSlice {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
        };
        if s.addr.checked_add(s.len).is_none() {
            return Err(VerbsError::InvalidArgument(
                "the remote buffer wraps around the address space",
            ));
        }
        Ok(s)
    }

    /// A piece of the buffer (offsets relative to it).
    ///
    /// # Errors
    /// [`VerbsError::OutOfBounds`] if `range` is not inside it.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteSlice> {
        let (s, e) = bounds(range, self.len, "remote buffer")?;
        Ok(RemoteSlice {
            addr: self.addr + s,
            len: e - s,
            rkey: self.rkey,
        })
    }

    /// The buffer in pieces of `n` bytes (the last may be shorter).
    ///
    /// ```
    /// # use softrdma::verbs::RemoteSlice;
    /// let buf = RemoteSlice { addr: 0x1000, len: 10_000, rkey: 9 };
    /// let lens: Vec<u64> = buf.chunks(4096).map(|c| c.len).collect();
    /// assert_eq!(lens, [4096, 4096, 1808]);
    /// ```
    pub fn chunks(&self, n: u64) -> impl Iterator<Item = RemoteSlice> + '_ {
        let n = n.max(1);
        (0..self.len.div_ceil(n)).map(move |i| RemoteSlice {
            addr: self.addr + i * n,
            len: n.min(self.len - i * n),
            rkey: self.rkey,
        })
    }
}
