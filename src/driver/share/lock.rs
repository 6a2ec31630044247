//! The registry's locks: an exclusive `flock` of the lock file guards every change, and an
//! OFD lock on byte `slot` of it holds a slot for as long as its context's file is open (a
//! process that dies gives its slots back with no clean-up).

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use super::error::ShareError;

/// Byte-range lock request on `slot`'s byte.
fn slot_lock(kind: libc::c_short, slot: u8) -> libc::flock {
    // SAFETY: flock is a plain C struct; all-zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = slot as libc::off_t;
    l.l_len = 1;
    l
}

fn fcntl_lock(fd: RawFd, cmd: libc::c_int, l: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `l` is a live flock structure the kernel reads (and, for GETLK, writes).
    if unsafe { libc::fcntl(fd, cmd, l as *mut libc::flock) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Take `slot` in the lock file `fd` (never waits); false if another open file holds it.
pub(crate) fn take_slot(fd: RawFd, slot: u8) -> bool {
    let mut l = slot_lock(libc::F_WRLCK as libc::c_short, slot);
    fcntl_lock(fd, libc::F_OFD_SETLK, &mut l).is_ok()
}

/// Give `slot` back in the lock file `fd`.
pub(crate) fn give_slot(fd: RawFd, slot: u8) {
    let mut u = slot_lock(libc::F_UNLCK as libc::c_short, slot);
    let _ = fcntl_lock(fd, libc::F_OFD_SETLK, &mut u);
}

/// Whether some other open file holds `slot`'s lock in `fd`'s file (its context is alive).
pub(crate) fn slot_held(fd: RawFd, slot: u8) -> bool {
    let mut l = slot_lock(libc::F_WRLCK as libc::c_short, slot);
    match fcntl_lock(fd, libc::F_OFD_GETLK, &mut l) {
        Ok(()) => l.l_type != libc::F_UNLCK as libc::c_short,
        // Cannot tell: keep it.
        Err(_) => true,
    }
}

/// An exclusive `flock` of a registry's lock file, released on drop.
pub(crate) struct Locked<'a>(&'a File);

/// How long a change waits for the lock (a process stopped while holding it must not hang
/// everyone else forever).
const LOCK_WAIT: Duration = Duration::from_secs(5);

impl<'a> Locked<'a> {
    /// Wait (at most [`LOCK_WAIT`]) for the lock of `addr`'s registry `f`.
    pub fn new(f: &'a File, addr: SocketAddr) -> io::Result<Locked<'a>> {
        let t0 = Instant::now();
        loop {
            if let Some(l) = Self::try_new(f) {
                return Ok(l);
            }
            if t0.elapsed() > LOCK_WAIT {
                return Err(ShareError::Locked {
                    addr: addr.ip(),
                    secs: LOCK_WAIT.as_secs(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The lock if nobody holds it now (never waits).
    pub fn try_new(f: &'a File) -> Option<Locked<'a>> {
        // SAFETY: flock on our own open file.
        (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0)
            .then_some(Locked(f))
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: flock on our own open file.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}
