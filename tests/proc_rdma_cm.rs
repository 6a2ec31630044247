//! rdma_cm between two processes on one machine: the rping and cmatose examples as server and
//! client. The server binds a 127.0.0.x address of its own (`-a`/`-b`: its endpoint binds
//! exactly that address), the client's endpoint takes the first free 127.0.0.x.

mod examples_util;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use examples_util::example;

const TIMEOUT: Duration = Duration::from_secs(120);

fn spawn(name: &str, args: &[&str]) -> Child {
    Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"))
}

/// A server process, killed if the test fails before it finished.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Server {
    fn finish(mut self, what: &str) -> Output {
        finish(self.0.take().expect("running"), what)
    }
}

/// Wait for `child` (killed after [`TIMEOUT`]).
fn finish(mut child: Child, what: &str) -> Output {
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish in {TIMEOUT:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run the client until it succeeds (the server may not listen yet: REJECTED), at most 20 times.
fn client(name: &str, args: &[&str]) -> Output {
    let mut last = None;
    for _ in 0..20 {
        let out = finish(spawn(name, args), name);
        if out.status.success() {
            return out;
        }
        last = Some(out);
        std::thread::sleep(Duration::from_millis(250));
    }
    let out = last.expect("ran");
    panic!(
        "{name} client kept failing:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A loopback address no endpoint uses (nothing answers on its UDP port 4791), a different one
/// for each test of this binary (they run in parallel).
fn free_loopback() -> String {
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(100);
    loop {
        let x = NEXT.fetch_add(7, std::sync::atomic::Ordering::Relaxed);
        assert!(x < 250, "no free 127.0.0.x");
        let a = std::net::Ipv4Addr::new(127, 0, 0, x);
        if std::net::UdpSocket::bind((a, 4791)).is_ok() {
            return a.to_string();
        }
    }
}

#[test]
fn rping_cmatose_and_seed_001_between_two_processes() {
    examples_util::private_netns();
    rping_and_cmatose();
    seed_rdma_cm_server_and_client();
}

fn rping_and_cmatose() {
    let addr = free_loopback();
    let port = (20000 + std::process::id() % 20000).to_string();
    // rping: 10 pings of 3000 bytes (READ and WRITE span several packets), validated.
    let server = Server(Some(spawn(
        "rping",
        &["-s", "-a", &addr, "-v", "-S", "3000", "-p", &port],
    )));
    let c = client(
        "rping",
        &[
            "-c", "-a", &addr, "-p", &port, "-C", "10", "-S", "3000", "-v", "-V",
        ],
    );
    let s = server.finish("rping server");
    assert!(s.status.success(), "rping server: {}", text(&s));
    let (ct, st) = (text(&c), text(&s));
    assert_eq!(ct.matches("ping data: rdma-ping-").count(), 10, "{ct}");
    assert!(ct.contains("ping data: rdma-ping-9: "), "{ct}");
    assert_eq!(
        st.matches("server ping data: rdma-ping-").count(),
        10,
        "{st}"
    );
    assert!(st.contains("server DISCONNECT EVENT"), "{st}");

    // cmatose: 8 connections, 30 messages each way.
    let port = (20001 + std::process::id() % 20000).to_string();
    let server = Server(Some(spawn(
        "cmatose",
        &["-b", &addr, "-p", &port, "-c", "8", "-C", "30"],
    )));
    let c = client(
        "cmatose",
        &["-s", &addr, "-p", &port, "-c", "8", "-C", "30"],
    );
    let s = server.finish("cmatose server");
    let (ct, st) = (text(&c), text(&s));
    assert!(s.status.success(), "{st}");
    assert!(ct.contains("return status 0"), "{ct}");
    assert!(
        st.contains("data transfers complete") && st.contains("disconnected"),
        "{st}"
    );
}

/// The seed's (001) server and client as two processes: the client connects to the port the
/// server printed, both print the other's message, the client disconnects, both exit 0. (Run
/// after the others, from one test: these processes must not race each other for addresses.)
fn seed_rdma_cm_server_and_client() {
    use std::io::{BufRead, BufReader, Read};
    // As the seed: the server binds any address and the client connects to 127.0.0.1, which
    // the server's loopback endpoint holds (nothing else runs now).
    let addr = "127.0.0.1".to_string();
    let mut server = Command::new(example("rdma_cm_server"))
        .arg("--once")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdma_cm_server");
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the server's first line");
    let port = first
        .trim()
        .strip_prefix("listening on port ")
        .and_then(|p| p.strip_suffix('.'))
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    let server = Server(Some(server));
    let c = finish(
        spawn("rdma_cm_client", &["127.0.0.1", &port]),
        "rdma_cm_client",
    );
    let ct = text(&c);
    assert!(
        c.status.success(),
        "client to {addr}:{port} (server said {first:?}): {ct}"
    );
    for line in [
        "address resolved.",
        "route resolved.",
        "connected. posting send...",
        "send completed successfully.",
        "received message: message from passive/server side with pid",
        "disconnected.",
    ] {
        assert!(ct.contains(line), "client lacks {line:?}:\n{ct}");
    }
    let mut rest = String::new();
    let s = server.finish("rdma_cm_server");
    let _ = out.read_to_string(&mut rest);
    assert!(s.status.success(), "{rest}{}", text(&s));
    for line in [
        "received connection request.",
        "connected. posting send...",
        "received message: message from active/client side with pid",
        "send completed successfully.",
        "peer disconnected.",
    ] {
        assert!(rest.contains(line), "server lacks {line:?}:\n{rest}");
    }
}

/// Whether `::1` can be bound (else the IPv6 test says so and returns).
fn have_v6() -> bool {
    let on = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .is_ok_and(|s| s.trim() == "0")
        && std::net::UdpSocket::bind("[::1]:0").is_ok();
    if !on {
        eprintln!("no IPv6 loopback: skipped");
    }
    on
}

/// rping over `::1` between two processes; an rping server bound to `[::]` serving an IPv4
/// client (as Linux's rdma_cm: the IPv6 wildcard takes IPv4 connections); udaddy (SIDR, UD)
/// over `::1`.
#[test]
fn rping_and_udaddy_over_ipv6_between_two_processes() {
    examples_util::private_netns();
    if !have_v6() {
        return;
    }
    let base = 40000 + std::process::id() % 10000;
    for (bind, dst, port) in [("::1", "::1", base), ("::", "127.0.0.1", base + 1)] {
        let port = port.to_string();
        let server = Server(Some(spawn(
            "rping",
            &["-s", "-a", bind, "-v", "-S", "3000", "-p", &port],
        )));
        let c = client(
            "rping",
            &[
                "-c", "-a", dst, "-p", &port, "-C", "5", "-S", "3000", "-v", "-V",
            ],
        );
        let s = server.finish("rping server");
        let (ct, st) = (text(&c), text(&s));
        assert!(s.status.success(), "rping server on {bind}: {st}");
        assert_eq!(ct.matches("ping data: rdma-ping-").count(), 5, "{ct}");
        assert_eq!(
            st.matches("server ping data: rdma-ping-").count(),
            5,
            "{st}"
        );
        assert!(st.contains("server DISCONNECT EVENT"), "{st}");
    }
    let port = (base + 2).to_string();
    let server = Server(Some(spawn("udaddy", &["-b", "::1", "-p", &port])));
    let c = client("udaddy", &["-s", "::1", "-p", &port]);
    let s = server.finish("udaddy server");
    let (ct, st) = (text(&c), text(&s));
    assert!(s.status.success(), "{st}");
    assert!(ct.contains("return status 0"), "{ct}");
    assert!(st.contains("data transfers complete"), "{st}");
}
