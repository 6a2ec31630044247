//! softrdma on a host shared with other users and other softrdma versions (issue 20), played
//! as root with users of its own (`host_util`): a planted state directory, another user at the
//! registry's files, a squatted port 4791 and the administrator's holder, a damaged or deleted
//! registry under a live pair, an older softrdma version in the group, and rdma_cm peers of a
//! process killed with SIGKILL. Each test runs in a network namespace of its own and ends with
//! the legitimate pair finishing with its data intact, or a clear error. Without root they are
//! skipped (they need other users and namespaces).
mod host_util;
#[path = "common/netns.rs"]
mod netns;
mod verbs_util;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use host_util::*;
use softrdma::transport::{SendOp, WcOpcode, WcStatus};
use verbs_util::{loopback_dev, pair, sge, End};

/// The tests share the users' state directories (and one of them deletes its own): one at a
/// time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `None` (skip) unless this is root; else the test's turn, with the test thread moved into a
/// network namespace of its own.
fn setup(name: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !is_root() {
        eprintln!("{name}: skipped (needs root: other users and network namespaces)");
        return None;
    }
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    assert!(netns::private_netns(), "a private network namespace");
    Some(turn)
}

/// `n` rounds over a connected pair: a 64 KiB RDMA WRITE of round `i`'s pattern into B's
/// region, then a SEND naming `i`; B checks the region when the SEND arrives. Every
/// completion must succeed and every byte match.
fn stream(a: &End, b: &End, n: usize) {
    const LEN: usize = 64 * 1024;
    let (amr, bmr) = (a.mr(LEN + 64), b.mr(LEN + 64));
    for i in 0..n {
        let pattern: Vec<u8> = (0..LEN).map(|k| (k * 7 + i * 13) as u8).collect();
        amr.write(0, &pattern).unwrap();
        amr.write(LEN, &(i as u64).to_le_bytes()).unwrap();
        b.post_recv(1, &[sge(&bmr, LEN, 8)]);
        a.post_send(
            10,
            SendOp::RdmaWrite {
                remote_addr: bmr.addr(),
                rkey: bmr.rkey(),
            },
            &[sge(&amr, 0, LEN)],
        );
        a.post_send(11, SendOp::Send, &[sge(&amr, LEN, 8)]);
        for _ in 0..2 {
            let wc = a.wait();
            assert_eq!(wc.status, WcStatus::Success, "round {i}: {wc:?}");
        }
        let wc = b.wait();
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "round {i}"
        );
        let mut got = vec![0u8; LEN + 8];
        bmr.read(0, &mut got).unwrap();
        assert_eq!(&got[LEN..], &(i as u64).to_le_bytes(), "round {i}");
        assert!(got[..LEN] == pattern[..], "round {i}: the WRITE's bytes");
    }
}

/// This thread's network namespace, as registry names carry it.
fn netns_inode() -> String {
    let l = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let l = l.to_string_lossy();
    l.trim_start_matches("net:[")
        .trim_end_matches(']')
        .to_string()
}

/// The registry directory a non-root user gets by default (no `XDG_RUNTIME_DIR`).
fn tmp_state_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/softrdma-{uid}"))
}

fn chown(p: &std::path::Path, uid: u32) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: lchown with a NUL-terminated path we own.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0, "{p:?}");
}

// ---- Roles: run only as children (`host_util::spawn_as`) ----

#[test]
#[ignore]
fn role_open_loopback() {
    if !in_child() {
        return;
    }
    match loopback_dev().open() {
        Ok(c) => println!("OPENED {}", c.addr()),
        Err(e) => println!("ERROR {} {e}", e.errno()),
    }
}

#[test]
#[ignore]
fn role_pair() {
    if !in_child() {
        return;
    }
    let (a, b) = pair();
    stream(&a, &b, 20);
    println!("PAIR OK");
}

/// Bind `$SR_BIND` (no SO_REUSEPORT) and hold it until stdin closes.
#[test]
#[ignore]
fn role_bind() {
    if !in_child() {
        return;
    }
    let at: std::net::SocketAddr = std::env::var("SR_BIND").unwrap().parse().unwrap();
    match UdpSocket::bind(at) {
        Ok(_s) => {
            println!("BOUND");
            wait_stdin_closed();
        }
        Err(e) => println!("BIND_ERR {}", e.raw_os_error().unwrap_or(0)),
    }
}

