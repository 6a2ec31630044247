//! The whole receive path of an endpoint, without sockets, on arbitrary datagrams: the length
//! and ICRC gate (`IcrcGate`, its per-source state kept across datagrams), `Packet::parse`, then
//! a connected RC QP pair (`transport::sim` memory, work outstanding on both sides, whatever one
//! sends delivered to the other) or the CM manager's `handle_gsi_packet` (a listener and a
//! client with a REQ and a SIDR request out). No panic; every packet a QP or the CM sends
//! parses; a datagram whose ICRC was filled with some IP ID passes the gate with that ID.
//!
//! The input is a list of records: `ctl, src, id_hi, id_lo, len_hi, len_lo`, then `len` bytes
//! (len modulo MAX_PACKET_LEN + 64, so that impossible lengths come too; the last record takes
//! what is left). `src` is the last byte of the source address 10.0.0.x. `ctl` bit 0: fill the
//! ICRC with IP ID `id` first (otherwise almost nothing gets through the gate); bits 1-4: how
//! far the clock moves before the datagram (in 16 ms steps). The packet goes to the CM if its
//! destination QP is 1, else to QP side `dest_qpn & 1` (the engine would look the QPN up).
//!
//! `cargo +nightly fuzz run datagram`
#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma::cm::manager::{CmConfig, CmManager, ConnectParams, MadAddr};
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::sidr_manager::SidrParams;
use softrdma::cm::{CmMad, CmaHdr};
use softrdma::transport::sim::{pattern, recv_wr, send_wr, ConnectOpts, LinkConfig, Sim};
use softrdma::transport::{AccessFlags, Mtu, QpCaps, SendOp};
use softrdma::verbs::gid_from_ipv4;
use softrdma::wire::icrc::{self, Accepted, IcrcGate, Rejected};
use softrdma::wire::packet::{possible_len, MAX_PACKET_LEN};
use softrdma::wire::{Ipv4Udp, Packet, ROCE_V2_PORT};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn manager(ip: Ipv4Addr, seed: u64) -> CmManager {
    CmManager::new(CmConfig {
        local_gid: gid_from_ipv4(ip),
        local_ca_guid: seed,
        hi_tid: seed as u32,
        seed,
    })
}

/// Two connected RC QPs, side 0 with receives posted, side 1 with a SEND, a WRITE, a READ and an
/// atomic in flight.
fn qps() -> Sim {
    let mut s = Sim::new(1, LinkConfig::default(), QpCaps::default());
    s.connect(ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..Default::default()
    });
    let all = AccessFlags::all();
    let lmr = s.ends[1].mem.register(1 << 14, all);
    let rmr = s.ends[0].mem.register(1 << 14, all);
    s.ends[1].mem.write(lmr.addr, &pattern(1, 1 << 14));
    for i in 0..4 {
        let _ = s.ends[0].qp.post_recv(recv_wr(i, vec![rmr.sge(0, 4096)]));
    }
    let ops = [
        SendOp::Send,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        SendOp::RdmaRead {
            remote_addr: rmr.addr + 4096,
            rkey: rmr.rkey,
        },
        SendOp::FetchAdd {
            remote_addr: rmr.addr + 8192,
            rkey: rmr.rkey,
            add: 1,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if matches!(op, SendOp::FetchAdd { .. }) { 8 } else { 3000 };
        let _ = s.ends[1]
            .qp
            .post_send(send_wr(i as u64, op, vec![lmr.sge(4096 * i as u64, len)]));
    }
    s
}

/// Move what each QP and the CM managers have to send: QP packets go to the other QP (bounded),
/// CM MADs are only parsed.
fn pump(s: &mut Sim, cms: &mut [CmManager; 2], buf: &mut [u8]) {
    for _ in 0..8 {
        let mut moved = false;
        for i in 0..2 {
            let mut n_out = 0;
            while let Some(n) = {
                let e = &mut s.ends[i];
                e.qp.poll_transmit(s.now, &e.mem, buf)
            } {
                let pkt = Packet::parse(&buf[..n]).expect("a packet a QP sends must parse");
                let e = &mut s.ends[1 - i];
                e.qp.handle_packet(s.now, &pkt, &e.mem);
                moved = true;
                n_out += 1;
                if n_out > 256 {
                    break;
                }
            }
            for e in &mut s.ends {
                while e.qp.poll_completion().is_some() {}
            }
        }
        if !moved {
            break;
        }
    }
    for m in cms {
        while let Some((_, out)) = m.poll_transmit() {
            assert!(CmMad::parse(&out).is_ok(), "a MAD we send must parse");
        }
        while m.poll_event().is_some() {}
    }
}

