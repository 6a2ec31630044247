//! The receive side of the endpoint: a datagram's length and ICRC are checked (recovering the
//! IPv4 ID the socket hides), then it goes to QP1's CM or to its QP, which is fed it with the
//! memory of its protection domain; one for another context on the same address is given back
//! to the driver to hand over.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::memory::MrTable;
use super::qp::QpTransport;
use super::{Endpoint, GSI_QPN};
use crate::cm::endpoint::mad_owner;
use crate::cm::manager::MadAddr;
use crate::transport::ud::{net_header_v4, NetHeader};
use crate::transport::AddressVector;
use crate::wire::gid::{gid_from_ip, gid_to_ip};
use crate::wire::ipv4::{Ipv4Udp, IPV4_LEN, UDP_LEN};
use crate::wire::ipv6::{Ipv6Udp, IPV6_LEN};
use crate::wire::packet::possible_len;
use crate::wire::{icrc, Packet, ROCE_V2_PORT};

/// What a received datagram's control messages told about its IPv6 header (zero over IPv4).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct RxInfo {
    pub traffic_class: u8,
    pub flow_label: u32,
    /// 0 when the kernel did not say.
    pub hop_limit: u8,
}

/// Sees every datagram whose network header was rebuilt, as it arrived (packet capture).
pub(crate) trait Tap {
    /// `ip_udp`: the IPv4 (20 bytes) or IPv6 (40) and UDP headers; `payload`: BTH to ICRC.
    fn record(&mut self, ip_udp: &[u8], payload: &[u8], received: bool);
}

/// What became of a datagram.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// Taken (or dropped, and counted).
    Done,
    /// For the context in slot `owner` of the same address (its QPN's or CM ID's top byte):
    /// the driver hands it over, with the network header it arrived with.
    Elsewhere { owner: u8, net: Option<NetHeader> },
}

