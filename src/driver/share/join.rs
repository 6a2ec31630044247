//! Joining: a context binds UDP 4791 on each of its addresses (its IPv4 address, its IPv6
//! ones) and takes one slot for all of them, since its QPNs and CM IDs carry the slot whichever
//! address a packet comes to.
//!
//! A joiner first makes sure it knows every socket in each group: the kernel's list must match
//! the registry (dead members pruned, a dying one's socket gone). A socket the registry does not
//! list is a member putting itself back after damage (it does within a round of its check), or
//! a stranger: another softrdma version or a program of its own. The joiner waits a moment for
//! the former and refuses the latter ([`ShareError::OtherVersion`]): sharing with a group it
//! cannot steer would misroute live connections.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::dir::StateDir;
use super::error::ShareError;
use super::lock::{self, Locked};
use super::registry::{Member, Names, PROTOCOL};
use super::{
    at_exit, attach, kernel, kernel_inodes, names_of, prune, read_layout, settle, write_layout,
    Held, Inner, Mine, Share, MAX_SLOTS, SETTLE_WAIT,
};

/// One address a context joins (see [`Share::join_many`]).
pub(crate) struct Joiner<'a> {
    /// The address, port 4791 (with the scope of a link-local IPv6 address).
    pub addr: SocketAddr,
    /// The address's lock file ([`Share::open_registry`]).
    pub reg: File,
    /// The socket: not yet bound, `SO_REUSEPORT` set, numbered above `reg`.
    pub sock_fd: RawFd,
    /// Binds the socket to `addr`.
    pub bind: Box<dyn FnOnce() -> io::Result<()> + 'a>,
    /// If it cannot bind, nothing is joined (else the address is left out).
    pub required: bool,
}

/// How long a joiner waits for unlisted sockets to be listed (members put themselves back
/// within a round of their 100 ms check).
const JOIN_WAIT: Duration = Duration::from_millis(1000);

/// A joined address: the share and its forward socket.
pub(crate) type Joined = (Share, Option<UnixDatagram>);

