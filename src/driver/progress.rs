//! The progress thread: makes one-sided operations to a passive side complete, and retransmits,
//! while the application does not call in. It sleeps in poll(2) on the sockets and a wake fd.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::engine::ready_mask;
use super::runtime::Runtime;
use super::socket::Io;

/// Longest sleep, so that a dropped context's thread notices soon.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// An application that polled its CQ this recently is taken to be busy-polling.
const POLL_WINDOW: Duration = Duration::from_millis(2);
/// How often the contexts sharing the address are checked for dead ones.
const SHARE_CHECK: Duration = Duration::from_millis(100);

pub(crate) fn spawn(shared: Weak<Runtime>, io: Arc<Io>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("softrdma-progress".into())
        .spawn(move || run(shared, io))?;
    Ok(())
}

/// Sleep until `fd` is readable or `timeout` passes.
fn wait_fd(fd: i32, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is a live pollfd.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis().max(1) as libc::c_int) };
}

fn run(shared: Weak<Runtime>, io: Arc<Io>) {
    let mut last_check = Instant::now();
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(io.fds.len() + 1);
    loop {
        if io.stopped() {
            return;
        }
        let misrouted = io.misrouted.swap(0, std::sync::atomic::Ordering::AcqRel);
        if misrouted != 0 {
            io.resync_share_in_background(misrouted);
        }
        if last_check.elapsed() >= SHARE_CHECK {
            last_check = Instant::now();
            io.check_share();
        }
        let sleep = match shared.upgrade() {
            Some(s) => {
                if s.app_polling(POLL_WINDOW) {
                    // The application drives the transport itself by polling its CQ: competing
                    // for the socket and the engine lock would only add lock-holder preemption
                    // on a small machine. Stand aside for a while, unless the application goes
                    // to sleep on a channel (it then wakes us).
                    s.set_yielding(true);
                    if s.app_polling(POLL_WINDOW) {
                        drop(s);
                        wait_fd(io.wake_fd(), POLL_WINDOW);
                        io.drain_wake();
                        if let Some(s) = shared.upgrade() {
                            s.set_yielding(false);
                        }
                    } else {
                        s.set_yielding(false);
                    }
                    continue;
                }
                let e = s.lock_engine();
                let now = Instant::now();
                let sleep = e
                    .next_deadline()
                    .map_or(MAX_SLEEP, |d| d.saturating_duration_since(now))
                    .min(MAX_SLEEP);
                // Published under the engine lock: whoever sets an earlier timer after this
                // sees it and wakes us.
                s.plan_wake(now + sleep);
                sleep
            }
            None => return,
        };
        // Round up so a deadline 0.3 ms away does not become a busy loop of 0 ms polls.
        let ms = (sleep.as_micros() as i64 + 999) / 1000;
        // The wake fd, then the sockets.
        fds.clear();
        fds.extend(
            std::iter::once(io.wake_fd())
                .chain(io.fds.iter().copied())
                .chain(io.fwd_fds.iter().copied())
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }),
        );
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structures.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                ms as libc::c_int,
            )
        };
        if fds[0].revents != 0 {
            io.drain_wake();
        }
        let n = io.fds.len();
        let datagram = fds[1..=n].iter().any(|p| p.revents != 0);
        let handed_over = fds[n + 1..].iter().any(|p| p.revents != 0);
        match shared.upgrade() {
            Some(s) => {
                if s.app_polling(POLL_WINDOW) {
                    // Woken by a packet the busy-polling application is about to take.
                    s.woke();
                    continue;
                }
                s.woke();
                let ready = ready_mask(&fds[1..=n]);
                if handed_over {
                    s.drive_forwarded();
                } else if ready != 0 {
                    s.drive_ready(ready);
                } else {
                    s.drive();
                }
                if datagram {
                    // A datagram woke us: more tend to follow within microseconds (the next
                    // READ of a ping-pong, the rest of a window), and a thread wake-up costs
                    // tens of µs here. Keep looking for a short while before sleeping again.
                    let mut last = Instant::now();
                    while last.elapsed() < SPIN && !io.stopped() && !s.app_polling(POLL_WINDOW) {
                        match readable(&mut fds[1..=n]) {
                            0 => std::hint::spin_loop(),
                            ready => {
                                s.drive_ready(ready);
                                last = Instant::now();
                            }
                        }
                    }
                }
            }
            None => return,
        }
    }
}

/// How long the progress thread keeps looking after serving a datagram.
const SPIN: Duration = Duration::from_micros(50);

/// Which of the sockets of `fds` have something to read (bit `k`: `fds[k]`; past 31, bit
/// 31), without waiting.
fn readable(fds: &mut [libc::pollfd]) -> u32 {
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structures.
    if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) } <= 0 {
        return 0;
    }
    ready_mask(fds)
}
