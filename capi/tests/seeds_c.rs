//! The C code of the tutorials the project grew from (`tests/c/seeds/`, one program per seed
//! program; each file's opening comment names its seed and what was completed), compiled with
//! the system's compiler against rdma-core's headers, linked with `-libverbs -lrdmacm`, and run
//! on softrdma: a server and a client on this machine, each checking the data it gets and
//! printing "seedNNN server: OK" / "seedNNN client: OK".
//!
//! A client started before its server listens exits with status 75 (TCP connection refused, or
//! rdma_cm's REJECTED / UNREACHABLE / CONNECT_ERROR) and is started again.

mod util;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};
use util::{compile_c, free_port, have_headers, run, text, wait};

/// Each process's deadline, and the time a client is retried while its server starts.
const LIMIT: Duration = Duration::from_secs(300);
/// The clients' exit status for "no server listening yet".
const NOT_LISTENING: i32 = 75;

/// `softrdma run -- exe args` in a process group of its own, so that a kill reaches the program
/// (`softrdma run`'s child) too.
fn start(exe: &Path, args: &[&str]) -> Child {
    let mut c: Command = run(exe.to_str().unwrap(), args);
    c.process_group(0);
    c.spawn().unwrap()
}

/// Kills `child`'s process group: `softrdma run` and the program.
fn kill(child: &Child) {
    // SAFETY: kill on the process group of a child we spawned as its leader and have not reaped.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
}

/// Starts `server`, then `client` until it finds the server listening; waits for both and
/// checks that each exited 0 and printed every line in its `want`.
///
/// One pair at a time (the plain-verbs programs poll their CQs, and a 2-core machine running
/// several pairs only makes each slower), and, where it may (root), in a network namespace of
/// its own (`util::private_netns`: only `lo`, so the first device is the loopback one), so
/// that other processes joining and leaving the host's shared devices cannot disturb it.
fn pair(
    server: (&Path, &[&str]),
    server_want: &[&str],
    client: (&Path, &[&str]),
    client_want: &[&str],
) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    util::private_netns();
    let name = server.0.file_name().unwrap().to_string_lossy().to_string();
    let mut srv = start(server.0, server.1);
    let began = Instant::now();
    let mut tries = 0;
    let client_out: Output = loop {
        tries += 1;
        let o = wait(start(client.0, client.1), "client", LIMIT);
        if o.status.code() != Some(NOT_LISTENING) {
            break o;
        }
        if let Some(status) = srv.try_wait().unwrap() {
            let s = wait(srv, "server", LIMIT);
            panic!(
                "{name}: the server exited ({status}) before a client reached it:\n{}",
                text(&s)
            );
        }
        if began.elapsed() > LIMIT {
            kill(&srv);
            let s = wait(srv, "server", LIMIT);
            panic!(
                "{name}: no server listening after {tries} clients\nlast client: {}\nserver: {}",
                text(&o),
                text(&s)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !client_out.status.success() {
        // The server may wait for a client that is gone.
        kill(&srv);
    }
    let server_out = wait(srv, "server", LIMIT);
    let both = format!(
        "{name}, client after {tries} tries\n--- server: {}\n--- client: {}",
        text(&server_out),
        text(&client_out)
    );
    assert!(server_out.status.success(), "server failed: {both}");
    assert!(client_out.status.success(), "client failed: {both}");
    for (o, want) in [(&server_out, server_want), (&client_out, client_want)] {
        let out = String::from_utf8_lossy(&o.stdout);
        for w in want {
            assert!(out.contains(w), "no {w:?} in the output: {both}");
        }
    }
}

/// Seed 000: plain verbs, the seed's single signaled IBV_WR_SEND (4096 bytes checked).
#[test]
fn seed000_verbs_send() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("seeds/seed000_verbs_send");
    let port = free_port().to_string();
    pair(
        (&exe, &["server", &port]),
        &[
            "seed000 server: received 4096 bytes, all as sent",
            "seed000 server: OK",
        ],
        (&exe, &["client", "127.0.0.1", &port]),
        &["seed000 client: sent 4096 bytes", "seed000 client: OK"],
    );
}

/// Seed 001: the rdma_cm server and client (a wildcard listener; the client on 127.0.0.1),
/// each SENDing its 1024-byte message, which the other checks.
#[test]
fn seed001_rdma_cm_client_server() {
    if !have_headers() {
        return;
    }
    let server = compile_c("seeds/seed001_server");
    let client = compile_c("seeds/seed001_client");
    let port = free_port().to_string();
    pair(
        (&server, &[&port]),
        &[
            &format!("listening on port {port}."),
            "received message: message from active/client side with pid ",
            "seed001 server: the message and all 1024 bytes are as sent",
            "peer disconnected.",
            "seed001 server: OK",
        ],
        (&client, &["127.0.0.1", &port]),
        &[
            "address resolved.",
            "route resolved.",
            "received message: message from passive/server side with pid ",
            "seed001 client: the message and all 1024 bytes are as sent",
            "disconnected.",
            "seed001 client: OK",
        ],
    );
}

/// Seed 002: rdma_cm and the CQ's completion channel in one edge-triggered epoll loop, on the
/// first device's address; 10000 bytes each way, checked.
#[test]
fn seed002_epoll_event_loop() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("seeds/seed002_epoll");
    let port = free_port().to_string();
    pair(
        (&exe, &["server", &port]),
        &[
            "seed002 server: RDMA_CM_EVENT_CONNECT_REQUEST",
            "seed002 server: received 10000 bytes, all as sent",
            "seed002 server: RDMA_CM_EVENT_DISCONNECTED",
            "seed002 server: OK",
        ],
        (&exe, &["client", &port]),
        &[
            "seed002 client: RDMA_CM_EVENT_ESTABLISHED",
            "seed002 client: received 10000 bytes, all as sent",
            "seed002 client: RDMA_CM_EVENT_DISCONNECTED",
            "seed002 client: OK",
        ],
    );
}