impl Share {
    /// Join the groups of several addresses with one slot, free on all of them: lock every
    /// registry (in the order of their names, so two joiners never wait for each other in a
    /// circle), make sure every socket of each group is known, claim a slot no registry has,
    /// bind each socket (the required ones first), record each bound socket and steer its slot
    /// to it. Returns one result per joiner, in order, or the error of a required joiner
    /// (nothing is joined then).
    pub fn join_many(joiners: Vec<Joiner<'_>>) -> io::Result<Vec<io::Result<Joined>>> {
        let n = joiners.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let dir = StateDir::current()?;
        let mut addrs = Vec::with_capacity(n);
        let mut regs = Vec::with_capacity(n);
        let mut fds = Vec::with_capacity(n);
        let mut binds = Vec::with_capacity(n);
        let mut required = Vec::with_capacity(n);
        for j in joiners {
            debug_assert!(j.sock_fd > j.reg.as_raw_fd());
            addrs.push(j.addr);
            regs.push(j.reg);
            fds.push(j.sock_fd);
            binds.push(Some(j.bind));
            required.push(j.required);
        }
        let names: Vec<Names> = addrs.iter().map(|a| names_of(*a)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|a, b| names[*a].data().cmp(names[*b].data()));
        // Addresses left out (a stranger in an optional one's group).
        let mut refused: Vec<Option<io::Error>> = (0..n).map(|_| None).collect();
        let t0 = Instant::now();
        let (guards, mut layouts) = loop {
            let mut guards = Vec::with_capacity(n);
            for &i in &order {
                guards.push(Locked::new(&regs[i], addrs[i])?);
            }
            let mut layouts = Vec::with_capacity(n);
            let mut unknown: Vec<Vec<u64>> = Vec::with_capacity(n);
            for i in 0..n {
                let mut l = read_layout(&dir, &names[i])?.unwrap_or_default();
                let k = kernel_inodes(addrs[i], None);
                prune(regs[i].as_raw_fd(), &mut l, None, k.as_deref());
                settle(addrs[i], &l, SETTLE_WAIT);
                let k = kernel_inodes(addrs[i], None).unwrap_or_default();
                unknown.push(
                    k.into_iter()
                        .filter(|i| !l.members.iter().any(|m| m.inode == *i))
                        .collect(),
                );
                layouts.push(l);
            }
            if unknown.iter().all(Vec::is_empty) {
                break (guards, layouts);
            }
            // A socket bound without SO_REUSEPORT (another program of this user) is no member:
            // the port is simply held.
            for i in 0..n {
                if unknown[i].is_empty() || refused[i].is_some() || !held_alone(addrs[i]) {
                    continue;
                }
                let e: io::Error = ShareError::PortHeld {
                    addr: addrs[i].ip(),
                    holder: kernel::describe_holder(addrs[i].ip()),
                }
                .into();
                if required[i] {
                    return Err(e);
                }
                refused[i] = Some(e);
                unknown[i].clear();
            }
            if unknown.iter().all(Vec::is_empty) {
                break (guards, layouts);
            }
            if t0.elapsed() >= JOIN_WAIT {
                for i in 0..n {
                    if unknown[i].is_empty() {
                        continue;
                    }
                    let e = stranger(addrs[i], &unknown[i]);
                    if required[i] {
                        return Err(e);
                    }
                    refused[i] = Some(e);
                }
                break (guards, layouts);
            }
            drop(guards);
            std::thread::sleep(Duration::from_millis(20));
        };
        let live: Vec<usize> = (0..n).filter(|i| refused[*i].is_none()).collect();
        let start = live.first().map_or(1, |i| layouts[*i].next_slot.max(1)) as usize;
        let live_regs: Vec<&File> = live.iter().map(|i| &regs[*i]).collect();
        let slot = (0..MAX_SLOTS)
            .map(|k| ((start - 1 + k) % MAX_SLOTS + 1) as u8)
            .filter(|s| live.iter().all(|i| layouts[*i].member(*s).is_none()))
            .find(|s| lock_slot_everywhere_refs(&live_regs, *s))
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrInUse))?;
        // Required sockets first: if one cannot bind, no other has joined its group yet.
        let mut bound: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
        for (i, e) in refused.iter_mut().enumerate() {
            if let Some(e) = e.take() {
                bound[i] = Some(Err(e));
            }
        }
        let by_need: Vec<usize> = live
            .iter()
            .copied()
            .filter(|i| required[*i])
            .chain(live.iter().copied().filter(|i| !required[*i]))
            .collect();
        for i in by_need {
            let r = binds[i].take().map_or(Ok(()), |b| b());
            if let Err(e) = r {
                if required[i] {
                    return Err(e);
                }
                bound[i] = Some(Err(e));
                continue;
            }
            bound[i] = Some(Ok(()));
        }
        let next = if slot as usize == MAX_SLOTS {
            1
        } else {
            slot + 1
        };
        let pid = std::process::id();
        let mut inodes = vec![0u64; n];
        for i in 0..n {
            if !matches!(bound[i], Some(Ok(()))) {
                continue;
            }
            inodes[i] = kernel::inode_of(fds[i]);
            let l = &mut layouts[i];
            l.next_slot = next;
            l.members.push(Member {
                slot,
                index: l.members.len() as u32,
                pid,
                inode: inodes[i],
                ports: Vec::new(),
            });
            if let Err(e) = write_layout(&dir, &names[i], l).and_then(|_| attach(fds[i], l)) {
                // The socket is in the kernel's group but not in the registry: the caller
                // closes it (an error here is a broken state directory).
                bound[i] = Some(Err(e));
            }
        }
        // Everything is recorded and steered: the lock can go (the slot locks stay with `reg`).
        drop(guards);
        let mut out = Vec::with_capacity(n);
        for (i, (reg, b)) in regs.into_iter().zip(bound).enumerate() {
            out.push(match b {
                Some(Ok(())) => {
                    let lock_id = dir.ident(&names[i].lock());
                    let fwd = super::super::forward::bind(&dir, &names[i].forward(slot));
                    let inner = Arc::new(Inner {
                        slot,
                        addr: addrs[i],
                        names: names[i].clone(),
                        sock_fd: fds[i],
                        inode: inodes[i],
                        held: Mutex::new(Held {
                            dir: dir.clone(),
                            reg,
                            lock_id,
                        }),
                        busy: Mutex::new(()),
                        mine: Mutex::new(Mine {
                            ports: Vec::new(),
                            index: layouts[i].member(slot).map_or(0, |m| m.index),
                            unverified: false,
                        }),
                        cache: Mutex::new(None),
                        watch: Mutex::new(Default::default()),
                        left: AtomicBool::new(false),
                    });
                    at_exit::register(&inner);
                    Ok((Share { inner }, fwd))
                }
                // Dropping `reg` gives the slot's lock in that registry back.
                Some(Err(e)) => Err(e),
                None => Err(io::Error::other("not bound")),
            });
        }
        Ok(out)
    }
}

