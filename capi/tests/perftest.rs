//! Debian's perftest (`ib_{send,write,read,atomic}_{bw,lat}`), unmodified, on softrdma's
//! libraries: server and client on this machine, with the TCP exchange and with `-R`
//! (rdma_cm), each result table checked, and `ib_atomic_bw`'s counter checked in memory by the
//! server's report.

mod util;

use std::process::Output;
use std::time::Duration;
use util::{have, run, text, wait};

const LIMIT: Duration = Duration::from_secs(120);

fn is_refused(o: &Output) -> bool {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    all.contains("Couldn't connect to") || all.contains("Unexpected CM event bl blka 8")
}

/// Runs `prog args` as server and `prog args 127.0.0.1` as client (again while the server is
/// not listening yet); returns (server, client) outputs.
fn pair(prog: &str, args: &[&str]) -> Option<(Output, Output)> {
    if !have(prog) {
        eprintln!("skipped: {prog} (perftest) is not installed");
        return None;
    }
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    util::private_netns();
    let port = util::free_port().to_string();
    let mut a: Vec<&str> = args.to_vec();
    a.extend_from_slice(&["-p", &port]);
    let server = run(prog, &a).spawn().unwrap();
    let mut ca = a.clone();
    ca.push("127.0.0.1");
    let mut client = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        let o = wait(run(prog, &ca).spawn().unwrap(), prog, LIMIT);
        if !o.status.success() && is_refused(&o) {
            continue;
        }
        client = Some(o);
        break;
    }
    let client = client.expect("the client reached the server");
    let server = wait(server, prog, LIMIT);
    Some((server, client))
}

/// The first row of perftest's result table under `header` (a line starting with `#bytes`).
fn result_row(o: &Output) -> Option<Vec<String>> {
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    let row = lines.next()?;
    Some(row.split_whitespace().map(str::to_string).collect())
}

fn check(prog: &str, extra: &[&str], size: &str, iters: &str) {
    let mut args = vec!["-n", iters];
    args.extend_from_slice(extra);
    if !args.contains(&"-R") {
        args.extend_from_slice(&["-x", "0"]);
    }
    let Some((s, c)) = pair(prog, &args) else {
        return;
    };
    assert!(s.status.success(), "{prog} {extra:?} server: {}", text(&s));
    assert!(c.status.success(), "{prog} {extra:?} client: {}", text(&c));
    let row =
        result_row(&c).unwrap_or_else(|| panic!("{prog} {extra:?}: no result row: {}", text(&c)));
    assert_eq!(
        row.first().map(String::as_str),
        Some(size),
        "{prog}: {row:?}"
    );
    if prog.ends_with("_bw") {
        assert_eq!(
            row.get(1).map(String::as_str),
            Some(iters),
            "{prog}: {row:?}"
        );
        let avg: f64 = row[3].parse().expect("BW average");
        assert!(avg > 0.0, "{prog}: no bandwidth in {row:?}");
    } else {
        assert_eq!(
            row.get(1).map(String::as_str),
            Some(iters),
            "{prog}: {row:?}"
        );
        let t_min: f64 = row[2].parse().expect("t_min");
        assert!(t_min > 0.0, "{prog}: {row:?}");
    }
}

macro_rules! perftest {
    ($($(#[$m:meta])* $name:ident: $prog:literal $extra:expr, $size:literal;)*) => {$(
        #[test]
        $(#[$m])*
        fn $name() {
            check($prog, $extra, $size, "200");
        }
    )*};
}

// With `-R`, perftest syncs over one rdma_cm connection and then the server listens on a second
// id while the client connects to it: the client's REQ can arrive first (softrdma's active side
// is fast), and Debian's perftest 4.5 cannot retry (it reuses ids it destroyed). These tests
// are what caught it; the REQ now waits for the listener (cm/manager/unclaimed.rs).
perftest! {
    ib_write_bw_tcp: "ib_write_bw" &["-s", "65536"], "65536";
    ib_write_bw_rdma_cm: "ib_write_bw" &["-R", "-s", "65536"], "65536";
    ib_read_bw_tcp: "ib_read_bw" &["-s", "65536"], "65536";
    ib_read_bw_rdma_cm: "ib_read_bw" &["-R", "-s", "65536"], "65536";
    ib_send_bw_tcp: "ib_send_bw" &["-s", "65536"], "65536";
    ib_send_bw_rdma_cm: "ib_send_bw" &["-R", "-s", "65536"], "65536";
    ib_atomic_bw_tcp: "ib_atomic_bw" &[], "8";
    ib_atomic_bw_rdma_cm: "ib_atomic_bw" &["-R"], "8";
    ib_write_lat_tcp: "ib_write_lat" &["-s", "2"], "2";
    ib_write_lat_rdma_cm: "ib_write_lat" &["-R", "-s", "2"], "2";
    ib_read_lat_tcp: "ib_read_lat" &["-s", "2"], "2";
    ib_read_lat_rdma_cm: "ib_read_lat" &["-R", "-s", "2"], "2";
    ib_send_lat_tcp: "ib_send_lat" &["-s", "2"], "2";
    ib_send_lat_rdma_cm: "ib_send_lat" &["-R", "-s", "2"], "2";
    ib_atomic_lat_tcp: "ib_atomic_lat" &[], "8";
    ib_atomic_lat_rdma_cm: "ib_atomic_lat" &["-R"], "8";
}
