//! One device address shared by any number of contexts, in any number of processes of one
//! user, as rdma_rxe's devices are: every context binds UDP `addr:4791` with `SO_REUSEPORT`,
//! and the kernel hands each datagram to the socket of the context that owns it.
//!
//! * **Slots.** Each context on an address holds a slot, 1..=255: the top byte of its 24-bit
//!   QPNs and of its CM communication and SIDR request IDs (peers echo those back in REP, RTU,
//!   REJ, MRA, DREQ, DREP and SIDR_REP). A slot is held by an OFD lock on byte `slot` of the
//!   address's lock file ([`lock`]). A context on several addresses (its IPv4 address and its
//!   IPv6 ones, each a group of its own) holds one slot, free on all of them ([`join`]).
//! * **Steering.** A classic-BPF program attached to the reuseport group (unprivileged,
//!   `SO_ATTACH_REUSEPORT_CBPF`, `driver::steer`) reads the UDP payload and returns the group
//!   index of the owner's socket.
//! * **The registry** ([`registry`]) mirrors the kernel's array of the group's sockets: one
//!   line per member (slot, index, pid, socket inode, rdma_cm ports), under a version header.
//!   It lives in a directory private to the user ([`dir`]), is changed under an exclusive
//!   `flock` and replaced whole (rename) on every change. The kernel's own list of the
//!   group's sockets (`/proc/net/udp`, by inode: [`kernel`]) is the truth it is checked
//!   against: a member whose socket is gone and whose slot lock is free is dead, and a socket
//!   the registry does not list is either a member putting itself back after damage or a
//!   stranger (another softrdma version), which a joining context refuses to share with.
//! * **Indexes.** The kernel appends a new socket, and moves the last one into a leaver's
//!   place (`reuseport_detach_sock`). Joining and leaving happen under the lock, and a leaving
//!   context closes its socket before it lets go, so the mirror stays exact; a process that
//!   exits normally leaves in an `atexit` handler ([`at_exit`]); dead ones are removed the way
//!   the kernel removed them, and probes (`driver::probe`) read the layout again when in doubt.
//! * **Self-repair** ([`repair`]): every member checks its own entry, the registry's header,
//!   its lock file and the directory every 100 ms, and puts back what was damaged or deleted
//!   (with the index it last knew, verified by probes), without losing a connection.
//! * **Hand-overs** (`driver::forward`): each member has a unix datagram socket in the
//!   private directory, where others hand it datagrams the stale steering gave them.
//! * **Dead peers** ([`conns`]): a member that dies leaves its rdma_cm connections in a
//!   record; a survivor sends the DREQs in its name.
//! * **Limits.** `SO_REUSEPORT` groups only sockets of one user: another user, a kernel
//!   rdma_rxe or a non-sharing program holding the port is reported by name
//!   ([`ShareError::PortHeld`]); the device is never moved to another address.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Leaving at normal process exit, for contexts nobody drops (held in statics).
mod at_exit;
/// Connection records, for the DREQs of a dead member's connections.
pub(crate) mod conns;
/// The private state directory.
pub(crate) mod dir;
/// Errors that name what was found.
pub(crate) mod error;
/// Joining the groups of a context's addresses with one slot.
mod join;
/// What the kernel lists on port 4791.
pub(crate) mod kernel;
/// The registry's locks.
mod lock;
/// The registry's text and file names.
pub(crate) mod registry;
/// The periodic check and self-repair.
mod repair;

pub(crate) use conns::ConnRecord;
use dir::StateDir;
pub use error::ShareError;
pub(crate) use join::Joiner;
use lock::Locked;
#[cfg(test)]
pub(crate) use registry::Member;
pub(crate) use registry::{Layout, Names};

/// Slots per address: the top byte of a QPN (0 is QP0/QP1's).
pub(crate) const MAX_SLOTS: usize = 255;

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

/// The registry of `addr` in the calling thread's network namespace.
pub(crate) fn names_of(addr: SocketAddr) -> Names {
    Names::new(&netns_id(), addr)
}

/// The directory and lock file a member is registered in (both replaced by a repair).
struct Held {
    dir: Arc<StateDir>,
    reg: File,
    /// The lock file's identity when opened: another one under its name means it was
    /// deleted (and perhaps made again by someone else).
    lock_id: Option<(u64, u64)>,
}

/// What a member knows of itself, to put back after damage.
struct Mine {
    ports: Vec<u16>,
    /// Its index as last written or read.
    index: u32,
    /// The index was put back from memory and not yet confirmed by probes.
    unverified: bool,
}

impl Inner {
    /// Remove the dead from `layout` (see [`prune`]); the kernel's list of the group, if it
    /// could be read.
    fn prune_dead(&self, held: &Held, layout: &mut Layout) -> Option<Vec<u64>> {
        let kernel = kernel_inodes(self.addr, Some(self.inode));
        prune(
            held.reg.as_raw_fd(),
            layout,
            Some(self.slot),
            kernel.as_deref(),
        );
        kernel
    }

