//! One device address shared by any number of contexts, in any number of processes, as
//! rdma_rxe's devices are: every context binds UDP `addr:4791` with `SO_REUSEPORT`, and the
//! kernel hands each datagram to the socket of the context that owns its destination.
//!
//! * **Slots.** Each context on an address holds a slot, 1..=255: the top byte of its 24-bit
//!   QPNs and of its CM communication and SIDR request IDs (peers echo those back in REP, RTU,
//!   REJ, MRA, DREQ, DREP and SIDR_REP). A slot is held by an OFD lock on byte `slot` of the
//!   address's registry lock file, so a process that dies gives its slots back with no
//!   clean-up. A context on several addresses (its IPv4 address and its IPv6 ones, each a group
//!   of its own) holds one slot, free on all of them ([`join`]). The registry itself is a small text file replaced whole (rename) on every
//!   change, so a process that dies while writing it never leaves it torn.
//! * **Steering.** A classic-BPF program attached to the reuseport group (unprivileged,
//!   `SO_ATTACH_REUSEPORT_CBPF`) reads the UDP payload: the BTH's destination QPN selects the
//!   slot; for QP1 (connection management, shared by all) the MAD selects it: REQ and SIDR_REQ
//!   by the rdma_cm port in their Service ID (the listener's), SIDR_REP by its request ID, the
//!   others by the remote communication ID. It returns the group index of the slot's socket;
//!   anything it cannot place (a port nobody listens on) goes to a socket chosen by hash, whose
//!   CM answers as the only listener-less CM would.
//! * **Indexes.** The kernel keeps a group's sockets in an array: a new one is appended, and
//!   when one closes the last one moves into its place (`reuseport_detach_sock`). The registry
//!   mirrors that array. Joining and leaving happen under an exclusive `flock` of the lock file,
//!   and a leaving context closes its socket before it lets go of the lock, so the mirror stays
//!   exact. A process that exits normally leaves for each of its contexts in an `atexit`
//!   handler (contexts held in statics are never dropped). A context found dead (its slot lock
//!   free) is removed the way the kernel removed it; its socket left the group before its slot
//!   lock was released, because the registry fd is numbered below the socket's and an exiting
//!   process's files are released in reverse fd order.
//! * **Limits.** `SO_REUSEPORT` groups only sockets of one user: another user's process, a
//!   kernel rdma_rxe (which holds UDP 4791 on every address once loaded) or a non-sharing
//!   program makes the bind fail with `EADDRINUSE`, reported as such.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Slots per address: the top byte of a QPN (0 is QP0/QP1's).
pub(crate) const MAX_SLOTS: usize = 255;

/// Where the registries live: one file per network namespace and address, private to the
/// user.
fn registry_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("softrdma-{uid}"))
}

/// The network namespace's identity: reuseport groups are per namespace, and two namespaces
/// may both have an address (127.0.0.1 always).
fn netns_id() -> String {
    // The calling thread's namespace (a thread may have moved to one of its own, as tests do);
    // `/proc/self` would show the process's first thread's.
    std::fs::read_link("/proc/thread-self/ns/net")
        .or_else(|_| std::fs::read_link("/proc/self/ns/net"))
        .ok()
        .and_then(|p| {
            let s = p.to_string_lossy().into_owned();
            // "net:[4026531840]"
            s.strip_prefix("net:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "net".into())
}

/// One context on the address, as the registry records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub slot: u8,
    /// Its socket's index in the kernel's reuseport array.
    pub index: u32,
    /// rdma_cm ports it listens on (REQ and SIDR_REQ go there).
    pub ports: Vec<u16>,
    /// The UDP port of its forward socket on the address (0: none): datagrams for it that reach
    /// another context are handed over there (`driver::forward`).
    pub fwd: u16,
}

/// The registry's contents: the members in the kernel's array order is `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    pub members: Vec<Member>,
    /// Where the search for a free slot starts: slots are handed out round robin, so a slot
    /// (and its QPNs and CM IDs) is not reused while the old owner's peers may still send.
    pub next_slot: u8,
}

impl Layout {
    fn parse(text: &str) -> Layout {
        let mut members = Vec::new();
        let mut next_slot = 1;
        for line in text.lines() {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("m") => {}
                Some("next") => {
                    next_slot = f.next().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
                    continue;
                }
                _ => continue,
            }
            let (Some(slot), Some(index)) = (
                f.next().and_then(|s| s.parse::<u8>().ok()),
                f.next().and_then(|s| s.parse::<u32>().ok()),
            ) else {
                continue;
            };
            let mut fwd = 0;
            let mut ports = Vec::new();
            for t in f {
                match t.strip_prefix('f') {
                    Some(v) => fwd = v.parse().unwrap_or(0),
                    None => ports.extend(t.parse::<u16>().ok()),
                }
            }
            if slot != 0 {
                members.push(Member {
                    slot,
                    index,
                    ports,
                    fwd,
                });
            }
        }
        Layout { members, next_slot }
    }

    fn render(&self) -> String {
        let mut s = String::from(
            "# softrdma: contexts sharing this address (slot, reuseport index, ports)\n",
        );
        s.push_str(&format!("next {}\n", self.next_slot));
        for m in &self.members {
            s.push_str(&format!("m {} {}", m.slot, m.index));
            for p in &m.ports {
                s.push_str(&format!(" {p}"));
            }
            if m.fwd != 0 {
                s.push_str(&format!(" f{}", m.fwd));
            }
            s.push('\n');
        }
        s
    }

    /// The kernel's `reuseport_detach_sock`: the last socket moves into the leaver's index.
    fn detach(&mut self, slot: u8) {
        let Some(pos) = self.members.iter().position(|m| m.slot == slot) else {
            return;
        };
        let gone = self.members.remove(pos).index;
        let last = self.members.len() as u32;
        if let Some(m) = self.members.iter_mut().find(|m| m.index == last) {
            m.index = gone;
        }
    }

    /// The owner of rdma_cm `port`, if a member listens on it.
    pub fn port_owner(&self, port: u16) -> Option<u8> {
        self.members
            .iter()
            .find(|m| m.ports.contains(&port))
            .map(|m| m.slot)
    }
}

