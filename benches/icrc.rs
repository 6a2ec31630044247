//! Cost of the receive-side ICRC check per datagram, the IPv4 Identification unknown (as a UDP
//! socket delivers it):
//!
//! ```text
//! cargo bench --bench icrc
//! ```
//!
//! 64-byte and 4 KiB RC SEND packets sent with IP ID 0 (softrdma), with a non-zero IP ID (Linux
//! rdma_rxe; consecutive IDs, so that the gate predicts them), and random garbage of the same
//! length; through the stateless `verify_v4_unknown_id` and through an `IcrcGate`. Then one
//! datagram of every length, with the heap growth. Prints ns per packet; nothing is asserted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use softrdma::wire::icrc;
use softrdma::wire::ipv4::Ipv4Udp;

const ROUNDS: usize = 200_000;

/// Counts the bytes allocated (and not freed) by the process.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        System.dealloc(p, l)
    }
}
#[global_allocator]
static ALLOC: Counting = Counting;

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn header(id: u16, len: usize) -> [u8; 28] {
    let mut h = [0u8; 28];
    Ipv4Udp {
        id,
        ..Ipv4Udp::new(
            [10, 0, 0, 2].into(),
            49152,
            [10, 0, 0, 1].into(),
            4791,
            len.min(65507),
        )
    }
    .emit(&mut h);
    h
}

/// `n` datagrams of `len` bytes: valid RC SEND_ONLY packets whose ICRC was computed with IP IDs
/// `id0, id0 + 1, ...` (all 0 if `id0` is 0), or random bytes if `garbage`.
fn datagrams(len: usize, id0: u16, garbage: bool, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ len as u64);
    (0..n)
        .map(|i| {
            let mut p: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if !garbage {
                p[0] = 0x04; // RC SEND_ONLY
                p[1] = 0x40; // migreq, pad 0, tver 0
                let id = if id0 == 0 {
                    0
                } else {
                    id0.wrapping_add(i as u16)
                };
                icrc::fill_v4(&header(id, len), &mut p);
            }
            p
        })
        .collect()
}

/// The same through one `IcrcGate` (the engine's check: length gate, ID 0, predicted, solved).
fn run_gate(name: &str, len: usize, id0: u16, garbage: bool) {
    let pkts = datagrams(len, id0, garbage, 256);
    let rounds = ROUNDS.min(400_000_000 / len.max(64)) as u64;
    let mut gate = icrc::IcrcGate::new();
    let mut ok = 0u64;
    let t = Instant::now();
    for r in 0..rounds {
        let p = &pkts[r as usize % pkts.len()];
        let mut h = header(0, len);
        ok += black_box(gate.check_v4(&mut h, black_box(p))).is_ok() as u64;
    }
    let ns = t.elapsed().as_nanos() as f64 / rounds as f64;
    println!(
        "IcrcGate::check_v4   {name:<22} {len:>5} B  {ns:>8.1} ns/packet  ({ok}/{rounds} accepted)"
    );
}

fn run(name: &str, len: usize, id0: u16, garbage: bool) {
    let pkts = datagrams(len, id0, garbage, 256);
    let rounds = ROUNDS.min(400_000_000 / len.max(64)) as u64;
    let mut ok = 0u64;
    let t = Instant::now();
    for r in 0..rounds {
        let p = &pkts[r as usize % pkts.len()];
        let mut h = header(0, len);
        ok += black_box(icrc::verify_v4_unknown_id(&mut h, black_box(p))).is_ok() as u64;
    }
    let ns = t.elapsed().as_nanos() as f64 / rounds as f64;
    println!(
        "verify_v4_unknown_id {name:<22} {len:>5} B  {ns:>8.1} ns/packet  ({ok}/{rounds} accepted)"
    );
}

/// One random datagram of every length 0..=65535 (a UDP socket delivers up to 65507 over IPv4):
/// time per datagram and heap growth.
fn every_length() {
    let mut rng = Rng(7);
    let buf: Vec<u8> = (0..65536).map(|_| rng.next() as u8).collect();
    let before = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut ok = 0;
    for len in 0..=65535usize {
        let mut h = header(0, len);
        ok += black_box(icrc::verify_v4_unknown_id(&mut h, &buf[..len])).is_ok() as u64;
    }
    let ns = t.elapsed().as_nanos() as f64 / 65536.0;
    let grew = LIVE.load(Ordering::Relaxed) as isize - before as isize;
    println!("verify_v4_unknown_id every length 0..=65535   {ns:>8.1} ns/packet  ({ok} accepted), heap grew {grew} bytes");
}

fn main() {
    for len in [64, 4096] {
        run("ip id 0", len, 0, false);
        run("ip id non-zero", len, 0xe6e6, false);
        run("random garbage", len, 0, true);
    }
    for len in [64, 4096] {
        run_gate("ip id 0", len, 0, false);
        run_gate("ip id non-zero", len, 0xe6e6, false);
        run_gate("random garbage", len, 0, true);
    }
    every_length();
}