/// Take `slot`'s lock in every registry, or in none.
fn lock_slot_everywhere_refs(regs: &[&File], slot: u8) -> bool {
    for (k, r) in regs.iter().enumerate() {
        if !lock::take_slot(r.as_raw_fd(), slot) {
            for r in &regs[..k] {
                lock::give_slot(r.as_raw_fd(), slot);
            }
            return false;
        }
    }
    true
}

/// Whether `addr`:4791 is held by a socket that does not share it: a trial socket with
/// `SO_REUSEPORT` cannot bind. (If it can, it joined the group as its last member and leaves
/// at once, which moves nobody.)
fn held_alone(addr: SocketAddr) -> bool {
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let Ok(s) = socket2::Socket::new(domain, socket2::Type::DGRAM, None) else {
        return false;
    };
    if addr.is_ipv6() {
        let _ = s.set_only_v6(true);
    }
    if s.set_reuse_port(true).is_err() {
        return false;
    }
    matches!(s.bind(&addr.into()), Err(e) if e.kind() == io::ErrorKind::AddrInUse)
}

/// The error for a group with sockets the registry does not list (`unknown`): who they are
/// and what they speak.
fn stranger(addr: SocketAddr, unknown: &[u64]) -> io::Error {
    let n = kernel::group(addr).map_or(0, |g| g.len());
    let answers = super::super::probe::identify(addr, n);
    let who: Vec<String> = unknown
        .iter()
        .map(|i| kernel::describe_process(*i))
        .collect();
    ShareError::OtherVersion {
        addr: addr.ip(),
        who: who.join(", "),
        what: super::repair::describe_protocols(&answers),
        ours: PROTOCOL,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::super::super::socket::Io;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    fn v6_loopback() -> Option<SocketAddrV6> {
        let on = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
            .is_ok_and(|s| s.trim() == "0");
        // ::1 must be bindable (IPv6 may be off on lo alone).
        (on && UdpSocket::bind("[::1]:0").is_ok())
            .then(|| SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0))
    }

    /// A datagram for `slot`, sent to `to`, reaches `sock` (retried: a leave elsewhere can
    /// misroute one for a moment).
    fn reaches(to: SocketAddr, slot: u8, sock: &UdpSocket) -> bool {
        let tx = UdpSocket::bind(SocketAddr::new(to.ip(), 0)).unwrap();
        for attempt in 0..3u8 {
            let mut pkt = [0u8; 64];
            pkt[0] = 0x04;
            pkt[5] = slot;
            pkt[8] = attempt;
            tx.send_to(&pkt, to).unwrap();
            let t0 = Instant::now();
            let mut buf = [0u8; 128];
            while t0.elapsed() < Duration::from_millis(200) {
                // SAFETY: recv into a live local buffer of 128 bytes.
                let n = unsafe {
                    libc::recv(
                        sock.as_raw_fd(),
                        buf.as_mut_ptr() as *mut _,
                        128,
                        libc::MSG_DONTWAIT,
                    )
                };
                if n == 64 && buf[5] == slot {
                    return true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        false
    }

    /// A context on 127.0.0.1 and ::1 takes one slot free on both: here slot `s` is held on
    /// ::1 alone, and the next dual-stack contexts skip it although 127.0.0.1 has it free;
    /// each address steers the context's slot to its own socket.
    #[test]
    fn one_slot_free_on_every_address() {
        let Some(v6) = v6_loopback() else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        let only_v6 = Io::bind(None, &[v6], true).unwrap();
        assert_eq!(only_v6.socks.len(), 1);
        let held = only_v6.slot();
        let both: Vec<Io> = (0..4)
            .map(|_| Io::bind(Some(Ipv4Addr::LOCALHOST), &[v6], true).unwrap())
            .collect();
        let mut slots: Vec<u8> = both.iter().map(|io| io.slot()).collect();
        assert!(!slots.contains(&held), "{held} in {slots:?}");
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 4);
        for io in &both {
            assert_eq!(io.socks.len(), 2);
            assert!(io.socks[0].local.is_ipv4() && io.socks[1].local.is_ipv6());
            for s in &io.socks {
                assert!(reaches(s.local, io.slot(), &s.socket), "{:?}", s.local);
            }
        }
        assert!(reaches(
            only_v6.socks[0].local,
            held,
            &only_v6.socks[0].socket
        ));
    }
}
