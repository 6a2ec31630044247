//! The progress thread: makes one-sided operations to a passive side complete, and retransmits,
//! while the application does not call in. It sleeps in poll(2) on the socket and a wake fd.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::socket::Io;
use crate::verbs::Shared;

/// Longest sleep, so that a dropped context's thread notices soon.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// An application that polled its CQ this recently is taken to be busy-polling.
const POLL_WINDOW: Duration = Duration::from_millis(2);

pub(crate) fn spawn(shared: Weak<Shared>, io: Arc<Io>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("softrdma-progress".into())
        .spawn(move || run(shared, io))?;
    Ok(())
}

fn run(shared: Weak<Shared>, io: Arc<Io>) {
    loop {
        if io.stopped() {
            return;
        }
        let (deadline, app_polling) = match shared.upgrade() {
            Some(s) => (
                s.engine
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .next_deadline(),
                s.app_polling(POLL_WINDOW),
            ),
            None => return,
        };
        if app_polling {
            // The application drives the transport itself by polling its CQ: competing for
            // the socket and the engine lock would only add lock-holder preemption on a small
            // machine. Look again shortly.
            std::thread::sleep(POLL_WINDOW);
            continue;
        }
        let now = Instant::now();
        let sleep = deadline
            .map_or(MAX_SLEEP, |d| d.saturating_duration_since(now))
            .min(MAX_SLEEP);
        // Round up so a deadline 0.3 ms away does not become a busy loop of 0 ms polls.
        let ms = (sleep.as_micros() as i64 + 999) / 1000;
        let mut fds = [
            libc::pollfd {
                fd: io.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: io.wake_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd structures.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms as libc::c_int) };
        if fds[1].revents != 0 {
            io.drain_wake();
        }
        match shared.upgrade() {
            Some(s) => s.drive(),
            None => return,
        }
    }
}