fuzz_target!(|data: &[u8]| {
    let peer = Ipv4Addr::new(10, 0, 0, 2);
    let mut sim = qps();
    let mut now = sim.now;
    let mut server = manager(LOCAL, 1);
    let _ = server.listen(PortSpace::Tcp.service_id(7174));
    let _ = server.listen(PortSpace::Udp.service_id(7174));
    let mut client = manager(LOCAL, 2);
    let _ = client.connect(
        now,
        &ConnectParams::rdma_cm_tcp(
            SocketAddrV4::new(LOCAL, 40000),
            SocketAddrV4::new(peer, 7174),
            0x11,
            0x100,
        ),
    );
    let _ = client.sidr_request(
        now,
        &SidrParams::rdma_cm_udp(
            MadAddr::gsi_v4(peer),
            CmaHdr::v4(SocketAddrV4::new(LOCAL, 40001), peer),
            7174,
            Vec::new(),
        ),
    );
    let mut cms = [server, client];
    let mut gate = IcrcGate::new();
    let mut buf = vec![0u8; 8192];
    let mut rest = data;
    while rest.len() >= 6 {
        let (h, tail) = rest.split_at(6);
        let (ctl, src, id) = (h[0], h[1], u16::from_be_bytes([h[2], h[3]]));
        let len = (u16::from_be_bytes([h[4], h[5]]) as usize % (MAX_PACKET_LEN + 64)).min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        now += Duration::from_millis(16 * ((ctl as u64 >> 1) & 0xf));
        sim.now = now;
        for e in &mut sim.ends {
            if e.qp.poll_timeout().is_some_and(|t| t <= now) {
                e.qp.handle_timeout(now);
            }
        }
        for m in &mut cms {
            m.handle_timeout(now);
        }
        let src_ip = Ipv4Addr::new(10, 0, 0, src);
        receive(&mut gate, &mut sim, &mut cms, now, src_ip, ctl & 1 != 0, id, payload);
        pump(&mut sim, &mut cms, &mut buf);
    }
});

#[allow(clippy::too_many_arguments)]
fn receive(
    gate: &mut IcrcGate,
    sim: &mut Sim,
    cms: &mut [CmManager; 2],
    now: Instant,
    src: Ipv4Addr,
    fill: bool,
    id: u16,
    payload: &[u8],
) {
    // As the engine: lengths first, then the headers the socket shows, then the ICRC.
    if !possible_len(payload.len()) {
        let mut hdr = [0u8; 28];
        assert_eq!(gate.check_v4(&mut hdr, payload), Err(Rejected::Length));
        return;
    }
    let mut hdr = [0u8; 28];
    let mut ip = Ipv4Udp::new(src, 49152, LOCAL, ROCE_V2_PORT, payload.len());
    ip.emit(&mut hdr);
    let mut p = payload.to_vec();
    if fill {
        ip.id = id;
        let mut sent = [0u8; 28];
        ip.emit(&mut sent);
        icrc::fill_v4(&sent, &mut p);
    }
    let stateless = icrc::verify_v4_unknown_id(&mut hdr.clone(), &p);
    let checked = gate.check_v4(&mut hdr, &p);
    match checked {
        Ok((got, how)) => {
            assert_eq!(stateless, Ok(got));
            assert_eq!(hdr[4..6], got.to_be_bytes());
            if fill {
                assert_eq!(got, id, "the gate must recover the IP ID the ICRC was made with");
            }
            assert_eq!(how == Accepted::Id0, got == 0);
        }
        Err(e) => {
            assert!(!fill, "a filled ICRC must pass");
            assert_eq!(e, Rejected::Icrc);
            assert!(stateless.is_err());
            return;
        }
    }
    let Ok(pkt) = Packet::parse(&p) else { return };
    if pkt.bth.dest_qpn == 1 {
        let gid = gid_from_ipv4(src);
        let which = (id & 1) as usize;
        cms[which].handle_gsi_packet(now, gid, &pkt);
    } else {
        let e = &mut sim.ends[(pkt.bth.dest_qpn & 1) as usize];
        e.qp.handle_packet(now, &pkt, &e.mem);
    }
}