/// This context's place in the address's group.
pub(crate) struct Share {
    pub slot: u8,
    /// The address (port 4791; the scope of a link-local IPv6 address).
    addr: SocketAddr,
    /// The registry's lock file, open for this context alone: the OFD lock on byte `slot`
    /// says it is alive; `flock` on it guards every change.
    reg: File,
    /// The registry's contents (replaced whole on every change).
    data: PathBuf,
    /// Held (with the `flock`) by whoever changes the registry from this process: `flock`
    /// locks belong to the open file, which every thread of the process shares, so it does not
    /// keep two threads of one context (two `listen`s, or a `listen` and the progress
    /// thread's check) from changing the registry at once and losing one's change.
    busy: std::sync::Mutex<()>,
    /// The registry as last read for [`Share::fwd_port_of`].
    fwd_cache: std::sync::Mutex<Option<(Instant, Layout)>>,
}

/// How long [`Share::fwd_port_of`] trusts the registry it read.
const FWD_CACHE: Duration = Duration::from_millis(100);

/// Byte-range lock request on `slot`'s byte.
fn slot_lock(kind: libc::c_short, slot: u8) -> libc::flock {
    // SAFETY: flock is a plain C struct; all-zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = slot as libc::off_t;
    l.l_len = 1;
    l
}

