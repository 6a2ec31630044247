//! Leaving at normal process exit, for contexts nobody drops (held in statics): an `atexit`
//! handler does for every live share of the process what [`super::Share::leave`] would.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Once};

use super::{attach, guard, kernel_inodes, prune, read_layout, write_layout, Inner};

struct Live {
    shares: Vec<Arc<Inner>>,
    exiting: bool,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    shares: Vec::new(),
    exiting: false,
});
static HANDLER: Once = Once::new();

pub(super) fn register(share: &Arc<Inner>) {
    HANDLER.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(on_exit) };
    });
    guard(&LIVE).shares.push(share.clone());
}

/// Forget a share that leaves by itself; false if the exit handler has taken over.
pub(super) fn unregister(share: &Inner) -> bool {
    let mut l = guard(&LIVE);
    l.shares.retain(|s| !std::ptr::eq(&**s, share));
    !l.exiting
}

/// The file identity of an fd (two shares on one address have one lock file).
fn inode(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: `fd` is a live file of this process for the duration of this call.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).ok().map(|st| (st.st_dev, st.st_ino))
}

extern "C" fn on_exit() {
    let mut l = guard(&LIVE);
    l.exiting = true;
    // The kernel releases an exiting process's files in reverse fd order: the sockets with
    // the highest fds leave their groups first.
    let mut shares = l.shares.clone();
    drop(l);
    shares.sort_unstable_by_key(|s| std::cmp::Reverse(s.sock_fd));
    // One flock per lock file (several shares on one address share it), taken on the file's
    // lowest fd: it is kept until the process's files are released, and that fd, below every
    // socket of those shares (unless a repair opened it anew), is released after all of them.
    let fds: Vec<i32> = shares
        .iter()
        .map(|s| guard(&s.held).reg.as_raw_fd())
        .collect();
    let mut locked: Vec<(u64, u64)> = Vec::new();
    for &fd in &fds {
        let Some(id) = inode(fd) else { continue };
        if locked.contains(&id) {
            continue;
        }
        let lowest = fds
            .iter()
            .copied()
            .filter(|f| inode(*f) == Some(id))
            .min()
            .unwrap_or(fd);
        // SAFETY: flock on our own open file.
        if unsafe { libc::flock(lowest, libc::LOCK_EX) } == 0 {
            locked.push(id);
        }
    }
    for (s, fd) in shares.iter().zip(fds) {
        if !inode(fd).is_some_and(|id| locked.contains(&id)) {
            continue;
        }
        let h = guard(&s.held);
        if let Ok(Ok(mut layout)) = read_layout(&h.dir, &s.names) {
            let kernel = kernel_inodes(s.addr, Some(s.inode));
            prune(fd, &mut layout, Some(s.slot), kernel.as_deref());
            layout.detach(s.slot);
            let _ = write_layout(&h.dir, &s.names, &layout);
            let _ = attach(s.sock_fd, &layout);
        }
        h.dir.remove(&s.names.forward(s.slot));
        h.dir.remove(&s.names.conns(s.slot));
        s.left.store(true, Ordering::Release);
    }
}
