//! The endpoint's UDP socket on port 4791 and the eventfd that wakes the progress thread.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::{Domain, Protocol, Socket, Type};

use crate::wire::ROCE_V2_PORT;

pub(crate) struct Io {
    pub socket: UdpSocket,
    wake: OwnedFd,
    stop: AtomicBool,
}

impl Io {
    /// Bind `addr:4791`. On a loopback address that is taken, try the next 127.0.0.x, so several
    /// endpoints (in one process or several) share a machine with no configuration; a `pinned`
    /// address is bound exactly or not at all.
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
                Ok(s) => return Self::finish(s),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
    }

    fn bind_one(a: Ipv4Addr) -> io::Result<Socket> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.bind(&SocketAddrV4::new(a, ROCE_V2_PORT).into())?;
        Ok(s)
    }

    fn finish(s: Socket) -> io::Result<Io> {
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
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Io {
            socket: s.into(),
            wake,
            stop: AtomicBool::new(false),
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
