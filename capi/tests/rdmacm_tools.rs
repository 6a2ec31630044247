//! librdmacm on softrdma: Debian's unmodified rdmacm-utils programs (server and client, two
//! processes on this machine's loopback device), and a C program that checks the API's
//! details (`c/rdmacm_api.c`). Each test uses its own ports.
//!
//! A client started before its server listens is refused; such a client is started again, a
//! bounded number of times, rather than guessing how long the server takes to start on a
//! loaded machine.

mod util;

use std::os::unix::process::CommandExt;
use std::process::{Child, Output};
use std::time::Duration;
use util::{have, run, text, wait};

const LIMIT: Duration = Duration::from_secs(120);

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// True if the client's output says nobody listened yet: REJECTED (RC, reason 8),
/// UNREACHABLE (UD: the SIDR reply's status 1), or ECONNREFUSED from a synchronous id.
fn refused(o: &Output) -> bool {
    let s = out(o);
    !o.status.success()
        && ["REJECTED", "UNREACHABLE", "refused"]
            .iter()
            .any(|w| s.contains(w))
}

/// One server/client pair at a time: the programs poll, and a 2-core machine running several
/// pairs at once only makes each slower.
/// Where it may (root), the pair also gets a network namespace of its own (see
/// `util::private_netns`), so other processes using the host's devices cannot disturb it.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = M.lock().unwrap_or_else(|e| e.into_inner());
    util::private_netns();
    g
}

/// Starts `server`, then runs the client (again while it is refused) and returns both
/// outputs; the server is waited for if `server_exits`, else killed once the client is done.
fn pair(
    prog_s: &str,
    server: &[&str],
    prog_c: &str,
    client: &[&str],
    server_exits: bool,
) -> (Output, Output) {
    let _one = one_at_a_time();
    // Its own process group, so that killing it reaches the program `softrdma run` started.
    let s: Child = run(prog_s, server).process_group(0).spawn().unwrap();
    let mut attempt = 0;
    let c = loop {
        std::thread::sleep(Duration::from_millis(300));
        let c = wait(run(prog_c, client).spawn().unwrap(), prog_c, LIMIT);
        attempt += 1;
        if !refused(&c) || attempt == 20 {
            break c;
        }
    };
    let group = -(s.id() as i32);
    // SAFETY: kill on the process group of a child we spawned (and still hold).
    let kill = move || unsafe { libc::kill(group, libc::SIGKILL) };
    if !server_exits || !c.status.success() {
        kill();
    }
    // A server that does not finish is killed with its program before `wait` reports it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        if rx.recv_timeout(LIMIT - Duration::from_secs(5)).is_err() {
            kill();
        }
    });
    let s = wait(s, prog_s, LIMIT);
    let _ = tx.send(());
    let _ = guard.join();
    (s, c)
}

/// Both programs exited 0 and each printed every line of `want`.
fn both_ok(s: &Output, c: &Output, want: &[&str]) {
    assert!(
        c.status.success(),
        "client: {}\nserver: {}",
        text(c),
        text(s)
    );
    assert!(
        s.status.success(),
        "server: {}\nclient: {}",
        text(s),
        text(c)
    );
    for o in [s, c] {
        for w in want {
            assert!(out(o).contains(w), "no {w:?} in {}", text(o));
        }
    }
}

fn skip(prog: &str) -> bool {
    if have(prog) {
        return false;
    }
    eprintln!("skipped: {prog} (rdmacm-utils) is not installed");
    true
}

