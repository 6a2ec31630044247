//! Port 4791 reserved by the administrator: `softrdma holder`, run as root, hands out sockets
//! bound to `addr:4791` to the users it allows, so that on a host where 4791 is a privileged
//! port (`sysctl net.ipv4.ip_unprivileged_port_start=4792`) no other user can take it first.
//!
//! A context whose bind of `addr:4791` fails with `EACCES` asks the holder over a unix stream
//! socket ([`HOLDER_SOCKET`], or `$SOFTRDMA_HOLDER`): one line, `bind <address>`. The holder
//! knows the asker by its credentials (`SO_PEERCRED`), refuses users it was not told to serve
//! and askers in another network namespace, and otherwise makes a UDP socket **owned by the
//! asker** (created under the asker's fsuid, so it joins the asker's reuseport group and no
//! other user's), with `SO_REUSEPORT` (and `IPV6_V6ONLY`), binds it and passes it back
//! (`SCM_RIGHTS`) with the line `ok`; or answers `err <errno> <reason>`. The context then goes
//! on as if it had bound the socket itself.

use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::wire::ROCE_V2_PORT;

/// Where the holder listens by default.
pub const HOLDER_SOCKET: &str = "/run/softrdma-holder/socket";

/// The holder's socket for this process: `$SOFTRDMA_HOLDER` if set (another holder, a test's),
/// else [`HOLDER_SOCKET`].
pub(crate) fn holder_path() -> PathBuf {
    std::env::var_os("SOFTRDMA_HOLDER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(HOLDER_SOCKET), PathBuf::from)
}

/// The address as the request names it (`127.0.0.1`, `fe80::1%2`).
fn render(at: SocketAddr) -> String {
    match at {
        SocketAddr::V6(a) if a.scope_id() != 0 => format!("{}%{}", a.ip(), a.scope_id()),
        a => a.ip().to_string(),
    }
}

fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, scope) = match s.split_once('%') {
        Some((ip, z)) => (ip, z.parse().ok()?),
        None => (s, 0),
    };
    Some(match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(a) => SocketAddr::new(a.into(), ROCE_V2_PORT),
        IpAddr::V6(a) => SocketAddrV6::new(a, ROCE_V2_PORT, 0, scope).into(),
    })
}

/// Ask the holder for a socket bound to `at` (port 4791). `Err` with the holder's reason, or
/// `NotFound` if no holder answers.
pub(crate) fn request(at: SocketAddr) -> io::Result<OwnedFd> {
    let path = holder_path();
    let mut s = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no softrdma holder answers at {}: {e}", path.display()),
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // A holder that refuses may close before reading all of it: its answer still waits.
    let _ = writeln!(s, "bind {}", render(at));
    let mut buf = [0u8; 512];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let r = rustix::net::recvmsg(&s, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    let mut fd = None;
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = m {
            fd = fds.next();
        }
    }
    let line = String::from_utf8_lossy(&buf[..r.bytes]).trim().to_string();
    match (line.as_str(), fd) {
        ("ok", Some(fd)) => Ok(fd),
        _ => {
            let mut f = line.splitn(3, ' ');
            let errno = match (f.next(), f.next().and_then(|e| e.parse::<i32>().ok())) {
                (Some("err"), Some(e)) => e,
                _ => libc::EPROTO,
            };
            let why = f.next().unwrap_or(&line).to_string();
            Err(io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!("the softrdma holder at {} refused: {why}", path.display()),
            ))
        }
    }
}

/// Who may ask a holder for sockets.
#[derive(Clone, Debug, Default)]
pub struct HolderPolicy {
    /// Users served (empty: every user).
    pub users: Vec<u32>,
}

/// Serve at `path` until an error ends it (run as root). The socket's directory is made
/// root-owned 0755, the socket itself 0666: any user may ask; the policy decides.
pub fn serve(path: &Path, policy: &HolderPolicy) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    let my_ns = std::fs::read_link("/proc/thread-self/ns/net").ok();
    for conn in l.incoming() {
        let Ok(c) = conn else { continue };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
        let answer = answer(&c, policy, my_ns.as_deref());
        let (line, fd) = match answer {
            Ok(fd) => ("ok\n".to_string(), Some(fd)),
            Err((errno, why)) => (format!("err {errno} {why}\n"), None),
        };
        let _ = reply(&c, &line, fd.as_ref());
    }
    Ok(())
}

