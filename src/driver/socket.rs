//! The endpoint's UDP sockets on port 4791 — one on its IPv4 address, one on each of its IPv6
//! addresses — its GID table, and the eventfd that wakes the progress thread.

use std::io;
use std::mem::ManuallyDrop;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::Mutex;

use socket2::{Domain, Protocol, Socket, Type};

use super::share::{ConnRecord, Joiner, Share, ShareError};
use crate::endpoint::gids::GidTable;
use crate::wire::ROCE_V2_PORT;

/// One bound socket of the endpoint.
pub(crate) struct Sock {
    /// Closed by `Drop` while the share's registry is locked (see [`Share::leave`]).
    pub socket: ManuallyDrop<UdpSocket>,
    /// What it is bound to: port 4791 on one address (with its scope if link-local).
    pub local: SocketAddr,
    /// Its place among the contexts sharing its address; `None` when sharing could not be set
    /// up (the address is then this endpoint's alone).
    share: Option<Share>,
    /// Where other contexts on the address hand over datagrams meant for this one that the
    /// kernel gave them (`driver::forward`): a unix socket in the user's state directory
    /// (made anew if the directory is deleted), and its fd (-1: none) for the progress thread.
    pub fwd: Mutex<Option<UnixDatagram>>,
    pub fwd_fd: AtomicI32,
}

pub(crate) struct Io {
    /// The IPv4 socket first, when there is one; then one per IPv6 address.
    pub socks: Vec<Sock>,
    /// The sockets' fds, in the same order (for batched sends).
    pub fds: Vec<RawFd>,
    /// The GID table: which local address (socket) each GID index is.
    pub gids: GidTable,
    /// Every socket takes `UDP_SEGMENT`: runs of packets go out as GSO messages.
    pub gso: bool,
    /// The slot that owns this endpoint's QPNs and CM IDs (their top byte), on every address.
    slot: u8,
    wake: OwnedFd,
    stop: AtomicBool,
    /// Set by the engine (bit `k`: socket `k`) when traffic for another context arrived (see
    /// `resync_share`).
    pub misrouted: AtomicU32,
    last_resync: std::sync::Mutex<Option<std::time::Instant>>,
    /// A resync runs ([`Io::resync_share_in_background`]).
    resyncing: AtomicBool,
}

/// Shortest time between two resyncs of the shared address's layout.
const RESYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// `IPV6_AUTOFLOWLABEL` (linux/in6.h): 0 sends flow label 0, as rdma_rxe does.
const IPV6_AUTOFLOWLABEL: libc::c_int = 70;
/// `UDP_NO_CHECK6_RX` (linux/udp.h): take IPv6 datagrams whose UDP checksum is zero. rdma_rxe
/// sends RoCEv2 over IPv6 with a zero checksum (its tunnel socket does not compute one: the
/// ICRC covers the packet), which a UDP socket otherwise drops.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// A bound socket, its address, its place in the address's group (if shared) and its forward
/// socket.
type Bound = (Socket, SocketAddr, Option<Share>, Option<UnixDatagram>);

/// A socket to bind, before binding.
struct Pending {
    socket: Socket,
    at: SocketAddr,
    /// `None`: no registry (no state directory can be made: a read-only file system, say):
    /// bind alone.
    reg: Option<std::fs::File>,
    required: bool,
}

impl Io {
    /// Bind UDP 4791 on the IPv4 address `v4` and on each IPv6 address of `v6`, each shared
    /// with every other context of this user on that address (see [`super::share`]), all with
    /// one slot. When `v4` is held by something that does not share (another user, kernel
    /// rdma_rxe, a program of its own), the error is [`ShareError::PortHeld`], naming it: the
    /// endpoint never moves to another address, which its peers would not know. An IPv6 address
    /// that cannot be bound (held, or still tentative) is left out, unless the endpoint is
    /// `pinned` or has no other address.
    pub fn bind(v4: Option<Ipv4Addr>, v6: &[SocketAddrV6], pinned: bool) -> io::Result<Io> {
        let mut want: Vec<(SocketAddr, bool)> = Vec::new();
        if let Some(a) = v4 {
            want.push((SocketAddrV4::new(a, ROCE_V2_PORT).into(), true));
        }
        for a in v6 {
            let at = SocketAddrV6::new(*a.ip(), ROCE_V2_PORT, 0, a.scope_id());
            want.push((at.into(), pinned));
        }
        let (socks, slot) = Self::bind_all(&want)?;
        Self::finish(socks, slot)
    }

