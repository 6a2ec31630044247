//! The IB CM state machine on arbitrary MADs: the input is cut into 256-byte MADs (a byte
//! before each picks the receiving side and how far the clock moves) and fed to a listening
//! `CmManager` and to one with an outstanding REQ and SIDR request. No panic, and whatever the
//! managers send back parses.
//!
//! `cargo +nightly fuzz run cm`
#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma::cm::manager::{CmConfig, CmManager, ConnectParams, MadAddr};
use softrdma::cm::mad::MAD_LEN;
use softrdma::cm::service_id::PortSpace;
use softrdma::cm::sidr_manager::SidrParams;
use softrdma::cm::{CmMad, CmaHdr};
use softrdma::verbs::gid_from_ipv4;

fn manager(ip: Ipv4Addr, seed: u64) -> CmManager {
    CmManager::new(CmConfig {
        local_gid: gid_from_ipv4(ip),
        local_ca_guid: seed,
        hi_tid: seed as u32,
        seed,
    })
}

fuzz_target!(|data: &[u8]| {
    let (a_ip, b_ip) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let mut now = Instant::now();
    let mut server = manager(a_ip, 1);
    let _ = server.listen(PortSpace::Tcp.service_id(7174));
    let _ = server.listen(PortSpace::Udp.service_id(7174));
    let mut client = manager(b_ip, 2);
    let p = ConnectParams::rdma_cm_tcp(
        SocketAddrV4::new(b_ip, 40000),
        SocketAddrV4::new(a_ip, 7174),
        0x11,
        0x100,
    );
    let _ = client.connect(now, &p);
    let s = SidrParams::rdma_cm_udp(
        MadAddr::gsi_v4(a_ip),
        CmaHdr::v4(SocketAddrV4::new(b_ip, 40001), a_ip),
        7174,
        Vec::new(),
    );
    let _ = client.sidr_request(now, &s);
    for chunk in data.chunks(MAD_LEN + 1) {
        let (ctl, mad) = chunk.split_first().unwrap_or((&0, &[]));
        now += Duration::from_millis((*ctl as u64 & 0x3f) * 64);
        let (m, from) = if ctl & 0x80 == 0 {
            (&mut server, b_ip)
        } else {
            (&mut client, a_ip)
        };
        m.handle_mad(now, MadAddr::gsi_v4(from), mad);
        m.handle_timeout(now);
        while let Some((_, out)) = m.poll_transmit() {
            assert!(CmMad::parse(&out).is_ok(), "a MAD we send must parse");
        }
        while m.poll_event().is_some() {}
    }
});
