//! The C libraries against the Rust API, same machine, same run: Debian's perftest
//! (`ib_write_bw`, `ib_send_lat`) and `ibv_rc_pingpong` on softrdma's libibverbs.so.1 (through
//! `softrdma run`) against softrdma's Rust versions of the same programs (`examples/perftest`
//! `write` and `send_lat`, `examples/rc_pingpong`), two
//! processes on the first device, each pair run alternately `ROUNDS` times; prints the medians
//! and the ratio C/Rust.
//!
//! ```text
//! cargo build --release -p softrdma --examples && cargo bench -p softrdma-capi --bench c_vs_rust
//! ```
//!
//! Nothing is asserted: this is a benchmark.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROUNDS: usize = 5;

fn examples() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_softrdma"));
    bin.parent().expect("target dir").join("examples")
}

/// Runs a server and a client (the client retried until the server listens) and returns the
/// client's stdout.
fn pair(server: &[String], client: &[String]) -> Option<String> {
    let mut s = Command::new(&server[0])
        .args(&server[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut out = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        let o = Command::new(&client[0]).args(&client[1..]).output().ok()?;
        if o.status.success() {
            out = Some(String::from_utf8_lossy(&o.stdout).to_string());
            break;
        }
    }
    let _ = s.kill();
    let _ = s.wait();
    out
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// perftest's bandwidth line: "size iters peak avg msgrate" -> average MB/s.
fn bw_avg(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 5 && f[0] == "65536")
            .then(|| f[3].parse().ok())
            .flatten()
    })
}

/// rc_pingpong's "N iters in S seconds = U usec/iter" -> µs per round trip.
fn usec_per_iter(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let (_, tail) = l.split_once(" = ")?;
        tail.strip_suffix(" usec/iter")?.trim().parse().ok()
    })
}

/// perftest's latency line: "size iters t_min t_max t_typical ..." -> t_typical (µs).
fn t_typical(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 9 && f[0] == "2")
            .then(|| f[4].parse().ok())
            .flatten()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    let softrdma = env!("CARGO_BIN_EXE_softrdma");
    let ex = examples();
    let have = |p: &Path| p.exists();
    if !have(&ex.join("perftest")) || !have(&ex.join("rc_pingpong")) {
        eprintln!("build the Rust programs first: cargo build --release -p softrdma --examples");
        return;
    }
    let ex_s = |n: &str| ex.join(n).to_string_lossy().to_string();
    let c = |prog: &str, rest: &[&str]| {
        let mut v = args(&[softrdma, "run", "--", prog]);
        v.extend(args(rest));
        v
    };
    let r = |prog: &str, rest: &[&str]| {
        let mut v = vec![ex_s(prog)];
        v.extend(args(rest));
        v
    };
    println!(
        "{:<34} {:>12} {:>12} {:>7}",
        "item", "C libs", "Rust API", "C/Rust"
    );
    // 64 KiB RDMA WRITE bandwidth, perftest's defaults otherwise (TCP exchange, GID index 0).
    let bw = ["-x", "0", "-s", "65536", "-n", "20000", "-p", "18700"];
    let mut cv = Vec::new();
    let mut rv = Vec::new();
    for _ in 0..ROUNDS {
        let mut cc = bw.to_vec();
        cc.push("127.0.0.1");
        if let Some(v) =
            pair(&c("ib_write_bw", &bw), &c("ib_write_bw", &cc)).and_then(|o| bw_avg(&o))
        {
            cv.push(v);
        }
        let mut rs = vec!["write"];
        rs.extend_from_slice(&bw);
        let mut rc = rs.clone();
        rc.push("127.0.0.1");
        if let Some(v) = pair(&r("perftest", &rs), &r("perftest", &rc)).and_then(|o| bw_avg(&o)) {
            rv.push(v);
        }
    }
    if !cv.is_empty() && !rv.is_empty() {
        let (a, b) = (median(cv), median(rv));
        println!(
            "{:<34} {:>9.0} MB/s {:>7.0} MB/s {:>7.2}",
            "64 KiB WRITE bw (ib_write_bw)",
            a,
            b,
            a / b
        );
    }
    // ib_send_lat: 2-byte SEND/RECV ping-pong, half the round trip (perftest's "typical").
    let lat = ["-x", "0", "-s", "2", "-n", "20000", "-p", "18702"];
    let mut cv = Vec::new();
    let mut rv = Vec::new();
    for _ in 0..ROUNDS {
        let mut cc = lat.to_vec();
        cc.push("127.0.0.1");
        if let Some(v) =
            pair(&c("ib_send_lat", &lat), &c("ib_send_lat", &cc)).and_then(|o| t_typical(&o))
        {
            cv.push(v);
        }
        let mut rs = vec!["send_lat"];
        rs.extend_from_slice(&lat);
        let mut rc = rs.clone();
        rc.push("127.0.0.1");
        if let Some(v) = pair(&r("perftest", &rs), &r("perftest", &rc)).and_then(|o| t_typical(&o))
        {
            rv.push(v);
        }
    }
    if !cv.is_empty() && !rv.is_empty() {
        let (a, b) = (median(cv), median(rv));
        println!(
            "{:<34} {:>10.2} µs {:>9.2} µs {:>7.2}",
            "2 B SEND latency (ib_send_lat)",
            a,
            b,
            a / b
        );
    }
    // 8-byte SEND/RECV ping-pong, busy polling.
    let pp = ["-g", "0", "-s", "8", "-n", "20000", "-p", "18701"];
    let mut cv = Vec::new();
    let mut rv = Vec::new();
    for _ in 0..ROUNDS {
        let mut cc = pp.to_vec();
        cc.push("127.0.0.1");
        if let Some(v) = pair(&c("ibv_rc_pingpong", &pp), &c("ibv_rc_pingpong", &cc))
            .and_then(|o| usec_per_iter(&o))
        {
            cv.push(v);
        }
        if let Some(v) =
            pair(&r("rc_pingpong", &pp), &r("rc_pingpong", &cc)).and_then(|o| usec_per_iter(&o))
        {
            rv.push(v);
        }
    }
    if !cv.is_empty() && !rv.is_empty() {
        let (a, b) = (median(cv), median(rv));
        println!(
            "{:<34} {:>10.1} µs {:>9.1} µs {:>7.2}",
            "8 B SEND ping-pong (rc_pingpong)",
            a,
            b,
            a / b
        );
    }
}
