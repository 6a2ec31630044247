//! For tests whose peer is another process: this test binary re-executed on one of its
//! ignored tests, driven through its stdio.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;

use super::WAIT;

/// Kills the child when dropped (a failing test does not leave it running).
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run the ignored test `role` of this binary as a child process (with `SOFTRDMA_TEST_CHILD`
/// set); its stdout lines arrive through a thread, so a stuck child fails a bounded wait
/// instead of hanging the test.
pub fn spawn(role: &str) -> (Kill, ChildStdin, Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            role,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SOFTRDMA_TEST_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (Kill(child), stdin, rx)
}

/// The first line from the child that contains `tag`, from `tag` on (libtest prints
/// "test NAME ... " before the child's own output on the same line).
pub fn line_with(rx: &Receiver<String>, tag: &str) -> String {
    loop {
        let l = rx.recv_timeout(WAIT).expect("a line from the child");
        if let Some(i) = l.find(tag) {
            return l[i..].to_string();
        }
    }
}

/// Wait (bounded by [`WAIT`]) for the child to exit, and check it succeeded.
pub fn wait_success(child: &mut Kill) {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            assert!(st.success(), "child failed: {st}");
            return;
        }
        assert!(t0.elapsed() < WAIT, "child did not exit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub fn hex(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}
