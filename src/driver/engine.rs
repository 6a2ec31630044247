//! The engine: the driver's half of a device. It moves datagrams between the sockets and the
//! sans-IO [`Endpoint`] (receive with `recvmmsg`/GRO, send with `sendmmsg`/GSO through
//! [`Tx`]), answers the probes of the shared address's layout and hands other contexts'
//! datagrams over (`driver::forward`). Buffers are reused: no allocation per packet.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::Instant;

use super::batch::{RxBatch, TxBatch};
use super::capture::Capture;
use super::share::ConnRecord;
use super::socket::Io;
use super::tx::Tx;
use super::{forward, probe};
use crate::endpoint::error::EndpointError;
use crate::endpoint::events::AsyncQueue;
use crate::endpoint::memory::MrTable;
use crate::endpoint::receive::{Delivery, Tap};
use crate::endpoint::Endpoint;
use crate::transport::ud::NetHeader;
use crate::wire::gid::gid_to_ip;
use crate::wire::ipv4::IPV4_LEN;
use crate::wire::ipv6::IPV6_LEN;

pub use crate::endpoint::Stats;

/// Datagrams handled per receive burst before timers and transmission get a turn.
const RX_BURST: usize = 64;
/// At most this many datagrams that emptied the socket's queue end its receive at once.
const LATENCY_BURST: usize = 2;
/// Datagrams handed over per receive burst, at most (beyond: dropped, as the kernel would).
const MAX_HANDED: usize = 64;
/// How often an engine driven by a busy-polling application polls all its sockets (see
/// [`Engine::ready_sockets`]).
const FULL_POLL_EVERY: std::time::Duration = std::time::Duration::from_micros(50);
/// How often a busy engine reads its forward sockets by itself (the progress thread reads them
/// as soon as something arrives).
const FWD_CHECK: std::time::Duration = std::time::Duration::from_millis(1);
/// How often a busy application's rounds look at the CM's timers (see [`Engine::drive`]).
const CM_CHECK: std::time::Duration = std::time::Duration::from_micros(500);
/// Acknowledgements held for a busy-polling application's answer (see [`TxBatch::hold_acks`])
/// are due this long after, at the latest: a progress thread asleep on a longer timer is woken
/// for them (one standing aside sends them at its next look, see `driver::progress`).
const ACK_HOLD_MAX: std::time::Duration = std::time::Duration::from_micros(500);

/// What a [`Tx`] does with what was queued when its user is done.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flush {
    /// Send everything now.
    Now,
    /// Hold it if it is only acknowledgements, and none were held yet (a busy-polling
    /// application's round: see [`TxBatch::hold_acks`]).
    HoldAcks,
    /// Keep held acknowledgements held if nothing else was queued (a verb that posts).
    KeepHeld,
}

/// Who drives a round of [`Engine::drive`], and what it already knows of the sockets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Round {
    /// Look at every socket.
    Full,
    /// The application's busy CQ poll: see [`Engine::ready_sockets`].
    App,
    /// These sockets (bit `k`: socket `k`) were just found readable (the progress thread's
    /// wake-up and spin): read them without polling again.
    Ready(u32),
    /// A forward socket was found readable: read what other contexts handed over, and every
    /// socket.
    Forwarded,
}

pub(crate) struct Engine {
    /// The device's sans-IO endpoint (the engine dereferences to it).
    pub ep: Endpoint,
    rx: RxBatch,
    tx: TxBatch,
    capture: Option<Capture>,
    /// Answers to probes of the shared addresses' layout, sent after the receive burst out of
    /// the socket that got the probe.
    probe_answers: Vec<(usize, SocketAddr, [u8; probe::PROBE_LEN])>,
    /// Datagrams for another context's QPN arrived on these sockets (bit `k`: socket `k`):
    /// their steering is stale.
    misrouted: u32,
    /// Room for polling the sockets (see [`readable`]).
    pollfds: Vec<libc::pollfd>,
    /// The socket that last had something to read, and when all of them are next polled.
    hot: usize,
    next_full_poll: Instant,
    /// Datagrams for other contexts, to hand over after the receive burst: (socket, owner's
    /// slot, envelope); and envelopes' buffers for reuse.
    handed: Vec<(usize, u8, Vec<u8>)>,
    handed_spare: Vec<Vec<u8>>,
    /// When [`Engine::drain_forwarded`] is next due, and its receive buffer.
    next_fwd_check: Instant,
    fwd_buf: Vec<u8>,
    /// The established rdma_cm connections as last recorded for the address's other members
    /// (`share::conns`).
    recorded_conns: Vec<(u32, u32, u32, crate::cm::manager::MadAddr)>,
    /// Since when acknowledgements are held in the send batch (see [`TxBatch::hold_acks`]).
    held_at: Option<Instant>,
    /// When a busy application's round next looks at the CM's timers.
    next_cm_check: Instant,
}

