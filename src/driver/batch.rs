//! Batched datagram I/O, with no allocation per datagram:
//!
//! * receive: `recvmmsg` fills up to [`RX_MSGS`] buffers in one system call; with `UDP_GRO` on
//!   the socket a buffer may hold several datagrams of one flow coalesced by the kernel (the
//!   control message gives their size), which [`RxBatch`] splits again;
//! * send: packets are built back to back in one arena; consecutive packets to one destination
//!   whose sizes allow it form one UDP GSO message (`UDP_SEGMENT`: the kernel cuts it into the
//!   datagrams again), and `sendmmsg` sends up to [`TX_MSGS`] messages in one system call.
//!
//! The ICRC covers the IPv4 Identification field. A datagram sent alone with DF set on an
//! unconnected socket carries ID 0; the kernel numbers the segments of a GSO message from its
//! ID, 0, 1, 2, … (`inet_gso_segment`), so segment `k` of a run is built with ID `k`
//! ([`TxBatch::next_id`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

/// Receive messages per system call.
pub(crate) const RX_MSGS: usize = 16;
/// A receive buffer: one coalesced GRO message of up to 64 KiB.
const RX_SLOT: usize = 65536;
/// Room for the largest RoCE packet (4,132 bytes) and then some.
pub(crate) const SLOT: usize = 4096 + 256;
/// Send messages per system call.
pub(crate) const TX_MSGS: usize = 32;
/// Segments per GSO message (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGS: usize = 64;
/// Bytes per GSO message: what fits one IPv4 datagram.
const GSO_MAX_BYTES: usize = 65535 - 20 - 8;
/// Room for packets queued before a flush: a full batch of full GSO messages is never needed,
/// the arena is flushed when the next packet might not fit.
const TX_ARENA: usize = 256 * 1024;

const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
    let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as libc::sa_family_t;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Ask the kernel to coalesce received datagrams (`UDP_GRO`); false where it cannot.
pub(crate) fn enable_gro(fd: RawFd) -> bool {
    set_int(fd, SOL_UDP, UDP_GRO, 1).is_ok()
}

/// Whether the kernel takes `UDP_SEGMENT` on this socket (checked once per socket).
pub(crate) fn gso_supported(fd: RawFd) -> bool {
    // Setting the socket-wide default to 0 (no segmentation) probes support harmlessly.
    set_int(fd, SOL_UDP, UDP_SEGMENT, 0).is_ok()
}

/// Control-message room for one `int` (UDP_GRO / UDP_SEGMENT).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; 32]);

/// Receive buffers and the datagrams found in them.
pub(crate) struct RxBatch {
    bufs: Box<[u8]>,
    from: [libc::sockaddr_in; RX_MSGS],
    cmsg: [CmsgBuf; RX_MSGS],
    /// (offset in `bufs`, length, message index) of each datagram of the last receive.
    dgrams: Vec<(u32, u32, u8)>,
}

impl RxBatch {
    pub fn new() -> RxBatch {
        RxBatch {
            bufs: vec![0u8; RX_MSGS * RX_SLOT].into_boxed_slice(),
            // SAFETY: sockaddr_in is a plain C struct; all-zero is valid.
            from: [unsafe { std::mem::zeroed() }; RX_MSGS],
            cmsg: [CmsgBuf([0; 32]); RX_MSGS],
            dgrams: Vec::with_capacity(RX_MSGS * GSO_MAX_SEGS),
        }
    }

    /// Receive what is waiting (without blocking): returns how many datagrams were found
    /// (0: nothing waits).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.dgrams.clear();
        // SAFETY: plain C structs; all-zero is valid.
        let mut iov: [libc::iovec; RX_MSGS] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; RX_MSGS] = unsafe { std::mem::zeroed() };
        for (i, (v, m)) in iov.iter_mut().zip(msgs.iter_mut()).enumerate() {
            v.iov_base = self.bufs[i * RX_SLOT..].as_mut_ptr() as *mut libc::c_void;
            v.iov_len = RX_SLOT;
            let h = &mut m.msg_hdr;
            h.msg_iov = v;
            h.msg_iovlen = 1;
            h.msg_name = &mut self.from[i] as *mut libc::sockaddr_in as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_control = self.cmsg[i].0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
        }
        let n = loop {
            // SAFETY: every mmsghdr points at a live iovec over its own RX_SLOT bytes of
            // `bufs`, its own sockaddr_in and its own control buffer; all outlive the call.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    msgs.as_mut_ptr(),
                    RX_MSGS as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        };
        for (i, m) in msgs.iter().enumerate().take(n) {
            let len = (m.msg_len as usize).min(RX_SLOT);
            let seg = gro_size(&m.msg_hdr).filter(|s| *s > 0).unwrap_or(len);
            let base = i * RX_SLOT;
            let mut off = 0;
            while off < len {
                let l = seg.min(len - off);
                self.dgrams.push(((base + off) as u32, l as u32, i as u8));
                off += l;
            }
            if len == 0 {
                self.dgrams.push((base as u32, 0, i as u8));
            }
        }
        Ok(self.dgrams.len())
    }

    /// Datagram `i` of the last [`RxBatch::recv`]: its bytes and its sender.
    pub fn get(&self, i: usize) -> (&[u8], SocketAddrV4) {
        let (off, len, m) = self.dgrams[i];
        let f = &self.from[m as usize];
        let from = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(f.sin_addr.s_addr)),
            u16::from_be(f.sin_port),
        );
        (&self.bufs[off as usize..][..len as usize], from)
    }
}

