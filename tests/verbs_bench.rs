//! Loopback latency and bandwidth, for measurement only (ignored by default; no timing is
//! asserted). Run with:
//!
//! ```text
//! cargo test --release --test verbs_bench -- --ignored --nocapture --test-threads=1
//! ```
mod verbs_util;

use std::time::Instant;

use softrdma::transport::{SendFlags, SendOp, WcOpcode, WcStatus};
use softrdma::verbs::{CompletionChannel, CompletionQueue, RecvWr, SendWr, WorkCompletion};
use verbs_util::*;

const ITERS: usize = 20_000;

/// Wait for a receive completion by sleeping on the channel (or busy-polling if `ch` is None).
fn next_recv(cq: &CompletionQueue, ch: Option<&CompletionChannel>) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 8];
    loop {
        let n = cq.poll(&mut wc[..1]).unwrap();
        if n == 1 {
            assert_eq!(wc[0].status, WcStatus::Success);
            if wc[0].opcode == WcOpcode::Recv {
                return wc[0];
            }
            continue;
        }
        if let Some(ch) = ch {
            cq.req_notify(false).unwrap();
            // Re-check after arming, as libibverbs users must.
            if cq.poll(&mut wc[..1]).unwrap() == 1 {
                if wc[0].opcode == WcOpcode::Recv {
                    return wc[0];
                }
                continue;
            }
            let c = ch.get_cq_event().unwrap();
            c.ack_events(1);
        }
    }
}

fn ping_pong(events: bool) {
    let (a, b) = pair();
    let (cha, chb) = if events {
        (
            Some(a.ctx.create_comp_channel().unwrap()),
            Some(b.ctx.create_comp_channel().unwrap()),
        )
    } else {
        (None, None)
    };
    // CQs with channels when sleeping on events.
    let rebuild = |e: &End,
                   ch: Option<&CompletionChannel>|
     -> (CompletionQueue, softrdma::verbs::QueuePair) {
        let cq = e.ctx.create_cq(1024, ch).unwrap();
        let qp =
            e.pd.create_qp(&softrdma::verbs::QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: Default::default(),
                qp_type: softrdma::verbs::QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap();
        (cq, qp)
    };
    let (cqa, qpa) = rebuild(&a, cha.as_ref());
    let (cqb, qpb) = rebuild(&b, chb.as_ref());
    connect(&qpa, 1, qpb.qp_num(), 2, b.ctx.gid());
    connect(&qpb, 2, qpa.qp_num(), 1, a.ctx.gid());
    let ma = a.mr(64);
    let mb = b.mr(64);
    let post_recv = |qp: &softrdma::verbs::QueuePair, mr: &softrdma::verbs::MemoryRegion| {
        qp.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &[sge(mr, 0, 64)],
        }])
        .unwrap()
    };
    let send = |qp: &softrdma::verbs::QueuePair, mr: &softrdma::verbs::MemoryRegion, i: usize| {
        // Unsignaled inline sends, one signaled every 64 to free the send queue.
        qp.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            sg_list: &[sge(mr, 32, 8)],
            flags: SendFlags {
                inline: true,
                signaled: i % 64 == 63,
                ..Default::default()
            },
        }])
        .unwrap()
    };
    for _ in 0..64 {
        post_recv(&qpa, &ma);
        post_recv(&qpb, &mb);
    }
    let server = std::thread::spawn(move || {
        for i in 0..ITERS {
            next_recv(&cqb, chb.as_ref());
            post_recv(&qpb, &mb);
            send(&qpb, &mb, i);
        }
        (qpb, cqb, b)
    });
    let warm = 1000;
    let mut t0 = Instant::now();
    for i in 0..ITERS {
        if i == warm {
            t0 = Instant::now();
        }
        send(&qpa, &ma, i);
        next_recv(&cqa, cha.as_ref());
        post_recv(&qpa, &ma);
    }
    let dt = t0.elapsed();
    let _ = server.join().unwrap();
    let n = (ITERS - warm) as f64;
    println!(
        "SEND/RECV ping-pong, 8 bytes, {}: {:.1} µs round trip ({} iterations)",
        if events {
            "channel wait (get_cq_event)"
        } else {
            "busy polling"
        },
        dt.as_secs_f64() * 1e6 / n,
        ITERS - warm
    );
}

#[test]
#[ignore = "benchmark"]
fn bench_ping_pong_busy_poll() {
    ping_pong(false);
}

#[test]
#[ignore = "benchmark"]
fn bench_ping_pong_channel() {
    ping_pong(true);
}

/// RDMA READ latency against a passive side served by its progress thread.
#[test]
#[ignore = "benchmark"]
fn bench_read_latency_passive_peer() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    let (addr, rkey) = (mb.addr(), mb.rkey());
    let n = 5000;
    let t0 = Instant::now();
    for i in 0..n {
        a.post_send(
            i,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            &[sge(&ma, 0, 8)],
        );
        assert_eq!(a.wait().status, WcStatus::Success);
    }
    println!(
        "RDMA READ 8 bytes, passive peer (progress thread): {:.1} µs",
        t0.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    drop(b);
}

/// RDMA WRITE bandwidth, 64 KiB messages, 16 outstanding, passive peer.
#[test]
#[ignore = "benchmark"]
fn bench_write_bandwidth() {
    let (a, b) = pair();
    let len = 1 << 16;
    let ma = a.mr(len);
    let mb = b.mr(len);
    let (addr, rkey) = (mb.addr(), mb.rkey());
    let n = 2000u64;
    let t0 = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < n {
        while posted < n && posted - done < 16 {
            a.post_send(
                posted,
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey,
                },
                &[sge(&ma, 0, len)],
            );
            posted += 1;
        }
        assert_eq!(a.wait().status, WcStatus::Success);
        done += 1;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "RDMA WRITE 64 KiB x {n}, 16 outstanding, MTU 1024: {:.0} MB/s",
        (n as f64 * len as f64) / dt / 1e6
    );
    drop(b);
}
