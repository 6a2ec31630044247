//! The directory where softrdma keeps what processes of one user share on this host (each
//! address's registry, its lock, the forward sockets, the connection records): private to the
//! user, checked before every use, and reached only through a descriptor of the checked
//! directory, so that nothing another user planted is ever opened, followed or overwritten.
//!
//! * **Where.** Root: `/run/softrdma` (only root can create in `/run`). Anyone else:
//!   `$XDG_RUNTIME_DIR/softrdma` (the per-user directory logind makes), or else
//!   `$TMPDIR/softrdma-<uid>` (`/tmp` by default).
//! * **Checked.** The parent must belong to root or the user and, if others may write in it,
//!   be sticky (so nobody else can rename our directory away). The directory is created
//!   0700; opened with `O_NOFOLLOW` (a symbolic link is refused) and checked with `fstat` on
//!   the open descriptor (no window between check and use): it must be a directory owned by
//!   the user that nobody else may write. Anything else is a [`ShareError::UnsafeDir`] that
//!   names it; it is never used, nothing in it is touched.
//! * **Used through the descriptor.** Files are opened with `openat(O_NOFOLLOW)` (created with
//!   `O_EXCL` where they are new), replaced with `renameat`, and unix sockets are bound and
//!   reached as `/proc/self/fd/<dir>/<name>`, which resolves through the checked directory
//!   itself. Only the user (and root) can create anything inside a 0700 directory, so
//!   another user can neither plant a file nor a socket there, nor read one.
//! * **Deleted?** A `/tmp` cleaner or a logout (which removes `XDG_RUNTIME_DIR`) can delete
//!   it under live processes: [`StateDir::current`] notices (the held directory has no links,
//!   or the path names another one) and makes a new one, and the members put their entries
//!   back (`share::repair`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};

use super::error::ShareError;

/// The directory, open and checked.
pub(crate) struct StateDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Device and inode of the directory when it was checked.
    id: (u64, u64),
}

/// The state directory in use by this process (made again when it was deleted).
static CURRENT: Mutex<Option<Arc<StateDir>>> = Mutex::new(None);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A user's name, for messages ("uid 1001 (mallory)").
pub(crate) fn describe_uid(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
        p.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
        })
    });
    match name {
        Some(n) => format!("uid {uid} ({n})"),
        None => format!("uid {uid}"),
    }
}

fn unsafe_dir(path: &Path, why: impl Into<String>) -> io::Error {
    ShareError::UnsafeDir {
        path: path.to_path_buf(),
        why: why.into(),
    }
    .into()
}

/// Where the directory goes: its parent and its name, for this user and environment.
fn location() -> io::Result<(PathBuf, String)> {
    let uid = euid();
    if uid == 0 && Path::new("/run").is_dir() {
        return Ok((PathBuf::from("/run"), "softrdma".into()));
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        let x = PathBuf::from(x);
        if x.is_absolute() {
            return Ok((x, "softrdma".into()));
        }
    }
    Ok((std::env::temp_dir(), format!("softrdma-{uid}")))
}

fn mode_of(st: &rustix::fs::Stat) -> u32 {
    st.st_mode & 0o7777
}

/// The parent may hold our directory: it belongs to root or to us, and if others may write
/// in it, it is sticky (nobody else can rename or remove our directory).
fn check_parent(parent: &Path, fd: &OwnedFd) -> io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    let uid = euid();
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(unsafe_dir(
            parent,
            format!("it belongs to {}", describe_uid(st.st_uid)),
        ));
    }
    let mode = mode_of(&st);
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_dir(
            parent,
            format!("others may write in it and it is not sticky (mode {mode:04o})"),
        ));
    }
    Ok(())
}

impl StateDir {
    /// The state directory, made (or made again, if it was deleted) and checked.
    pub fn current() -> io::Result<Arc<StateDir>> {
        let mut c = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = c.as_ref().filter(|d| d.intact()) {
            return Ok(d.clone());
        }
        let d = Arc::new(Self::open()?);
        *c = Some(d.clone());
        Ok(d)
    }