    /// Write the registry and steer the group by it.
    fn publish(&self, held: &Held, layout: &Layout) -> io::Result<()> {
        write_layout(&held.dir, &self.names, layout)?;
        attach(self.sock_fd, layout)
    }
}

/// This context's place in the address's group.
pub(crate) struct Share {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    slot: u8,
    /// The address (port 4791; the scope of a link-local IPv6 address).
    addr: SocketAddr,
    names: Names,
    sock_fd: RawFd,
    /// The socket's inode, as `/proc/net/udp` lists it.
    inode: u64,
    held: Mutex<Held>,
    /// Held (with the `flock`) by whoever changes the registry from this process: `flock`
    /// locks belong to the open file, which every thread of the process shares, so it does
    /// not keep two threads of one context (two `listen`s, or a `listen` and the progress
    /// thread's check) from changing the registry at once and losing one's change.
    busy: Mutex<()>,
    mine: Mutex<Mine>,
    /// The registry as last read, for the lookups of hand-overs ([`Share::forward_path`]).
    cache: Mutex<Option<(Instant, Layout)>>,
    /// What the periodic check tracks between rounds.
    watch: Mutex<repair::Watch>,
    /// The context left (or the process is exiting and left for it).
    left: AtomicBool,
}

/// How long [`Share::listener_slot`] and hand-over lookups trust the registry they read.
const CACHE_FOR: Duration = Duration::from_millis(100);

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Read a registry: absent is empty; damaged (`Err`) the caller rebuilds.
fn read_layout(dir: &StateDir, names: &Names) -> io::Result<Result<Layout, registry::Damaged>> {
    Ok(match dir.read(names.data())? {
        None => Ok(Layout::default()),
        Some(t) => Layout::parse(&t),
    })
}

fn write_layout(dir: &StateDir, names: &Names, l: &Layout) -> io::Result<()> {
    dir.replace(names.data(), l.render().as_bytes())
}

/// The inodes of the group's sockets (this user's: no other can be in it), if the table can be
/// read and, when `me` is given, lists it (else the view is another namespace's).
fn kernel_inodes(addr: SocketAddr, me: Option<u64>) -> Option<Vec<u64>> {
    let uid = rustix::process::geteuid().as_raw();
    let v: Vec<u64> = kernel::group(addr)?
        .into_iter()
        .filter(|s| s.uid == uid && s.inode != 0)
        .map(|s| s.inode)
        .collect();
    match me {
        Some(i) if !v.contains(&i) => None,
        _ => Some(v),
    }
}

/// Remove dead members: their slot lock is free and (when the kernel's list can be read) their
/// socket has left the group; the kernel moved the last socket into each one's place. Returns
/// the slots removed.
fn prune(reg: RawFd, l: &mut Layout, me: Option<u8>, kernel: Option<&[u64]>) -> Vec<u8> {
    let mut dead: Vec<(u32, u8)> = l
        .members
        .iter()
        .filter(|m| Some(m.slot) != me)
        .filter(|m| kernel.map_or(true, |k| !k.contains(&m.inode)))
        .filter(|m| !lock::slot_held(reg, m.slot))
        .map(|m| (m.index, m.slot))
        .collect();
    // Exact for one. For several found at once the kernel's order of closing is unknown:
    // highest index first is a guess that can leave two members' indexes swapped until a
    // probe resync (docs/sharing.md).
    dead.sort_unstable_by(|a, b| b.cmp(a));
    for (_, s) in &dead {
        l.detach(*s);
    }
    dead.into_iter().map(|(_, s)| s).collect()
}

/// How long to wait for the kernel to catch up with the registry (a dead process's socket
/// that has not left the group yet).
const SETTLE_WAIT: Duration = Duration::from_millis(100);

