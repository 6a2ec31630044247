//! A UDP socket does not show the sender's IPv4 Identification, which the ICRC covers, and
//! Linux rdma_rxe numbers its packets (IP ID is not 0). Every packet of both kernel captures must
//! verify with the ID hidden, and the ID recovered must be the one on the wire.

use softrdma::wire::ethernet;
use softrdma::wire::icrc;
use softrdma::wire::pcap::PcapSlice;

fn check(path: &str, accepted_corrupt: &mut usize) -> usize {
    let data = std::fs::read(path).unwrap();
    let mut n = 0;
    let mut nonzero = 0;
    for rec in PcapSlice::new(&data).unwrap() {
        let rec = rec.unwrap();
        let (hdr, payload) = ethernet::split_ipv4_udp(rec.data).unwrap();
        let mut hidden = hdr;
        hidden[4] = 0;
        hidden[5] = 0;
        let id = icrc::verify_v4_unknown_id(&mut hidden, payload).unwrap();
        assert_eq!(id.to_be_bytes(), [hdr[4], hdr[5]], "{path} record {n}");
        assert_eq!(hidden, hdr);
        // A flipped payload bit is refused, unless some other ID happens to explain it (the
        // check is 16 bits strong here, not 32): count those and bound them below.
        let mut bad = payload.to_vec();
        let at = bad.len() / 2;
        bad[at] ^= 0x10;
        let mut h2 = hdr;
        if let Ok(other) = icrc::verify_v4_unknown_id(&mut h2, &bad) {
            assert_ne!(other.to_be_bytes(), [hdr[4], hdr[5]], "{path} record {n}");
            *accepted_corrupt += 1;
        }
        nonzero += (id != 0) as usize;
        n += 1;
    }
    assert!(nonzero > n / 2, "the kernel's IP IDs are not 0");
    n
}

#[test]
fn kernel_packets_verify_without_seeing_the_ip_id() {
    let mut accepted_corrupt = 0;
    assert_eq!(
        check("tests/data/rxe-basic.pcap", &mut accepted_corrupt),
        413
    );
    assert_eq!(
        check("tests/data/rxe-loss-mtu4096.pcap", &mut accepted_corrupt),
        2567
    );
    // 2,980 corruptions at 2^-16 each: about 0.05 expected to slip through.
    assert!(
        accepted_corrupt <= 1,
        "{accepted_corrupt} corrupted packets accepted"
    );
}
