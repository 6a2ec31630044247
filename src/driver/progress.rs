//! The progress thread: makes one-sided operations to a passive side complete, and retransmits,
//! while the application does not call in. It sleeps in poll(2) on the sockets and a wake fd.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::engine::{ready_mask, Round};
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

/// The wake fd, then the sockets, then the forward sockets, to poll.
fn fill(fds: &mut Vec<libc::pollfd>, io: &Io) {
    fds.clear();
    fds.extend(
        std::iter::once(io.wake_fd())
            .chain(io.fds.iter().copied())
            .chain(
                io.socks
                    .iter()
                    .map(|s| s.fwd_fd.load(std::sync::atomic::Ordering::Acquire)),
            )
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }),
    );
}

/// Sleep until one of `fds` is readable or `timeout` passes.
fn wait(fds: &mut [libc::pollfd], timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structures, `ts` a live timespec.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// A look at the sockets while the progress thread stands aside for a busy-polling
/// application. Such an application takes its datagrams within microseconds; one that has
/// stopped calling in — ib_write_lat spins on its own memory for the peer's WRITE, which lands
/// only when somebody drives the transport — leaves them there. So a datagram is driven here
/// once the application has not polled for [`TAKE_WINDOW`]; while it polls, this thread sleeps
/// (it does not spin: on a small machine that would take the application's CPU). True if it
/// drove (the application leaves datagrams to us: watch the sockets from now on). `watch`: a
/// datagram woke this thread (else it is a periodic look, every [`LOOK_EVERY`]).
fn stand_aside(s: &Runtime, socks: &mut [libc::pollfd], watch: bool) -> bool {
    let t0 = Instant::now();
    if !watch && s.acks_held() && !s.app_polling(TAKE_WINDOW) {
        // The application's last round held its ACKs, and it stopped calling in without
        // answering: they go now (see `TxBatch::hold_acks`).
        return s.try_drive_ready(readable(socks));
    }
    loop {
        let polling = s.app_polling(TAKE_WINDOW);
        if polling && !watch {
            // A periodic look while the application polls: nothing to do (and no second
            // wake-up to pay).
            return false;
        }
        if polling && t0.elapsed() < 4 * TAKE_WINDOW {
            // It polls: whatever waits is about to be its own. Look again in a while.
            wait(&mut [], TAKE_WINDOW);
            if readable(socks) == 0 {
                return false;
            }
            continue;
        }
        // Unless the application is inside a verb this very moment (posting, say: it holds the
        // engine, and will poll next).
        return match readable(socks) {
            0 => false,
            ready => s.try_drive_ready(ready),
        };
    }
}

/// How long a busy-polling application is given to take a datagram before the progress thread
/// takes it (a busy loop polls its CQ every microsecond or two).
const TAKE_WINDOW: Duration = Duration::from_micros(20);
/// How often the progress thread looks at the sockets while it stands aside for an application
/// that takes its datagrams itself (a wake-up per datagram would cost the application more).
const LOOK_EVERY: Duration = POLL_WINDOW;

fn run(shared: Weak<Runtime>, io: Arc<Io>) {
    let mut last_check = Instant::now();
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(io.fds.len() + 1);
    // While standing aside: the application left a datagram to us lately (when we last
    // drove for it), so the sockets are watched.
    let mut watch = false;
    let mut last_drive: Option<Instant> = None;
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
            let (orphans, resync) = io.check_share();
            if resync != 0 {
                io.resync_share_in_background(resync);
            }
            if !orphans.is_empty() {
                if let Some(s) = shared.upgrade() {
                    s.disconnect_orphans(&orphans);
                }
            }
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
                        // Asleep on the wake fd, and on the sockets too while the application
                        // leaves datagrams to us (`watch`); otherwise it looks at them every
                        // `LOOK_EVERY` (see `stand_aside`).
                        fill(&mut fds, &io);
                        let n = io.fds.len();
                        if watch {
                            wait(&mut fds[..=n], POLL_WINDOW);
                        } else {
                            wait(&mut fds[..1], LOOK_EVERY);
                        }
                        if fds[0].revents != 0 {
                            io.drain_wake();
                        }
                        if let Some(s) = shared.upgrade() {
                            s.set_yielding(false);
                            if stand_aside(&s, &mut fds[1..=n], watch) {
                                last_drive = Some(Instant::now());
                            }
                            // Watch while the application has left datagrams to us lately
                            // (taking its own ACKs in between, as ib_write_lat does).
                            watch = last_drive.is_some_and(|t| t.elapsed() < POLL_WINDOW);
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
                // Whole milliseconds, rounded up: a deadline 0.3 ms away does not become a run
                // of short wake-ups (the transport's timers are not that fine; the application's
                // own polls serve a busy connection). Acknowledgements held for an application
                // that went quiet are the exception: they are due within ACK_HOLD_MAX (0.5 ms),
                // and rounded up to 1 ms they would race the sender's 1 ms tail-loss probe.
                if e.holding() {
                    sleep
                } else {
                    Duration::from_millis((sleep.as_micros() as u64).div_ceil(1000))
                }
            }
            None => return,
        };
        fill(&mut fds, &io);
        wait(&mut fds, sleep);
        if fds[0].revents != 0 {
            io.drain_wake();
        }
        let n = io.fds.len();
        let datagram = fds[1..=n].iter().any(|p| p.revents != 0);
        let handed_over = fds[n + 1..].iter().any(|p| p.revents != 0);
        match shared.upgrade() {
            Some(s) => {
                if s.app_polling(POLL_WINDOW) {
                    // Woken by a packet while the application polls: it takes it, or leaves it
                    // to us (see `stand_aside`).
                    s.woke();
                    if datagram && stand_aside(&s, &mut fds[1..=n], true) {
                        last_drive = Some(Instant::now());
                        watch = true;
                    }
                    continue;
                }
                s.woke();
                let ready = ready_mask(&fds[1..=n]);
                s.drive(if handed_over {
                    Round::Forwarded
                } else if ready != 0 {
                    Round::Ready(ready)
                } else {
                    Round::Full
                });
                if datagram {
                    // A datagram woke us: more tend to follow within microseconds (the next
                    // READ of a ping-pong, the rest of a window), and a thread wake-up costs
                    // tens of µs here. Keep looking for a short while before sleeping again.
                    let mut last = Instant::now();
                    while last.elapsed() < SPIN && !io.stopped() && !s.app_polling(POLL_WINDOW) {
                        match readable(&mut fds[1..=n]) {
                            0 => std::hint::spin_loop(),
                            ready => {
                                s.drive(Round::Ready(ready));
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