/// The segment size of a coalesced message, from its `UDP_GRO` control message.
fn gro_size(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: `h` is a msghdr recvmmsg filled in; the CMSG macros stay within msg_control.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// A message being built: consecutive packets to one destination.
#[derive(Clone, Copy)]
struct Run {
    start: usize,
    /// Size of each packet but possibly the last.
    seg: usize,
    count: usize,
    bytes: usize,
    /// A packet shorter than `seg` ended the run.
    closed: bool,
    to: libc::sockaddr_in,
    /// The destination QPN of every packet of the run.
    qpn: u32,
}

/// Packets queued for one `sendmmsg`.
pub(crate) struct TxBatch {
    arena: Box<[u8]>,
    used: usize,
    runs: [Run; TX_MSGS],
    n: usize,
    /// Whether the socket takes `UDP_SEGMENT` (else every packet is its own message).
    gso: bool,
    /// The source address, for rebuilding ICRCs when GSO turns out not to work.
    local: Ipv4Addr,
}

/// What [`TxBatch::flush`] did, in datagrams.
#[derive(Default, Clone, Copy)]
pub(crate) struct Sent {
    pub sent: u64,
    pub dropped: u64,
}

impl TxBatch {
    pub fn new(gso: bool, local: Ipv4Addr) -> TxBatch {
        TxBatch {
            arena: vec![0u8; TX_ARENA].into_boxed_slice(),
            used: 0,
            runs: [Run {
                start: 0,
                seg: 0,
                count: 0,
                bytes: 0,
                closed: true,
                to: sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
                qpn: 0,
            }; TX_MSGS],
            n: 0,
            gso,
            local,
        }
    }

    /// Whether the next packet may not fit: flush first.
    pub fn is_full(&self) -> bool {
        self.n == TX_MSGS || self.used + SLOT > self.arena.len()
    }

    /// The buffer the next packet is built in ([`SLOT`] bytes). Flush first if full.
    pub fn next_buf(&mut self) -> &mut [u8] {
        debug_assert!(!self.is_full());
        &mut self.arena[self.used..][..SLOT]
    }

    /// Whether the next packet, of `len` bytes to QP `qpn` at `to`, joins the last run. Only
    /// packets to one QP share a GSO message: a message that stays whole up to the receiving
    /// socket (loopback, veth) is steered to one sharer of the address by its first packet
    /// (`driver::steer`), and QP1's packets are steered by their content, so they never share.
    fn joins(&self, len: usize, to: &libc::sockaddr_in, qpn: u32) -> bool {
        if !self.gso || self.n == 0 || qpn >> 16 == 0 {
            return false;
        }
        let r = &self.runs[self.n - 1];
        !r.closed
            && r.qpn == qpn
            && r.to.sin_addr.s_addr == to.sin_addr.s_addr
            && r.to.sin_port == to.sin_port
            && len <= r.seg
            && r.count < GSO_MAX_SEGS
            && r.bytes + len <= GSO_MAX_BYTES
    }

    /// The IPv4 ID the kernel will give the next packet, of `len` bytes to QP `qpn` at `to`:
    /// its index in its GSO message (0 alone). Build its ICRC with it, then
    /// [`TxBatch::push`] it.
    pub fn next_id(&self, len: usize, to: SocketAddrV4, qpn: u32) -> u16 {
        if self.joins(len, &sockaddr(to), qpn) {
            self.runs[self.n - 1].count as u16
        } else {
            0
        }
    }

    /// Queue the first `len` bytes of [`TxBatch::next_buf`], a packet to QP `qpn`, for `to`.
    pub fn push(&mut self, len: usize, to: SocketAddrV4, qpn: u32) {
        let to = sockaddr(to);
        if self.joins(len, &to, qpn) {
            let r = &mut self.runs[self.n - 1];
            r.count += 1;
            r.bytes += len;
            r.closed = len < r.seg;
        } else {
            self.runs[self.n] = Run {
                start: self.used,
                seg: len,
                count: 1,
                bytes: len,
                closed: false,
                to,
                qpn,
            };
            self.n += 1;
        }
        self.used += len;
    }

    /// Send everything queued. A full socket buffer is waited out (the packets are not lost
    /// to a retransmission timeout); a message the kernel refuses (unreachable) is dropped.
    pub fn flush(&mut self, fd: RawFd) -> Sent {
        let mut out = Sent::default();
        let mut done = 0;
        let mut waits = 0;
        while done < self.n {
            // SAFETY: plain C structs; all-zero is valid.
            let mut iov: [libc::iovec; TX_MSGS] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; TX_MSGS] = unsafe { std::mem::zeroed() };
            let mut cmsg = [CmsgBuf([0; 32]); TX_MSGS];
            let count = self.n - done;
            for k in 0..count {
                let r = &mut self.runs[done + k];
                iov[k].iov_base = self.arena[r.start..].as_mut_ptr() as *mut libc::c_void;
                iov[k].iov_len = r.bytes;
                let h = &mut msgs[k].msg_hdr;
                h.msg_iov = &mut iov[k];
                h.msg_iovlen = 1;
                h.msg_name = &mut r.to as *mut libc::sockaddr_in as *mut libc::c_void;
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                if r.count > 1 {
                    h.msg_control = cmsg[k].0.as_mut_ptr() as *mut libc::c_void;
                    // SAFETY: CMSG_SPACE is a pure computation.
                    h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                    // SAFETY: msg_control points at 32 aligned bytes, enough for one int.
                    unsafe {
                        let c = libc::CMSG_FIRSTHDR(h);
                        (*c).cmsg_level = SOL_UDP;
                        (*c).cmsg_type = UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, r.seg as u16);
                    }
                }
            }
            // SAFETY: the first `count` mmsghdrs point at live iovecs over queued bytes of
            // `arena`, their sockaddr_in in `runs` and their control buffers in `cmsg`; all
            // outlive the call.
            let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), count as libc::c_uint, 0) };
            if r > 0 {
                for k in 0..r as usize {
                    out.sent += self.runs[done + k].count as u64;
                }
                done += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock if waits < 1000 => {
                    waits += 1;
                    std::thread::yield_now();
                }
                // The path cannot segment (no checksum offload, say): send this run's
                // packets one by one, their ICRCs rebuilt for ID 0, and stop using GSO.
                _ if self.runs[done].count > 1
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP)
                    ) =>
                {
                    self.gso = false;
                    let (sent, dropped) = self.send_one_by_one(fd, done);
                    out.sent += sent;
                    out.dropped += dropped;
                    done += 1;
                }
                // Unreachable and the like (or a buffer that stays full): drop the first
                // message; retransmission handles it.
                _ => {
                    out.dropped += self.runs[done].count as u64;
                    done += 1;
                }
            }
        }
        self.n = 0;
        self.used = 0;
        out
    }

    /// Send run `i` as separate datagrams (each then carries IP ID 0).
    fn send_one_by_one(&mut self, fd: RawFd, i: usize) -> (u64, u64) {
        use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
        let r = self.runs[i];
        let to = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(r.to.sin_addr.s_addr)),
            u16::from_be(r.to.sin_port),
        );
        let (mut sent, mut dropped) = (0, 0);
        let mut off = r.start;
        let end = r.start + r.bytes;
        while off < end {
            let len = r.seg.min(end - off);
            let pkt = &mut self.arena[off..off + len];
            let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
            Ipv4Udp::new(
                self.local,
                crate::wire::ROCE_V2_PORT,
                *to.ip(),
                to.port(),
                len,
            )
            .emit(&mut hdr);
            crate::wire::icrc::fill_v4(&hdr, pkt);
            let sa = r.to;
            // SAFETY: sendto reads `len` bytes of the arena and a live sockaddr_in.
            let n = unsafe {
                libc::sendto(
                    fd,
                    pkt.as_ptr() as *const libc::c_void,
                    len,
                    0,
                    &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if n < 0 {
                dropped += 1;
            } else {
                sent += 1;
            }
            off += len;
        }
        (sent, dropped)
    }
}