impl Endpoint {
    /// A datagram `data` (BTH to ICRC) from `from` to the local address `local`; `info`: what
    /// the socket said of its IPv6 header. Checked, then delivered.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        local: SocketAddr,
        from: SocketAddr,
        info: RxInfo,
        data: &[u8],
        mrs: &MrTable,
        tap: Option<&mut dyn Tap>,
    ) -> Delivery {
        self.stats.rx_packets += 1;
        let n = data.len();
        // Lengths no RoCEv2 sender produces are dropped before any CRC (or capture).
        if !possible_len(n) {
            self.stats.rx_bad_length += 1;
            trace_event!(len = n, %from, "dropped: impossible length");
            return Delivery::Done;
        }
        // The network header as it arrived, as far as the ICRC covers it (and the UD GRH shows
        // it): the IPv4 ID, which the socket hides, is recovered by the ICRC check.
        let net = match (from, local) {
            (SocketAddr::V4(f), SocketAddr::V4(l)) => {
                let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
                Ipv4Udp::new(*f.ip(), f.port(), *l.ip(), ROCE_V2_PORT, n).emit(&mut hdr);
                let icrc = self.icrc_gate.check_v4(&mut hdr, data);
                if let Some(t) = tap {
                    t.record(&hdr, data, true);
                }
                match icrc {
                    Ok((_, icrc::Accepted::Id0)) => self.stats.rx_icrc_id0 += 1,
                    Ok((_, icrc::Accepted::Predicted)) => self.stats.rx_icrc_predicted += 1,
                    Ok((_, icrc::Accepted::Solved)) => self.stats.rx_icrc_solved += 1,
                    Err(icrc::Rejected::Length) => {
                        self.stats.rx_bad_length += 1;
                        return Delivery::Done;
                    }
                    Err(icrc::Rejected::Icrc) => {
                        self.stats.rx_bad_icrc += 1;
                        return Delivery::Done;
                    }
                }
                net_header_v4(&hdr)
            }
            (SocketAddr::V6(f), SocketAddr::V6(l)) => {
                let hdr = v6_header(*f.ip(), f.port(), *l.ip(), n, info);
                if let Some(t) = tap {
                    t.record(&hdr, data, true);
                }
                if icrc::verify_v6(&hdr, data).is_err() {
                    self.stats.rx_bad_icrc += 1;
                    return Delivery::Done;
                }
                self.stats.rx_icrc_v6 += 1;
                let mut h = [0u8; IPV6_LEN];
                h.copy_from_slice(&hdr[..IPV6_LEN]);
                Some(NetHeader::V6(h))
            }
            // A socket gets datagrams of its own family only (IPv6 ones are IPv6-only).
            _ => {
                self.stats.rx_malformed += 1;
                return Delivery::Done;
            }
        };
        self.dispatch(now, local, from, net, data, mrs)
    }

    /// A datagram another context on the same address checked and handed over (see
    /// `driver::forward`), with the network header it arrived with. Never handed on again.
    pub fn handle_handed_over(
        &mut self,
        now: Instant,
        local: SocketAddr,
        from: SocketAddr,
        net: Option<NetHeader>,
        data: &[u8],
        mrs: &MrTable,
    ) {
        self.stats.rx_forwarded += 1;
        // The same checks as a datagram from the wire: its length, and its ICRC over the
        // network header it arrived with (the one the forwarder rebuilt, whose source and
        // destination must be the datagram's).
        if !possible_len(data.len()) {
            self.stats.rx_bad_length += 1;
            return;
        }
        if !handed_over_icrc_ok(local, from, net.as_ref(), data) {
            self.stats.rx_bad_icrc += 1;
            return;
        }
        // One that is not ours either is dropped (it is never handed on again).
        let _ = self.dispatch(now, local, from, net, data, mrs);
    }

    /// A CM MAD another context on the address `local` received from `src` and handed over,
    /// because this one listens for it.
    pub fn handle_forwarded_mad(
        &mut self,
        now: Instant,
        local: SocketAddr,
        src: MadAddr,
        mad: &[u8],
    ) {
        self.stats.rx_forwarded += 1;
        self.gsi
            .endpoint_mut()
            .on_forwarded_mad(now, src, gid_from_ip(local.ip()), mad);
        self.gsi_pending = true;
    }

    /// A datagram whose ICRC was checked, from `from` to `local`: to the CM or to its QP.
    fn dispatch(
        &mut self,
        now: Instant,
        local: SocketAddr,
        from: SocketAddr,
        net: Option<NetHeader>,
        data: &[u8],
        mrs: &MrTable,
    ) -> Delivery {
        let pkt = match Packet::parse(data) {
            Ok(p) => p,
            Err(_) => {
                self.stats.rx_malformed += 1;
                return Delivery::Done;
            }
        };
        let qpn = pkt.bth.dest_qpn;
        if qpn == GSI_QPN {
            // A CM reply for another context (its slot in the comm ID's top byte).
            let owner = mad_owner(pkt.payload);
            if let Some(owner) = owner.filter(|o| *o != 0 && *o != self.slot) {
                return Delivery::Elsewhere { owner, net };
            }
            // GSI: connection management MADs go to the CM, never to an app QP.
            self.stats.rx_gsi += 1;
            self.gsi.endpoint_mut().on_gsi_packet(
                now,
                gid_from_ip(from.ip()),
                gid_from_ip(local.ip()),
                &pkt,
            );
            self.gsi_pending = true;
            return Delivery::Done;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.stats.rx_unknown_qp += 1;
            trace_event!(qpn, %from, "packet for a QP this endpoint does not have");
            // Another context's QPN (its slot in the top byte) reached this socket.
            let owner = (qpn >> 16) as u8;
            if owner != 0 && owner != self.slot {
                return Delivery::Elsewhere { owner, net };
            }
            return Delivery::Done;
        };
        let mem = mrs.for_pd(slot.pd);
        // A QP on a shared receive queue is lent it, locked, for this packet.
        let mut srq = slot.srq.as_deref().map(|s| (s, s.lock()));
        match &mut slot.qp {
            QpTransport::Rc(rc) => {
                // A connected QP takes packets from its peer only: anyone can send to UDP 4791,
                // and a forged packet must neither land in memory nor disturb the PSN sequence.
                if !from_peer(rc.destination(), from.ip()) {
                    self.stats.rx_bad_source += 1;
                    trace_event!(qpn, %from, "dropped: not from the QP's peer");
                    return Delivery::Done;
                }
                match &mut srq {
                    Some((_, q)) => rc.handle_packet_srq(now, &pkt, &mem, q),
                    None => rc.handle_packet(now, &pkt, &mem),
                }
            }
            QpTransport::Uc(uc) => {
                // Connected too: the same rule as RC (rxe's `check_addr` covers RC and UC).
                if !from_peer(uc.destination(), from.ip()) {
                    self.stats.rx_bad_source += 1;
                    return Delivery::Done;
                }
                match &mut srq {
                    Some((_, q)) => uc.handle_packet_srq(&pkt, &mem, q),
                    None => uc.handle_packet(&pkt, &mem),
                }
            }
            QpTransport::Ud(ud) => {
                // The network header as it arrived, for the GRH area.
                let Some(net) = net else {
                    self.stats.rx_malformed += 1;
                    return Delivery::Done;
                };
                match &mut srq {
                    Some((_, q)) => ud.handle_packet_srq(&pkt, &net, &mem, q),
                    None => ud.handle_packet(&pkt, &net, &mem),
                }
            }
        }
        if let Some((s, mut q)) = srq {
            s.raise_events(&mut q);
        }
        if !self.dirty.contains(&qpn) {
            self.dirty.push(qpn);
        }
        Delivery::Done
    }
}

