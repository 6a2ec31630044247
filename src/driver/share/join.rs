//! Joining: a context binds UDP 4791 on each of its addresses (its IPv4 address, its IPv6
//! ones) and takes one slot for all of them, since its QPNs and CM IDs carry the slot whichever
//! address a packet comes to.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use super::{
    at_exit, attach, fcntl_lock, prune, read_layout, settle, slot_lock, write_layout, Locked,
    Member, Share, MAX_SLOTS,
};

/// One address a context joins (see [`Share::join_many`]).
pub(crate) struct Joiner<'a> {
    /// The address, port 4791 (with the scope of a link-local IPv6 address).
    pub addr: SocketAddr,
    /// The address's registry ([`Share::open_registry`]).
    pub reg: File,
    /// The socket: not yet bound, `SO_REUSEPORT` set, numbered above `reg`.
    pub sock_fd: RawFd,
    /// Binds the socket to `addr`.
    pub bind: Box<dyn FnOnce() -> io::Result<()> + 'a>,
    /// If it cannot bind, nothing is joined (else the address is left out).
    pub required: bool,
    /// The port of the context's forward socket on the address (0: none).
    pub fwd: u16,
}

/// Take `slot`'s lock in every registry, or in none.
fn lock_slot_everywhere(regs: &[File], slot: u8) -> bool {
    for (k, r) in regs.iter().enumerate() {
        let mut l = slot_lock(libc::F_WRLCK as libc::c_short, slot);
        if fcntl_lock(r.as_raw_fd(), libc::F_OFD_SETLK, &mut l).is_err() {
            for r in &regs[..k] {
                let mut u = slot_lock(libc::F_UNLCK as libc::c_short, slot);
                let _ = fcntl_lock(r.as_raw_fd(), libc::F_OFD_SETLK, &mut u);
            }
            return false;
        }
    }
    true
}

impl Share {
    /// Join the groups of several addresses with one slot, free on all of them: lock every
    /// registry (in the order of their paths, so two joiners never wait for each other in a
    /// circle), claim a slot no registry has, bind each socket (the required ones first), record
    /// each bound socket's index and steer its slot to it. Returns one result per joiner, in
    /// order, or the error of a required joiner that could not bind (nothing is joined then).
    pub fn join_many(joiners: Vec<Joiner<'_>>) -> io::Result<Vec<io::Result<Share>>> {
        let n = joiners.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut addrs = Vec::with_capacity(n);
        let mut regs = Vec::with_capacity(n);
        let mut fds = Vec::with_capacity(n);
        let mut binds = Vec::with_capacity(n);
        let mut required = Vec::with_capacity(n);
        let mut fwds = Vec::with_capacity(n);
        for j in joiners {
            fwds.push(j.fwd);
            debug_assert!(j.sock_fd > j.reg.as_raw_fd());
            addrs.push(j.addr);
            regs.push(j.reg);
            fds.push(j.sock_fd);
            binds.push(Some(j.bind));
            required.push(j.required);
        }
        let datas: Vec<_> = addrs.iter().map(|a| Self::data_path(*a)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|a, b| datas[*a].cmp(&datas[*b]));
        let mut guards = Vec::with_capacity(n);
        for &i in &order {
            guards.push(Locked::new(&regs[i])?);
        }
        let mut layouts = Vec::with_capacity(n);
        for i in 0..n {
            let mut l = read_layout(&datas[i])?;
            prune(regs[i].as_raw_fd(), &mut l, None);
            settle(addrs[i], l.members.len());
            layouts.push(l);
        }
        let start = layouts.first().map_or(1, |l| l.next_slot.max(1)) as usize;
        let slot = (0..MAX_SLOTS)
            .map(|k| ((start - 1 + k) % MAX_SLOTS + 1) as u8)
            .filter(|s| {
                layouts
                    .iter()
                    .all(|l| !l.members.iter().any(|m| m.slot == *s))
            })
            .find(|s| lock_slot_everywhere(&regs, *s))
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrInUse))?;
        // Required sockets first: if one cannot bind, no other has joined its group yet.
        let mut bound: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
        let by_need: Vec<usize> = (0..n)
            .filter(|i| required[*i])
            .chain((0..n).filter(|i| !required[*i]))
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
        for i in 0..n {
            if !matches!(bound[i], Some(Ok(()))) {
                continue;
            }
            let l = &mut layouts[i];
            l.next_slot = next;
            l.members.push(Member {
                slot,
                index: l.members.len() as u32,
                ports: Vec::new(),
                fwd: fwds[i],
            });
            if let Err(e) = write_layout(&datas[i], l).and_then(|_| attach(fds[i], l)) {
                // The socket is in the kernel's group but not in the registry: the caller
                // closes it (an error here is a broken temporary directory).
                bound[i] = Some(Err(e));
            }
        }
        drop(guards);
        let mut out = Vec::with_capacity(n);
        for ((((reg, addr), data), fd), b) in
            regs.into_iter().zip(addrs).zip(datas).zip(fds).zip(bound)
        {
            out.push(match b {
                Some(Ok(())) => {
                    at_exit::register(reg.as_raw_fd(), fd, slot, data.clone());
                    Ok(Share {
                        slot,
                        addr,
                        reg,
                        data,
                        busy: std::sync::Mutex::new(()),
                        fwd_cache: std::sync::Mutex::new(None),
                    })
                }
                // Dropping `reg` gives the slot's lock in that registry back.
                Some(Err(e)) => Err(e),
                None => Err(io::Error::other("not bound")),
            });
        }
        Ok(out)
    }
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