/// Wait (holding the registry lock) until the kernel's group has the registry's members, so
/// that the next bind is appended where the registry says.
fn settle(addr: SocketAddr, l: &Layout, wait: Duration) {
    let t0 = Instant::now();
    loop {
        let Some(k) = kernel_inodes(addr, None) else {
            return;
        };
        let same = k.len() == l.members.len() && l.members.iter().all(|m| k.contains(&m.inode));
        if same || t0.elapsed() >= wait {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
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

impl Share {
    /// Open the state directory and (creating it) the lock file of `addr`'s registry in this
    /// network namespace. Open it before the socket: a process's files are released in
    /// reverse order of their fds at exit, and the socket should leave the group before the
    /// slot lock is seen free.
    pub fn open_registry(addr: SocketAddr) -> io::Result<File> {
        let dir = StateDir::current()?;
        dir.open_rw(&names_of(addr).lock())
    }

    /// The slot that owns this context's QPNs and CM IDs.
    pub fn slot(&self) -> u8 {
        self.inner.slot
    }

    /// Leave the group: record the kernel's move, steer for the group without us, then run
    /// `close` (which closes the socket) while still holding the registry lock.
    pub fn leave(&self, close: impl FnOnce()) {
        if !at_exit::unregister(&self.inner) {
            // The process is exiting and its handler left for us.
            close();
            return;
        }
        let me = &self.inner;
        let busy = guard(&me.busy);
        let held = guard(&me.held);
        let locked = Locked::new(&held.reg, me.addr);
        if locked.is_ok() {
            if let Ok(Ok(mut layout)) = read_layout(&held.dir, &me.names) {
                me.prune_dead(&held, &mut layout);
                settle(me.addr, &layout, SETTLE_WAIT);
                layout.detach(me.slot);
                let _ = me.publish(&held, &layout);
            }
        }
        close();
        me.left.store(true, Ordering::Release);
        held.dir.remove(&me.names.forward(me.slot));
        held.dir.remove(&me.names.conns(me.slot));
        drop(locked);
        drop(held);
        drop(busy);
    }

    /// Read the kernel's layout of the group with probes and steer by it (this context got
    /// traffic for another one, or its index was put back from memory). Never waits for the
    /// registry lock. Runs on a thread of its own (`Io::resync_share_in_background`):
    /// datagrams that reach this socket meanwhile are served, those for other contexts handed
    /// over (`driver::forward`).
    pub fn resync(&self) {
        let me = &self.inner;
        let Ok(_busy) = me.busy.try_lock() else {
            return;
        };
        let held = guard(&me.held);
        let Some(_guard) = Locked::try_new(&held.reg) else {
            return;
        };
        let Ok(Ok(mut layout)) = read_layout(&held.dir, &me.names) else {
            return;
        };
        let kernel = me.prune_dead(&held, &mut layout);
        // Our own socket is in the group: a count of 0 is a wrong view (another namespace's
        // table), and steering by it would drop every member.
        let Some(n) = kernel.map(|k| k.len()).filter(|n| *n > 0) else {
            return;
        };
        if let Ok(true) = super::probe::resync(me.addr, n, &mut layout) {
            if me.publish(&held, &layout).is_ok() {
                let mut mine = guard(&me.mine);
                if let Some(m) = layout.member(me.slot) {
                    mine.index = m.index;
                }
                mine.unverified = false;
            }
        }
    }

    /// The registry as read at most [`CACHE_FOR`] ago (read again when `want` is not in it: a
    /// context that just joined).
    fn cached<R>(&self, f: impl Fn(&Layout) -> Option<R>) -> Option<R> {
        let me = &self.inner;
        // Lock order: `held` before `cache`, never both (the check holds `held` and then
        // clears the cache).
        let dir = guard(&me.held).dir.clone();
        let mut c = guard(&me.cache);
        if let Some((at, l)) = c.as_ref() {
            if at.elapsed() < CACHE_FOR {
                if let Some(r) = f(l) {
                    return Some(r);
                }
            }
        }
        let l = read_layout(&dir, &me.names).ok()?.ok()?;
        let r = f(&l);
        *c = Some((Instant::now(), l));
        r
    }

    /// Where the forward socket of the member with `slot` is (see `driver::forward`), if the
    /// registry lists it.
    pub fn forward_path(&self, slot: u8) -> Option<PathBuf> {
        let me = &self.inner;
        self.cached(|l| l.member(slot).map(|_| ()))?;
        guard(&me.held).dir.socket_path(&me.names.forward(slot))
    }

    /// The slot of another member that listens on rdma_cm `port` now, read from the registry
    /// (no lock: a stale answer only sends a handed-over REQ to a context that rejects it, as
    /// the kernel's hash could have).
    pub fn listener_slot(&self, port: u16) -> Option<u8> {
        let slot = self.inner.slot;
        self.cached(|l| l.port_owner(port)).filter(|s| *s != slot)
    }

    /// Change this member's rdma_cm ports under the lock and steer again. Fails with
    /// `AddrInUse` if another member (another process) listens on `port`.
    pub fn set_port(&self, port: u16, listening: bool) -> io::Result<()> {
        let me = &self.inner;
        let _busy = guard(&me.busy);
        let held = guard(&me.held);
        let _guard = Locked::new(&held.reg, me.addr)?;
        let mut layout = read_layout(&held.dir, &me.names)?.unwrap_or_default();
        me.prune_dead(&held, &mut layout);
        if listening && layout.port_owner(port).is_some_and(|s| s != me.slot) {
            return Err(io::Error::from(io::ErrorKind::AddrInUse));
        }
        let mut mine = guard(&me.mine);
        mine.ports.retain(|p| *p != port);
        if listening {
            mine.ports.push(port);
        }
        repair::put_self(me, &mut layout, &mut mine);
        drop(mine);
        me.publish(&held, &layout)
    }

    /// Record this member's established rdma_cm connections ([`conns`]).
    pub fn record_conns(&self, recs: &[ConnRecord]) {
        let me = &self.inner;
        let dir = guard(&me.held).dir.clone();
        let name = me.names.conns(me.slot);
        if recs.is_empty() {
            dir.remove(&name);
        } else {
            let _ = dir.replace(&name, conns::render(recs).as_bytes());
        }
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
