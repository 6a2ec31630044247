//! Handing datagrams to another context on the same shared address (see [`super::share`]).
//!
//! Every context has a *forward socket* on each of its shared addresses (an ephemeral port,
//! recorded with its slot in the registry), so that another context can reach it without the
//! reuseport group's steering, by its slot alone. Two things go there:
//!
//! * **A REQ nobody listened for yet.** It reaches whichever context the kernel's hash picks;
//!   if another process starts listening on its rdma_cm port while it waits
//!   (`cm/manager/unclaimed.rs`), the context holding it sends it on to the listener, in a
//!   kind-1 envelope: 284 bytes, `ff 'S' 'R' 'P'`, two zero bytes, the kind (1), a zero byte, the
//!   MAD's source GID (16 bytes) and GSI QPN (u32), then the 256-byte MAD. The listener handles
//!   the MAD as one from its source and never hands it on.
//! * **Misrouted datagrams.** While the group's steering is stale (a context left or died and
//!   the program was not yet replaced), the kernel gives a context datagrams for another one: a
//!   QPN whose top byte is another context's slot, a CM reply whose comm ID is. The context that
//!   gets one hands it over at once to the owner's forward socket (reaching it needs no
//!   reuseport index, the very thing that is stale), in a kind-2 envelope: the 8-byte head
//!   (kind 2), the datagram's source address (16 bytes, IPv4-mapped for IPv4) and port (u16),
//!   the length of the IP header that follows (u8) and a zero byte, that header as the
//!   receiver rebuilt it (IPv4: 20 bytes, its IP ID recovered by the ICRC check; IPv6: 40; the
//!   UD GRH area shows it), then the datagram. The owner handles it as if the kernel had steered it right
//!   and never hands it on.
//!
//! A forward socket is a unix datagram socket in the user's private state directory
//! (`share::dir`: `<registry>.f<slot>`, bound and reached through the checked directory's
//! descriptor), so only processes of the same user on the same host can reach it, whatever the
//! address family; another host never can (before, it was a UDP port, and over IPv6 nothing
//! kept an off-host sender from posing as the host's own port 4791). Each envelope also carries
//! its sender's credentials (`SO_PASSCRED`), checked against this user. The datagram inside
//! passes the same checks as one from the wire: its length, its ICRC over the network header
//! it came with, and the QP's source-address check. An envelope starts as a probe does
//! (`ff 'S' 'R' 'P'`) but is longer than one, so the two never mix, and no RoCE packet starts
//! with opcode 0xff.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::unix::net::UnixDatagram;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use super::share::dir::StateDir;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::cm::mad::MAD_LEN;
use crate::cm::manager::MadAddr;

use super::probe::PROBE_MAGIC;

const KIND_MAD: u8 = 1;
const KIND_DATAGRAM: u8 = 2;
/// The kind-2 envelope's head: 8 + 16 + 2 + 2 bytes, then the network header and the datagram.
const DGRAM_HEAD: usize = 28;
/// The envelope's length.
pub(crate) const FORWARD_LEN: usize = 8 + 16 + 4 + MAD_LEN;

/// The kind-1 envelope of `mad`, from `src`.
pub(crate) fn envelope(src: &MadAddr, mad: &[u8; MAD_LEN]) -> [u8; FORWARD_LEN] {
    let mut b = [0u8; FORWARD_LEN];
    b[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    b[6] = KIND_MAD;
    b[8..24].copy_from_slice(&src.gid);
    b[24..28].copy_from_slice(&src.qpn.to_be_bytes());
    b[28..].copy_from_slice(mad);
    b
}

/// The source and MAD of an envelope, if `data` is one.
pub(crate) fn parse(data: &[u8]) -> Option<(MadAddr, &[u8])> {
    if data.len() != FORWARD_LEN || data[..4] != PROBE_MAGIC.to_be_bytes() || data[6] != KIND_MAD {
        return None;
    }
    let gid: [u8; 16] = data[8..24].try_into().ok()?;
    let qpn = u32::from_be_bytes(data[24..28].try_into().ok()?);
    Some((MadAddr { gid, qpn }, &data[28..]))
}

/// The kind-2 envelope of `data`, which came from `from` with the IP header `net`
/// (as the receiver rebuilt it), into `out` (cleared first).
pub(crate) fn datagram_envelope(from: SocketAddr, net: &[u8], data: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&PROBE_MAGIC.to_be_bytes());
    out.extend_from_slice(&[0, 0, KIND_DATAGRAM, 0]);
    let ip = match from.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&from.port().to_be_bytes());
    out.push(net.len() as u8);
    out.push(0);
    out.extend_from_slice(net);
    out.extend_from_slice(data);
}

