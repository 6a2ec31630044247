//! The periodic check of a member's place (every 100 ms, from the progress thread) and the
//! repairs it makes. Nothing here waits for the registry lock: whoever holds it is changing
//! the registry and checks too.
//!
//! * **Dead members** (slot lock free, socket gone from the kernel's list) are removed the
//!   way the kernel removed them, and their connection records claimed ([`super::conns`]).
//! * **Damage**: a registry that does not parse, that lacks this member or lists it wrong, a
//!   lock file deleted or replaced, a state directory deleted (a `/tmp` cleaner, a logout):
//!   the member opens the directory and lock file anew, takes its slot there, puts its own
//!   entry back with the index it last knew, re-binds its forward socket if it was lost, and
//!   asks for a probe resync to confirm the indexes. Every member does the same within a
//!   round, so the registry is rebuilt from the live members; none of their sockets moved, so
//!   no connection is lost meanwhile.
//! * **Strangers**: a socket in the group that the registry does not list makes the member
//!   attach its steering again at once (a stranger's join replaced the group's program); one
//!   still unlisted after a member would have put itself back is another softrdma version (or
//!   a program of its own): it is reported once on stderr, naming its process and protocol, and
//!   this member keeps its own steering attached so that its connections are not misrouted.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::conns::{self, ConnRecord};
use super::dir::StateDir;
use super::lock::{self, Locked};
use super::registry::{Layout, Member, PROTOCOL};
use super::{guard, kernel, kernel_inodes, read_layout};
use super::{Inner, Mine, Share};

/// How long a socket may be in the group unlisted before it is taken for a stranger.
const STRANGER_AFTER: Duration = Duration::from_millis(1000);
/// How often the state directory is cleared of records of members that died unwatched.
const ORPHAN_SCAN: Duration = Duration::from_secs(5);

/// What the check tracks between rounds.
#[derive(Default)]
pub(crate) struct Watch {
    /// Sockets the registry does not list, and since when.
    unknown: Vec<(u64, Instant)>,
    /// Strangers already reported.
    reported: Vec<u64>,
    /// A repair failure was reported (one line, not one per round).
    warned: bool,
    /// The slots of the registry at the last round (one missing now died or left).
    slots: Vec<u8>,
    last_scan: Option<Instant>,
}

/// What the caller (the context's sockets) has to do after a check.
#[derive(Default)]
pub(crate) struct Outcome {
    /// Confirm the layout with probes (`Share::resync`).
    pub resync: bool,
    /// The forward socket was lost (the directory was deleted): here is a new one.
    pub new_forward: Option<UnixDatagram>,
    /// Connections of dead members, to disconnect in their name.
    pub orphans: Vec<ConnRecord>,
}

/// Put this member's entry in `layout` as it should be (slot, pid, inode, ports; the index
/// it last knew when it was missing). Returns true if it had to be added.
pub(super) fn put_self(me: &Inner, layout: &mut Layout, mine: &mut Mine) -> bool {
    let want = |index| Member {
        slot: me.slot,
        index,
        pid: std::process::id(),
        inode: me.inode,
        ports: mine.ports.clone(),
    };
    match layout.members.iter_mut().find(|m| m.slot == me.slot) {
        Some(m) => {
            let w = want(m.index);
            if *m != w {
                *m = w;
            }
            mine.index = m.index;
            false
        }
        None => {
            // Another member may have taken the index we remember (a wrong guess, or a move
            // we did not see): then take the first free one; probes confirm.
            let taken = |i: u32| layout.members.iter().any(|m| m.index == i);
            let index = if taken(mine.index) {
                (0..).find(|i| !taken(*i)).unwrap_or(0)
            } else {
                mine.index
            };
            layout.members.push(want(index));
            mine.index = index;
            mine.unverified = true;
            true
        }
    }
}

