//! Batched datagram I/O, with no allocation per datagram:
//!
//! * receive: `recvmmsg` fills up to [`RX_MSGS`] buffers in one system call; with `UDP_GRO` on
//!   the socket a buffer may hold several datagrams of one flow coalesced by the kernel (the
//!   control message gives their size), which [`RxBatch`] splits again;
//! * send: packets are built back to back in one arena; consecutive packets to one destination
//!   whose sizes allow it form one UDP GSO message (`UDP_SEGMENT`: the kernel cuts it into the
//!   datagrams again), and `sendmmsg` sends up to [`TX_MSGS`] messages in one system call.
//!
//! Datagrams go out through one of the endpoint's sockets (its IPv4 one or one per IPv6
//! address): each message names its socket, and `sendmmsg` takes each run of messages of one
//! socket.
//!
//! The ICRC covers the IPv4 Identification field (IPv6 has none). A datagram sent alone with DF set on an
//! unconnected socket carries ID 0; the kernel numbers the segments of a GSO message from its
//! ID, 0, 1, 2, … (`inet_gso_segment`), so segment `k` of a run is built with ID `k`
//! ([`TxBatch::next_id`]).

use crate::endpoint::receive::RxInfo;
use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;

use super::sockaddr::RawAddr;

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

pub(crate) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
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

/// Ask for the IPv6 header fields a UD receive's GRH shows and the socket hides: the traffic
/// class and flow label (`IPV6_FLOWINFO`) and the hop limit (`IPV6_RECVHOPLIMIT`).
pub(crate) fn enable_v6_header_info(fd: RawFd) {
    let _ = set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO, 1);
    let _ = set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1);
}

/// Control-message room for a few `int`s (UDP_GRO / UDP_SEGMENT, IPv6 flow info and hop limit).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; 128]);

/// The `recvmmsg` headers of an [`RxBatch`], built once: each message's iovec (over its slot of
/// the batch's buffer), its address room and its control buffer. Boxed, so that the pointers
/// between them stay valid when the batch moves.
struct RxHeaders {
    iov: [libc::iovec; RX_MSGS],
    msgs: [libc::mmsghdr; RX_MSGS],
    from: [RawAddr; RX_MSGS],
    cmsg: [CmsgBuf; RX_MSGS],
}

// SAFETY: the raw pointers in `iov` and `msgs` point only into memory the same `RxBatch` owns
// (this box and the heap block of its `bufs`), which moves with it between threads; they are
// used only through `&mut RxBatch`.
unsafe impl Send for RxHeaders {}

/// Receive buffers and the datagrams found in them.
pub(crate) struct RxBatch {
    bufs: Box<[u8]>,
    hdrs: Box<RxHeaders>,
    info: [RxInfo; RX_MSGS],
    /// (offset in `bufs`, length, message index) of each datagram of the last receive.
    dgrams: Vec<(u32, u32, u8)>,
    /// Messages the last receive got: fewer than [`RX_MSGS`] means the socket's queue ran empty.
    msgs: usize,
}

impl RxBatch {
    pub fn new() -> RxBatch {
        let mut bufs = vec![0u8; RX_MSGS * RX_SLOT].into_boxed_slice();
        // SAFETY: plain C structs; all-zero is valid.
        let mut hdrs: Box<RxHeaders> = Box::new(RxHeaders {
            iov: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            msgs: unsafe { std::mem::zeroed() },
            from: [RawAddr::zeroed(); RX_MSGS],
            cmsg: [CmsgBuf([0; 128]); RX_MSGS],
        });
        let h = &mut *hdrs;
        for i in 0..RX_MSGS {
            h.iov[i].iov_base = bufs[i * RX_SLOT..].as_mut_ptr() as *mut libc::c_void;
            h.iov[i].iov_len = RX_SLOT;
            let m = &mut h.msgs[i].msg_hdr;
            m.msg_iov = &mut h.iov[i];
            m.msg_iovlen = 1;
            m.msg_name = h.from[i].as_mut_ptr();
            m.msg_control = h.cmsg[i].0.as_mut_ptr() as *mut libc::c_void;
        }
        let mut b = RxBatch {
            bufs,
            hdrs,
            info: [RxInfo::default(); RX_MSGS],
            dgrams: Vec::with_capacity(RX_MSGS * GSO_MAX_SEGS),
            msgs: RX_MSGS,
        };
        b.reset_lengths();
        b
    }