/// A kind-2 envelope's source, network header and datagram, if `env` is one. `v4`: the
/// receiving address is IPv4 (the source is then the IPv4-mapped address's IPv4 one).
pub(crate) fn parse_datagram(env: &[u8], v4: bool) -> Option<(SocketAddr, &[u8], &[u8])> {
    if env.len() < DGRAM_HEAD || env[..4] != PROBE_MAGIC.to_be_bytes() || env[6] != KIND_DATAGRAM {
        return None;
    }
    let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(&env[8..24]).ok()?);
    let ip = match (v4, ip6.to_ipv4_mapped()) {
        (true, Some(a)) => IpAddr::V4(a),
        (false, _) => IpAddr::V6(ip6),
        (true, None) => return None,
    };
    let port = u16::from_be_bytes([env[24], env[25]]);
    let hlen = env[26] as usize;
    let net = env.get(DGRAM_HEAD..DGRAM_HEAD + hlen)?;
    let data = &env[DGRAM_HEAD + hlen..];
    Some((SocketAddr::new(ip, port), net, data))
}

/// Bind the forward socket `name` in `dir`, non-blocking, with its senders' credentials on
/// every datagram. A dead predecessor's socket of that name is removed first (the caller holds
/// its slot). `None` if it cannot be had (hand-overs to this member are then lost, and RC
/// retransmits what the stale steering misroutes).
pub(crate) fn bind(dir: &StateDir, name: &str) -> Option<UnixDatagram> {
    let path = dir.socket_path(name)?;
    dir.remove(name);
    let s = UnixDatagram::bind(&path).ok()?;
    s.set_nonblocking(true).ok()?;
    rustix::net::sockopt::set_socket_passcred(&s, true).ok()?;
    Some(s)
}

/// What [`recv`] got.
pub(crate) enum Received {
    /// Nothing waits.
    Empty,
    /// An envelope of this many bytes from a process of this user.
    Envelope(usize),
    /// A datagram from another user (or without credentials): dropped.
    Refused,
}

/// Receive one envelope from forward socket `s` into `buf`.
pub(crate) fn recv(s: &UnixDatagram, buf: &mut [u8]) -> Received {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(buf)];
    let Ok(r) = rustix::net::recvmsg(s, &mut iov, &mut cmsg, RecvFlags::DONTWAIT) else {
        return Received::Empty;
    };
    let me = rustix::process::geteuid();
    let mut ours = false;
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmCredentials(c) = m {
            ours = c.uid == me;
        }
    }
    if ours {
        Received::Envelope(r.bytes)
    } else {
        Received::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_is_no_probe() {
        let src = MadAddr {
            gid: [7; 16],
            qpn: 1,
        };
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[255] = 9;
        let e = envelope(&src, &mad);
        let (s, m) = parse(&e).expect("an envelope");
        assert_eq!((s, m), (src, &mad[..]));
        assert!(super::super::probe::parse(&e).is_none());
        assert!(parse(&e[..FORWARD_LEN - 1]).is_none());
        let mut bad = e;
        bad[6] = 0;
        assert!(parse(&bad).is_none());
    }

    #[test]
    fn datagram_envelope_round_trips() {
        let mut env = Vec::new();
        let from: SocketAddr = "10.1.2.3:49152".parse().unwrap();
        datagram_envelope(from, &[1; 20], &[9, 8, 7], &mut env);
        let (f, net, data) = parse_datagram(&env, true).expect("an envelope");
        assert_eq!((f, net, data), (from, &[1u8; 20][..], &[9u8, 8, 7][..]));
        assert!(parse_datagram(&env, false).is_some_and(|(f, ..)| f.is_ipv6()));
        assert!(parse(&env).is_none() && super::super::probe::parse(&env).is_none());
        let from6: SocketAddr = "[fd00::5]:4791".parse().unwrap();
        datagram_envelope(from6, &[2; 40], &[], &mut env);
        assert_eq!(
            parse_datagram(&env, false).map(|(f, n, _)| (f, n.len())),
            Some((from6, 40))
        );
        assert!(
            parse_datagram(&env, true).is_none(),
            "an IPv6 source on an IPv4 address"
        );
        // Truncated: the header claims more than there is.
        assert!(parse_datagram(&env[..40], false).is_none());
    }
}