/// Seed 003: "Hello, RDMA!" and its acknowledgement over plain verbs; the server's loop ends
/// when the client closes the connection.
#[test]
fn seed003_hello_and_acknowledgement() {
    if !have_headers() {
        return;
    }
    let server = compile_c("seeds/seed003_server");
    let client = compile_c("seeds/seed003_client");
    let port = free_port().to_string();
    pair(
        (&server, &[&port]),
        &[
            "Received message: Hello, RDMA!",
            "seed003 server: OK (1 messages)",
        ],
        (&client, &["127.0.0.1", &port]),
        &["Received acknowledgment from server.", "seed003 client: OK"],
    );
}

/// Seed 004: every opcode of ibv_post_send's struct ibv_send_wr between two RC QPs, each result
/// checked (immediates in network byte order, atomics' old values and remote memory).
#[test]
fn seed004_every_post_send_opcode() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("seeds/seed004_post_send");
    let port = free_port().to_string();
    pair(
        (&exe, &["server", &port]),
        &[
            "seed004 server: receive of IBV_WR_SEND completed",
            "seed004 server: receive of IBV_WR_SEND_WITH_IMM completed",
            "seed004 server: receive of IBV_WR_RDMA_WRITE_WITH_IMM completed",
            "seed004 server: receive of the final IBV_WR_SEND completed",
            "seed004 server: OK",
        ],
        (&exe, &["client", "127.0.0.1", &port]),
        &[
            "seed004 client: IBV_WR_RDMA_WRITE completed",
            "seed004 client: IBV_WR_RDMA_READ completed",
            "seed004 client: IBV_WR_ATOMIC_CMP_AND_SWP (match) completed",
            "seed004 client: IBV_WR_ATOMIC_CMP_AND_SWP (no match) completed",
            "seed004 client: IBV_WR_ATOMIC_FETCH_AND_ADD (-1) completed",
            "seed004 client: OK",
        ],
    );
}
