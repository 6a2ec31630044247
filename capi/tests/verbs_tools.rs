//! Debian's unmodified libibverbs programs (ibverbs-utils) on softrdma's libibverbs.so.1, two
//! processes on this machine, each opening the first device as a user would.

mod util;

use std::time::Duration;
use util::{have, run, text, wait};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn ibv_devices_lists_softrdmas_devices() {
    if !have("ibv_devices") {
        eprintln!("skipped: ibverbs-utils is not installed");
        return;
    }
    let ours = std::process::Command::new(util::softrdma())
        .arg("devices")
        .output()
        .expect("softrdma devices");
    let o = wait(
        run("ibv_devices", &[]).spawn().unwrap(),
        "ibv_devices",
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let listed = String::from_utf8_lossy(&o.stdout).to_string();
    let names: Vec<String> = String::from_utf8_lossy(&ours.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(!names.is_empty(), "softrdma lists devices");
    for n in &names {
        assert!(
            listed.contains(n.as_str()),
            "{n} missing from ibv_devices:\n{listed}"
        );
    }
}

#[test]
fn ibv_devinfo_shows_an_active_roce_port() {
    if !have("ibv_devinfo") {
        eprintln!("skipped: ibverbs-utils is not installed");
        return;
    }
    let o = wait(
        run("ibv_devinfo", &["-v"]).spawn().unwrap(),
        "ibv_devinfo",
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "hca_id:\tsrxe",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:",
        "::ffff:",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
}

/// Runs `prog` as server and client (`extra` for both) and checks both report `iters`
/// exchanges.
fn pingpong(prog: &str, extra: &[&str], iters: u32) {
    pingpong_gid(prog, extra, iters, 0)
}

/// [`pingpong`] over GID `gid` of the first device (`-g`); skipped if it has no such GID.
fn pingpong_gid(prog: &str, extra: &[&str], iters: u32, gid: u32) {
    // The tools have no timeouts, and UC and UD lose a message for good if a datagram is lost,
    // which a shared device can do while other processes join and leave it: the pair gets a
    // network namespace of its own where it can, and pairs run one at a time otherwise.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one =
        (!util::private_netns()).then(|| ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
    if !have(prog) {
        eprintln!("skipped: {prog} is not installed");
        return;
    }
    if gid > 0 {
        let first = softrdma::devices().ok().and_then(|d| d.into_iter().next());
        let len = first
            .and_then(|d| d.open().ok())
            .and_then(|c| c.query_port(1).ok())
            .map_or(0, |p| p.gid_tbl_len);
        if gid >= len {
            eprintln!("skipped: the first device has no GID {gid} (no IPv6 address)");
            return;
        }
    }
    let port = util::free_port().to_string();
    let n = iters.to_string();
    let g = gid.to_string();
    let mut args = vec!["-g", g.as_str(), "-p", port.as_str(), "-n", n.as_str()];
    args.extend_from_slice(extra);
    let server = run(prog, &args).spawn().unwrap();
    // The client retries its TCP connect until the server listens (as the tools do not).
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let mut client_out = None;
    for _ in 0..100 {
        let o = wait(run(prog, &client_args).spawn().unwrap(), prog, LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() && err.contains("Couldn't connect to") {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        client_out = Some(o);
        break;
    }
    let Some(client) = client_out else {
        // Show why the server never listened.
        let mut server = server;
        let _ = server.kill();
        let o = server.wait_with_output().expect("server output");
        panic!("the client never reached the server: {}", text(&o));
    };
    let server = wait(server, prog, LIMIT);
    for (who, o) in [("server", &server), ("client", &client)] {
        assert!(o.status.success(), "{prog} {who}: {}", text(o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("{iters} iters in")),
            "{prog} {who} did not report {iters} iterations: {}",
            text(o)
        );
        // Over an IPv6 GID both ends show IPv6 GIDs (not IPv4-mapped ones).
        if gid > 0 {
            let gids: Vec<&str> = out.lines().filter_map(|l| l.split("GID ").nth(1)).collect();
            assert!(
                gids.len() == 2
                    && gids
                        .iter()
                        .all(|g| g.contains(':') && !g.starts_with("::ffff:")),
                "{prog} {who}: {}",
                text(o)
            );
        }
    }
}

#[test]
fn ibv_rc_pingpong_polling() {
    pingpong("ibv_rc_pingpong", &[], 500);
}

#[test]
fn ibv_rc_pingpong_events_and_large_messages_checked() {
    pingpong("ibv_rc_pingpong", &["-e", "-s", "65536", "-c"], 100);
}

#[test]
fn ibv_rc_pingpong_new_send_api() {
    pingpong("ibv_rc_pingpong", &["-N", "-s", "1024"], 200);
}

#[test]
fn ibv_uc_pingpong() {
    // 4 packets per message at ibv_uc_pingpong's default path MTU (1024).
    pingpong("ibv_uc_pingpong", &["-s", "4096"], 500);
}

#[test]
fn ibv_uc_pingpong_events() {
    pingpong("ibv_uc_pingpong", &["-e", "-s", "10000", "-m", "4096"], 100);
}

#[test]
fn ibv_ud_pingpong() {
    pingpong("ibv_ud_pingpong", &["-s", "1024"], 500);
}

/// GID 2 is the first device's first IPv6 address (`::1` when the pair has a network
/// namespace of its own): RoCEv2 over IPv6 through the C ABI.
#[test]
fn ibv_rc_pingpong_over_ipv6() {
    pingpong_gid("ibv_rc_pingpong", &["-s", "4096"], 200, 2);
}

#[test]
fn ibv_ud_pingpong_over_ipv6() {
    pingpong_gid("ibv_ud_pingpong", &["-s", "1024"], 200, 2);
}

#[test]
fn ibv_srq_pingpong_sixteen_qps_on_one_srq() {
    pingpong("ibv_srq_pingpong", &["-s", "2048"], 200);
}
