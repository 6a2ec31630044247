//! The receive-side ICRC gate (`IcrcGate`) against hostile input: its memory stays bounded
//! whatever lengths arrive, and random datagrams pass only as often as the math says.

use std::alloc::{GlobalAlloc, Layout, System};

use softrdma::wire::icrc::{self, Accepted, IcrcGate, Rejected, GATE_SOURCES};
use softrdma::wire::ipv4::Ipv4Udp;
use softrdma::wire::packet::{possible_len, MAX_PACKET_LEN, MIN_PACKET_LEN};

/// Counts the bytes allocated by this thread's test (tests run on several threads: counted per
/// thread).
struct Counting;
thread_local! {
    static ALLOCATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + l.size()));
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static ALLOC: Counting = Counting;

fn allocated() -> usize {
    ALLOCATED.with(|a| a.get())
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

fn header(src: [u8; 4], len: usize) -> [u8; 28] {
    let mut h = [0u8; 28];
    // Ipv4Udp's length fields are u16: a UDP payload over IPv4 is at most 65507 bytes.
    Ipv4Udp::new(
        src.into(),
        49152,
        [10, 0, 0, 1].into(),
        4791,
        len.min(65507),
    )
    .emit(&mut h);
    h
}

/// One datagram of every length 0..=65535: no allocation at all, the gate's state is a fixed
/// array, and only the possible lengths get to the CRC.
#[test]
fn every_length_allocates_nothing() {
    let mut rng = Rng(1);
    let mut buf = vec![0u8; 65536];
    rng.fill(&mut buf);
    let mut gate = IcrcGate::new();
    let before = allocated();
    let mut refused_len = 0;
    for len in 0..=65535usize {
        let src = [10, 0, (len >> 8) as u8, len as u8];
        let mut h = header(src, len);
        match gate.check_v4(&mut h, &buf[..len]) {
            Err(Rejected::Length) => refused_len += 1,
            _ => assert!(possible_len(len)),
        }
        let _ = icrc::verify_v4_unknown_id(&mut h, &buf[..len]);
    }
    assert_eq!(allocated() - before, 0, "bytes allocated by the ICRC check");
    assert_eq!(
        refused_len,
        65536 - (MAX_PACKET_LEN - MIN_PACKET_LEN) / 4 - 1
    );
    // The whole state of the gate: GATE_SOURCES entries of 8 bytes.
    assert!(std::mem::size_of::<IcrcGate>() <= GATE_SOURCES * 8);
    assert!(std::mem::size_of::<IcrcGate>() <= 1024);
}

/// 1,000,000 random datagrams of random possible lengths from 16 sources through one gate. Each
/// passes if ID 0 fits (2^-32) or if the 32-bit CRC difference falls in the 16-dimensional space
/// of ID effects (2^-16): 15.26 expected. Poisson: P(X > 40) < 1e-8, P(X < 3) < 1e-4 (seeded:
/// the outcome is fixed anyway).
#[test]
fn random_datagrams_pass_at_2_pow_minus_16() {
    const N: usize = 1_000_000;
    let mut rng = Rng(0x5eed_1c4c);
    let mut buf = vec![0u8; MAX_PACKET_LEN];
    let mut gate = IcrcGate::new();
    let (mut passed, mut id0, mut predicted, mut bytes) = (0, 0, 0, 0usize);
    let lens = (MAX_PACKET_LEN - MIN_PACKET_LEN) / 4 + 1;
    for _ in 0..N {
        let r = rng.next();
        // Mostly short datagrams (cheap), a quarter of any possible length.
        let len = if r & 3 == 0 {
            MIN_PACKET_LEN + 4 * ((r >> 8) as usize % lens)
        } else {
            MIN_PACKET_LEN + 4 * ((r >> 8) as usize % 16)
        };
        assert!(possible_len(len));
        bytes += len;
        rng.fill(&mut buf[..len]);
        let mut h = header([10, 9, 8, (r >> 40) as u8 & 15], len);
        match gate.check_v4(&mut h, &buf[..len]) {
            Ok((_, how)) => {
                passed += 1;
                id0 += (how == Accepted::Id0) as usize;
                predicted += (how == Accepted::Predicted) as usize;
            }
            Err(e) => assert_eq!(e, Rejected::Icrc),
        }
    }
    eprintln!(
        "{N} random datagrams ({} MB): {passed} passed ({id0} as ID 0, {predicted} predicted)",
        bytes >> 20
    );
    assert!(
        (3..=40).contains(&passed),
        "{passed} random datagrams passed"
    );
    assert_eq!(id0, 0);
    assert!(predicted <= 1);
}
