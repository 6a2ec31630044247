//! What the kernel says about UDP port 4791 of an address: which sockets are bound to it
//! (`/proc/net/udp`, `/proc/net/udp6`: every member of the reuseport group, by socket inode
//! and owner), and who holds it when softrdma cannot bind it.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, RawFd};

use super::dir::describe_uid;
use crate::wire::ROCE_V2_PORT;

/// A UDP socket bound to port 4791, as `/proc/net/udp` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelSock {
    /// The socket's inode (0: a kernel socket, as rdma_rxe's tunnel socket).
    pub inode: u64,
    pub uid: u32,
}

/// The address as the kernel prints it: each __be32 read as a host-order u32, in hex, then
/// the port.
fn proc_key(ip: IpAddr, port: u16) -> String {
    let octets: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut s: String = octets
        .chunks(4)
        .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
        .collect();
    s.push_str(&format!(":{port:04X}"));
    s
}

/// The table of the calling thread's network namespace (a thread may have moved to a
/// namespace of its own, as tests do; `/proc/self` would show the first thread's).
fn table(v6: bool) -> Option<String> {
    let t = if v6 { "udp6" } else { "udp" };
    std::fs::read_to_string(format!("/proc/thread-self/net/{t}"))
        .or_else(|_| std::fs::read_to_string(format!("/proc/net/{t}")))
        .ok()
}

/// The sockets bound to exactly `ip`:`port` (none: `Some(empty)`; no table: `None`).
pub(crate) fn bound_to(ip: IpAddr, port: u16) -> Option<Vec<KernelSock>> {
    let key = proc_key(ip, port);
    let t = table(ip.is_ipv6())?;
    Some(
        t.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.get(1) != Some(&key.as_str()) {
                    return None;
                }
                Some(KernelSock {
                    uid: f.get(7)?.parse().ok()?,
                    inode: f.get(9)?.parse().ok()?,
                })
            })
            .collect(),
    )
}

/// The members of `addr`'s group: every socket bound to its address and port 4791.
pub(crate) fn group(addr: SocketAddr) -> Option<Vec<KernelSock>> {
    bound_to(addr.ip(), ROCE_V2_PORT)
}

/// The inode of socket `fd` (what `/proc/net/udp` lists).
pub(crate) fn inode_of(fd: RawFd) -> u64 {
    // SAFETY: `fd` is a live socket of the caller's for the duration of this call.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b.as_fd()).map_or(0, |st| st.st_ino)
}

/// The process that has socket `inode` open, and its command name, if this process may see
/// it (its own user's processes; every process for root).
pub(crate) fn process_of(inode: u64) -> Option<(u32, String)> {
    if inode == 0 {
        return None;
    }
    let want = format!("socket:[{inode}]");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.trim().to_string())
                    .unwrap_or_default();
                return Some((pid, comm));
            }
        }
    }
    None
}

/// Whether process `pid` has the file `path` open (or one that was there and was deleted: a
/// member of this protocol holds its registry's lock file open).
pub(crate) fn process_has_open(pid: u32, path: &std::path::Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let want = path.to_string_lossy().into_owned();
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|l| {
            let l = l.to_string_lossy();
            l == want || l.strip_suffix(" (deleted)") == Some(want.as_str())
        })
    })
}

/// "pid 4242 (nc)", or "an unknown process" when it cannot be seen.
pub(crate) fn describe_process(inode: u64) -> String {
    match process_of(inode) {
        Some((pid, comm)) => format!("pid {pid} ({comm})"),
        None => "a process this user cannot see".into(),
    }
}

/// Who holds UDP 4791 of `ip` so that this user cannot bind it: a socket on the address
/// itself or on the wildcard address of its family (an IPv6 wildcard socket may cover IPv4
/// too). Prefers another user's socket, then a kernel one, then any.
pub(crate) fn describe_holder(ip: IpAddr) -> String {
    let me = rustix::process::geteuid().as_raw();
    let mut found: Vec<(IpAddr, KernelSock)> = Vec::new();
    let wild4: IpAddr = std::net::Ipv4Addr::UNSPECIFIED.into();
    let wild6: IpAddr = std::net::Ipv6Addr::UNSPECIFIED.into();
    let places: Vec<IpAddr> = match ip {
        IpAddr::V4(_) => vec![ip, wild4, wild6],
        IpAddr::V6(_) => vec![ip, wild6],
    };
    for p in places {
        for s in bound_to(p, ROCE_V2_PORT).unwrap_or_default() {
            found.push((p, s));
        }
    }
    let pick = found
        .iter()
        .find(|(_, s)| s.uid != me)
        .or_else(|| found.iter().find(|(_, s)| s.inode == 0))
        .or_else(|| found.first());
    match pick {
        None => "a socket this process cannot see (another network namespace's?)".into(),
        Some((at, s)) if s.inode == 0 => {
            format!("the kernel (a kernel socket on {at}:4791: rdma_rxe, or a UDP tunnel)")
        }
        Some((at, s)) => {
            let on = if *at == ip {
                String::new()
            } else {
                format!(" on {at}:4791")
            };
            let whose = if s.uid == me {
                format!(
                    "{} (you), bound without SO_REUSEPORT or not as softrdma",
                    describe_uid(s.uid)
                )
            } else {
                describe_uid(s.uid)
            };
            format!("{whose}, {}{on}", describe_process(s.inode))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn lists_a_bound_socket_with_its_inode_and_owner() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        let found = bound_to("127.0.0.1".parse().unwrap(), port).unwrap();
        let ino = inode_of(s.as_raw_fd());
        assert_eq!(
            found,
            vec![KernelSock {
                inode: ino,
                uid: rustix::process::geteuid().as_raw()
            }]
        );
        assert_eq!(process_of(ino).map(|p| p.0), Some(std::process::id()));
    }
}