/// Whether `src` is the IP address of a connected (RC or UC) QP's peer, given the QP's
/// address vector (no peer before RTR: nothing is).
fn from_peer(dest: Option<AddressVector>, src: IpAddr) -> bool {
    dest.is_some_and(|av| gid_to_ip(&av.dgid) == src)
}

/// Whether a handed-over datagram's ICRC matches the network header it came with, and that
/// header names its source and the local address.
fn handed_over_icrc_ok(
    local: SocketAddr,
    from: SocketAddr,
    net: Option<&NetHeader>,
    data: &[u8],
) -> bool {
    match (net, from, local) {
        (Some(NetHeader::V4(ip)), SocketAddr::V4(f), SocketAddr::V4(l)) => {
            let mut hdr = [0u8; IPV4_LEN + UDP_LEN];
            Ipv4Udp::new(*f.ip(), f.port(), *l.ip(), ROCE_V2_PORT, data.len()).emit(&mut hdr);
            if ip[12..16] != hdr[12..16] || ip[16..20] != hdr[16..20] {
                return false;
            }
            hdr[..IPV4_LEN].copy_from_slice(ip);
            icrc::verify_v4(&hdr, data).is_ok()
        }
        (Some(NetHeader::V6(ip)), SocketAddr::V6(f), SocketAddr::V6(l)) => {
            let mut hdr = v6_header(*f.ip(), f.port(), *l.ip(), data.len(), RxInfo::default());
            if ip[8..24] != hdr[8..24] || ip[24..40] != hdr[24..40] {
                return false;
            }
            hdr[..IPV6_LEN].copy_from_slice(ip);
            icrc::verify_v6(&hdr, data).is_ok()
        }
        _ => false,
    }
}

/// The IPv6 and UDP headers of a datagram received from `src`:`src_port` on `local`, `len`
/// bytes of UDP payload, with the traffic class, flow label and hop limit the kernel reported
/// (the ICRC masks those three, and the UDP checksum, which the socket hides: 0 here).
fn v6_header(
    src: std::net::Ipv6Addr,
    src_port: u16,
    local: std::net::Ipv6Addr,
    len: usize,
    info: RxInfo,
) -> [u8; IPV6_LEN + UDP_LEN] {
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    Ipv6Udp {
        traffic_class: info.traffic_class,
        flow_label: info.flow_label,
        hop_limit: if info.hop_limit == 0 {
            64
        } else {
            info.hop_limit
        },
        ..Ipv6Udp::new(src, src_port, local, ROCE_V2_PORT, len)
    }
    .emit(&mut hdr);
    hdr
}
