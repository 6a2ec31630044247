//! Finding the shared object and the `softrdma` tool, and running programs on them.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The shared object built with the tests, as `softrdma libdir` finds it (the library names
/// there are symbolic links to it).
pub fn shared_object() -> PathBuf {
    let o = Command::new(softrdma())
        .arg("libdir")
        .output()
        .expect("run softrdma libdir");
    assert!(o.status.success(), "softrdma libdir: {}", text(&o));
    let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
    std::fs::canonicalize(PathBuf::from(dir).join("libibverbs.so.1")).expect("the shared object")
}

/// The `softrdma` command-line tool.
pub fn softrdma() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_softrdma"))
}

/// `softrdma run -- prog args...`, output captured.
pub fn run(prog: &str, args: &[&str]) -> Command {
    let mut c = Command::new(softrdma());
    c.arg("run").arg("--").arg(prog).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// True if `prog` is installed (the Debian packages the tests run); in CI (`CI` set) it must
/// be, so a missing package fails the test instead of skipping it.
pub fn have(prog: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI needs {prog} (.ci/run installs ibverbs-utils, rdmacm-utils and perftest)"
    );
    ok
}

/// Waits for `child` with a deadline; kills it and panics with its output if it is late.
pub fn wait(child: Child, what: &str, limit: Duration) -> Output {
    let start = Instant::now();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit.saturating_sub(start.elapsed())) {
        Ok(o) => o.expect("wait"),
        Err(_) => {
            // SAFETY: kill on a pid we spawned, and on its process group if it leads one (a
            // program that `softrdma run` started is its child).
            unsafe {
                if libc::getpgid(pid as i32) == pid as i32 {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
                libc::kill(pid as i32, libc::SIGKILL)
            };
            let o = rx.recv().expect("child output").expect("wait");
            panic!(
                "{what} did not finish in {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A TCP port nobody listens on, for a test's out-of-band exchange.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// True if rdma-core's development headers are installed; in CI (`CI` set) they must be.
pub fn have_headers() -> bool {
    let ok = std::path::Path::new("/usr/include/infiniband/verbs.h").exists()
        && std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs libibverbs-dev and librdmacm-dev (.ci/run installs them)"
        );
        eprintln!("skipped: install libibverbs-dev and librdmacm-dev to run this test");
    }
    ok
}

/// Compiles `tests/c/<name>.c` with the system's C compiler against the system headers,
/// linked normally with `-libverbs -lrdmacm`; returns the executable. `name` may name a
/// subdirectory (`seeds/seed000_verbs_send`); headers next to the source are found by
/// `#include "..."`.
pub fn compile_c(name: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let dir = std::env::temp_dir().join(format!("softrdma-c-{}", std::process::id()));
    let exe = dir.join(name);
    std::fs::create_dir_all(exe.parent().expect("parent")).expect("temp dir");
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-I"])
        .arg(src.parent().expect("tests/c"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-libverbs", "-lrdmacm", "-lpthread"])
        .output()
        .expect("cc runs");
    assert!(
        o.status.success(),
        "compiling {}: {}",
        src.display(),
        text(&o)
    );
    exe
}

#[path = "../../../tests/common/netns.rs"]
mod netns;
#[allow(unused_imports)]
pub use netns::private_netns;