impl Share {
    /// The periodic check: cheap when all is well (a read of the registry and of the kernel's
    /// list, a few `stat`s).
    pub fn check(&self) -> Outcome {
        let me = &*self.inner;
        let mut out = Outcome::default();
        if me.left.load(Ordering::Acquire) {
            return out;
        }
        let (dir, lock_ok, fwd_ok) = {
            let h = guard(&me.held);
            let lock_ok = h.dir.intact() && h.dir.ident(&me.names.lock()) == h.lock_id;
            let fwd_ok = h.dir.ident(&me.names.forward(me.slot)).is_some();
            (h.dir.clone(), lock_ok, fwd_ok)
        };
        let layout = if lock_ok {
            read_layout(&dir, &me.names).ok().and_then(Result::ok)
        } else {
            None
        };
        let kernel = kernel_inodes(me.addr, Some(me.inode));
        let now = Instant::now();
        let mut w = guard(&me.watch);
        let mut fine = lock_ok && fwd_ok;
        let mut strangers = Vec::new();
        if let Some(l) = &layout {
            let mine = guard(&me.mine);
            let mine_ok = l.member(me.slot).is_some_and(|m| {
                m.inode == me.inode && m.ports == mine.ports && m.pid == std::process::id()
            });
            fine &= mine_ok && !mine.unverified;
            drop(mine);
            let reg = guard(&me.held).reg.as_raw_fd();
            if let Some(k) = &kernel {
                let listed = |i: &u64| l.members.iter().any(|m| m.inode == *i);
                w.unknown.retain(|(i, _)| k.contains(i) && !listed(i));
                for i in k.iter().filter(|i| !listed(i)) {
                    if !w.unknown.iter().any(|(u, _)| u == i) {
                        w.unknown.push((*i, now));
                    }
                }
                strangers = w
                    .unknown
                    .iter()
                    .filter(|(_, since)| now.duration_since(*since) >= STRANGER_AFTER)
                    .map(|(i, _)| *i)
                    .collect();
                // Any unlisted socket: steer again at once, under the lock (a stranger's
                // program replaced ours: a flow the kernel's hash gives it loses every
                // retransmission until then).
                fine &= w.unknown.is_empty();
                fine &= !l.members.iter().any(|m| {
                    m.slot != me.slot && !k.contains(&m.inode) && !lock::slot_held(reg, m.slot)
                });
            }
            let slots: Vec<u8> = l.members.iter().map(|m| m.slot).collect();
            let died: Vec<u8> = w
                .slots
                .iter()
                .copied()
                .filter(|s| !slots.contains(s))
                .collect();
            let scan_due = w
                .last_scan
                .map_or(true, |t| now.duration_since(t) >= ORPHAN_SCAN);
            // Only while every socket of the group is listed: a live member that is putting
            // itself back after damage must not lose its connections.
            let all_listed = kernel.is_some() && w.unknown.is_empty();
            if all_listed && (!died.is_empty() || scan_due) {
                if scan_due {
                    w.last_scan = Some(now);
                }
                // The connections of members seen dying are disconnected in their name; the
                // records of members that died unwatched (before this one joined) are only
                // removed: their peers are long gone or have timed out.
                out.orphans = claim_orphans(&dir, me, &slots, reg, &died);
            }
            w.slots = slots;
        } else {
            fine = false;
        }
        drop(w);
        if fine {
            return out;
        }
        let Ok(_busy) = me.busy.try_lock() else {
            return out;
        };
        if !lock_ok {
            if let Err(e) = self.reopen() {
                warn_once(
                    me,
                    &format!("cannot repair the registry of {}: {e}", me.addr),
                );
                return out;
            }
        }
        let held = guard(&me.held);
        let Some(_guard) = Locked::try_new(&held.reg) else {
            return out;
        };
        let mut layout = read_layout(&held.dir, &me.names)
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        me.prune_dead(&held, &mut layout);
        let mut mine = guard(&me.mine);
        put_self(me, &mut layout, &mut mine);
        out.resync = mine.unverified;
        drop(mine);
        // Strangers: still unlisted now that we hold the lock (a joiner writes its entry
        // before it lets go of the lock, so this is not one), and not a member of this
        // protocol that is slow to put itself back (it holds this registry's lock file open).
        let lock_path = held.dir.real_path(&me.names.lock());
        let strangers: Vec<u64> = strangers
            .into_iter()
            .filter(|i| !layout.members.iter().any(|m| m.inode == *i))
            .filter(|i| {
                !kernel::process_of(*i)
                    .is_some_and(|(pid, _)| kernel::process_has_open(pid, &lock_path))
            })
            .collect();
        let _ = me.publish(&held, &layout);
        if !fwd_ok || !lock_ok {
            out.new_forward = super::super::forward::bind(&held.dir, &me.names.forward(me.slot));
        }
        drop(_guard);
        drop(held);
        *guard(&me.cache) = None;
        // Probing takes up to 200 ms: not while holding what hand-overs need.
        if !strangers.is_empty() {
            self.report_strangers(&strangers);
        }
        out
    }