    /// Bind every address of `want` (`(address, required)`), shared where a registry can be
    /// had. Fails if a required one fails, or if none could be bound.
    fn bind_all(want: &[(SocketAddr, bool)]) -> io::Result<(Vec<Bound>, u8)> {
        let mut pending = Vec::new();
        for &(at, required) in want {
            let reg = match Share::open_registry(at) {
                Ok(r) => Some(r),
                // A state directory another user could have planted is never used, nor is
                // the address then bound alone: say so.
                Err(e) => match ShareError::take(e) {
                    Ok(se) => return Err(se.into()),
                    Err(_) => None,
                },
            };
            let socket = new_socket(at, reg.as_ref().map(|r| r.as_raw_fd()))?;
            let shared = reg.is_some() && socket.set_reuse_port(true).is_ok();
            pending.push(Pending {
                socket,
                at,
                reg: if shared { reg } else { None },
                required,
            });
        }
        // Every shared address is joined at once, with one slot.
        let regs: Vec<Option<std::fs::File>> = pending.iter_mut().map(|p| p.reg.take()).collect();
        let joiners: Vec<Joiner<'_>> = pending
            .iter()
            .zip(regs)
            .filter_map(|(p, reg)| {
                let (s, at) = (&p.socket, p.at);
                Some(Joiner {
                    addr: at,
                    reg: reg?,
                    sock_fd: s.as_raw_fd(),
                    bind: Box::new(move || bind_port(s, at)),
                    required: p.required,
                })
            })
            .collect();
        let shared_at: Vec<SocketAddr> = joiners.iter().map(|j| j.addr).collect();
        let mut joined = Share::join_many(joiners)?;
        let slot = joined
            .iter()
            .find_map(|r| r.as_ref().ok().map(|(s, _)| s.slot()))
            .unwrap_or(1);
        let mut out = Vec::new();
        let mut first_err = None;
        for p in pending {
            let r = match shared_at.iter().position(|a| *a == p.at) {
                Some(k) => {
                    std::mem::replace(&mut joined[k], Err(io::Error::other("taken"))).map(Some)
                }
                None => bind_port(&p.socket, p.at).map(|_| None),
            };
            match r {
                Ok(Some((share, fwd))) => out.push((p.socket, p.at, Some(share), fwd)),
                Ok(None) => out.push((p.socket, p.at, None, None)),
                Err(e) if p.required => return Err(e),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if out.is_empty() {
            return Err(
                first_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable))
            );
        }
        Ok((out, slot))
    }

    /// The slot that owns this endpoint's QPNs and CM IDs (their top byte): 1 when alone.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// Check every share (the progress thread calls this every 100 ms): dead sharers leave
    /// the steering, damage is repaired, a lost forward socket is replaced. Returns the
    /// connections of dead sharers to disconnect in their name, and whether a resync is due
    /// (bit `k`: socket `k`).
    pub fn check_share(&self) -> (Vec<ConnRecord>, u32) {
        let mut orphans = Vec::new();
        let mut resync = 0;
        for (k, s) in self.socks.iter().enumerate() {
            let Some(share) = &s.share else { continue };
            let out = share.check();
            orphans.extend(out.orphans);
            if out.resync {
                resync |= 1 << k.min(31);
            }
            if let Some(f) = out.new_forward {
                let mut g = s.fwd.lock().unwrap_or_else(|p| p.into_inner());
                s.fwd_fd.store(f.as_raw_fd(), Ordering::Release);
                *g = Some(f);
            }
        }
        (orphans, resync)
    }

    /// Record the context's established rdma_cm connections (see `share::conns`) with the
    /// share of its first address.
    pub fn record_conns(&self, recs: &[ConnRecord]) {
        if let Some(share) = self.socks.first().and_then(|s| s.share.as_ref()) {
            share.record_conns(recs);
        }
    }

