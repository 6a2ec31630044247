//! C programs compiled with the system's compiler against rdma-core's headers, linked with
//! `-libverbs -lrdmacm` as any RDMA program is, and run on softrdma's libraries.

mod util;

use std::time::Duration;
use util::{compile_c, have_headers, run, text, wait};

/// Runs a self-checking C program (it prints "N checks, 0 failed") and asserts it ran at least
/// `min` checks with none failed.
fn run_checks(name: &str, min: u32) {
    if !have_headers() {
        return;
    }
    util::private_netns();
    let exe = compile_c(name);
    let o = wait(
        run(exe.to_str().unwrap(), &[]).spawn().unwrap(),
        name,
        Duration::from_secs(120),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains(" checks, 0 failed"), "{}", text(&o));
    let n: u32 = out
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    assert!(n >= min, "only {n} checks ran: {}", text(&o));
}

/// The extended verbs through `struct verbs_context`: `ibv_query_device_ex`, the inline
/// `ibv_query_port`, `ibv_query_gid_ex`, `ibv_create_cq_ex` with the `ibv_start_poll` API, and
/// `ibv_create_qp_ex` with the `ibv_wr_*` post API (inline data, immediate, WRITE, READ,
/// atomics), each result checked in memory.
#[test]
fn extended_verbs_work() {
    run_checks("ex_verbs", 25);
}

/// Bad input at the ABI: NULL and destroyed handles, out-of-range queries, unsupported objects,
/// oversized and malformed work requests, a WR naming a deregistered MR, remote access outside
/// an MR. Every call must return the documented errno or completion status; the program counts
/// its checks and fails on any miss (or a crash).
#[test]
fn bad_input_gets_the_documented_errors() {
    run_checks("bad_input", 50);
}
