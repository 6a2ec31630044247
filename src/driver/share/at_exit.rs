//! Leaving at normal process exit, for contexts nobody drops (held in statics): an `atexit`
//! handler does for every live share of the process what [`super::Share::leave`] would.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::{Mutex, Once};

use super::{attach, prune, read_layout, write_layout};

struct Live {
    /// (registry lock fd, socket fd, slot, registry file) of each share of this process.
    shares: Vec<(RawFd, RawFd, u8, PathBuf)>,
    exiting: bool,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    shares: Vec::new(),
    exiting: false,
});
static HANDLER: Once = Once::new();

fn live() -> std::sync::MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn register(reg: RawFd, sock: RawFd, slot: u8, data: PathBuf) {
    HANDLER.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(on_exit) };
    });
    live().shares.push((reg, sock, slot, data));
}

/// Forget a share that leaves by itself; false if the exit handler has taken over.
pub fn unregister(reg: RawFd) -> bool {
    let mut l = live();
    l.shares.retain(|s| s.0 != reg);
    !l.exiting
}

/// The file identity of an fd (two shares on one address have one registry file).
fn inode(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat writes a stat structure we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is live and `fd` is ours.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

extern "C" fn on_exit() {
    let mut l = live();
    l.exiting = true;
    // The kernel releases an exiting process's files in reverse fd order: the sockets with
    // the highest fds leave their groups first.
    let mut shares = l.shares.clone();
    shares.sort_unstable_by_key(|s| std::cmp::Reverse(s.1));
    // One flock per registry file (several shares on one address share it), taken on the
    // file's lowest registry fd: it is kept until the process's files are released, and
    // that fd, below every socket of those shares, is released after all of them.
    let mut locked: Vec<(u64, u64)> = Vec::new();
    for (reg, ..) in &shares {
        let reg = *reg;
        let Some(id) = inode(reg) else { continue };
        if locked.contains(&id) {
            continue;
        }
        let lowest = shares
            .iter()
            .filter(|s| inode(s.0) == Some(id))
            .map(|s| s.0)
            .min()
            .unwrap_or(reg);
        // SAFETY: flock on our own open file.
        if unsafe { libc::flock(lowest, libc::LOCK_EX) } == 0 {
            locked.push(id);
        }
    }
    for (reg, sock, slot, data) in shares {
        if !inode(reg).is_some_and(|id| locked.contains(&id)) {
            continue;
        }
        if let Ok(mut layout) = read_layout(&data) {
            prune(reg, &mut layout, Some(slot));
            layout.detach(slot);
            let _ = write_layout(&data, &layout);
            let _ = attach(sock, &layout);
        }
    }
}
