//! The CPU cost of one RC SEND/RECV ping-pong round trip, both ends driven by one thread, against
//! the same exchange of raw UDP datagrams:
//!
//! ```text
//! cargo bench --bench hop                 # SOFTRDMA_HOP_ITERS=200000 by default
//! SOFTRDMA_HOP_ONLY=rc perf record -g target/release/deps/hop-* --bench   # or =raw, =idle, =write
//! ```
//!
//! Two contexts on the loopback device in this process, a connected RC QP pair, 8-byte SENDs:
//! A posts, B polls until the message is there, re-posts its receive and answers, A polls until
//! the answer is there and re-posts. On loopback the kernel delivers a datagram into the peer's
//! socket within the sender's system call, so nothing waits on another CPU or thread: the time
//! per round trip is the CPU work of the exchange (both ends' kernel and user space), with no
//! idle polling in it, which makes the profile of this benchmark the profile of the work itself.
//! The twoproc benchmark measures the latency between two processes; this one what each round
//! trip costs. Nothing is asserted.

use std::net::UdpSocket;
use std::time::Instant;

use softrdma::verbs::{MemoryRegion, WorkCompletion};
use softrdma::verbs::{Mtu, SendOp, WcOpcode, WcStatus};

#[path = "../tests/verbs_util/mod.rs"]
mod verbs_util;
use verbs_util::{connect, connect_path, loopback_ctx, rc_qp, sge, End};

const WARMUP: usize = 2_000;

/// Poll `end` until a receive completion is there (send completions are reaped on the way).
/// `peer` is polled too when this CQ is empty, as its own process would poll it: an end that
/// stops polling has its progress thread take over its datagrams, which is not what a
/// busy-polling application pays.
fn wait_recv(end: &End, peer: &End) {
    let mut wc = [WorkCompletion::default(); 4];
    loop {
        let n = end.cq.poll(&mut wc).expect("poll");
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == WcOpcode::Recv {
                return;
            }
        }
        if n == 0 {
            let n = peer.cq.poll(&mut wc).expect("poll");
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                assert_ne!(c.opcode, WcOpcode::Recv, "the peer's message came early");
            }
        }
    }
}

