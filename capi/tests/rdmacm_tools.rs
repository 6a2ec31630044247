//! librdmacm on softrdma: Debian's unmodified rdmacm-utils programs (server and client, two
//! processes on this machine's loopback device), and a C program that checks the API's
//! details (`c/rdmacm_api.c`). Each test uses its own ports.
//!
//! A client started before its server listens is refused (REJECTED, reason 8); such a client
//! is started again, a bounded number of times, rather than guessing how long the server takes
//! to start on a loaded machine.

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

/// True if the client's output says nobody listened yet.
fn refused(o: &Output) -> bool {
    let s = out(o);
    !o.status.success() && (s.contains("REJECTED") || s.contains("refused"))
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
    if !server_exits {
        // SAFETY: kill on the process group of a child we spawned (and still hold).
        unsafe { libc::kill(-(s.id() as i32), libc::SIGKILL) };
    }
    let s = wait(s, prog_s, LIMIT);
    (s, c)
}

fn skip(prog: &str) -> bool {
    if have(prog) {
        return false;
    }
    eprintln!("skipped: {prog} (rdmacm-utils) is not installed");
    true
}

#[test]
fn rdmacm_api_in_c() {
    let dir = std::env::temp_dir().join(format!("softrdma-rdmacm-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("rdmacm_api");
    let src = format!("{}/tests/c/rdmacm_api.c", env!("CARGO_MANIFEST_DIR"));
    let cc = std::process::Command::new("cc")
        .args([src.as_str(), "-o"])
        .arg(&exe)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("a C compiler (cc) runs");
    if !cc.status.success() && String::from_utf8_lossy(&cc.stderr).contains("rdma_cma.h") {
        eprintln!("skipped: librdmacm-dev is not installed");
        return;
    }
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let port = util::free_port().to_string();
    let o = wait(
        run(exe.to_str().unwrap(), &[port.as_str()])
            .spawn()
            .unwrap(),
        "rdmacm_api",
        LIMIT,
    );
    let _ = std::fs::remove_dir_all(&dir);
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

fn ucmatose(extra: &[&str]) {
    if skip("ucmatose") {
        return;
    }
    let port = util::free_port().to_string();
    let mut sa = vec!["-p", port.as_str(), "-c", "2"];
    sa.extend_from_slice(extra);
    let mut ca = vec!["-s", "127.0.0.1", "-p", port.as_str(), "-c", "2"];
    ca.extend_from_slice(extra);
    let (s, c) = pair("ucmatose", &sa, "ucmatose", &ca, true);
    assert!(
        c.status.success(),
        "client: {}\nserver: {}",
        text(&c),
        text(&s)
    );
    assert!(
        s.status.success(),
        "server: {}\nclient: {}",
        text(&s),
        text(&c)
    );
    for o in [&s, &c] {
        assert!(out(o).contains("return status 0"), "{}", text(o));
    }
}

#[test]
fn ucmatose_two_connections() {
    ucmatose(&["-C", "0"]);
}

#[test]
fn ucmatose_migrates_ids_to_a_new_channel() {
    ucmatose(&["-C", "0", "-m"]);
}

/// udaddy's port is fixed (7174; its `-p` is the port space), so only this test runs it.
#[test]
fn udaddy_resolves_a_ud_peer() {
    if skip("udaddy") {
        return;
    }
    let (s, c) = pair(
        "udaddy",
        &["-C", "0"],
        "udaddy",
        &["-s", "127.0.0.1", "-C", "0"],
        true,
    );
    assert!(
        c.status.success(),
        "client: {}\nserver: {}",
        text(&c),
        text(&s)
    );
    assert!(
        s.status.success(),
        "server: {}\nclient: {}",
        text(&s),
        text(&c)
    );
    for o in [&s, &c] {
        assert!(out(o).contains("return status 0"), "{}", text(o));
    }
}