    /// Give back the room the kernel shrank to what it wrote, in the messages the last receive
    /// may have filled.
    fn reset_lengths(&mut self) {
        for m in &mut self.hdrs.msgs[..self.msgs.clamp(1, RX_MSGS)] {
            m.msg_hdr.msg_namelen = RawAddr::CAPACITY;
            m.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
    }

    /// Receive what is waiting (without blocking): returns how many datagrams were found
    /// (0: nothing waits).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.dgrams.clear();
        self.reset_lengths();
        self.msgs = 0;
        debug_assert_eq!(
            self.hdrs.iov[0].iov_base as *const u8,
            self.bufs.as_ptr(),
            "the buffer lent out by take_bufs came back"
        );
        let n = loop {
            // SAFETY: every mmsghdr points at a live iovec over its own RX_SLOT bytes of
            // `bufs`, its own address room and its own control buffer (set up in `new`, all
            // owned by this batch, whose box and buffer do not move); all outlive the call.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.msgs.as_mut_ptr(),
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
        for i in 0..n {
            let m = &self.hdrs.msgs[i];
            let len = (m.msg_len as usize).min(RX_SLOT);
            let (gro, info) = control(&m.msg_hdr);
            self.info[i] = info;
            let seg = gro.filter(|s| *s > 0).unwrap_or(len);
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
        self.msgs = n;
        Ok(self.dgrams.len())
    }

    /// Whether the last [`RxBatch::recv`] emptied the socket's queue (it got fewer messages
    /// than it had room for): another receive now would most likely find nothing.
    pub fn drained(&self) -> bool {
        self.msgs < RX_MSGS
    }

    /// Datagram `i` of the last [`RxBatch::recv`]: its bytes, its sender (`None`: a family
    /// other than IPv4 and IPv6, never seen on these sockets) and its IPv6 header fields.
    /// The buffer of the last receive, lent out (no copy: a pointer moves) so that its
    /// datagrams can be read while the engine that owns this batch is changed; give it back
    /// with [`RxBatch::put_bufs`] before the next receive.
    pub fn take_bufs(&mut self) -> Box<[u8]> {
        std::mem::take(&mut self.bufs)
    }

    pub fn put_bufs(&mut self, bufs: Box<[u8]>) {
        self.bufs = bufs;
    }

    /// Datagram `i` of the last receive, in `bufs` (from [`RxBatch::take_bufs`]).
    pub fn get_in<'b>(&self, bufs: &'b [u8], i: usize) -> (&'b [u8], Option<SocketAddr>, RxInfo) {
        let (off, len, m) = self.dgrams[i];
        (
            &bufs[off as usize..][..len as usize],
            self.hdrs.from[m as usize].get(),
            self.info[m as usize],
        )
    }
}

/// What a received message's control messages say: the segment size of a coalesced message
/// (`UDP_GRO`) and the IPv6 header fields (`IPV6_FLOWINFO`, `IPV6_HOPLIMIT`).
fn control(h: &libc::msghdr) -> (Option<usize>, RxInfo) {
    let mut gro = None;
    let mut info = RxInfo::default();
    // SAFETY: `h` is a msghdr recvmmsg filled in; the CMSG macros stay within msg_control.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (SOL_UDP, UDP_GRO) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    gro = usize::try_from(v).ok();
                }
                (libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO) => {
                    // The first word of the IPv6 header without the version: big-endian.
                    let v = u32::from_be(std::ptr::read_unaligned(data as *const u32));
                    info.traffic_class = (v >> 20) as u8;
                    info.flow_label = v & 0xf_ffff;
                }
                (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    info.hop_limit = v as u8;
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    (gro, info)
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
    /// The socket it goes out of (an index into the fds given to [`TxBatch::flush`]).
    sock: u8,
    to: SocketAddr,
    raw_to: RawAddr,
    /// The destination QPN of every packet of the run.
    qpn: u32,
}

/// Packets queued for one `sendmmsg`.
pub(crate) struct TxBatch {
    arena: Box<[u8]>,
    used: usize,
    runs: [Run; TX_MSGS],
    n: usize,
    /// Whether the sockets take `UDP_SEGMENT` (else every packet is its own message).
    gso: bool,
    /// The IPv4 source address, for rebuilding ICRCs when GSO turns out not to work (an
    /// IPv6 packet's ICRC does not depend on its place in a GSO message).
    local: Ipv4Addr,
    /// The first `held` runs are acknowledgements held back by [`TxBatch::hold_acks`]: the
    /// next flush sends them after what was queued since.
    held: usize,
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
                sock: 0,
                to: SocketAddr::from(([0, 0, 0, 0], 0)),
                raw_to: RawAddr::zeroed(),
                qpn: 0,
            }; TX_MSGS],
            n: 0,
            gso,
            local,
            held: 0,
        }
    }

    /// Hold what is queued instead of sending it now, if it is nothing but RC acknowledgements
    /// (single packets, opcode ACKNOWLEDGE): the next [`TxBatch::flush`] sends them behind
    /// what is queued by then for the QPs they acknowledge (in front of anything else). A
    /// busy-polling application that just found its message usually answers at once, and its
    /// answer then reaches the peer before the ACK does instead of after it. (An ACK older than
    /// one sent before it is a duplicate the peer's completer ignores.) Never twice in a row,
    /// never an empty batch. True if something was held.
    pub fn hold_acks(&mut self) -> bool {
        if self.held > 0 || self.n == 0 {
            // Held once already: never twice (a stream of receives would hold its ACKs).
            return false;
        }
        let acks_only = self.runs[self.held..self.n].iter().all(|r| {
            r.count == 1 && self.arena[r.start] == crate::wire::opcode::Opcode::RC_ACKNOWLEDGE.0
        });
        if !acks_only {
            return false;
        }
        for r in &mut self.runs[self.held..self.n] {
            // Nothing joins a held run.
            r.closed = true;
        }
        self.held = self.n;
        true
    }

    /// Whether packets to one QP go out as UDP GSO messages (else one by one; this turns off
    /// if the kernel refuses a GSO message).
    pub fn gso(&self) -> bool {
        self.gso
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

    /// Whether the next packet, of `len` bytes to QP `qpn` at `to` out of socket `sock`, joins
    /// the last run. Only packets to one QP share a GSO message: a message that stays whole up
    /// to the receiving socket (loopback, veth) is steered to one sharer of the address by its
    /// first packet (`driver::steer`), and QP1's packets are steered by their content, so they
    /// never share. (A QP numbered below 2^16 other than QP1 is not softrdma's, whose numbers
    /// carry a slot of 1 or more in their top byte, but a kernel rxe's or a NIC's: its host's
    /// kernel receives the packets one by one whatever the sender's batching.)
    fn joins(&self, len: usize, sock: u8, to: SocketAddr, qpn: u32) -> bool {
        if !self.gso || self.n == 0 || qpn <= 1 {
            return false;
        }
        let r = &self.runs[self.n - 1];
        !r.closed
            && r.qpn == qpn
            && r.sock == sock
            && r.to == to
            && len <= r.seg
            && r.count < GSO_MAX_SEGS
            && r.bytes + len <= GSO_MAX_BYTES
    }

    /// The IPv4 ID the kernel will give the next packet, of `len` bytes to QP `qpn` at `to`
    /// out of socket `sock`: its index in its GSO message (0 alone). Build its ICRC with it,
    /// then [`TxBatch::push`] it.
    pub fn next_id(&self, len: usize, sock: u8, to: SocketAddr, qpn: u32) -> u16 {
        if self.joins(len, sock, to, qpn) {
            self.runs[self.n - 1].count as u16
        } else {
            0
        }
    }

    /// Queue the first `len` bytes of [`TxBatch::next_buf`], a packet to QP `qpn`, for `to`
    /// out of socket `sock`.
    pub fn push(&mut self, len: usize, sock: u8, to: SocketAddr, qpn: u32) {
        if self.joins(len, sock, to, qpn) {
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
                sock,
                to,
                raw_to: RawAddr::new(to),
                qpn,
            };
            self.n += 1;
        }
        self.used += len;
    }

    /// Everything queued after the held acknowledgements goes to a QP (and address) one of
    /// them acknowledges.
    fn answers_held(&self) -> bool {
        let (held, new) = self.runs[..self.n].split_at(self.held);
        new.iter().all(|r| {
            held.iter()
                .any(|h| h.qpn == r.qpn && h.to == r.to && h.sock == r.sock)
        })
    }

    /// Nothing is queued but held acknowledgements (see [`TxBatch::hold_acks`]).
    pub fn only_held(&self) -> bool {
        self.held > 0 && self.n == self.held
    }

    /// Send everything queued, each message out of its socket (`fds[sock]`). A full socket
    /// buffer is waited out (the packets are not lost to a retransmission timeout); a message
    /// the kernel refuses (unreachable) is dropped.
    pub fn flush(&mut self, fds: &[RawFd]) -> Sent {
        // Held acknowledgements go behind the answer: what was queued since, if all of it goes
        // to a QP they acknowledge (anything else, a CM message say, may depend on them).
        if self.held > 0 && self.answers_held() {
            self.runs[..self.n].rotate_left(self.held);
        }
        self.held = 0;
        let mut out = Sent::default();
        let mut done = 0;
        let mut waits = 0;
        while done < self.n {
            let sock = self.runs[done].sock;
            let Some(&fd) = fds.get(sock as usize) else {
                out.dropped += self.runs[done].count as u64;
                done += 1;
                continue;
            };
            // Only the first `count` entries are built and used: a latency round sends one or
            // two messages, and zeroing the whole arrays (6.5 KiB) cost more than building them.
            let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; TX_MSGS];
            let mut msgs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; TX_MSGS];
            let mut cmsg = [const { MaybeUninit::<CmsgBuf>::uninit() }; TX_MSGS];
            // The messages of one socket, from `done` on.
            let count = self.runs[done..self.n]
                .iter()
                .take_while(|r| r.sock == sock)
                .count();
            for k in 0..count {
                let r = &mut self.runs[done + k];
                let v = iov[k].write(libc::iovec {
                    iov_base: self.arena[r.start..].as_mut_ptr() as *mut libc::c_void,
                    iov_len: r.bytes,
                });
                // SAFETY: plain C struct; all-zero is valid (no control data, no flags).
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                let h = &mut m.msg_hdr;
                h.msg_iov = v;
                h.msg_iovlen = 1;
                h.msg_namelen = r.raw_to.len();
                h.msg_name = r.raw_to.as_mut_ptr();
                if r.count > 1 {
                    let c = cmsg[k].write(CmsgBuf([0; 128]));
                    h.msg_control = c.0.as_mut_ptr() as *mut libc::c_void;
                    // SAFETY: CMSG_SPACE is a pure computation.
                    h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                    // SAFETY: msg_control points at 128 zeroed, aligned bytes, enough for one
                    // cmsghdr and its u16.
                    unsafe {
                        let c = libc::CMSG_FIRSTHDR(h);
                        (*c).cmsg_level = SOL_UDP;
                        (*c).cmsg_type = UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, r.seg as u16);
                    }
                }
                msgs[k].write(m);
            }
            // SAFETY: the first `count` mmsghdrs are initialized (above) and point at live
            // iovecs over queued bytes of `arena`, their addresses in `runs` and their control
            // buffers in `cmsg`; all outlive the call, which reads no entry past `count`.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    msgs.as_mut_ptr() as *mut libc::mmsghdr,
                    count as libc::c_uint,
                    0,
                )
            };
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
        let mut r = self.runs[i];
        let (mut sent, mut dropped) = (0, 0);
        let mut off = r.start;
        let end = r.start + r.bytes;
        while off < end {
            let len = r.seg.min(end - off);
            let pkt = &mut self.arena[off..off + len];
            if let SocketAddr::V4(to) = r.to {
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
            }
            let namelen = r.raw_to.len();
            // SAFETY: sendto reads `len` bytes of the arena and a live address of `namelen`
            // bytes.
            let n = unsafe {
                libc::sendto(
                    fd,
                    pkt.as_ptr() as *const libc::c_void,
                    len,
                    0,
                    r.raw_to.as_mut_ptr() as *const libc::sockaddr,
                    namelen,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::opcode::Opcode;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// Queue a packet of `len` bytes whose first byte (the BTH opcode) is `op`, to `to`.
    fn queue(b: &mut TxBatch, op: Opcode, len: usize, to: SocketAddr) {
        queue_to(b, op, len, to, 0x1_0011);
    }

    fn queue_to(b: &mut TxBatch, op: Opcode, len: usize, to: SocketAddr, qpn: u32) {
        let buf = b.next_buf();
        buf[..len].fill(0);
        buf[0] = op.0;
        b.push(len, 0, to, qpn);
    }

    fn opcodes_received(rx: &UdpSocket, n: usize) -> Vec<u8> {
        let mut buf = [0u8; 64];
        (0..n)
            .map(|_| {
                let (len, _) = rx.recv_from(&mut buf).unwrap();
                assert!(len > 0);
                buf[0]
            })
            .collect()
    }

    #[test]
    fn held_acks_go_out_behind_what_is_queued_next() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let fds = [tx.as_raw_fd()];
        let mut b = TxBatch::new(false, Ipv4Addr::LOCALHOST);
        assert!(!b.hold_acks(), "nothing to hold");

        queue(&mut b, Opcode::RC_ACKNOWLEDGE, 20, to);
        assert!(b.hold_acks());
        assert!(b.only_held());
        // Held once: the next round's ACKs are not held again (a stream would starve).
        queue(&mut b, Opcode::RC_ACKNOWLEDGE, 20, to);
        assert!(!b.hold_acks());
        queue(&mut b, Opcode::RC_SEND_ONLY, 24, to);
        assert!(!b.only_held());
        let sent = b.flush(&fds);
        assert_eq!(sent.sent, 3);
        assert_eq!(
            opcodes_received(&rx, 3),
            [
                Opcode::RC_ACKNOWLEDGE.0,
                Opcode::RC_SEND_ONLY.0,
                Opcode::RC_ACKNOWLEDGE.0
            ],
            "the held ACK goes last"
        );

        // Only acknowledgements are held: a request is never reordered behind later ones.
        queue(&mut b, Opcode::RC_SEND_ONLY, 24, to);
        queue(&mut b, Opcode::RC_ACKNOWLEDGE, 20, to);
        assert!(!b.hold_acks());
        assert!(!b.only_held());
        assert_eq!(b.flush(&fds).sent, 2);
        assert_eq!(
            opcodes_received(&rx, 2),
            [Opcode::RC_SEND_ONLY.0, Opcode::RC_ACKNOWLEDGE.0]
        );
        // Only the answer (to a QP a held ACK acknowledges) overtakes them; anything else (a
        // CM message to QP1, another QP's request) may depend on them and goes behind.
        queue(&mut b, Opcode::RC_ACKNOWLEDGE, 20, to);
        assert!(b.hold_acks());
        queue_to(&mut b, Opcode::RC_SEND_ONLY, 24, to, 0x1_0012);
        assert_eq!(b.flush(&fds).sent, 2);
        assert_eq!(
            opcodes_received(&rx, 2),
            [Opcode::RC_ACKNOWLEDGE.0, Opcode::RC_SEND_ONLY.0]
        );
        // A flush with nothing new sends what is held.
        queue(&mut b, Opcode::RC_ACKNOWLEDGE, 20, to);
        assert!(b.hold_acks());
        assert_eq!(b.flush(&fds).sent, 1);
        assert!(!b.only_held());
        assert_eq!(opcodes_received(&rx, 1), [Opcode::RC_ACKNOWLEDGE.0]);
    }
}

#[cfg(test)]
mod gso_tests {
    use super::*;

    /// Runs (GSO messages) that `qpns` make, three equal packets to each in turn.
    fn runs_for(qpns: &[u32]) -> Vec<usize> {
        let to = SocketAddr::from(([127, 0, 0, 1], 4791));
        let mut b = TxBatch::new(true, Ipv4Addr::LOCALHOST);
        for &qpn in qpns {
            for _ in 0..3 {
                b.next_buf()[..100].fill(0);
                b.push(100, 0, to, qpn);
            }
        }
        b.runs[..b.n].iter().map(|r| r.count).collect()
    }

    #[test]
    fn a_qps_equal_packets_share_a_gso_message_but_qp1s_do_not() {
        // softrdma's QPs (a slot in the top byte) and a kernel rxe's or a NIC's (below 2^16).
        assert_eq!(runs_for(&[0x1_0011]), vec![3]);
        assert_eq!(runs_for(&[0x11]), vec![3]);
        // One message per QP, and QP1's packets (steered by content) each alone.
        assert_eq!(runs_for(&[0x11, 0x12]), vec![3, 3]);
        assert_eq!(runs_for(&[1]), vec![1, 1, 1]);
    }
}