/// Try to open `$SR_PATH` for reading and writing, to create a file in it, and to connect to it.
#[test]
#[ignore]
fn role_touch() {
    if !in_child() {
        return;
    }
    let p = PathBuf::from(std::env::var("SR_PATH").unwrap());
    let open = std::fs::OpenOptions::new().read(true).write(true).open(&p);
    println!(
        "OPEN {}",
        open.map_or_else(|e| e.raw_os_error().unwrap_or(0), |_| 0)
    );
    let list = std::fs::read_dir(p.parent().unwrap());
    println!(
        "LIST {}",
        list.map_or_else(|e| e.raw_os_error().unwrap_or(0), |_| 0)
    );
    let plant = std::fs::write(p.with_extension("planted"), b"x");
    println!(
        "PLANT {}",
        plant.map_or_else(|e| e.raw_os_error().unwrap_or(0), |_| 0)
    );
}

// ---- 1. The state directory ----

/// Another user creates the directory the victim would use (or a link, or a world-writable
/// one): the victim's device does not open, and the error names the directory and why;
/// nothing in it is used. Removed, the victim's pair works.
#[test]
fn a_planted_state_directory_is_refused_by_name() {
    let Some(_turn) = setup("a_planted_state_directory_is_refused_by_name") else {
        return;
    };
    let dir = tmp_state_dir(VICTIM);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&dir);
    let open = || spawn_as("role_open_loopback", Some(VICTIM), &[]).line_with("OPENED");
    let refused = || {
        let r = spawn_as("role_open_loopback", Some(VICTIM), &[]);
        let l = r.line_with("ERROR");
        assert!(l.contains(&dir.display().to_string()), "{l}");
        assert!(l.starts_with(&format!("ERROR {} ", libc::EACCES)), "{l}");
        l
    };
    // Owned by mallory.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    chown(&dir, MALLORY);
    let l = refused();
    assert!(l.contains(&format!("uid {MALLORY}")), "{l}");
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "nothing was made in it"
    );
    std::fs::remove_dir(&dir).unwrap();
    // A link to a directory of the victim's (mallory cannot make one in the victim's name
    // otherwise): refused as a link.
    let target = PathBuf::from(format!("/tmp/softrdma-target-{}", std::process::id()));
    std::fs::create_dir_all(&target).unwrap();
    chown(&target, VICTIM);
    std::os::unix::fs::symlink(&target, &dir).unwrap();
    chown(&dir, MALLORY);
    let l = refused();
    assert!(l.contains("symbolic link"), "{l}");
    assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    std::fs::remove_file(&dir).unwrap();
    std::fs::remove_dir(&target).unwrap();
    // The victim's own, but writable by others.
    std::fs::create_dir(&dir).unwrap();
    chown(&dir, VICTIM);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let l = refused();
    assert!(l.contains("others may write"), "{l}");
    std::fs::remove_dir(&dir).unwrap();
    // Nothing planted: the victim makes it, private, and its device opens.
    assert_eq!(open(), "OPENED 127.0.0.1");
    let md = std::fs::symlink_metadata(&dir).unwrap();
    assert!(md.is_dir());
    assert_eq!((md.uid(), md.mode() & 0o777), (VICTIM, 0o700));
    let mut p = spawn_as("role_pair", Some(VICTIM), &[]);
    p.line_with("PAIR OK");
    assert!(p.wait());
}

/// Another user can neither read, nor change, nor lock the victim's registry, nor plant a
/// file beside it, nor reach its forward sockets.
#[test]
fn another_user_cannot_touch_the_registry() {
    let Some(_turn) = setup("another_user_cannot_touch_the_registry") else {
        return;
    };
    let dir = tmp_state_dir(VICTIM);
    // The victim's devices open and leave their registry behind.
    assert_eq!(
        spawn_as("role_open_loopback", Some(VICTIM), &[]).line_with("OPENED"),
        "OPENED 127.0.0.1"
    );
    let lock = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "lock"))
        .expect("a lock file");
    let r = spawn_as(
        "role_touch",
        Some(MALLORY),
        &[("SR_PATH", lock.display().to_string())],
    );
    assert_eq!(r.line_with("OPEN"), format!("OPEN {}", libc::EACCES));
    assert_eq!(r.line_with("LIST"), format!("LIST {}", libc::EACCES));
    assert_eq!(r.line_with("PLANT"), format!("PLANT {}", libc::EACCES));
    // The victim itself may (the control: the role can do it when allowed).
    let r = spawn_as(
        "role_touch",
        Some(VICTIM),
        &[("SR_PATH", lock.display().to_string())],
    );
    assert_eq!(r.line_with("OPEN"), "OPEN 0");
    let _ = std::fs::remove_file(lock.with_extension("planted"));
}

