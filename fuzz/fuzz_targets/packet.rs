//! Packet::parse, the Ethernet splitter, Ipv4Udp::parse and the ICRC check on arbitrary bytes:
//! no panic, and whatever parses re-emits to the bytes it came from (pad bytes, which emit
//! always writes as zero, excepted).
//!
//! `cargo +nightly fuzz run packet` (seed corpus: `fuzz/seed.sh`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma::wire::ethernet::{self, EthHeader};
use softrdma::wire::packet::ICRC_LEN;
use softrdma::wire::{icrc, ipv4, Ipv4Udp, Ipv6Udp, Packet};

fn check_packet(b: &[u8]) {
    let Ok(p) = Packet::parse(b) else { return };
    let pad = p.bth.pad_count as usize;
    assert_eq!(p.buffer_len(), b.len());
    let mut out = vec![0u8; b.len()];
    assert_eq!(p.emit(&mut out), Ok(b.len()));
    let mut want = b.to_vec();
    let at = b.len() - ICRC_LEN - pad;
    want[at..at + pad].fill(0);
    assert_eq!(out, want);
    assert_eq!(Packet::parse(&want).unwrap(), p);
}

fn check_ipv4(b: &[u8]) {
    let Ok((ip, raw, payload)) = Ipv4Udp::parse(b) else {
        return;
    };
    let mut hdr = [0u8; 28];
    ip.emit(&mut hdr);
    assert_eq!(ipv4::checksum(&hdr[..20]), 0);
    let total = u16::from_be_bytes([b[2], b[3]]) as usize;
    if raw.len() == 20 && total == 28 + payload.len() {
        let mut want = [0u8; 28];
        want.copy_from_slice(&b[..28]);
        want[10..12].copy_from_slice(&hdr[10..12]);
        want[26..28].fill(0);
        assert_eq!(hdr, want);
    }
}

fuzz_target!(|data: &[u8]| {
    // The input as a UDP payload, as an IPv4 packet and as an Ethernet frame.
    check_packet(data);
    check_ipv4(data);
    let _ = Ipv6Udp::parse(data);
    if let Ok((eth, _)) = EthHeader::parse(data) {
        let mut h = [0u8; 18];
        assert_eq!(eth.emit(&mut h), Ok(eth.len()));
        assert_eq!(h[..eth.len()], data[..eth.len()]);
    }
    if let Ok((hdr, payload)) = ethernet::split_ipv4_udp(data) {
        let _ = icrc::verify_v4(&hdr, payload);
        check_packet(payload);
    }
    if let Ok((hdr, payload)) = ethernet::split_ipv6_udp(data) {
        let _ = icrc::verify_v6(&hdr, payload);
        check_packet(payload);
    }
});
