//! The endpoint's UDP socket on port 4791 and the eventfd that wakes the progress thread.

use std::io;
use std::mem::ManuallyDrop;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::{Domain, Protocol, Socket, Type};

use super::share::Share;
use crate::wire::ROCE_V2_PORT;

pub(crate) struct Io {
    /// Closed by `Drop` while the share's registry is locked (see [`Share::leave`]).
    pub socket: ManuallyDrop<UdpSocket>,
    /// The socket takes `UDP_SEGMENT`: runs of packets go out as GSO messages.
    pub gso: bool,
    /// This endpoint's place among the contexts sharing its address; `None` when sharing
    /// could not be set up (the address is then this endpoint's alone).
    share: Option<Share>,
    wake: OwnedFd,
    stop: AtomicBool,
    /// Set by the engine when traffic for another context arrived (see `resync_share`).
    pub misrouted: AtomicBool,
    last_resync: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Shortest time between two resyncs of the shared address's layout.
const RESYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

impl Io {
    /// Bind `addr:4791`, shared with every other context of this user on that address (see
    /// [`super::share`]). When the address is held by something that does not share (kernel
    /// rdma_rxe, another user), a loopback address that is not `pinned` moves to the next free
    /// 127.0.0.x; otherwise the error is `AddrInUse`.
    pub fn bind(addr: Ipv4Addr, pinned: bool) -> io::Result<Io> {
        let mut candidates = vec![addr];
        if addr.is_loopback() && !pinned {
            candidates.extend(
                (1..=254u8)
                    .map(|i| Ipv4Addr::new(127, 0, 0, i))
                    .filter(|a| *a != addr),
            );
        }
        let mut last = None;
        for a in candidates {
            match Self::bind_one(a) {
                Ok((s, share)) => return Self::finish(s, share),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
    }

    fn bind_one(a: Ipv4Addr) -> io::Result<(Socket, Option<Share>)> {
        let at = SocketAddrV4::new(a, ROCE_V2_PORT);
        // No registry (an unwritable temporary directory, say): bind alone.
        if let Ok(reg) = Share::open_registry(a) {
            let s = socket_above(reg.as_raw_fd())?;
            if s.set_reuse_port(true).is_ok() {
                // A registry that exists but fails (a lock held too long, say) is an error:
                // binding alone would lock every other sharer out of the address.
                return match Share::join(a, reg, s.as_raw_fd(), || s.bind(&at.into())) {
                    Ok(share) => Ok((s, Some(share))),
                    Err(e) => Err(e),
                };
            }
        }
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.bind(&at.into())?;
        Ok((s, None))
    }

    /// The slot that owns this endpoint's QPNs and CM IDs (their top byte): 1 when alone.
    pub fn slot(&self) -> u8 {
        self.share.as_ref().map_or(1, |s| s.slot)
    }

    /// Drop dead sharers from the steering (the progress thread calls this now and then).
    pub fn check_share(&self) {
        if let Some(s) = &self.share {
            s.check(self.socket.as_raw_fd());
        }
    }

    /// Traffic for another context reached this socket: read the group's layout again (at most
    /// every [`RESYNC_EVERY`]).
    pub fn resync_share(&self) {
        let Some(s) = &self.share else { return };
        let now = std::time::Instant::now();
        let mut last = self.last_resync.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < RESYNC_EVERY) {
            return;
        }
        *last = Some(now);
        drop(last);
        s.resync(self.socket.as_raw_fd());
    }

    /// Steer REQs and SIDR_REQs for rdma_cm `port` to this endpoint (`listening`) or stop.
    /// `AddrInUse`: another process listens on it.
    pub fn set_listening(&self, port: u16, listening: bool) -> io::Result<()> {
        match &self.share {
            Some(s) => s.set_port(self.socket.as_raw_fd(), port, listening),
            None => Ok(()),
        }
    }

    fn finish(s: Socket, share: Option<Share>) -> io::Result<Io> {
        s.set_nonblocking(true)?;
        let _ = s.set_recv_buffer_size(8 << 20);
        let _ = s.set_send_buffer_size(8 << 20);
        // DF on every datagram: Linux then writes IP ID 0, as rdma_rxe does, and the ICRC we
        // compute over the IP header matches what the peer sees (IBA A17.4.5.1).
        let v: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let gso = super::batch::gso_supported(s.as_raw_fd());
        super::batch::enable_gro(s.as_raw_fd());
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Io {
            socket: ManuallyDrop::new(s.into()),
            gso,
            share,
            wake,
            stop: AtomicBool::new(false),
            misrouted: AtomicBool::new(false),
            last_resync: std::sync::Mutex::new(None),
        })
    }

    pub fn local_addr(&self) -> Ipv4Addr {
        match self.socket.local_addr() {
            Ok(std::net::SocketAddr::V4(a)) => *a.ip(),
            _ => Ipv4Addr::UNSPECIFIED,
        }
    }

    /// Wake the progress thread (new timers may be due sooner than it planned).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    pub fn drain_wake(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe {
            libc::read(
                self.wake.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }

    pub fn wake_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// A UDP socket whose fd is above `fd` (see [`Share::open_registry`]).
fn socket_above(fd: RawFd) -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    if s.as_raw_fd() > fd {
        return Ok(s);
    }
    // SAFETY: F_DUPFD_CLOEXEC on our own socket returns a new fd we then own.
    let n = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_DUPFD_CLOEXEC, fd + 1) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` is a fresh descriptor of the same socket, owned by nothing else.
    Ok(unsafe { Socket::from_raw_fd(n) })
}

impl Drop for Io {
    fn drop(&mut self) {
        // SAFETY: `socket` is taken exactly once, here, and not used afterwards.
        let socket = unsafe { ManuallyDrop::take(&mut self.socket) };
        match self.share.take() {
            Some(share) => {
                let fd = socket.as_raw_fd();
                share.leave(fd, move || drop(socket));
            }
            None => drop(socket),
        }
    }
}