    /// Make (if absent), open and check the directory where [`location`] says.
    fn open() -> io::Result<StateDir> {
        let (parent, name) = location()?;
        let path = parent.join(&name);
        let pfd = rustix::fs::open(
            &parent,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        check_parent(&parent, &pfd)?;
        match rustix::fs::mkdirat(&pfd, name.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = match rustix::fs::openat(
            &pfd,
            name.as_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                let link = rustix::fs::statat(&pfd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                return Err(unsafe_dir(
                    &path,
                    if link {
                        "it is a symbolic link"
                    } else {
                        "it is not a directory"
                    },
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(unsafe_dir(&path, "it is not a directory"));
        }
        if st.st_uid != euid() {
            return Err(unsafe_dir(
                &path,
                format!(
                    "it belongs to {}, not to you ({})",
                    describe_uid(st.st_uid),
                    describe_uid(euid())
                ),
            ));
        }
        let mode = mode_of(&st);
        if mode & 0o022 != 0 {
            return Err(unsafe_dir(
                &path,
                format!("others may write in it (mode {mode:04o})"),
            ));
        }
        if mode & 0o077 != 0 {
            // Ours and written only by us: just make it private.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        }
        Ok(StateDir {
            id: (st.st_dev, st.st_ino),
            fd,
            path,
        })
    }

    /// The directory is still there under its name (not deleted, not replaced).
    pub fn intact(&self) -> bool {
        let held = rustix::fs::fstat(&self.fd).is_ok_and(|st| st.st_nlink > 0);
        held && rustix::fs::statat(CWD, &self.path, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == self.id)
    }

    /// Its path.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The real path of `name` in it (for messages, and to recognise it among a process's
    /// open files).
    pub fn real_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Open (creating it, 0600) the file `name` for reading and writing: a regular file of
    /// ours, never a link.
    pub fn open_rw(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        self.check_file(name, &fd)?;
        Ok(File::from(fd))
    }

    fn check_file(&self, name: &str, fd: &OwnedFd) -> io::Result<()> {
        let st = rustix::fs::fstat(fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != euid() {
            return Err(unsafe_dir(
                &self.path.join(name),
                "it is not a regular file of yours",
            ));
        }
        Ok(())
    }

    /// The contents of `name` (at most 1 MiB), `None` if there is no such file.
    pub fn read(&self, name: &str) -> io::Result<Option<String>> {
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.check_file(name, &fd)?;
        let mut s = Vec::new();
        File::from(fd).take(1 << 20).read_to_end(&mut s)?;
        // Damage (invalid UTF-8) reads as text the parser rejects.
        Ok(Some(String::from_utf8_lossy(&s).into_owned()))
    }

    /// Replace `name`'s contents at once: a new file (`O_EXCL`) renamed over it, so a reader
    /// never sees a partial one and a process that dies meanwhile leaves the old contents.
    pub fn replace(&self, name: &str, contents: &[u8]) -> io::Result<()> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let tmp = format!(".{name}.{}.{tid}.tmp", std::process::id());
        let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        let fd = rustix::fs::openat(
            &self.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut f = File::from(fd);
        if let Err(e) = f.write_all(contents) {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(e);
        }
        drop(f);
        rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(io::Error::from)
    }

    /// Remove `name` (gone already is fine).
    pub fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
    }

    /// Device and inode of `name`, if it exists (never following a link).
    pub fn ident(&self, name: &str) -> Option<(u64, u64)> {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| (st.st_dev, st.st_ino))
    }

    /// The path by which a unix socket `name` in this directory is bound or reached: through
    /// the held descriptor (`/proc/self/fd/N/name`), so it can only be this checked directory;
    /// `None` if that is too long for a socket address.
    pub fn socket_path(&self, name: &str) -> Option<PathBuf> {
        let p = PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()));
        (p.as_os_str().len() < 108).then_some(p)
    }

    /// A directory `name` in this one (made 0700 if absent; a link or anything not a
    /// directory of ours is refused): its path.
    pub fn subdir(&self, name: &str) -> io::Result<PathBuf> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let path = self.path.join(name);
        let st = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory
            || st.st_uid != euid()
            || mode_of(&st) & 0o022 != 0
        {
            return Err(unsafe_dir(&path, "it is not a private directory of yours"));
        }
        Ok(path)
    }

    /// The directory's descriptor.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_private_directory_and_replaces_files_whole() {
        let d = StateDir::current().unwrap();
        let st = rustix::fs::fstat(&d.fd).unwrap();
        assert_eq!(st.st_uid, euid());
        assert_eq!(mode_of(&st) & 0o077, 0);
        let name = format!("test-{}", std::process::id());
        d.replace(&name, b"one").unwrap();
        d.replace(&name, b"two").unwrap();
        assert_eq!(d.read(&name).unwrap().as_deref(), Some("two"));
        d.remove(&name);
        assert_eq!(d.read(&name).unwrap(), None);
        assert!(d.intact());
    }

    #[test]
    fn a_link_in_the_directory_is_never_followed() {
        let d = StateDir::current().unwrap();
        let name = format!("link-{}", std::process::id());
        let target = std::env::temp_dir().join(format!("softrdma-target-{}", std::process::id()));
        std::fs::write(&target, b"keep").unwrap();
        let link = d.path().join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(d.read(&name).is_err());
        assert!(d.open_rw(&name).is_err());
        // Replacing renames over the link itself; the target is untouched.
        d.replace(&name, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        d.remove(&name);
        let _ = std::fs::remove_file(&target);
    }
}