    /// [`Io::resync_share`] on a thread of its own: the probes' answers take up to 200 ms, and
    /// the progress thread must go on serving the datagrams that meanwhile reach this context
    /// (its own and those it hands over, see `driver::forward`). One at a time.
    pub fn resync_share_in_background(self: &std::sync::Arc<Self>, mask: u32) {
        if self.resyncing.swap(true, Ordering::AcqRel) {
            return;
        }
        let io = self.clone();
        let spawned = std::thread::Builder::new()
            .name("softrdma-resync".into())
            .spawn(move || {
                io.resync_share(mask);
                io.resyncing.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.resyncing.store(false, Ordering::Release);
        }
    }

    /// Traffic for another context reached the sockets of `mask` (bit `k`: socket `k`): read
    /// their groups' layout again (at most every [`RESYNC_EVERY`]).
    pub fn resync_share(&self, mask: u32) {
        let now = std::time::Instant::now();
        let mut last = self.last_resync.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < RESYNC_EVERY) {
            return;
        }
        *last = Some(now);
        drop(last);
        for (k, s) in self.socks.iter().enumerate() {
            if let (Some(share), true) = (&s.share, mask & (1 << k.min(31)) != 0) {
                share.resync();
            }
        }
    }

    /// Steer REQs and SIDR_REQs for rdma_cm `port` to this endpoint (`listening`) or stop, on
    /// the addresses an id bound to `bound` listens on: `::` every address, `0.0.0.0` the IPv4
    /// one, an address itself. `AddrInUse`: another process listens on it there.
    pub fn set_listening(&self, port: u16, listening: bool, bound: IpAddr) -> io::Result<()> {
        let covers = |local: IpAddr| match bound {
            IpAddr::V6(a) if a.is_unspecified() => true,
            IpAddr::V4(a) if a.is_unspecified() => local.is_ipv4(),
            a => a == local,
        };
        let socks: Vec<&Sock> = self.socks.iter().filter(|s| covers(s.local.ip())).collect();
        for (k, s) in socks.iter().enumerate() {
            let Some(share) = &s.share else { continue };
            if let Err(e) = share.set_port(port, listening) {
                if listening {
                    for s in &socks[..k] {
                        if let Some(share) = &s.share {
                            let _ = share.set_port(port, false);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Where to hand a REQ for rdma_cm `port` that came to the address `local` (else to the
    /// first address of `peer`'s family): the socket `k` on that address and the forward socket
    /// of the context (another process) that listens on the port now.
    pub fn forward_target(
        &self,
        port: u16,
        local: Option<IpAddr>,
        peer: IpAddr,
    ) -> Option<(usize, PathBuf)> {
        let k = match local {
            Some(ip) => self.socks.iter().position(|s| s.local.ip() == ip)?,
            None => self
                .socks
                .iter()
                .position(|s| s.local.is_ipv4() == peer.is_ipv4())?,
        };
        let slot = self.socks[k].share.as_ref()?.listener_slot(port)?;
        Some((k, self.forward_to_slot(k, slot)?))
    }

    /// Where to hand a datagram for the context with `slot` that reached socket `k`: that
    /// context's forward socket on the same address.
    pub fn forward_to_slot(&self, k: usize, slot: u8) -> Option<PathBuf> {
        self.socks.get(k)?.share.as_ref()?.forward_path(slot)
    }

    /// Send envelope `env` to the forward socket at `to` (from socket `k`'s own forward
    /// socket); false if it could not go.
    pub fn send_forward(&self, k: usize, env: &[u8], to: &PathBuf) -> bool {
        let Some(s) = self.socks.get(k) else {
            return false;
        };
        let g = s.fwd.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(f) => f.send_to(env, to).is_ok(),
            None => UnixDatagram::unbound().is_ok_and(|u| u.send_to(env, to).is_ok()),
        }
    }

    fn finish(bound: Vec<Bound>, slot: u8) -> io::Result<Io> {
        let mut socks = Vec::with_capacity(bound.len());
        let mut gso = true;
        for (s, local, share, fwd) in bound {
            setup(&s, local)?;
            gso &= super::batch::gso_supported(s.as_raw_fd());
            super::batch::enable_gro(s.as_raw_fd());
            socks.push(Sock {
                socket: ManuallyDrop::new(s.into()),
                local,
                share,
                fwd_fd: AtomicI32::new(fwd.as_ref().map_or(-1, |f| f.as_raw_fd())),
                fwd: Mutex::new(fwd),
            });
        }
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let locals: Vec<SocketAddr> = socks.iter().map(|s| s.local).collect();
        Ok(Io {
            fds: socks.iter().map(|s| s.socket.as_raw_fd()).collect(),
            gids: GidTable::new(&locals),
            socks,
            gso,
            slot,
            wake,
            stop: AtomicBool::new(false),
            misrouted: AtomicU32::new(0),
            last_resync: std::sync::Mutex::new(None),
            resyncing: AtomicBool::new(false),
        })
    }

    /// The IPv4 address the endpoint is bound to, if any.
    pub fn local_v4(&self) -> Option<Ipv4Addr> {
        self.socks.iter().find_map(|s| match s.local {
            SocketAddr::V4(a) => Some(*a.ip()),
            SocketAddr::V6(_) => None,
        })
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

/// Socket options of a bound endpoint socket.
fn setup(s: &Socket, local: SocketAddr) -> io::Result<()> {
    s.set_nonblocking(true)?;
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    let fd = s.as_raw_fd();
    match local {
        // DF on every datagram: Linux then writes IP ID 0, as rdma_rxe does, and the ICRC we
        // compute over the IP header matches what the peer sees (IBA A17.4.5.1).
        SocketAddr::V4(_) => super::batch::set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        ),
        // No fragments either (a datagram over the path MTU fails to send); flow label 0 as
        // rxe sends (the ICRC masks it anyway); rxe's zero UDP checksums taken; the header
        // fields a UD GRH shows.
        SocketAddr::V6(_) => {
            super::batch::set_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
            let _ = super::batch::set_int(fd, libc::IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0);
            super::batch::set_int(fd, libc::SOL_UDP, UDP_NO_CHECK6_RX, 1)?;
            super::batch::enable_v6_header_info(fd);
            Ok(())
        }
    }
}

/// Bind `s` to `at` (port 4791). Held by something that does not share it: the error names
/// who ([`ShareError::PortHeld`]). A privileged port here (the administrator reserved it):
/// the socket comes from the softrdma holder (`driver::holder`), in place of `s`.
fn bind_port(s: &Socket, at: SocketAddr) -> io::Result<()> {
    match s.bind(&at.into()) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(ShareError::PortHeld {
            addr: at.ip(),
            holder: super::share::kernel::describe_holder(at.ip()),
        }
        .into()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let held = super::holder::request(at).map_err(|h| ShareError::Reserved {
                addr: at.ip(),
                why: h.to_string(),
            })?;
            // The holder's socket takes the place (and the fd number) of ours.
            // SAFETY: both fds are live sockets of this process; dup3 replaces `s`'s
            // description with the holder's, atomically, keeping the number.
            if unsafe { libc::dup3(held.as_raw_fd(), s.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
        r => r,
    }
}

/// A UDP socket for `at`, its fd above `above` when given (see [`Share::open_registry`]).
fn new_socket(at: SocketAddr, above: Option<RawFd>) -> io::Result<Socket> {
    let domain = if at.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let mut s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(fd) = above.filter(|fd| s.as_raw_fd() <= *fd) {
        // SAFETY: F_DUPFD_CLOEXEC on our own socket returns a new fd we then own.
        let n = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_DUPFD_CLOEXEC, fd + 1) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `n` is a fresh descriptor of the same socket, owned by nothing else.
        s = unsafe { Socket::from_raw_fd(n) };
    }
    if at.is_ipv6() {
        s.set_only_v6(true)?;
    }
    Ok(s)
}

impl Drop for Io {
    fn drop(&mut self) {
        for s in self.socks.iter_mut().rev() {
            // SAFETY: `socket` is taken exactly once, here, and not used afterwards.
            let socket = unsafe { ManuallyDrop::take(&mut s.socket) };
            match s.share.take() {
                Some(share) => share.leave(move || drop(socket)),
                None => drop(socket),
            }
        }
    }
}