/// The API's details from C: addresses and `rdma_getaddrinfo`, `rdma_get_devices`, the fields
/// of `rdma_cm_id`, events with their parameters and private data both ways, QPs and CQs made
/// by `rdma_create_qp`, reject, disconnect, non-blocking channels and `rpoll`, options,
/// migration, IPv6 addresses, errors.
#[test]
fn rdmacm_api_in_c() {
    if !util::have_headers() {
        return;
    }
    let exe = util::compile_c("rdmacm_api");
    // A namespace of its own when root: `lo` there has ::1, whatever the host's IPv6 setup.
    util::private_netns();
    let ports: Vec<String> = (0..4).map(|_| util::free_port().to_string()).collect();
    let ports: Vec<&str> = ports.iter().map(String::as_str).collect();
    let o = wait(
        run(exe.to_str().unwrap(), &ports).spawn().unwrap(),
        "rdmacm_api",
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(out(&o).contains("checks passed"), "{}", text(&o));
}

#[test]
fn cmtime_connects_and_disconnects() {
    if skip("cmtime") {
        return;
    }
    let port = util::free_port().to_string();
    let (s, c) = pair(
        "cmtime",
        &["-b", "127.0.0.1", "-p", &port],
        "cmtime",
        &["-s", "127.0.0.1", "-p", &port, "-c", "10"],
        false,
    );
    assert!(
        c.status.success(),
        "client: {}\nserver: {}",
        text(&c),
        text(&s)
    );
    let o = out(&c);
    for step in [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(o.contains(step), "no {step:?} in:\n{o}");
    }
}

fn ucmatose(extra: &[&str]) -> (Output, Output) {
    let port = util::free_port().to_string();
    let mut sa = vec!["-p", port.as_str(), "-c", "2"];
    sa.extend_from_slice(extra);
    let mut ca = vec!["-s", "127.0.0.1", "-p", port.as_str(), "-c", "2"];
    ca.extend_from_slice(extra);
    pair("ucmatose", &sa, "ucmatose", &ca, true)
}

#[test]
fn ucmatose_two_connections_ten_messages_each() {
    if skip("ucmatose") {
        return;
    }
    let (s, c) = ucmatose(&["-C", "10"]);
    both_ok(&s, &c, &["data transfers complete", "return status 0"]);
}

#[test]
fn ucmatose_migrates_ids_to_a_new_channel() {
    if skip("ucmatose") {
        return;
    }
    let (s, c) = ucmatose(&["-C", "0", "-m"]);
    both_ok(
        &s,
        &c,
        &["migrating to new event channel", "return status 0"],
    );
}

/// udaddy's port is fixed (7174; its `-p` is the port space), so only this test runs it.
#[test]
fn udaddy_ud_messages_through_address_handles() {
    if skip("udaddy") {
        return;
    }
    let (s, c) = pair("udaddy", &[], "udaddy", &["-s", "127.0.0.1"], true);
    both_ok(&s, &c, &["data transfers complete", "return status 0"]);
}

#[test]
fn rping_ten_verified_pings() {
    if skip("rping") {
        return;
    }
    let port = util::free_port().to_string();
    let (s, c) = pair(
        "rping",
        &["-s", "-a", "127.0.0.1", "-p", &port, "-C", "10", "-V"],
        "rping",
        &["-c", "-a", "127.0.0.1", "-p", &port, "-C", "10", "-V", "-v"],
        true,
    );
    both_ok(&s, &c, &[]);
    let o = out(&c);
    for i in 0..10 {
        assert!(
            o.contains(&format!("ping data: rdma-ping-{i}: ")),
            "ping {i} missing:\n{o}"
        );
    }
}

/// `-q`: rping creates its QPs itself and moves them with `rdma_init_qp_attr`; the client gets
/// CONNECT_RESPONSE and calls `rdma_establish`.
#[test]
fn rping_with_its_own_qps() {
    if skip("rping") {
        return;
    }
    let port = util::free_port().to_string();
    let (s, c) = pair(
        "rping",
        &["-s", "-q", "-a", "127.0.0.1", "-p", &port, "-C", "5", "-V"],
        "rping",
        &[
            "-c",
            "-q",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "5",
            "-V",
            "-v",
        ],
        true,
    );
    both_ok(&s, &c, &[]);
    assert!(out(&c).contains("ping data: rdma-ping-4: "), "{}", text(&c));
}

/// The IPv6 wildcard takes an IPv4 peer, which may name itself IPv4-mapped.
#[test]
fn rping_ipv6_wildcard_server_ipv4_mapped_client() {
    if skip("rping") {
        return;
    }
    let port = util::free_port().to_string();
    let (s, c) = pair(
        "rping",
        &["-s", "-a", "::", "-p", &port, "-C", "3", "-V"],
        "rping",
        &[
            "-c",
            "-a",
            "::ffff:127.0.0.1",
            "-p",
            &port,
            "-C",
            "3",
            "-V",
            "-v",
        ],
        true,
    );
    both_ok(&s, &c, &[]);
    assert!(out(&c).contains("ping data: rdma-ping-2: "), "{}", text(&c));
}

/// rping, udaddy and ucmatose over IPv6 (`::1`): rdma_cm ids on IPv6 addresses, RoCEv2 over
/// IPv6 underneath.
#[test]
fn rping_udaddy_ucmatose_over_ipv6() {
    if skip("rping") || skip("udaddy") || skip("ucmatose") {
        return;
    }
    let port = util::free_port().to_string();
    let v6 = {
        let _ns = one_at_a_time();
        std::net::UdpSocket::bind("[::1]:0").is_ok()
    };
    if !v6 {
        eprintln!("skipped: no ::1 here (IPv6 disabled)");
        return;
    }
    let (s, c) = pair(
        "rping",
        &["-s", "-a", "::1", "-p", &port, "-C", "3", "-V"],
        "rping",
        &["-c", "-a", "::1", "-p", &port, "-C", "3", "-V", "-v"],
        true,
    );
    both_ok(&s, &c, &[]);
    assert!(out(&c).contains("ping data: rdma-ping-2: "), "{}", text(&c));
    let (s, c) = pair("udaddy", &["-b", "::1"], "udaddy", &["-s", "::1"], true);
    both_ok(&s, &c, &["data transfers complete", "return status 0"]);
    let (s, c) = pair("ucmatose", &["-b", "::1"], "ucmatose", &["-s", "::1"], true);
    both_ok(&s, &c, &["data transfers complete", "return status 0"]);
}

/// `rdma_server`/`rdma_client` and the x versions: synchronous endpoints (`rdma_create_ep`,
/// `rdma_get_request`), the `rdma_verbs.h` helpers on the CQs and channels librdmacm creates.
fn endpoints(server: &str, client: &str) {
    if skip(server) || skip(client) {
        return;
    }
    let port = util::free_port().to_string();
    let (s, c) = pair(
        server,
        &["-p", &port],
        client,
        &["-s", "127.0.0.1", "-p", &port],
        true,
    );
    both_ok(&s, &c, &[]);
    assert!(
        out(&s).contains(&format!("{server}: end 0")),
        "{}",
        text(&s)
    );
    assert!(
        out(&c).contains(&format!("{client}: end 0")),
        "{}",
        text(&c)
    );
}

#[test]
fn rdma_server_and_client() {
    endpoints("rdma_server", "rdma_client");
}

#[test]
fn rdma_xserver_and_xclient() {
    endpoints("rdma_xserver", "rdma_xclient");
}
