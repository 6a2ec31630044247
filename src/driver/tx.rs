//! The send side of one engine round: packets built in the batch's buffers get their IPv4 or
//! IPv6 header as the kernel will write it (for the ICRC and the capture) and go out of the
//! socket of their route.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

use super::batch::TxBatch;
use super::capture::Capture;
use super::engine::Stats;
use super::gids::Route;
use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use crate::wire::ipv6::{Ipv6Udp, IPV6_LEN};
use crate::wire::{icrc, ROCE_V2_PORT};

/// Where [`super::engine::Engine::flush_qp`] sends: a batch for the sockets, the capture, the
/// counters.
pub(crate) struct Tx<'a> {
    pub fds: &'a [RawFd],
    pub capture: &'a mut Option<Capture>,
    pub stats: &'a mut Stats,
    pub batch: &'a mut TxBatch,
}

impl Tx<'_> {
    /// The buffer to build the next packet in (BTH to ICRC); sends the batch first if full.
    pub fn buf(&mut self) -> &mut [u8] {
        if self.batch.is_full() {
            self.flush();
        }
        self.batch.next_buf()
    }

    /// Queue the `len` bytes built in [`Tx::buf`] along `route`, behind an IPv4 or IPv6 and
    /// UDP header as the kernel will write it (for the ICRC and the capture). No route (no
    /// peer, or no address of its family): dropped.
    pub fn commit(&mut self, len: usize, route: Option<Route>) {
        let Some(route) = route else {
            self.stats.tx_dropped += 1;
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
                Ipv4Udp {
                    id,
                    ..Ipv4Udp::new(src, ROCE_V2_PORT, *to.ip(), ROCE_V2_PORT, len)
                }
                .emit(&mut hdr);
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
                self.stats.tx_dropped += 1;
                return;
            }
        }
        self.batch.push(len, route.sock, route.to, qpn);
    }

    /// Send what is queued (`sendmmsg`, GSO runs).
    pub fn flush(&mut self) {
        let r = self.batch.flush(self.fds);
        self.stats.tx_packets += r.sent;
        self.stats.tx_dropped += r.dropped;
    }
}
