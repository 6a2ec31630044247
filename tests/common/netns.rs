//! A network namespace of its own for a test (shared by the tests of both packages: included
//! with `#[path]`).

/// Moves the calling test thread (and the processes it starts from now on) into a network
/// namespace of its own with `lo` up, when it may (root): other processes using this machine's
/// loopback device (other test binaries, other softrdma builds) then cannot disturb it.
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