impl std::ops::Deref for Engine {
    type Target = Endpoint;
    fn deref(&self) -> &Endpoint {
        &self.ep
    }
}

impl std::ops::DerefMut for Engine {
    fn deref_mut(&mut self) -> &mut Endpoint {
        &mut self.ep
    }
}

impl Engine {
    /// Whether this device sends a QP's packets in UDP GSO messages, which batch only packets
    /// of one length: its RC QPs then send a WRITE as a message per packet
    /// (`RcQp::set_split_writes`).
    pub fn batches_equal_lengths(&self) -> bool {
        self.tx.gso()
    }

    /// The engine of the endpoint `io` (its addresses, slot and GSO support).
    pub fn new(capture: Option<PathBuf>, io: &Io, node_guid: u64) -> Result<Engine, EndpointError> {
        let locals: Vec<std::net::IpAddr> = io.socks.iter().map(|s| s.local.ip()).collect();
        let capture = match capture {
            Some(p) => Some(Capture::open(&p, &locals)?),
            None => None,
        };
        let v4 = io.local_v4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        Ok(Engine {
            ep: Endpoint::new(v4, node_guid, io.slot()),
            rx: RxBatch::new(),
            tx: TxBatch::new(io.gso, v4),
            capture,
            probe_answers: Vec::with_capacity(8),
            misrouted: 0,
            pollfds: Vec::with_capacity(io.fds.len()),
            hot: 0,
            next_full_poll: Instant::now(),
            handed: Vec::new(),
            handed_spare: Vec::new(),
            next_fwd_check: Instant::now(),
            fwd_buf: Vec::new(),
            recorded_conns: Vec::new(),
            held_at: None,
            next_cm_check: Instant::now(),
        })
    }

