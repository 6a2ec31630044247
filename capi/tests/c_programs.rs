//! C programs compiled with the system's compiler against rdma-core's headers, linked with
//! `-libverbs -lrdmacm` as any RDMA program is, and run on softrdma's libraries.

mod util;

use std::time::Duration;
use util::{compile_c, have_headers, run, text, wait};

/// Bad input at the ABI: NULL and destroyed handles, out-of-range queries, unsupported objects,
/// oversized and malformed work requests, a WR naming a deregistered MR, remote access outside
/// an MR. Every call must return the documented errno or completion status; the program counts
/// its checks and fails on any miss (or a crash).
#[test]
fn bad_input_gets_the_documented_errors() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("bad_input");
    let o = wait(
        run(exe.to_str().unwrap(), &[]).spawn().unwrap(),
        "bad_input",
        Duration::from_secs(120),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains(" checks, 0 failed"), "{}", text(&o));
    let n: u32 = out
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    assert!(n >= 50, "only {n} checks ran: {}", text(&o));
}