// ---- 5. Port 4791 held by another user ----

/// Mallory binds 127.0.0.1:4791 (then 0.0.0.0:4791) first: the device does not move to
/// another address; opening it fails with an error naming mallory's uid and process. When
/// mallory is gone, it opens on 127.0.0.1 and a pair runs.
#[test]
fn a_squatted_port_is_an_error_naming_its_holder() {
    let Some(_turn) = setup("a_squatted_port_is_an_error_naming_its_holder") else {
        return;
    };
    for at in ["127.0.0.1:4791", "0.0.0.0:4791"] {
        let mut m = spawn_as("role_bind", Some(MALLORY), &[("SR_BIND", at.to_string())]);
        assert_eq!(m.line_with("BOUND"), "BOUND");
        // Root's open and a victim's open alike.
        let err = loopback_dev().open().expect_err("the port is taken");
        let msg = err.to_string();
        assert_eq!(err.errno(), libc::EADDRINUSE, "{msg}");
        assert!(msg.contains("127.0.0.1"), "{msg}");
        assert!(msg.contains(&format!("uid {MALLORY}")), "{msg}");
        assert!(msg.contains("pid "), "root sees mallory's process: {msg}");
        let v = spawn_as("role_open_loopback", Some(VICTIM), &[]).line_with("ERROR");
        assert!(v.starts_with(&format!("ERROR {}", libc::EADDRINUSE)), "{v}");
        assert!(v.contains(&format!("uid {MALLORY}")), "{v}");
        m.close_stdin();
        assert!(m.wait());
    }
    let (a, b) = pair();
    assert_eq!(a.ctx.addr(), Ipv4Addr::LOCALHOST);
    stream(&a, &b, 5);
}

/// A holder of the administrator's (`softrdma holder --user VICTIM`) on a host where 4791 is a
/// privileged port: mallory cannot bind it at all, the victim's processes get their sockets
/// from the holder and share the address, and mallory's softrdma is told the holder refuses.
#[test]
fn the_holder_reserves_the_port_for_the_users_it_serves() {
    let Some(_turn) = setup("the_holder_reserves_the_port_for_the_users_it_serves") else {
        return;
    };
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "4792\n")
        .expect("per-namespace sysctl");
    let sock = format!("/tmp/softrdma-holder-test-{}/socket", std::process::id());
    let env = [("SOFTRDMA_HOLDER", sock.clone())];
    let h = spawn_as(
        "role_holder",
        None,
        &[
            ("SOFTRDMA_HOLDER", sock.clone()),
            ("SR_USERS", VICTIM.to_string()),
        ],
    );
    h.line_with("HOLDING");
    let m = spawn_as(
        "role_bind",
        Some(MALLORY),
        &[("SR_BIND", "127.0.0.1:4791".to_string())],
    );
    assert_eq!(
        m.line_with("BIND_ERR"),
        format!("BIND_ERR {}", libc::EACCES)
    );
    let l = spawn_as("role_open_loopback", Some(MALLORY), &env).line_with("ERROR");
    assert!(l.starts_with(&format!("ERROR {}", libc::EACCES)), "{l}");
    assert!(l.contains("may not use port 4791"), "{l}");
    // Two victim contexts in one process, both from the holder, talk.
    let mut p = spawn_as("role_pair", Some(VICTIM), &env);
    p.line_with("PAIR OK");
    assert!(p.wait());
    let _ = std::fs::remove_dir_all(std::path::Path::new(&sock).parent().unwrap());
}

