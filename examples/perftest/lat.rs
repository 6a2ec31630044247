//! ib_send_lat's test (`run_iter_lat_send`): the client sends, the server answers each message
//! it receives with one of its own, `iters` times each way; each side busy-polls its CQ. A
//! latency sample is half the time between two of this side's sends (one round trip), and the
//! report is perftest's: minimum, maximum, median ("typical"), average, standard deviation and
//! the 99% and 99.9% percentiles, in microseconds.

use std::time::{Duration, Instant};

use softrdma::verbs::{CompletionQueue, MemoryRegion, QueuePair, RecvWr, WorkCompletion};
use softrdma::verbs::{SendOp, Sge, WcOpcode};

use super::Opts;

/// Run the ping-pong; returns one-way latency samples in microseconds.
pub fn ping_pong(
    o: &Opts,
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    half: usize,
    client: bool,
) -> Result<Vec<f64>, String> {
    let send_sge = [Sge {
        addr: mr.addr(),
        length: o.size as u32,
        lkey: mr.lkey(),
    }];
    let recv_sge = [Sge {
        addr: mr.addr() + half as u64,
        length: o.size as u32,
        lkey: mr.lkey(),
    }];
    let mut posted_at: Vec<Instant> = Vec::with_capacity(o.iters as usize);
    let mut wcs = [WorkCompletion::default(); 8];
    let (mut sent, mut received, mut send_done) = (0u64, 0u64, 0u64);
    let mut reposted = o.iters.min(super::LAT_RX_DEPTH);
    let mut last_progress = Instant::now();
    while sent < o.iters || received < o.iters || send_done < sent {
        // The client speaks first; after that each side sends once per message received.
        let may_send = sent < o.iters
            && (if client {
                sent == received
            } else {
                sent < received
            });
        if may_send {
            posted_at.push(Instant::now());
            super::post_signaled(qp, sent, SendOp::Send, &send_sge)?;
            sent += 1;
        }
        let n = cq
            .poll(&mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        for wc in &wcs[..n] {
            super::check_wc(wc, if client { "client" } else { "server" })?;
            if wc.opcode == WcOpcode::Recv {
                received += 1;
                if reposted < o.iters {
                    qp.post_recv(&[RecvWr {
                        wr_id: reposted,
                        sg_list: &recv_sge,
                    }])
                    .map_err(|e| format!("Couldn't post recv: rcnt={received}: {e}"))?;
                    reposted += 1;
                }
            } else {
                send_done += 1;
            }
        }
        if n > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "no completion for 30 s ({sent} sent, {received} received of {})",
                o.iters
            ));
        }
    }
    Ok(posted_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect())
}

/// perftest's latency line for `size`-byte messages.
pub fn print(size: usize, samples: &[f64]) {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        v.push(0.0);
    }
    let n = v.len();
    let avg = v.iter().sum::<f64>() / n as f64;
    let stdev = (v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64).sqrt();
    let pct = |p: f64| v[((n as f64 * p) as usize).min(n - 1)];
    println!(
        " {:<7} {:<10}   {:<7.2}        {:<7.2}      {:<7.2}     \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}   \t\t{:<7.2}",
        size,
        n + 1,
        v[0],
        v[n - 1],
        v[n / 2],
        avg,
        stdev,
        pct(0.99),
        pct(0.999)
    );
}