fn softrdma_round_trips(iters: usize) -> f64 {
    let a = End::new(loopback_ctx());
    let b = End::new(loopback_ctx());
    connect(&a.qp, 1, b.qp.qp_num(), 2, b.ctx.gid());
    connect(&b.qp, 2, a.qp.qp_num(), 1, a.ctx.gid());
    let (ma, mb): (MemoryRegion, MemoryRegion) = (a.mr(4096), b.mr(4096));
    for _ in 0..8 {
        a.post_recv(0, &[sge(&ma, 1024, 64)]);
        b.post_recv(0, &[sge(&mb, 1024, 64)]);
    }
    let mut t0 = Instant::now();
    for i in 0..WARMUP + iters {
        if i == WARMUP {
            t0 = Instant::now();
        }
        // Signaled 8-byte SENDs, as perftest's latency tests post them.
        a.post_send(1, SendOp::Send, &[sge(&ma, 0, 8)]);
        wait_recv(&b, &a);
        b.post_recv(0, &[sge(&mb, 1024, 64)]);
        b.post_send(1, SendOp::Send, &[sge(&mb, 0, 8)]);
        wait_recv(&a, &b);
        a.post_recv(0, &[sge(&ma, 1024, 64)]);
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

/// The CPU cost of a stream of 64 KiB RDMA WRITEs, 16 outstanding, path MTU 4096, both ends on
/// one thread (A posts and polls; when A's CQ is empty B's is polled, which drives B, as its
/// own busy-polling process would): time per WRITE. Under callgrind, the instructions per 64 KiB
/// of both ends together, which no phase of the machine moves.
fn softrdma_writes(iters: usize) -> f64 {
    const LEN: usize = 64 << 10;
    const DEPTH: usize = 16;
    let a = End::new(loopback_ctx());
    let b = End::new(loopback_ctx());
    let (ga, gb) = (a.ctx.gid(), b.ctx.gid());
    connect_path(&a.qp, 0, 1, (b.qp.qp_num(), 2, gb), 14, Mtu::Mtu4096);
    connect_path(&b.qp, 0, 2, (a.qp.qp_num(), 1, ga), 14, Mtu::Mtu4096);
    let (ma, mb) = (a.mr(LEN), b.mr(LEN));
    let op = SendOp::RdmaWrite {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    let total = WARMUP + iters;
    let (mut posted, mut done) = (0, 0);
    let mut wc = [WorkCompletion::default(); DEPTH];
    let mut t0 = Instant::now();
    while done < total {
        while posted - done < DEPTH && posted < total {
            a.post_send(posted as u64, op, &[sge(&ma, 0, LEN)]);
            posted += 1;
        }
        let n = a.cq.poll(&mut wc).expect("poll");
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
        if done < WARMUP && done + n >= WARMUP {
            t0 = Instant::now();
        }
        done += n;
        if n == 0 {
            assert_eq!(b.cq.poll(&mut wc).expect("poll"), 0);
        }
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

/// What one poll of an empty CQ costs (a busy-polling application's idle loop: it sets how
/// soon a datagram is found after it arrives), with `qps` more connected, idle QP pairs on the
/// device (an MPI rank's connections).
fn empty_polls(iters: usize, qps: usize) -> f64 {
    let a = End::new(loopback_ctx());
    let b = End::new(loopback_ctx());
    let mut idle = Vec::with_capacity(qps);
    for _ in 0..qps {
        let (qa, qb) = (rc_qp(&a.pd, &a.cq), rc_qp(&b.pd, &b.cq));
        connect(&qa, 1, qb.qp_num(), 2, b.ctx.gid());
        connect(&qb, 2, qa.qp_num(), 1, a.ctx.gid());
        idle.push((qa, qb));
    }
    let mut wc = [WorkCompletion::default(); 4];
    for _ in 0..WARMUP {
        assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn raw_round_trips(iters: usize) -> f64 {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let msg = [7u8; 8];
    let mut buf = [0u8; 64];
    let recv = |s: &UdpSocket, buf: &mut [u8]| loop {
        if s.recv(buf).is_ok() {
            return;
        }
    };
    let mut t0 = Instant::now();
    for i in 0..WARMUP + iters {
        if i == WARMUP {
            t0 = Instant::now();
        }
        a.send(&msg).unwrap();
        recv(&b, &mut buf);
        b.send(&msg).unwrap();
        recv(&a, &mut buf);
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let iters = std::env::var("SOFTRDMA_HOP_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    // SOFTRDMA_HOP_ONLY=raw, =rc or =idle: one of them (to profile it alone).
    let only = std::env::var("SOFTRDMA_HOP_ONLY").unwrap_or_default();
    // SOFTRDMA_HOP_QPS=1000: that many more idle connected QP pairs for the empty poll.
    let qps = std::env::var("SOFTRDMA_HOP_QPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if only == "write" {
        println!(
            "  softrdma RC WRITE 64 KiB, 16 outstanding  {:8.0} ns per WRITE",
            softrdma_writes(iters)
        );
        return;
    }
    if only == "idle" {
        println!(
            "  one poll of an empty CQ, {qps} more QP pairs {:8.0} ns",
            empty_polls(iters, qps)
        );
        return;
    }
    println!("CPU cost of one 8-byte ping-pong round trip, both ends on one thread ({iters} round trips)");
    let raw = if only == "rc" {
        f64::NAN
    } else {
        raw_round_trips(iters)
    };
    println!("  raw UDP (send, recv, send, recv)          {:8.0} ns", raw);
    if only == "raw" {
        return;
    }
    let rc = softrdma_round_trips(iters);
    println!(
        "  softrdma RC SEND/RECV, signaled           {:8.0} ns   ({:.2}x raw)",
        rc,
        rc / raw
    );
    if only == "rc" {
        return;
    }
    println!(
        "  one poll of an empty CQ                   {:8.0} ns",
        empty_polls(iters, 0)
    );
    println!(
        "  the same, 1000 more idle QP pairs         {:8.0} ns",
        empty_polls(iters, 1000)
    );
}