#[test]
#[ignore]
fn role_holder() {
    if !in_child() {
        return;
    }
    let path = PathBuf::from(std::env::var("SOFTRDMA_HOLDER").unwrap());
    let users = std::env::var("SR_USERS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|u| u.parse().ok())
        .collect();
    let policy = softrdma::host::HolderPolicy { users };
    // Listening once the socket exists.
    let p2 = path.clone();
    std::thread::spawn(move || {
        while !p2.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
        println!("HOLDING");
    });
    softrdma::host::serve_holder(&path, &policy).unwrap();
}

// ---- 6. rdma_cm peers of a killed process ----

#[test]
#[ignore]
fn role_cm_server() {
    if !in_child() {
        return;
    }
    use softrdma::rdma_cm::{ConnParam, EventChannel, EventType, PortSpace};
    let port: u16 = std::env::var("SR_PORT").unwrap().parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let l = ch.create_id(PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
        .unwrap();
    l.listen(4).unwrap();
    println!("LISTENING");
    let ev = ch
        .wait_event(EventType::ConnectRequest, Duration::from_secs(60))
        .unwrap();
    let id = ev.id().clone();
    drop(ev);
    let _qp = cm_qp(&id);
    id.accept(&ConnParam::default()).unwrap();
    drop(
        ch.wait_event(EventType::Established, Duration::from_secs(60))
            .unwrap(),
    );
    println!("CONNECTED");
    wait_for_disconnect(&ch);
}

#[test]
#[ignore]
fn role_cm_client() {
    if !in_child() {
        return;
    }
    use softrdma::rdma_cm::{ConnParam, EventChannel, EventType, PortSpace};
    let port: u16 = std::env::var("SR_PORT").unwrap().parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    id.resolve_addr(None, std::net::SocketAddr::V4(to), Duration::from_secs(5))
        .unwrap();
    drop(
        ch.wait_event(EventType::AddrResolved, Duration::from_secs(30))
            .unwrap(),
    );
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(
        ch.wait_event(EventType::RouteResolved, Duration::from_secs(30))
            .unwrap(),
    );
    let _qp = cm_qp(&id);
    id.connect(&ConnParam::default()).unwrap();
    drop(
        ch.wait_event(EventType::Established, Duration::from_secs(30))
            .unwrap(),
    );
    println!("CONNECTED");
    wait_for_disconnect(&ch);
}

fn cm_qp(id: &softrdma::rdma_cm::CmId) -> softrdma::verbs::QueuePair {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    id.create_qp(
        &pd,
        &softrdma::verbs::QpInitAttr::new(softrdma::verbs::QpType::Rc, &cq),
    )
    .unwrap()
}

/// Idle until the peer goes; say so.
fn wait_for_disconnect(ch: &softrdma::rdma_cm::EventChannel) {
    use softrdma::rdma_cm::EventType;
    loop {
        let Some(ev) = ch.get_cm_event_timeout(Duration::from_secs(120)) else {
            println!("NO DISCONNECT");
            return;
        };
        if ev.event() == EventType::Disconnected {
            println!("DISCONNECTED");
            let id = ev.id().clone();
            drop(ev);
            let _ = id.disconnect();
            return;
        }
    }
}

/// kill -9 of an rdma_cm server, then of a client: the survivor, an idle peer that sends
/// nothing, sees DISCONNECTED within a second (a member of the address sends the dead
/// process's DREQs).
#[test]
fn a_killed_rdma_cm_peer_is_disconnected_within_a_second() {
    let Some(_turn) = setup("a_killed_rdma_cm_peer_is_disconnected_within_a_second") else {
        return;
    };
    for (k, kill_server) in [(0u16, true), (1, false)] {
        let port = (24000 + k + (std::process::id() % 1000) as u16).to_string();
        let env = [("SR_PORT", port)];
        let server = spawn_as("role_cm_server", None, &env);
        server.line_with("LISTENING");
        let client = spawn_as("role_cm_client", None, &env);
        server.line_with("CONNECTED");
        client.line_with("CONNECTED");
        let (mut victim, survivor) = if kill_server {
            (server, client)
        } else {
            (client, server)
        };
        victim.child.kill().unwrap();
        victim.child.wait().unwrap();
        let t0 = Instant::now();
        let l = survivor.line_with("DISCONNECT");
        let took = t0.elapsed();
        assert_eq!(l, "DISCONNECTED", "kill server: {kill_server}");
        eprintln!(
            "kill -9 of the {}: DISCONNECTED after {took:?}",
            if kill_server { "server" } else { "client" }
        );
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
}

// ---- 3. A damaged or deleted registry under a live pair ----

/// Run as a user of its own (its state directory is its alone to damage): a pair streams
/// while the registry is filled with garbage, deleted, its lock file deleted, and the whole
/// state directory deleted; after each, the registry lists both members again, and a third
/// context joins without taking a live slot and talks to the first.
#[test]
#[ignore]
fn role_repair() {
    if !in_child() {
        return;
    }
    let (a, b) = pair();
    let dir = tmp_state_dir(REPAIRER);
    let data = dir.join(format!("s2-{}-127.0.0.1", netns_inode()));
    let lock = PathBuf::from(format!("{}.lock", data.display()));
    let listed = || -> usize {
        std::fs::read_to_string(&data)
            .map(|t| t.lines().filter(|l| l.starts_with("m ")).count())
            .unwrap_or(0)
    };
    assert_eq!(listed(), 2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let streamer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                stream(&a, &b, 2);
                rounds += 2;
            }
            (a, rounds)
        })
    };
    type Damage<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let damage: [Damage; 4] = [
        (
            "garbage",
            Box::new(|| std::fs::write(&data, b"\x00garbage\nm 1 0\n").unwrap()),
        ),
        (
            "registry deleted",
            Box::new(|| std::fs::remove_file(&data).unwrap()),
        ),
        (
            "lock deleted",
            Box::new(|| std::fs::remove_file(&lock).unwrap()),
        ),
        (
            "directory deleted",
            // As `rm -rf` run until it succeeds: the members write in it meanwhile.
            Box::new(|| {
                let t0 = Instant::now();
                while let Err(e) = std::fs::remove_dir_all(&dir) {
                    assert!(t0.elapsed() < Duration::from_secs(5), "rm -rf: {e}");
                }
            }),
        ),
    ];
    for (what, f) in damage.iter() {
        std::thread::sleep(Duration::from_millis(300));
        f();
        let t0 = Instant::now();
        while listed() != 2 || !lock.exists() {
            if t0.elapsed() > Duration::from_secs(5) {
                let files: Vec<_> = std::fs::read_dir(&dir)
                    .map(|d| d.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                panic!(
                    "{what}: not rebuilt: {:?} in {files:?}",
                    std::fs::read_to_string(&data)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("REBUILT {what} in {:?}", t0.elapsed());
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (a, rounds) = streamer.join().expect("the pair streamed through it all");
    // A newcomer takes a free slot (not a live one) and talks to A.
    let c = End::new(loopback_dev().open().unwrap());
    let slots: Vec<u32> = [&a, &c].iter().map(|e| e.qp.qp_num() >> 16).collect();
    assert_ne!(slots[0], slots[1]);
    let (a2, c2) = verbs_util::pair_of(a.ctx.clone(), c.ctx.clone());
    stream(&a2, &c2, 3);
    println!("REPAIR OK {rounds} rounds");
}

#[test]
fn a_damaged_or_deleted_registry_is_rebuilt_under_a_live_pair() {
    let Some(_turn) = setup("a_damaged_or_deleted_registry_is_rebuilt_under_a_live_pair") else {
        return;
    };
    let mut r = spawn_as("role_repair", Some(REPAIRER), &[]);
    for _ in 0..4 {
        eprintln!("{}", r.line_with("REBUILT"));
    }
    let l = r.line_with("REPAIR OK");
    eprintln!("{l}");
    assert!(r.wait(), "role_repair failed");
}

// ---- 4. Another softrdma version in the group ----

/// A member of the sharing protocol before this one (the fixture plays softrdma's earlier
/// layout, as far as others can see it): it binds the address with SO_REUSEPORT, takes slot
/// 1 of a registry of its own (it sees no other member), attaches its program (its slot to
/// index 0, probes to the index they name, anything else to the kernel's hash) and answers
/// probes with its slot and no protocol. Holds until stdin closes.
#[test]
#[ignore]
fn role_v1_member() {
    if !in_child() {
        return;
    }
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    s.set_reuse_port(true).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
    s.bind(&at.into()).unwrap();
    let ins = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let prog = [
        ins(0x20, 0, 0, 0),           // ld [0]
        ins(0x15, 0, 2, 0xff53_5250), // jeq probe
        ins(0x28, 0, 0, 4),           // ldh [4]
        ins(0x16, 0, 0, 0),           // ret a
        ins(0x30, 0, 0, 5),           // ldb [5]: the QPN's top byte
        ins(0x15, 0, 1, 1),           // jeq #1 (its slot)
        ins(0x06, 0, 0, 0),           // ret #0 (its index, as it believes)
        ins(0x06, 0, 0, u32::MAX),    // ret: hash
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut _,
    };
    // SAFETY: `fprog` points at `prog`, alive for the call.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    assert_eq!(r, 0);
    let u: UdpSocket = s.into();
    u.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    println!("V1 READY");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    std::thread::spawn(move || {
        wait_stdin_closed();
        d2.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let mut buf = [0u8; 8192];
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let Ok((n, from)) = u.recv_from(&mut buf) else {
            continue;
        };
        if n == 16 && buf[..4] == [0xff, b'S', b'R', b'P'] {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&[0xff, b'S', b'R', b'R']);
            a[4..6].copy_from_slice(&buf[4..6]);
            a[6] = 1;
            a[8..].copy_from_slice(&buf[8..16]);
            let _ = u.send_to(&a, from);
        }
    }
}

/// An older version first: opening the device is refused, naming its process and protocol.
/// This version first, with a pair streaming: the older one joins mid-run (its program
/// replaces ours); the pair finishes with its data intact.
#[test]
fn an_older_version_in_the_group_is_refused_or_outlived() {
    let Some(_turn) = setup("an_older_version_in_the_group_is_refused_or_outlived") else {
        return;
    };
    let mut v1 = spawn_as("role_v1_member", None, &[]);
    v1.line_with("V1 READY");
    let pid = v1.child.id();
    let t0 = Instant::now();
    let err = loopback_dev().open().expect_err("refused");
    let msg = err.to_string();
    eprintln!("refused after {:?}: {msg}", t0.elapsed());
    assert_eq!(err.errno(), libc::EADDRINUSE, "{msg}");
    assert!(msg.contains(&format!("pid {pid}")), "{msg}");
    assert!(msg.contains("protocol 1"), "{msg}");
    v1.close_stdin();
    assert!(v1.wait());

    let (a, b) = pair();
    stream(&a, &b, 3);
    let streamer = std::thread::spawn(move || {
        stream(&a, &b, 60);
        (a, b)
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut v1 = spawn_as("role_v1_member", None, &[]);
    v1.line_with("V1 READY");
    let (a, b) = streamer
        .join()
        .expect("the pair outlived the older version");
    stream(&a, &b, 5);
    v1.close_stdin();
    assert!(v1.wait());
}

// ---- 2. Hand-overs cannot be reached from another host ----

/// The responder's contexts share fd00::1 on a veth whose other end is in another network
/// namespace. From there, forged hand-over envelopes carrying an RDMA WRITE at the live
/// QP's next PSN, with the peer's address inside and the host's own address and port 4791 as
/// their (spoofed, raw) source, go to every UDP port bound on fd00::1: nothing lands, and the
/// pair's next WRITE does.
#[test]
fn envelopes_from_another_host_never_reach_a_context() {
    let Some(_turn) = setup("envelopes_from_another_host_never_reach_a_context") else {
        return;
    };
    let ns_b = format!("srb{}", std::process::id());
    run(&["ip", "netns", "add", &ns_b]);
    let _cleanup = Cleanup(ns_b.clone());
    run(&[
        "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &ns_b,
    ]);
    run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00::1/64",
        "dev",
        "va",
        "nodad",
    ]);
    run(&["ip", "link", "set", "va", "up"]);
    let inb = |c: &[&str]| {
        let mut v = vec!["ip", "netns", "exec", &ns_b];
        v.extend_from_slice(c);
        run(&v);
    };
    inb(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00::2/64",
        "dev",
        "vb",
        "nodad",
    ]);
    inb(&["ip", "link", "set", "vb", "up"]);
    inb(&["ip", "link", "set", "lo", "up"]);
    let dev = softrdma::devices()
        .unwrap()
        .into_iter()
        .find(|d| d.ipv6_addrs().contains(&"fd00::1".parse().unwrap()))
        .expect("the veth device");
    let (a, b) = verbs_util::pair_of(dev.open().unwrap(), dev.open().unwrap());
    let gid_index = |e: &End| {
        e.ctx
            .ip_addrs()
            .iter()
            .position(|ip| *ip == "fd00::1".parse::<std::net::IpAddr>().unwrap())
            .unwrap() as u8
    };
    assert_eq!(
        (gid_index(&a), gid_index(&b)),
        (0, 0),
        "an IPv6-only device"
    );
    stream(&a, &b, 2);
    let bmr = b.mr(4096);
    bmr.write(0, &[0u8; 4096]).unwrap();
    // Every UDP port on fd00::1 (and the wildcard) in this namespace.
    let ports: Vec<u16> = std::fs::read_to_string("/proc/thread-self/net/udp6")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let local = l.split_whitespace().nth(1)?;
            let (ip, port) = local.split_once(':')?;
            let fd00 = ip.starts_with("000000FD") || ip == "00000000000000000000000000000000";
            fd00.then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect();
    assert!(ports.contains(&4791), "{ports:?}");
    assert_eq!(
        ports.iter().filter(|p| **p != 4791).count(),
        0,
        "no other UDP socket on the address: hand-overs are unix sockets ({ports:?})"
    );
    let mac = mac_of("va");
    let before = b.ctx.stats().unwrap();
    let mut atk = spawn_cmd(
        {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", &ns_b])
                .arg(shared_bin())
                .args([
                    "--exact",
                    "role_envelope_attack",
                    "--ignored",
                    "--nocapture",
                ])
                .env("SOFTRDMA_TEST_CHILD", "1")
                .env("SR_MAC", &mac)
                .env(
                    "SR_PORTS",
                    ports
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                )
                .env("SR_QPN", b.qp.qp_num().to_string())
                .env("SR_RKEY", bmr.rkey().to_string())
                .env("SR_ADDR", bmr.addr().to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .stdin(std::process::Stdio::piped());
            c
        },
        "attacker",
    );
    let sent = atk.line_with("SENT");
    assert!(atk.wait(), "{sent}");
    std::thread::sleep(Duration::from_millis(300));
    let mut got = [0u8; 64];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, [0u8; 64], "a forged WRITE landed");
    let after = b.ctx.stats().unwrap();
    assert_eq!(after.rx_forwarded, before.rx_forwarded, "{sent}");
    // The pair goes on: nothing it sends was taken as a duplicate.
    stream(&a, &b, 3);
}

/// The MAC address of interface `name` in this thread's namespace ("aa:bb:..").
fn mac_of(name: &str) -> String {
    // SAFETY: an ioctl on a fresh socket with an `ifreq` we own; the socket is closed.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(s >= 0);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, b) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        assert_eq!(libc::ioctl(s, libc::SIOCGIFHWADDR, &mut ifr), 0, "{name}");
        libc::close(s);
        let a = ifr.ifr_ifru.ifru_hwaddr.sa_data;
        (0..6)
            .map(|i| format!("{:02x}", a[i] as u8))
            .collect::<Vec<_>>()
            .join(":")
    }
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

/// In the attacker's namespace: a raw Ethernet frame per port, IPv6 from fd00::1 port 4791
/// (the host's own address and port, which a forward socket used to trust) to fd00::1, whose
/// UDP payload is a hand-over envelope (kind 2) with an RDMA WRITE Only to the QP, "from"
/// fd00::1 (the QP's peer), at every PSN of a window, with a valid ICRC.
#[test]
#[ignore]
fn role_envelope_attack() {
    if !in_child() {
        return;
    }
    let mac: Vec<u8> = std::env::var("SR_MAC")
        .unwrap()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    assert_eq!(mac.len(), 6);
    let ports: Vec<u16> = std::env::var("SR_PORTS")
        .unwrap()
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    let qpn: u32 = std::env::var("SR_QPN").unwrap().parse().unwrap();
    let rkey: u32 = std::env::var("SR_RKEY").unwrap().parse().unwrap();
    let addr: u64 = std::env::var("SR_ADDR").unwrap().parse().unwrap();
    let host: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    // SAFETY: a packet socket of this namespace; closed at exit.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            (libc::ETH_P_IPV6 as u16).to_be() as i32,
        )
    };
    assert!(fd >= 0, "AF_PACKET");
    // SAFETY: a NUL-terminated interface name.
    let ifindex = unsafe { libc::if_nametoindex(c"vb".as_ptr()) } as i32;
    assert!(ifindex > 0, "vb");
    let mut sent = 0;
    for psn in 0..1024u32 {
        // The forged WRITE, as the peer would send it.
        let mut ib = vec![0u8; 12 + 16 + 64 + 4];
        ib[0] = 0x0a; // RC RDMA WRITE Only
        ib[1] = 0x40;
        ib[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
        ib[4..8].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
        ib[8..12].copy_from_slice(&(psn & 0xff_ffff).to_be_bytes());
        ib[12..20].copy_from_slice(&addr.to_be_bytes());
        ib[20..24].copy_from_slice(&rkey.to_be_bytes());
        ib[24..28].copy_from_slice(&64u32.to_be_bytes());
        for b in &mut ib[28..92] {
            *b = 0xee;
        }
        let inner_hdr = ipv6_udp(host, 4791, host, 4791, ib.len(), 0);
        let icrc = softrdma::wire::icrc::compute_v6(&inner_hdr, &ib[..ib.len() - 4]);
        let n = ib.len();
        ib[n - 4..].copy_from_slice(&icrc.to_le_bytes());
        // The envelope: magic, kind 2, source fd00::1 port 4791, the 40-byte IPv6 header.
        let mut env = vec![0xff, b'S', b'R', b'P', 0, 0, 2, 0];
        env.extend_from_slice(&host.octets());
        env.extend_from_slice(&4791u16.to_be_bytes());
        env.push(40);
        env.push(0);
        env.extend_from_slice(&inner_hdr[..40]);
        env.extend_from_slice(&ib);
        for &port in &ports {
            let ip_udp = ipv6_udp(host, 4791, host, port, env.len(), 0);
            let mut frame = Vec::new();
            frame.extend_from_slice(&mac);
            frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0xbb]);
            frame.extend_from_slice(&0x86ddu16.to_be_bytes());
            frame.extend_from_slice(&ip_udp);
            frame.extend_from_slice(&env);
            let csum = udp6_checksum(&host, &host, &frame[14 + 40..]);
            frame[14 + 46..14 + 48].copy_from_slice(&csum.to_be_bytes());
            // SAFETY: sockaddr_ll is plain data; sendto reads `frame` and `sa`, both live.
            let r = unsafe {
                let mut sa: libc::sockaddr_ll = std::mem::zeroed();
                sa.sll_family = libc::AF_PACKET as u16;
                sa.sll_protocol = (libc::ETH_P_IPV6 as u16).to_be();
                sa.sll_ifindex = ifindex;
                sa.sll_halen = 6;
                sa.sll_addr[..6].copy_from_slice(&mac);
                libc::sendto(
                    fd,
                    frame.as_ptr() as *const libc::c_void,
                    frame.len(),
                    0,
                    &sa as *const libc::sockaddr_ll as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            if r > 0 {
                sent += 1;
            }
        }
    }
    println!("SENT {sent} frames to ports {ports:?}");
}

/// IPv6 + UDP headers (48 bytes), UDP checksum left 0.
fn ipv6_udp(
    src: std::net::Ipv6Addr,
    sport: u16,
    dst: std::net::Ipv6Addr,
    dport: u16,
    payload: usize,
    flow: u32,
) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..4].copy_from_slice(&(0x6000_0000u32 | flow).to_be_bytes());
    h[4..6].copy_from_slice(&((payload + 8) as u16).to_be_bytes());
    h[6] = 17;
    h[7] = 64;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h[40..42].copy_from_slice(&sport.to_be_bytes());
    h[42..44].copy_from_slice(&dport.to_be_bytes());
    h[44..46].copy_from_slice(&((payload + 8) as u16).to_be_bytes());
    h
}

fn udp6_checksum(src: &std::net::Ipv6Addr, dst: &std::net::Ipv6Addr, udp: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}
