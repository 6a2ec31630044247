//! For tests that play several users on one host (as root): this test binary re-executed as
//! another user, in the test thread's network namespace, on one of its ignored tests (a
//! "role"), driven through its stdio.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Failure bound for waits.
pub const WAIT: Duration = Duration::from_secs(60);

/// Users the tests play (no passwd entry needed).
pub const VICTIM: u32 = 47911;
pub const MALLORY: u32 = 47912;
pub const REPAIRER: u32 = 47913;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// This test binary, copied where every user may run it (the build tree may be in a
/// directory only root can enter).
pub fn shared_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = PathBuf::from(format!("/tmp/softrdma-testbin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let to = dir.join(exe.file_name().unwrap());
        std::fs::copy(&exe, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        to
    })
    .clone()
}

/// A role running as a child process; killed when dropped.
pub struct Role {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: Receiver<String>,
    pub name: String,
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Role {
    /// The first line from the child containing `tag`, from `tag` on.
    pub fn line_with(&self, tag: &str) -> String {
        let t0 = Instant::now();
        let mut seen = Vec::new();
        loop {
            let left = WAIT.saturating_sub(t0.elapsed());
            let Ok(l) = self.lines.recv_timeout(left) else {
                panic!(
                    "{}: no line with {tag:?}; it said:\n{}",
                    self.name,
                    seen.join("\n")
                );
            };
            if let Some(i) = l.find(tag) {
                return l[i..].to_string();
            }
            seen.push(l);
        }
    }

    /// Wait for the child to exit; its success.
    pub fn wait(&mut self) -> bool {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            assert!(t0.elapsed() < WAIT, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Close its stdin (roles that wait for it end).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
}

/// Run role `role` (an ignored test of this binary) as `uid` (`None`: as root), with `env`.
/// The child's environment is this one's without `XDG_RUNTIME_DIR`, with `TMPDIR=/tmp`.
pub fn spawn_as(role: &str, uid: Option<u32>, env: &[(&str, String)]) -> Role {
    let mut c = Command::new(shared_bin());
    c.args([
        "--exact",
        role,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("SOFTRDMA_TEST_CHILD", "1")
    .env_remove("XDG_RUNTIME_DIR")
    .env("TMPDIR", "/tmp")
    .current_dir("/")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    spawn_cmd(c, role)
}

/// Run `cmd` with its stdout and stderr lines gathered.
pub fn spawn_cmd(mut c: Command, name: &str) -> Role {
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let (tx, rx) = std::sync::mpsc::channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
    }
    let stdin = child.stdin.take();
    Role {
        child,
        stdin,
        lines: rx,
        name: name.to_string(),
    }
}

/// Whether this process is a role (run by [`spawn_as`]); roles return at once otherwise.
pub fn in_child() -> bool {
    std::env::var_os("SOFTRDMA_TEST_CHILD").is_some()
}

/// Block until stdin closes (the parent ends the role).
pub fn wait_stdin_closed() {
    let mut s = String::new();
    while std::io::stdin().read_line(&mut s).is_ok_and(|n| n > 0) {
        s.clear();
    }
}

/// Run a command to completion; its output, or a panic naming it.
pub fn run(cmd: &[&str]) -> String {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