fn reply(c: &UnixStream, line: &str, fd: Option<&OwnedFd>) -> io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd.as_fd()];
        cmsg.push(SendAncillaryMessage::ScmRights(&fds));
    }
    rustix::net::sendmsg(
        c,
        &[IoSlice::new(line.as_bytes())],
        &mut cmsg,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// The socket for one request, or (errno, reason).
fn answer(
    c: &UnixStream,
    policy: &HolderPolicy,
    my_ns: Option<&Path>,
) -> Result<OwnedFd, (i32, String)> {
    // The request first: an answer sent before it was read would reach an asker still
    // writing (a broken pipe instead of the reason).
    let mut line = String::new();
    BufReader::new(io::Read::take(c, 200))
        .read_line(&mut line)
        .map_err(|e| (libc::EPROTO, format!("no request: {e}")))?;
    let cred = rustix::net::sockopt::socket_peercred(c)
        .map_err(|e| (e.raw_os_error(), "no peer credentials".to_string()))?;
    let uid = cred.uid.as_raw();
    let pid = cred.pid.as_raw_nonzero().get();
    if !policy.users.is_empty() && !policy.users.contains(&uid) {
        return Err((
            libc::EACCES,
            format!(
                "{} may not use port 4791 on this host (the holder serves {})",
                super::share::dir::describe_uid(uid),
                policy
                    .users
                    .iter()
                    .map(|u| super::share::dir::describe_uid(*u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    if my_ns.is_none() || ns.as_deref() != my_ns {
        return Err((
            libc::EXDEV,
            "the asker is in another network namespace than the holder".into(),
        ));
    }
    let at = line
        .trim()
        .strip_prefix("bind ")
        .and_then(parse_addr)
        .ok_or((libc::EINVAL, format!("bad request {:?}", line.trim())))?;
    socket_for(uid, at)
}

/// A UDP socket owned by `uid`, with `SO_REUSEPORT`, bound to `at`.
fn socket_for(uid: u32, at: SocketAddr) -> Result<OwnedFd, (i32, String)> {
    let domain = if at.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // A socket's owner is the fsuid of whoever creates it; the reuseport group it may join is
    // its owner's. Only this thread's fsuid changes, and only for the call.
    // SAFETY: setfsuid and socket have no memory-safety preconditions; the fd is checked and
    // owned below.
    let fd = unsafe {
        let old = libc::setfsuid(uid) as u32;
        let fd = libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        libc::setfsuid(old);
        fd
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err((e.raw_os_error().unwrap_or(libc::EIO), e.to_string()));
    }
    // SAFETY: `fd` is a fresh socket nothing else owns.
    let s = unsafe { socket2::Socket::from_raw_fd(fd) };
    let err = |e: io::Error| (e.raw_os_error().unwrap_or(libc::EIO), e.to_string());
    if at.is_ipv6() {
        s.set_only_v6(true).map_err(err)?;
    }
    s.set_reuse_port(true).map_err(err)?;
    if let Err(e) = s.bind(&at.into()) {
        if e.kind() == io::ErrorKind::AddrInUse {
            return Err((
                libc::EADDRINUSE,
                format!(
                    "UDP port 4791 of {} is held by {}",
                    at.ip(),
                    super::share::kernel::describe_holder(at.ip())
                ),
            ));
        }
        return Err(err(e));
    }
    Ok(OwnedFd::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_requests() {
        for a in ["127.0.0.1", "::1", "fe80::1%2", "10.1.2.3"] {
            let at = parse_addr(a).unwrap();
            assert_eq!(at.port(), ROCE_V2_PORT);
            assert_eq!(render(at), a);
        }
        assert_eq!(parse_addr("nonsense"), None);
        assert_eq!(parse_addr("fe80::1%x"), None);
    }
}
