//! Runs the seed ports (`examples/send_recv.rs`, `examples/rdma_rw.rs`, `examples/epoll_loop.rs`)
//! in their no-argument loopback mode as child processes and checks their exit status and output;
//! `ud_pingpong` and `rc_pingpong --uc` run as a server and a client over loopback.
//!
//! `cargo test` builds the examples, but `CARGO_BIN_EXE_*` only exists for `[[bin]]` targets, so
//! the example binaries are found under `target/<profile>/examples/`, next to the `deps/`
//! directory that holds this test's executable. Each child is killed after a timeout. When root,
//! each test's processes run in a network namespace of their own.

use std::io::Read;
use std::process::{Command, Stdio};

mod examples_util;
use examples_util::example;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Run an example with no arguments; returns (success, stdout, stderr).
fn run(name: &str) -> (bool, String, String) {
    // A network namespace of its own when root (see `examples_util::private_netns`).
    examples_util::private_netns();
    let path = example(name);
    let mut child = Command::new(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", path.display()));
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!(
                "{name} did not finish within {TIMEOUT:?}; stdout so far:\n{}",
                t_out.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (t_out.join().unwrap(), t_err.join().unwrap());
    (status.success(), stdout, stderr)
}

fn assert_run(name: &str, expected: &[String]) {
    let (ok, stdout, stderr) = run(name);
    assert!(
        ok,
        "{name} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().map(str::trim_end).collect();
    for want in expected {
        assert!(
            lines.iter().any(|l| l == want),
            "{name}: missing output line {want:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
    }
}

#[test]
fn send_recv_loopback() {
    let mut want = Vec::new();
    for i in 0..5 {
        want.push(format!("server received: message {i} from client"));
        want.push(format!("client received: reply to message {i} from client"));
    }
    want.push("server: received and answered 5 messages".into());
    want.push("send_recv: OK".into());
    assert_run("send_recv", &want);
}

#[test]
fn rdma_rw_loopback() {
    assert_run(
        "rdma_rw",
        &[
            "client: RDMA WRITE of 4096 bytes completed".into(),
            "client: RDMA READ returned the 4096 bytes written: \"hello from the client, writt\"..."
                .into(),
            "server: buffer verified, holds the 4096 bytes written by the client: \"hello from the client, writt\"..."
                .into(),
            "rdma_rw: OK".into(),
        ],
    );
}

#[test]
fn epoll_loop_loopback() {
    let mut want = Vec::new();
    for i in 0..10 {
        want.push(format!("server received: message {i} from client"));
        want.push(format!("client received: reply to message {i} from client"));
    }
    want.push("epoll_loop: OK".into());
    // (The "N CQ events" counts vary with timing and are not checked.)
    assert_run("epoll_loop", &want);
}

/// Start `name args...` with its output collected on threads; returns the child and the readers.
fn spawn(
    name: &str,
    args: &[&str],
) -> (
    std::process::Child,
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
) {
    let path = example(name);
    let mut child = Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", path.display()));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    (child, t_out, t_err)
}

/// Wait for a child until `deadline` (killed then); returns (success, stdout, stderr).
fn finish(
    (mut child, t_out, t_err): (
        std::process::Child,
        std::thread::JoinHandle<String>,
        std::thread::JoinHandle<String>,
    ),
    deadline: Instant,
) -> (bool, String, String) {
    let ok = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st.success();
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (ok, t_out.join().unwrap(), t_err.join().unwrap())
}

/// `ud_pingpong` (ibv_ud_pingpong's flags) as server and client over loopback: both finish and
/// print the byte and iteration counts.
#[test]
fn ud_pingpong_server_and_client() {
    pingpong_pair(
        "ud_pingpong",
        &["-g", "0", "-n", "200", "-s", "1024"],
        409_600,
        200,
    );
}

/// `rc_pingpong --uc` (ibv_uc_pingpong) as server and client over loopback, 10 packets per
/// message: both finish and print the byte and iteration counts.
#[test]
fn uc_pingpong_server_and_client() {
    let args = ["--uc", "-g", "0", "-n", "200", "-s", "10000", "-m", "1024"];
    pingpong_pair("rc_pingpong", &args, 4_000_000, 200);
}

/// Run example `name` with `args` as a server and, with 127.0.0.1 added, as a client; both must
/// succeed and print `bytes` and `iters` as the rdma-core pingpongs do.
fn pingpong_pair(name: &str, args: &[&str], bytes: usize, iters: usize) {
    // The pair gets a network namespace of its own when root: the other tests' processes
    // joining and leaving the shared device cannot disturb it (a UC message that a stale
    // steering loses is never sent again, and the ping-pong would wait for it for good).
    examples_util::private_netns();
    // A port of our own, so a concurrent pingpong test cannot take it.
    let port = (20000 + (std::process::id() + bytes as u32) % 20000).to_string();
    let mut args = args.to_vec();
    args.extend(["-p", &port]);
    let deadline = Instant::now() + TIMEOUT;
    let server = spawn(name, &args);
    // The client fails at once while the server does not listen yet: retry it.
    let client = loop {
        let mut cargs = args.to_vec();
        cargs.push("127.0.0.1");
        let r = finish(spawn(name, &cargs), deadline);
        if r.0 || !r.2.contains("Couldn't connect") || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let server = finish(server, deadline);
    for (role, (ok, out, err)) in [("client", &client), ("server", &server)] {
        assert!(
            *ok,
            "{name} {role} failed\n--- stdout\n{out}\n--- stderr\n{err}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{bytes} bytes in "))),
            "{name} {role}: no byte count\n{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{iters} iters in "))),
            "{name} {role}: no iteration count\n{out}"
        );
        assert!(
            out.contains("  local address:  LID 0x0000, QPN 0x"),
            "{out}"
        );
    }
}