fn fcntl_lock(fd: RawFd, cmd: libc::c_int, l: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `l` is a live flock structure the kernel reads (and, for GETLK, writes).
    if unsafe { libc::fcntl(fd, cmd, l as *mut libc::flock) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether some open file description holds `slot`'s lock (its context is alive).
fn slot_alive(fd: RawFd, slot: u8) -> bool {
    let mut l = slot_lock(libc::F_WRLCK as libc::c_short, slot);
    match fcntl_lock(fd, libc::F_OFD_GETLK, &mut l) {
        Ok(()) => l.l_type != libc::F_UNLCK as libc::c_short,
        // Cannot tell: keep it.
        Err(_) => true,
    }
}

/// An exclusive `flock` of the registry, released on drop. Waits at most `LOCK_WAIT` (a
/// process stopped while holding it must not hang everyone else forever).
struct Locked<'a>(&'a File);

const LOCK_WAIT: Duration = Duration::from_secs(5);

impl<'a> Locked<'a> {
    fn new(f: &'a File) -> io::Result<Locked<'a>> {
        let t0 = Instant::now();
        loop {
            // SAFETY: flock on our own open file.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Locked(f));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(e);
            }
            if t0.elapsed() > LOCK_WAIT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the softrdma device registry stayed locked",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl<'a> Locked<'a> {
    /// The lock if nobody holds it now (never waits).
    fn try_new(f: &'a File) -> Option<Locked<'a>> {
        // SAFETY: flock on our own open file.
        (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0)
            .then_some(Locked(f))
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: flock on our own open file.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn read_layout(path: &Path) -> io::Result<Layout> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Layout::parse(&s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Layout::default()),
        Err(e) => Err(e),
    }
}

/// Replace the registry's contents at once (a new file renamed over the old one): a process
/// that dies in the middle, as when it exits while a thread is leaving, leaves the old
/// contents, never a partial file.
fn write_layout(path: &Path, l: &Layout) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    // SAFETY: gettid has no preconditions.
    tmp.push(format!(".{}.{}.tmp", std::process::id(), unsafe {
        libc::gettid()
    }));
    let tmp = PathBuf::from(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(l.render().as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// How many UDP sockets of this network namespace are bound to `addr:4791`: the kernel's
/// size of the group (`/proc/net/udp` and `/proc/net/udp6` list a socket until it has left its
/// reuseport group).
fn kernel_group_size(addr: SocketAddr) -> Option<usize> {
    // The address as the kernel prints it: each __be32 read as a host-order u32, in hex.
    let (table, octets) = match addr.ip() {
        IpAddr::V4(a) => ("/proc/net/udp", a.octets().to_vec()),
        IpAddr::V6(a) => ("/proc/net/udp6", a.octets().to_vec()),
    };
    let mut want: String = octets
        .chunks(4)
        .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
        .collect();
    want.push_str(&format!(":{:04X}", crate::wire::ROCE_V2_PORT));
    // The calling thread's view of its network namespace (see `netns_id`).
    let table = std::fs::read_to_string(format!("/proc/thread-self{}", &table[5..]))
        .or_else(|_| std::fs::read_to_string(table))
        .ok()?;
    Some(
        table
            .lines()
            .skip(1)
            .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
            .count(),
    )
}

/// How long to wait for the kernel to catch up with the registry (a dead process's socket
/// that has not left the group yet).
const SETTLE_WAIT: Duration = Duration::from_millis(100);

/// Wait (holding the registry lock) until the kernel's group has as many sockets as the
/// registry has members, so that the next bind is appended where the registry says: a
/// process whose slot lock was seen free may not have had its socket released yet.
fn settle(addr: SocketAddr, members: usize) {
    settle_for(addr, members, SETTLE_WAIT)
}

fn settle_for(addr: SocketAddr, members: usize, wait: Duration) {
    let t0 = Instant::now();
    while kernel_group_size(addr).is_some_and(|n| n != members) && t0.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Remove members whose slot lock is free (their process died), as the kernel removed their
/// sockets. Returns whether anything changed.
fn prune(fd: RawFd, l: &mut Layout, me: Option<u8>) -> bool {
    let dead: Vec<u8> = l
        .members
        .iter()
        .filter(|m| Some(m.slot) != me && !slot_alive(fd, m.slot))
        .map(|m| m.slot)
        .collect();
    // Exact for one. For several found at once the kernel's order of closing is unknown:
    // highest index first is a guess that can leave two members' indexes swapped until the
    // next join or leave rewrites the steering (docs/sharing.md).
    let mut dead_by_index: Vec<(u32, u8)> = dead
        .iter()
        .filter_map(|s| {
            l.members
                .iter()
                .find(|m| m.slot == *s)
                .map(|m| (m.index, *s))
        })
        .collect();
    dead_by_index.sort_unstable_by(|a, b| b.cmp(a));
    for (_, s) in &dead_by_index {
        l.detach(*s);
    }
    !dead.is_empty()
}

impl Share {
    /// Open (creating it) the registry of `addr` in this network namespace. Open it before
    /// the socket: a process's files are released in reverse order of their fds at exit, and
    /// the socket must leave the group before the slot lock is seen free.
    pub fn open_registry(addr: SocketAddr) -> io::Result<File> {
        let dir = registry_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join(format!("{}.lock", registry_name(addr))))
    }

    /// The file holding the registry of `addr` in this network namespace.
    fn data_path(addr: SocketAddr) -> PathBuf {
        registry_dir().join(registry_name(addr))
    }

    /// Leave the group: record the kernel's move, steer for the group without us, then run
    /// `close` (which closes the socket) while still holding the registry lock.
    pub fn leave(&self, sock_fd: RawFd, close: impl FnOnce()) {
        if !at_exit::unregister(self.reg.as_raw_fd()) {
            // The process is exiting and its handler left for us.
            close();
            return;
        }
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let guard = Locked::new(&self.reg);
        if guard.is_ok() {
            if let Ok(mut layout) = read_layout(&self.data) {
                prune(self.reg.as_raw_fd(), &mut layout, Some(self.slot));
                settle(self.addr, layout.members.len());
                layout.detach(self.slot);
                let _ = self.publish(sock_fd, &layout);
            }
        }
        close();
        drop(guard);
        drop(busy);
    }

    /// Remove dead members, if any, and steer again (called now and then by the progress
    /// thread). Cheap when nothing changed: one read and one lock query per member. Never
    /// waits for the registry lock: the progress thread must keep serving its QPs, and whoever
    /// holds the lock prunes the dead as well.
    pub fn check(&self, sock_fd: RawFd) {
        let Ok(layout) = read_layout(&self.data) else {
            return;
        };
        let fd = self.reg.as_raw_fd();
        if layout
            .members
            .iter()
            .all(|m| m.slot == self.slot || slot_alive(fd, m.slot))
        {
            return;
        }
        let Ok(_busy) = self.busy.try_lock() else {
            return;
        };
        let Some(_guard) = Locked::try_new(&self.reg) else {
            return;
        };
        let Ok(mut layout) = read_layout(&self.data) else {
            return;
        };
        if prune(fd, &mut layout, Some(self.slot)) {
            // Only a brief wait here: the socket of a process found dead is normally gone.
            settle_for(self.addr, layout.members.len(), Duration::from_millis(20));
            let _ = self.publish(sock_fd, &layout);
        }
    }

    /// Read the kernel's layout of the group with probes and steer by it (this context got
    /// traffic for another one). Never waits for the registry lock. Runs on a thread of its own
    /// (`Io::resync_share_in_background`): datagrams that reach this socket meanwhile are
    /// served, those for other contexts handed over (`driver::forward`).
    pub fn resync(&self, sock_fd: RawFd) {
        let Ok(_busy) = self.busy.try_lock() else {
            return;
        };
        let Some(_guard) = Locked::try_new(&self.reg) else {
            return;
        };
        let Ok(mut layout) = read_layout(&self.data) else {
            return;
        };
        prune(self.reg.as_raw_fd(), &mut layout, Some(self.slot));
        // Our own socket is in the group: a count of 0 is a wrong view (another namespace's
        // table), and steering by it would drop every member.
        let Some(n) = kernel_group_size(self.addr).filter(|n| *n > 0) else {
            return;
        };
        if let Ok(true) = super::probe::resync(self.addr, n, &mut layout) {
            let _ = self.publish(sock_fd, &layout);
        }
    }

    /// The forward port of the context with `slot` on this address (see `driver::forward`),
    /// from the registry as read at most [`FWD_CACHE`] ago (read again when `slot` is not in
    /// it: a context that just joined).
    pub fn fwd_port_of(&self, slot: u8) -> Option<u16> {
        let mut c = self.fwd_cache.lock().unwrap_or_else(|p| p.into_inner());
        let find = |l: &Layout| l.members.iter().find(|m| m.slot == slot).map(|m| m.fwd);
        if let Some((at, l)) = c.as_ref() {
            if at.elapsed() < FWD_CACHE {
                if let Some(f) = find(l) {
                    return (f != 0).then_some(f);
                }
            }
        }
        let l = read_layout(&self.data).ok()?;
        let f = find(&l);
        *c = Some((Instant::now(), l));
        f.filter(|f| *f != 0)
    }

    /// The slot of another member that listens on rdma_cm `port` now, read from the registry
    /// (no lock: a stale answer only sends a handed-over REQ to a context that rejects it, as
    /// the kernel's hash could have).
    pub fn listener_slot(&self, port: u16) -> Option<u8> {
        read_layout(&self.data)
            .ok()?
            .port_owner(port)
            .filter(|s| *s != self.slot)
    }

    /// Change this member's rdma_cm ports under the lock and steer again. Fails with
    /// `AddrInUse` if another member (another process) listens on `port`.
    pub fn set_port(&self, sock_fd: RawFd, port: u16, listening: bool) -> io::Result<()> {
        let mut taken = false;
        self.update(sock_fd, |l| {
            if listening && l.port_owner(port).is_some_and(|s| s != self.slot) {
                taken = true;
                return;
            }
            if let Some(m) = l.members.iter_mut().find(|m| m.slot == self.slot) {
                m.ports.retain(|p| *p != port);
                if listening {
                    m.ports.push(port);
                }
            }
        })?;
        if taken {
            return Err(io::Error::from(io::ErrorKind::AddrInUse));
        }
        Ok(())
    }

    fn update(&self, sock_fd: RawFd, f: impl FnOnce(&mut Layout)) -> io::Result<()> {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let _guard = Locked::new(&self.reg)?;
        let mut layout = read_layout(&self.data)?;
        prune(self.reg.as_raw_fd(), &mut layout, Some(self.slot));
        settle(self.addr, layout.members.len());
        f(&mut layout);
        self.publish(sock_fd, &layout)
    }

    /// Write the registry and steer the group by it.
    fn publish(&self, sock_fd: RawFd, layout: &Layout) -> io::Result<()> {
        write_layout(&self.data, layout)?;
        attach(sock_fd, layout)
    }
}

/// Leaving at normal process exit, for contexts nobody drops (held in statics).
mod at_exit;
/// Joining the groups of a context's addresses with one slot.
mod join;
pub(crate) use join::Joiner;

/// A registry's name: the network namespace and the address (`4026531840-127.0.0.1`,
/// `4026531840-::1`, `4026531840-fe80::1%2` for a link-local address on interface 2).
fn registry_name(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V6(a) if a.scope_id() != 0 => {
            format!("{}-{}%{}", netns_id(), a.ip(), a.scope_id())
        }
        a => format!("{}-{}", netns_id(), a.ip()),
    }
}

/// Attach the steering program for `layout` to the group of `sock_fd`.
fn attach(sock_fd: RawFd, layout: &Layout) -> io::Result<()> {
    let prog = super::steer::program(layout);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies the program.
    let r = unsafe {
        libc::setsockopt(
            sock_fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(slot: u8, index: u32) -> Member {
        Member {
            slot,
            index,
            ports: vec![],
            fwd: 0,
        }
    }

    #[test]
    fn detach_moves_the_last_into_the_hole() {
        let mut l = Layout {
            next_slot: 1,
            members: vec![m(1, 0), m(2, 1), m(3, 2), m(4, 3)],
        };
        l.detach(2);
        assert_eq!(l.members, vec![m(1, 0), m(3, 2), m(4, 1)]);
        l.detach(4);
        assert_eq!(l.members, vec![m(1, 0), m(3, 1)]);
        l.detach(3);
        l.detach(1);
        assert!(l.members.is_empty());
    }

    #[test]
    fn layout_round_trips_through_text() {
        let l = Layout {
            next_slot: 1,
            members: vec![
                Member {
                    slot: 7,
                    index: 0,
                    ports: vec![7174, 18515],
                    fwd: 40123,
                },
                m(200, 1),
            ],
        };
        assert_eq!(Layout::parse(&l.render()), l);
        assert_eq!(l.port_owner(18515), Some(7));
        assert_eq!(l.port_owner(1), None);
        assert!(l.render().contains("m 7 0 7174 18515 f40123\n"));
        // Garbage lines are skipped.
        assert_eq!(Layout::parse("m x y\nm 0 1\nzz\n").members, vec![]);
    }
}

#[cfg(test)]
mod stress {
    use super::super::socket::Io;
    use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Join, check that a datagram for our slot reaches our socket, leave; many times, from
    /// several threads at once (the registry and the kernel's group must agree after every
    /// join and leave). Run it in several processes at once for a harder test.
    #[test]
    fn join_check_leave() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
                    let mut bad = 0;
                    for i in 0..50u8 {
                        let io = Io::bind(Some(Ipv4Addr::LOCALHOST), &[], true).unwrap();
                        let slot = io.slot();
                        // Right after joining, and again after the other threads have joined
                        // and left around us (a leave moves the last socket of the group).
                        for round in 0..2u8 {
                            // A datagram steered while another context is leaving can land in
                            // the leaver's socket (the window between attaching the new program
                            // and closing; RC retransmits): try up to three times.
                            let mut got = false;
                            for attempt in 0..3u8 {
                                let mut pkt = [0u8; 64];
                                pkt[0] = 0x04;
                                pkt[5] = slot;
                                pkt[6..10].copy_from_slice(&[t, i, round, attempt]);
                                tx.send_to(&pkt, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791))
                                    .unwrap();
                                let t0 = Instant::now();
                                let mut buf = [0u8; 128];
                                while !got && t0.elapsed() < Duration::from_millis(100) {
                                    // SAFETY: recv into a live local buffer of 128 bytes.
                                    let n = unsafe {
                                        libc::recv(
                                            io.socks[0].socket.as_raw_fd(),
                                            buf.as_mut_ptr() as *mut _,
                                            128,
                                            libc::MSG_DONTWAIT,
                                        )
                                    };
                                    got = n == 64 && buf[5] == slot && buf[6..9] == [t, i, round];
                                    if !got {
                                        std::thread::sleep(Duration::from_micros(200));
                                    }
                                }
                                if got {
                                    break;
                                }
                            }
                            if !got {
                                bad += 1;
                                eprintln!("missed: thread {t} join {i} round {round} slot {slot}");
                            }
                            std::thread::sleep(Duration::from_millis((i % 5) as u64));
                        }
                        drop(io);
                    }
                    bad
                })
            })
            .collect();
        let bad: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(bad, 0);
    }
}
