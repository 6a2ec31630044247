//! Batched datagram I/O: `recvmmsg` fills up to [`BATCH`] receive buffers in one system call,
//! `sendmmsg` sends up to [`BATCH`] queued datagrams in one. Buffers are allocated once per
//! engine; nothing is allocated per datagram.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

/// Datagrams per system call.
pub(crate) const BATCH: usize = 32;
/// Room for the largest RoCE packet (4,132 bytes) and then some: a longer datagram is truncated,
/// which the length gate then refuses.
pub(crate) const SLOT: usize = 4096 + 256;

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
    let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as libc::sa_family_t;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

/// Receive buffers and what `recvmmsg` said about them.
pub(crate) struct RxBatch {
    bufs: Box<[u8]>,
    lens: [usize; BATCH],
    from: [libc::sockaddr_in; BATCH],
}

impl RxBatch {
    pub fn new() -> RxBatch {
        RxBatch {
            bufs: vec![0u8; BATCH * SLOT].into_boxed_slice(),
            lens: [0; BATCH],
            // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
            from: [unsafe { std::mem::zeroed() }; BATCH],
        }
    }

    /// Receive what is waiting (without blocking), at most [`BATCH`] datagrams; returns how
    /// many. `Ok(0)`: nothing waits.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        // SAFETY: plain C structs; all-zero is valid.
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, (v, m)) in iov.iter_mut().zip(msgs.iter_mut()).enumerate() {
            v.iov_base = self.bufs[i * SLOT..].as_mut_ptr() as *mut libc::c_void;
            v.iov_len = SLOT;
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_name = &mut self.from[i] as *mut libc::sockaddr_in as *mut libc::c_void;
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        }
        loop {
            // SAFETY: every mmsghdr points at a live iovec over its own SLOT bytes of `bufs` and
            // at its own sockaddr_in in `from`; all outlive the call.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    msgs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                let n = n as usize;
                for (l, m) in self.lens.iter_mut().zip(&msgs).take(n) {
                    // A truncated datagram reports its full length: keep what was stored (the
                    // length gate refuses it anyway).
                    *l = (m.msg_len as usize).min(SLOT);
                    if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                        *l = SLOT;
                    }
                }
                return Ok(n);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Datagram `i` of the last [`RxBatch::recv`]: its bytes and its sender.
    pub fn get(&self, i: usize) -> (&[u8], SocketAddrV4) {
        let f = &self.from[i];
        let from = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(f.sin_addr.s_addr)),
            u16::from_be(f.sin_port),
        );
        (&self.bufs[i * SLOT..][..self.lens[i]], from)
    }
}

/// Datagrams queued for one `sendmmsg`.
pub(crate) struct TxBatch {
    bufs: Box<[u8]>,
    lens: [usize; BATCH],
    to: [libc::sockaddr_in; BATCH],
    n: usize,
}

/// What [`TxBatch::flush`] did.
#[derive(Default, Clone, Copy)]
pub(crate) struct Sent {
    pub sent: u64,
    pub dropped: u64,
}

impl TxBatch {
    pub fn new() -> TxBatch {
        TxBatch {
            bufs: vec![0u8; BATCH * SLOT].into_boxed_slice(),
            lens: [0; BATCH],
            // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
            to: [unsafe { std::mem::zeroed() }; BATCH],
            n: 0,
        }
    }

    pub fn is_full(&self) -> bool {
        self.n == BATCH
    }

    /// The buffer the next datagram is built in ([`SLOT`] bytes). Flush first if full.
    pub fn next_buf(&mut self) -> &mut [u8] {
        debug_assert!(!self.is_full());
        &mut self.bufs[self.n * SLOT..][..SLOT]
    }

    /// Queue the first `len` bytes of [`TxBatch::next_buf`] for `to`.
    pub fn push(&mut self, len: usize, to: SocketAddrV4) {
        self.lens[self.n] = len;
        self.to[self.n] = sockaddr(to);
        self.n += 1;
    }

    /// Send everything queued. A full socket buffer is waited out (the packets are not lost
    /// to a retransmission timeout); a datagram the kernel refuses (unreachable) is dropped.
    pub fn flush(&mut self, fd: RawFd) -> Sent {
        let mut out = Sent::default();
        let mut done = 0;
        let mut waits = 0;
        while done < self.n {
            // SAFETY: plain C structs; all-zero is valid.
            let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            let count = self.n - done;
            for k in 0..count {
                let i = done + k;
                iov[k].iov_base = self.bufs[i * SLOT..].as_mut_ptr() as *mut libc::c_void;
                iov[k].iov_len = self.lens[i];
                let h = &mut msgs[k].msg_hdr;
                h.msg_iov = &mut iov[k];
                h.msg_iovlen = 1;
                h.msg_name = &mut self.to[i] as *mut libc::sockaddr_in as *mut libc::c_void;
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            // SAFETY: the first `count` mmsghdrs point at live iovecs over queued bytes of
            // `bufs` and at their sockaddr_in in `to`; all outlive the call.
            let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), count as libc::c_uint, 0) };
            if r > 0 {
                done += r as usize;
                out.sent += r as u64;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock if waits < 1000 => {
                    waits += 1;
                    std::thread::yield_now();
                }
                // Unreachable and the like (or a buffer that stays full): drop the first one;
                // retransmission handles it.
                _ => {
                    done += 1;
                    out.dropped += 1;
                }
            }
        }
        self.n = 0;
        out
    }
}
