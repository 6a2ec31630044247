//! Finding the example binaries from an integration test: `cargo test` builds the examples, but
//! `CARGO_BIN_EXE_*` only exists for `[[bin]]` targets, so they are looked up under
//! `target/<profile>/examples/`, next to the `deps/` directory holding the test executable.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/examples/<name>`, located from this test executable's path.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/seeds_examples-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable is not under target/<profile>/deps");
    let dir = profile_dir.join("examples");
    let exact = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if exact.is_file() {
        return exact;
    }
    // Fall back to the newest hashed copy, examples/<name>-<hash>.
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let p = entry.path();
        let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
        let Some(hash) = file.strip_prefix(&format!("{name}-")) else {
            continue;
        };
        let hash = hash
            .strip_suffix(std::env::consts::EXE_SUFFIX)
            .unwrap_or(hash);
        if hash.is_empty() || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(mtime) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if best.as_ref().map_or(true, |(t, _)| mtime > *t) {
            best = Some((mtime, p));
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| {
        panic!(
            "example {name} not found in {} (run `cargo build --examples`)",
            dir.display()
        )
    })
}

/// Moves the calling test thread (and the processes it starts from now on) into a network
/// namespace of its own with `lo` up, when it may (root): other processes using this machine's
/// loopback device (other test binaries, other softrdma builds) then cannot disturb the pair.
/// Without the privilege the test runs on the host's devices. Returns whether it moved.
pub fn private_netns() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    // SAFETY: unshare on the calling thread only changes its network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return false;
    }
    // SAFETY: a datagram socket in the new namespace, closed below; the ioctls use the
    // `ifreq` we own.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(s >= 0, "socket in the new namespace");
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, b) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *b as libc::c_char;
        }
        assert_eq!(
            libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr),
            0,
            "SIOCGIFFLAGS lo"
        );
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        assert_eq!(
            libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr),
            0,
            "SIOCSIFFLAGS lo up"
        );
        libc::close(s);
    }
    true
}
