//! RC WRITE throughput under packet loss, in the deterministic simulator (no sockets, no wall
//! clock): a stream of 64 KiB RDMA WRITEs with perftest's window of outstanding WRs, over a
//! modelled path (bandwidth each way, one-way delay, seeded loss each way), lossless against
//! 2% loss. Prints a table; asserts nothing beyond what `write_stream` checks (every WRITE
//! completes successfully and in order).
//!
//! ```text
//! cargo bench --bench rc_loss
//! SOFTRDMA_SIM_MSGS=2000 SOFTRDMA_SIM_SEEDS=5 cargo bench --bench rc_loss
//! ```
//!
//! Columns: throughput in MB/s of payload per simulated second (the median over seeds), its
//! ratio to the lossless run, and the sender's and receiver's loss-recovery counters (summed
//! over the seeds, per 100 messages): request packets sent, retransmitted; go-backs on a NAK;
//! local ACK timeouts; tail-loss probes; PSNs rewound; the receiver's out-of-sequence drops;
//! and the share of simulated time spent with nothing on the link, waiting for a timer.

use std::time::Duration;

use softrdma::sim::{write_stream, LinkConfig, StreamOpts, StreamReport};
use softrdma::verbs::Mtu;

struct Profile {
    name: &'static str,
    rate: u64,
    delay: Duration,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; a filter argument, if any, selects profiles by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let msgs = env("SOFTRDMA_SIM_MSGS", 1000);
    let seeds = env("SOFTRDMA_SIM_SEEDS", 3);
    // SOFTRDMA_SIM_SPLIT=1: each packet of a WRITE a message of its own (what a device that
    // sends with UDP GSO does, `RcQp::set_split_writes`).
    let split = env("SOFTRDMA_SIM_SPLIT", 0) != 0;
    let profiles = [
        Profile {
            name: "10MB/s,500us",
            rate: 10_000_000,
            delay: Duration::from_micros(500),
        },
        Profile {
            name: "1Gb/s,50us",
            rate: 125_000_000,
            delay: Duration::from_micros(50),
        },
        Profile {
            name: "10Gb/s,20us",
            rate: 1_250_000_000,
            delay: Duration::from_micros(20),
        },
    ];
    println!(
        "64 KiB RDMA WRITE stream, {msgs} messages, median of {seeds} seeds, timeout 14 (67 ms), retry 7"
    );
    println!(
        "{:<14} {:>5} {:>5} {:>5} {:>9} {:>6} | per 100 msgs: {:>6} {:>6} {:>5} {:>5} {:>5} {:>6} {:>6} | {:>5}",
        "path", "mtu", "depth", "loss", "MB/s", "ratio", "sent", "rexmit", "naks", "rto", "tlp", "rewnd", "ooo", "idle"
    );
    for p in &profiles {
        if filter
            .as_ref()
            .is_some_and(|f| !p.name.contains(f.as_str()))
        {
            continue;
        }
        for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
            for depth in [128u32] {
                let mut base = 0.0;
                for loss in [0.0, 0.02] {
                    let mut runs: Vec<StreamReport> = (0..seeds)
                        .map(|seed| {
                            let cfg = LinkConfig::path(p.rate, p.delay, loss);
                            let o = StreamOpts {
                                messages: msgs,
                                depth,
                                mtu,
                                split_writes: split,
                                ..StreamOpts::default()
                            };
                            let r = write_stream(seed + 1, cfg, o, 200_000_000);
                            assert_eq!(r.messages, msgs, "seed {seed}: stuck: {r:?}");
                            r
                        })
                        .collect();
                    let len = 64 << 10;
                    runs.sort_by(|a, b| a.mbps(len).total_cmp(&b.mbps(len)));
                    let med = runs[runs.len() / 2].mbps(len);
                    if loss == 0.0 {
                        base = med;
                    }
                    let per = |f: &dyn Fn(&StreamReport) -> u64| {
                        runs.iter().map(f).sum::<u64>() as f64 * 100.0 / (msgs * seeds) as f64
                    };
                    let idle: f64 = runs
                        .iter()
                        .map(|r| r.idle.as_secs_f64() / r.elapsed.as_secs_f64())
                        .sum::<f64>()
                        / runs.len() as f64;
                    println!(
                        "{:<14} {:>5} {:>5} {:>4}% {:>9.1} {:>5.0}% | {:>13.0} {:>6.0} {:>5.1} {:>5.1} {:>5.1} {:>6.0} {:>6.0} | {:>4.0}%",
                        p.name,
                        mtu.bytes(),
                        depth,
                        loss * 100.0,
                        med,
                        med / base * 100.0,
                        per(&|r| r.sender.sent),
                        per(&|r| r.sender.retransmitted),
                        per(&|r| r.sender.nak_retries),
                        per(&|r| r.sender.timeouts),
                        per(&|r| r.sender.probes),
                        per(&|r| r.sender.rewound),
                        per(&|r| r.receiver.out_of_seq),
                        idle * 100.0,
                    );
                }
            }
        }
    }
}
