//! The send side of one engine round: packets built in the batch's buffers get their IPv4 or
//! IPv6 header as the kernel will write it (for the ICRC and the capture) and go out of the
//! socket of their route.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

use super::batch::TxBatch;
use super::capture::Capture;
use crate::endpoint::gids::Route;
use crate::endpoint::transmit::TxSink;
use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use crate::wire::ipv6::{Ipv6Udp, IPV6_LEN};
use crate::wire::{icrc, ROCE_V2_PORT};

/// The driver's [`TxSink`]: a batch for the sockets, the capture, and what was sent and dropped
/// (for the endpoint's counters).
pub(crate) struct Tx<'a> {
    fds: &'a [RawFd],
    capture: &'a mut Option<Capture>,
    batch: &'a mut TxBatch,
    pub sent: u64,
    pub dropped: u64,
}

impl<'a> Tx<'a> {
    pub fn new(fds: &'a [RawFd], capture: &'a mut Option<Capture>, batch: &'a mut TxBatch) -> Self {
        Tx {
            fds,
            capture,
            batch,
            sent: 0,
            dropped: 0,
        }
    }

    /// Send what is queued (`sendmmsg`, GSO runs).
    pub fn flush(&mut self) {
        let r = self.batch.flush(self.fds);
        self.sent += r.sent;
        self.dropped += r.dropped;
    }
}

impl Tx<'_> {
    /// Keep what is queued for the next flush if it is only acknowledgements (see
    /// [`TxBatch::hold_acks`]).
    pub fn hold_acks(&mut self) -> bool {
        self.batch.hold_acks()
    }

    /// Nothing new was queued since acknowledgements were held.
    pub fn only_held(&self) -> bool {
        self.batch.only_held()
    }
}

impl TxSink for Tx<'_> {
    /// The buffer to build the next packet in (BTH to ICRC); sends the batch first if full.
    fn buf(&mut self) -> &mut [u8] {
        if self.batch.is_full() {
            self.flush();
        }
        self.batch.next_buf()
    }

    /// Queue the `len` bytes built in [`TxSink::buf`] along `route`, behind an IPv4 or IPv6 and
    /// UDP header as the kernel will write it (for the ICRC and the capture). No route (no
    /// peer, or no address of its family): dropped.
    fn commit(&mut self, len: usize, route: Option<Route>) {
        let Some(route) = route else {
            self.dropped += 1;
            return;
        };
        let pkt = &mut self.batch.next_buf()[..len];
        let qpn = match pkt.get(5..8) {
            Some(q) => u32::from_be_bytes([0, q[0], q[1], q[2]]),
            None => 1,
        };
        match (route.from, route.to) {
            (IpAddr::V4(src), SocketAddr::V4(to)) => {
                let id = self.batch.next_id(len, route.sock, route.to, qpn);
                let pkt = &mut self.batch.next_buf()[..len];
                let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
                let ip = Ipv4Udp {
                    id,
                    ..Ipv4Udp::new(src, ROCE_V2_PORT, *to.ip(), ROCE_V2_PORT, len)
                };
                if self.capture.is_some() {
                    ip.emit(&mut hdr);
                } else {
                    ip.emit_no_checksum(&mut hdr);
                }
                icrc::fill_v4(&hdr, pkt);
                if let Some(c) = self.capture {
                    c.record(&hdr, pkt, false);
                }
            }
            (IpAddr::V6(src), SocketAddr::V6(to)) => {
                let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
                Ipv6Udp::new(src, ROCE_V2_PORT, *to.ip(), ROCE_V2_PORT, len).emit(&mut hdr);
                icrc::fill_v6(&hdr, pkt);
                if let Some(c) = self.capture {
                    c.record_v6(&hdr, pkt, false);
                }
            }
            _ => {
                self.dropped += 1;
                return;
            }
        }
        self.batch.push(len, route.sock, route.to, qpn);
    }
}
