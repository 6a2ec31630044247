//! A UDP socket does not show the sender's IPv4 Identification, which the ICRC covers, and
//! Linux rdma_rxe numbers its packets (IP ID is not 0). Every packet of both kernel captures must
//! verify with the ID hidden, and the ID recovered must be the one on the wire; through the
//! engine's [`IcrcGate`], fed in capture order, and through the stateless function.

use std::collections::HashMap;

use softrdma::wire::ethernet;
use softrdma::wire::icrc::{self, Accepted, IcrcGate};
use softrdma::wire::packet::{possible_len, MAX_PACKET_LEN, PACKET_ALIGN};
use softrdma::wire::pcap::PcapSlice;

#[derive(Default, Debug)]
struct Counts {
    packets: usize,
    nonzero: usize,
    id0: usize,
    predicted: usize,
    solved: usize,
    corrupt_accepted: usize,
    longest: usize,
}

fn check(path: &str, c: &mut Counts) {
    let data = std::fs::read(path).unwrap();
    let mut gate = IcrcGate::new();
    let mut seen = HashMap::new();
    let n0 = c.packets;
    for rec in PcapSlice::new(&data).unwrap() {
        let rec = rec.unwrap();
        let n = c.packets - n0;
        let (hdr, payload) = ethernet::split_ipv4_udp(rec.data).unwrap();
        // IBA pads every packet to 4 bytes: the length gate refuses no kernel packet.
        assert_eq!(payload.len() % PACKET_ALIGN, 0, "{path} record {n}");
        assert!(possible_len(payload.len()), "{path} record {n}");
        c.longest = c.longest.max(payload.len());
        let mut hidden = hdr;
        hidden[4] = 0;
        hidden[5] = 0;
        let id = icrc::verify_v4_unknown_id(&mut hidden.clone(), payload).unwrap();
        assert_eq!(id.to_be_bytes(), [hdr[4], hdr[5]], "{path} record {n}");
        let (gid, how) = gate.check_v4(&mut hidden, payload).unwrap();
        assert_eq!(gid, id, "{path} record {n}");
        assert_eq!(hidden, hdr);
        // A source's first packet is solved; after that, its next ID (+1) is predicted.
        let src = [hdr[12], hdr[13], hdr[14], hdr[15]];
        if let Some(&last) = seen.get(&src) {
            if id == u16::wrapping_add(last, 1) && id != 0 {
                assert_eq!(how, Accepted::Predicted, "{path} record {n}");
            }
        } else {
            assert_eq!(how, Accepted::Solved, "{path} record {n}");
        }
        seen.insert(src, id);
        match how {
            Accepted::Id0 => c.id0 += 1,
            Accepted::Predicted => c.predicted += 1,
            Accepted::Solved => c.solved += 1,
        }
        // A flipped payload bit is refused, unless some other ID happens to explain it (the
        // check is 16 bits strong here, not 32): count those and bound them below.
        let mut bad = payload.to_vec();
        let at = bad.len() / 2;
        bad[at] ^= 0x10;
        let mut h2 = hdr;
        if let Ok(other) = icrc::verify_v4_unknown_id(&mut h2, &bad) {
            assert_ne!(other.to_be_bytes(), [hdr[4], hdr[5]], "{path} record {n}");
            c.corrupt_accepted += 1;
        }
        c.nonzero += (id != 0) as usize;
        c.packets += 1;
    }
}

#[test]
fn kernel_packets_verify_without_seeing_the_ip_id() {
    let mut c = Counts::default();
    check("tests/data/rxe-basic.pcap", &mut c);
    assert_eq!(c.packets, 413);
    check("tests/data/rxe-loss-mtu4096.pcap", &mut c);
    assert_eq!(c.packets, 413 + 2567);
    eprintln!("{c:?}");
    assert!(c.nonzero > c.packets / 2, "the kernel's IP IDs are not 0");
    // Two sources per capture, each solved once; the rest is predicted but for the few jumps
    // of more than GATE_PREDICT_WINDOW after a pause.
    assert!(c.predicted > c.packets * 95 / 100, "{c:?}");
    assert!(c.solved < 60, "{c:?}");
    // The loss capture has MTU 4096 RDMA WRITEs: 28 bytes of headers + 4096 + ICRC.
    assert_eq!(c.longest, 4128);
    assert!(c.longest <= MAX_PACKET_LEN);
    // 2,980 corruptions at 2^-16 each: about 0.05 expected to slip through.
    assert!(c.corrupt_accepted <= 1, "{c:?}");
}