    /// Run `f` with a [`Tx`] over the sockets, then send what it queued.
    fn with_tx<R>(
        &mut self,
        io: &Io,
        now: Instant,
        f: impl FnOnce(&mut Endpoint, &mut Tx<'_>) -> R,
    ) -> R {
        self.with_tx_as(io, now, Flush::Now, f)
    }

    /// Run `f` with a [`Tx`] over the sockets, then send what it queued, or keep it as `flush`
    /// says (see [`TxBatch::hold_acks`]).
    fn with_tx_as<R>(
        &mut self,
        io: &Io,
        now: Instant,
        flush: Flush,
        f: impl FnOnce(&mut Endpoint, &mut Tx<'_>) -> R,
    ) -> R {
        let Engine {
            ep,
            capture,
            tx,
            held_at,
            ..
        } = self;
        // A captured device sends in the order it builds, so that the capture (written as
        // packets are built) shows the wire's order.
        let may_hold = capture.is_none();
        let mut out = Tx::new(&io.fds, capture, tx);
        let r = f(ep, &mut out);
        let keep = match flush {
            Flush::Now => false,
            Flush::HoldAcks => may_hold && out.hold_acks(),
            Flush::KeepHeld => out.only_held(),
        };
        if keep {
            if held_at.is_none() {
                ep.stats.tx_acks_held += 1;
            }
            held_at.get_or_insert(now);
        } else {
            out.flush();
            *held_at = None;
        }
        ep.stats.tx_packets += out.sent;
        ep.stats.tx_dropped += out.dropped;
        r
    }

    /// One round: receive what is waiting, fire due timers, transmit and complete.
    pub fn drive(
        &mut self,
        io: &Io,
        mrs: &MrTable,
        events: &AsyncQueue,
        now: Instant,
        round: Round,
    ) {
        let ready = self.ready_sockets(io, now, round);
        for (k, sock) in io.socks.iter().enumerate() {
            if ready & (1 << k.min(31)) == 0 {
                continue;
            }
            let fd = sock.socket.as_raw_fd();
            let mut received = 0;
            while received < RX_BURST {
                // Errors (ICMP port unreachable surfaces here) end the burst; the transport's
                // timers handle what was lost.
                let n = match self.rx.recv(fd) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                self.hot = k;
                let bufs = self.rx.take_bufs();
                for i in 0..n {
                    self.on_datagram(&bufs, i, k, sock.local, mrs, now);
                }
                self.rx.put_bufs(bufs);
                received += n;
                // A datagram or two that emptied the queue is a ping-pong's: answer now rather
                // than pay a receive that would find nothing. (A stream is read until the queue
                // stays empty, so that its ACKs coalesce.)
                if self.rx.drained() && received <= LATENCY_BURST {
                    break;
                }
            }
        }
        for (k, to, a) in self.probe_answers.drain(..) {
            let _ = io.socks[k].socket.send_to(&a, to);
        }
        self.send_handed_over(io);
        if now >= self.next_fwd_check || round == Round::Forwarded {
            self.drain_forwarded(io, mrs, now);
        }
        let misrouted = std::mem::take(&mut self.misrouted);
        if misrouted != 0 {
            io.misrouted
                .fetch_or(misrouted, std::sync::atomic::Ordering::AcqRel);
            io.wake();
        }
        // The CM's timers (MAD retries, timewait, unclaimed REQs: milliseconds and more) are
        // looked at every CM_CHECK by a busy application's rounds, which come every
        // microsecond or so; any other round looks every time (the progress thread sleeps
        // until the CM's deadline and must find it due).
        self.ep.handle_qp_timeouts(now);
        if round != Round::App || now >= self.next_cm_check {
            self.next_cm_check = now + CM_CHECK;
            if self.ep.handle_cm_timeouts(now) {
                self.forward_unclaimed(io, now);
            }
        }
        if self.ep.gsi_due() {
            self.flush_gsi(io, now);
        }
        // A busy-polling application that finds its message in this round answers it next, most
        // likely: its answer goes out before the ACKs of this round (see `TxBatch::hold_acks`);
        // whatever drives or sends next sends them.
        let flush = if round == Round::App {
            Flush::HoldAcks
        } else {
            Flush::Now
        };
        self.with_tx_as(io, now, flush, |ep, out| {
            ep.transmit_dirty(&io.gids, mrs, events, now, out)
        });
    }

    /// The earliest timer of the endpoint, or when held acknowledgements are due.
    pub fn next_deadline(&self) -> Option<Instant> {
        let held = self.held_at.map(|t| t + ACK_HOLD_MAX);
        match (self.ep.next_deadline(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Acknowledgements are held for the application's answer (see [`TxBatch::hold_acks`]).
    pub fn holding(&self) -> bool {
        self.held_at.is_some()
    }

    /// Send the acknowledgements held for the application's answer, if any.
    pub fn flush_held(&mut self, io: &Io) {
        if self.held_at.is_some() {
            self.with_tx(io, Instant::now(), |_, _| ());
        }
    }

    /// Destroy QP `qpn` (what it acknowledged is sent first).
    pub fn remove_qp(&mut self, qpn: u32, io: &Io) {
        self.flush_held(io);
        self.ep.remove_qp(qpn);
    }

    /// Send for every QP that received, timed out or changed state (see
    /// [`Endpoint::transmit_dirty`]).
    pub fn flush_dirty(&mut self, io: &Io, mrs: &MrTable, events: &AsyncQueue, now: Instant) {
        self.with_tx(io, now, |ep, out| {
            ep.transmit_dirty(&io.gids, mrs, events, now, out)
        });
    }

    /// Send everything the QP has to send, and move its completions to the CQs.
    ///
    /// `keep_held`: the caller posts, so acknowledgements held by the last round stay held if
    /// the QP has nothing to send (a receive posted before the application's answer, as
    /// perftest's `*_lat` and most ping-pongs post it): the answer, or the next round, sends
    /// them. Any other verb sends them now.
    pub fn flush_qp(&mut self, qpn: u32, io: &Io, mrs: &MrTable, now: Instant, keep_held: bool) {
        let flush = if keep_held {
            Flush::KeepHeld
        } else {
            Flush::Now
        };
        self.with_tx_as(io, now, flush, |ep, out| {
            ep.transmit_qp(qpn, &io.gids, mrs, now, out)
        });
    }

    /// Deliver the CM's events (moving QPs as they say) and send its MADs; record the
    /// established connections if they changed, before the events reach the application (a
    /// process killed right after it saw ESTABLISHED leaves the record behind) and after.
    pub fn flush_gsi(&mut self, io: &Io, now: Instant) {
        self.record_conns(io);
        self.with_tx(io, now, |ep, out| ep.transmit_gsi(&io.gids, now, out));
        self.record_conns(io);
    }

    /// Record the established rdma_cm connections for the address's other members, if they
    /// changed (`share::conns`).
    fn record_conns(&mut self, io: &Io) {
        let conns = self.ep.cm_endpoint().cm.established();
        if conns == self.recorded_conns {
            return;
        }
        let recs: Vec<ConnRecord> = conns
            .iter()
            .map(
                |&(local_comm_id, remote_comm_id, remote_qpn, peer)| ConnRecord {
                    local_comm_id,
                    remote_comm_id,
                    remote_qpn,
                    peer,
                },
            )
            .collect();
        io.record_conns(&recs);
        self.recorded_conns = conns;
    }

    /// Disconnect the rdma_cm connections of dead contexts of the address in their name
    /// (`share::conns`).
    pub fn disconnect_orphans(&mut self, io: &Io, recs: &[ConnRecord], now: Instant) {
        for r in recs {
            self.ep.cm_endpoint().cm.disconnect_for_dead(
                r.peer,
                r.local_comm_id,
                r.remote_comm_id,
                r.remote_qpn,
            );
        }
        self.flush_gsi(io, now);
    }

    /// Datagram `i` of the last receive batch (its buffer `bufs`), from socket `k` (bound to
    /// `local`).
    fn on_datagram(
        &mut self,
        bufs: &[u8],
        i: usize,
        k: usize,
        local: SocketAddr,
        mrs: &MrTable,
        now: Instant,
    ) {
        let (data, from, info) = self.rx.get_in(bufs, i);
        let Some(from) = from else {
            self.ep.stats.rx_packets += 1;
            self.ep.stats.rx_malformed += 1;
            return;
        };
        // A probe of the shared address's layout (`driver::probe`), from a context on it.
        if let Some((index, nonce)) = probe::parse(data) {
            self.ep.stats.rx_packets += 1;
            if from.ip() == local.ip() && self.probe_answers.len() < self.probe_answers.capacity() {
                self.probe_answers
                    .push((k, from, probe::answer(index, self.ep.slot(), nonce)));
            }
            return;
        }
        let tap = self.capture.as_mut().map(|c| c as &mut dyn Tap);
        if let Delivery::Elsewhere { owner, net } = self
            .ep
            .handle_datagram(now, local, from, info, data, mrs, tap)
        {
            // Another context's datagram reached this socket: hand it over, and have the
            // steering read again.
            self.misrouted |= 1 << k.min(31);
            self.hand_over(k, owner, from, net, data);
        }
    }

    /// Queue `data` (from `from`, network header `net`) for the context with `owner`'s slot,
    /// sent after the receive burst ([`Engine::send_handed_over`]).
    fn hand_over(
        &mut self,
        k: usize,
        owner: u8,
        from: SocketAddr,
        net: Option<NetHeader>,
        data: &[u8],
    ) {
        if self.handed.len() >= MAX_HANDED {
            self.ep.stats.tx_dropped += 1;
            return;
        }
        let mut env = self.handed_spare.pop().unwrap_or_default();
        forward::datagram_envelope(from, net_header_bytes(net.as_ref()), data, &mut env);
        self.handed.push((k, owner, env));
    }

    /// Send the datagrams handed over to other contexts: to the owner's forward socket for the
    /// address they came to (in the user's state directory).
    fn send_handed_over(&mut self, io: &Io) {
        for (k, owner, env) in self.handed.drain(..) {
            match io.forward_to_slot(k, owner) {
                Some(to) if io.send_forward(k, &env, &to) => self.ep.stats.tx_forwarded += 1,
                _ => self.ep.stats.tx_dropped += 1,
            }
            if self.handed_spare.len() < MAX_HANDED {
                self.handed_spare.push(env);
            }
        }
    }

    /// Read what other contexts handed to this one on its forward sockets (see [`forward`]).
    /// The engine does it at most every [`FWD_CHECK`] on its own, and whenever the progress
    /// thread saw a forward socket readable.
    pub fn drain_forwarded(&mut self, io: &Io, mrs: &MrTable, now: Instant) {
        self.next_fwd_check = now + FWD_CHECK;
        let mut buf = std::mem::take(&mut self.fwd_buf);
        if buf.is_empty() {
            buf = vec![0u8; 65536];
        }
        for sock in io.socks.iter() {
            let f = sock.fwd.lock().unwrap_or_else(|p| p.into_inner());
            let Some(f) = f.as_ref() else { continue };
            for _ in 0..RX_BURST {
                let n = match forward::recv(f, &mut buf) {
                    forward::Received::Empty => break,
                    // Only a process of this user hands datagrams over.
                    forward::Received::Refused => {
                        self.ep.stats.rx_malformed += 1;
                        continue;
                    }
                    forward::Received::Envelope(n) => n,
                };
                let env = &buf[..n];
                if let Some((msrc, mad)) = forward::parse(env) {
                    self.ep.handle_forwarded_mad(now, sock.local, msrc, mad);
                    continue;
                }
                let Some((from, hdr, data)) = forward::parse_datagram(env, sock.local.is_ipv4())
                else {
                    self.ep.stats.rx_malformed += 1;
                    continue;
                };
                let net = net_header_from_bytes(hdr);
                self.ep
                    .handle_handed_over(now, sock.local, from, net, data, mrs);
            }
        }
        self.fwd_buf = buf;
    }

    /// Which sockets to read this round (bit `k`: socket `k`). An application that busy-polls
    /// its CQ drives the engine back to back, and an endpoint has a socket per address (IPv4 and
    /// `::1` on loopback): polling them all each time costs a `poll(2)` per round on top of the
    /// receive, about 0.45 µs of each hop of a ping-pong here. So such a round reads only the
    /// socket that last had traffic, and polls all of them every [`FULL_POLL_EVERY`]; a round
    /// of the progress thread (woken by any socket) polls all.
    fn ready_sockets(&mut self, io: &Io, now: Instant, round: Round) -> u32 {
        if let Round::Ready(mask) = round {
            return mask;
        }
        if io.fds.len() <= 1 {
            return u32::MAX;
        }
        if round == Round::App && now < self.next_full_poll {
            return 1 << self.hot.min(31);
        }
        self.next_full_poll = now + FULL_POLL_EVERY;
        readable(&io.fds, &mut self.pollfds)
    }

    /// Hand REQs nobody here listens for to the context (another process on the same address)
    /// that listens for them now.
    fn forward_unclaimed(&mut self, io: &Io, now: Instant) {
        let out = self
            .ep
            .cm_endpoint()
            .forward_unclaimed(now, |port, local, src| {
                io.forward_target(port, local.map(|g| gid_to_ip(&g)), gid_to_ip(&src.gid))
            });
        for ((k, to), src, mad) in out {
            if io.send_forward(k, &forward::envelope(&src, &mad), &to) {
                self.ep.stats.tx_forwarded += 1;
            } else {
                self.ep.stats.tx_dropped += 1;
            }
        }
    }
}

/// Which of the sockets `fds` have something to read (bit `k`: `fds[k]`; a socket past 31
/// shares bit 31), without waiting. One socket is simply read (a receive that finds nothing
/// costs what this check would); several are checked with one `poll`, so an endpoint with
/// IPv4 and IPv6 sockets pays one system call, not one per socket, when nothing came.
fn readable(fds: &[RawFd], pollfds: &mut Vec<libc::pollfd>) -> u32 {
    if fds.len() <= 1 {
        return u32::MAX;
    }
    pollfds.clear();
    pollfds.extend(fds.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    // SAFETY: `pollfds` is a live array of `pollfds.len()` pollfd structures.
    let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, 0) };
    if n < 0 {
        // Interrupted, say: read them all.
        return u32::MAX;
    }
    ready_mask(pollfds)
}

/// The sockets of `fds` whose last poll found them readable (bit `k`: `fds[k]`; past 31, bit
/// 31).
pub(crate) fn ready_mask(fds: &[libc::pollfd]) -> u32 {
    fds.iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |m, (k, _)| m | 1 << k.min(31))
}

/// The IP header a handed-over datagram arrived with (for a UD GRH), as bytes: 20 (IPv4),
/// 40 (IPv6) or none.
fn net_header_bytes(net: Option<&NetHeader>) -> &[u8] {
    match net {
        Some(NetHeader::V4(ip)) => ip,
        Some(NetHeader::V6(ip)) => ip,
        None => &[],
    }
}

/// The IP header of a handed-over datagram (see [`net_header_bytes`]).
fn net_header_from_bytes(h: &[u8]) -> Option<NetHeader> {
    match h.len() {
        IPV4_LEN => Some(NetHeader::V4(h.try_into().ok()?)),
        IPV6_LEN => Some(NetHeader::V6(h.try_into().ok()?)),
        _ => None,
    }
}