    /// Open the state directory and the lock file anew (deleted or replaced) and take this
    /// member's slot in it.
    fn reopen(&self) -> std::io::Result<()> {
        let me = &*self.inner;
        let dir = StateDir::current()?;
        let reg = dir.open_rw(&me.names.lock())?;
        if !lock::take_slot(reg.as_raw_fd(), me.slot) {
            // Someone took our slot while the lock file was gone: a joiner that did not see us
            // (it waits for the members the kernel lists to put themselves back, so only one
            // that joined before we were listed). Both keep going; the steering is ours.
            warn_once(
                me,
                &format!(
                    "slot {} of {} was taken while the registry was missing",
                    me.slot, me.addr
                ),
            );
        }
        let lock_id = dir.ident(&me.names.lock());
        let mut h = guard(&me.held);
        h.dir = dir;
        h.reg = reg;
        h.lock_id = lock_id;
        Ok(())
    }

    /// Say once on stderr which strangers share the address: they cannot be steered to, and
    /// their connections will fail; ours are kept.
    fn report_strangers(&self, inodes: &[u64]) {
        let me = &*self.inner;
        let mut w = guard(&me.watch);
        let new: Vec<u64> = inodes
            .iter()
            .copied()
            .filter(|i| !w.reported.contains(i))
            .collect();
        if new.is_empty() {
            return;
        }
        w.reported.extend(&new);
        drop(w);
        let n = kernel::group(me.addr).map_or(0, |g| g.len());
        let protos = super::super::probe::identify(me.addr, n);
        for i in new {
            eprintln!(
                "softrdma: {} joined UDP 4791 of {} and {} (this process speaks sharing protocol \
                 {PROTOCOL}); its connections cannot be steered and will fail, this process's are kept. \
                 Run every program on this address with one softrdma version.",
                kernel::describe_process(i),
                me.addr.ip(),
                describe_protocols(&protos)
            );
        }
    }
}

/// What probes told of the strangers' protocol.
pub(super) fn describe_protocols(answers: &[Option<(u8, u8)>]) -> String {
    let other: Vec<u8> = answers
        .iter()
        .flatten()
        .map(|(_, p)| *p)
        .filter(|p| *p != PROTOCOL)
        .collect();
    if let Some(p) = other.first() {
        format!("speaks softrdma sharing protocol {p} (another softrdma version)")
    } else if answers.iter().any(Option::is_none) {
        "does not answer softrdma's probes (a program of its own bound with SO_REUSEPORT, or an \
         older softrdma)"
            .into()
    } else {
        format!("speaks sharing protocol {PROTOCOL} but is missing from the registry (stopped?)")
    }
}

fn warn_once(me: &Inner, msg: &str) {
    let mut w = guard(&me.watch);
    if std::mem::replace(&mut w.warned, true) {
        return;
    }
    eprintln!("softrdma: {msg}");
}

/// Take the connection records of slots no longer in the registry (`live`) nor held: renamed
/// away first, so that exactly one member takes each. Returns the records of the slots in
/// `died` (to disconnect); the others are only removed.
fn claim_orphans(
    dir: &StateDir,
    me: &Inner,
    live: &[u8],
    reg: std::os::fd::RawFd,
    died: &[u8],
) -> Vec<ConnRecord> {
    let mut out = Vec::new();
    for slot in 1..=super::MAX_SLOTS as u8 {
        if live.contains(&slot) || slot == me.slot || lock::slot_held(reg, slot) {
            continue;
        }
        // A dead member's forward socket.
        let fwd = me.names.forward(slot);
        if dir.ident(&fwd).is_some() {
            dir.remove(&fwd);
        }
        let name = me.names.conns(slot);
        if dir.ident(&name).is_none() {
            continue;
        }
        let claimed = format!(".{name}.{}.claimed", std::process::id());
        if rustix::fs::renameat(dir.fd(), name.as_str(), dir.fd(), claimed.as_str()).is_err() {
            continue;
        }
        if died.contains(&slot) {
            if let Ok(Some(t)) = dir.read(&claimed) {
                out.extend(conns::parse(&t));
            }
        }
        dir.remove(&claimed);
    }
    out
}
