//! Experiment for issue 8 ("Sharing"): can several processes share UDP `addr:4791`, with each
//! datagram steered to its owner by the destination QPN in the BTH, using SO_REUSEPORT and a
//! classic-BPF program attached with SO_ATTACH_REUSEPORT_CBPF? Not part of the engine.
//!
//! ```text
//! cargo build --example reuseport_probe
//! target/debug/examples/reuseport_probe all [--addr 127.0.0.1]   # steering, crash, uid, bench
//! target/debug/examples/reuseport_probe bench [--addr A] [--secs 2]
//! target/debug/examples/reuseport_probe steer --addr 10.78.0.1 --from-netns peer  # via a veth
//! ```
//!
//! The parent spawns copies of itself (`child ID ADDR`), one after another so the reuseport group
//! index of child n is n; each child binds `ADDR:4791` with SO_REUSEPORT, answers every "probe"
//! datagram (BTH opcode 0xC0, a manufacturer-specific opcode) with its id, counts everything, and
//! takes commands on stdin (`attach SPEC`, `count`, `exit`). The parent sends probes from 8
//! sockets (8 source ports, so the kernel's 4-tuple hash varies) and prints who received each.
//!
//! The program (see `table_prog`): A = BTH dest QPN (payload bytes 5..8; the cBPF program sees
//! the UDP payload at offset 0); owner = QPN >> 16; owner 0xFE is a probe whose low 16 bits are
//! the group index to return; otherwise a jeq chain maps owner → group index; unknown owners
//! return 0xffffffff (out of range).
//!
//! docs/sharing.md has the results and the design built on them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

const PORT: u16 = 4791;
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
const SO_DETACH_REUSEPORT_BPF: libc::c_int = 68;
const PROBE_OPCODE: u8 = 0xC0;
const PROBE_OWNER: u32 = 0xFE;
const NO_INDEX: u32 = 0xffff_ffff;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}
const LD_W_ABS: u16 = 0x20; // BPF_LD|BPF_W|BPF_ABS
const AND_K: u16 = 0x54; // BPF_ALU|BPF_AND|BPF_K
const RSH_K: u16 = 0x74; // BPF_ALU|BPF_RSH|BPF_K
const JEQ_K: u16 = 0x15; // BPF_JMP|BPF_JEQ|BPF_K
const LD_H_ABS: u16 = 0x28; // BPF_LD|BPF_H|BPF_ABS
const JA: u16 = 0x05; // BPF_JMP|BPF_JA
const TAX: u16 = 0x07; // BPF_MISC|BPF_TAX
const TXA: u16 = 0x87; // BPF_MISC|BPF_TXA
const RET_A: u16 = 0x16; // BPF_RET|BPF_A
const RET_K: u16 = 0x06; // BPF_RET|BPF_K

/// owner → group index, as a cBPF program run on the UDP payload. QP1 (CM) datagrams are steered
/// by the MAD: REQ/SIDR_REQ by the word holding port space and port of the service ID (payload
/// 56..60) through `listeners`; every other CM message by the top 8 bits of the recipient's comm
/// ID (payload 48..52) through the owner table. Payload: BTH 0..12, DETH 12..20, MAD 20..44
/// (attribute id 36..38), CM message 44.. (a slice of the layout documented in docs/sharing.md).
fn table_prog(table: &[(u32, u32)], listeners: &[(u32, u32)]) -> Vec<libc::sock_filter> {
    let l = 2 * listeners.len() as u32;
    assert!(l <= 240);
    let mut p = vec![
        ins(LD_W_ABS, 0, 0, 4), // 0: A = payload[4..8] = resv8 | dest QPN
        ins(AND_K, 0, 0, 0x00ff_ffff),
        ins(TAX, 0, 0, 0),
        ins(JEQ_K, 0, (8 + l) as u8, 1), // 3: QP1? else to NOTCM = 12 + l
        ins(LD_H_ABS, 0, 0, 36),         // 4: attribute id
        ins(JEQ_K, 4, 0, 0x0010),        // REQ -> LST (10)
        ins(JEQ_K, 3, 0, 0x0017),        // SIDR_REQ -> LST
        ins(LD_W_ABS, 0, 0, 48),         // 7: remote comm ID = ours
        ins(RSH_K, 0, 0, 24),            //    owner = its top 8 bits
        ins(JA, 0, 0, 8 + l),            // 9: -> OWNERS = 18 + l
        ins(LD_W_ABS, 0, 0, 56),         // 10 LST: port space << 16 | port
    ];
    for &(word, idx) in listeners {
        p.push(ins(JEQ_K, 0, 1, word));
        p.push(ins(RET_K, 0, 0, idx));
    }
    p.extend([
        ins(RET_K, 0, 0, NO_INDEX),
        ins(TXA, 0, 0, 0),             // NOTCM
        ins(RSH_K, 0, 0, 16),          // A = owner (QPN bits 23..16)
        ins(JEQ_K, 0, 3, PROBE_OWNER), // probe?
        ins(TXA, 0, 0, 0),             //   A = QPN
        ins(AND_K, 0, 0, 0xffff),      //   index = QPN & 0xffff
        ins(RET_A, 0, 0, 0),
    ]);
    assert_eq!(p.len() as u32, 18 + l);
    for &(owner, idx) in table {
        p.push(ins(JEQ_K, 0, 1, owner));
        p.push(ins(RET_K, 0, 0, idx));
    }
    p.push(ins(RET_K, 0, 0, NO_INDEX));
    p
}

fn attach(fd: libc::c_int, spec: &str) -> Result<usize, i32> {
    if spec == "none" {
        // SAFETY: SO_DETACH_REUSEPORT_BPF takes no meaningful value; we pass a live int.
        let r = unsafe {
            let v: libc::c_int = 0;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_DETACH_REUSEPORT_BPF,
                &v as *const _ as _,
                4,
            )
        };
        return if r == 0 { Ok(0) } else { Err(errno()) };
    }
    let prog = if spec == "zero" {
        vec![ins(RET_K, 0, 0, 0)]
    } else if let Some(n) = spec.strip_prefix("chain") {
        // n dummy entries before the real identity table: cost of a long table
        let n: u32 = n.parse().unwrap();
        let mut t: Vec<(u32, u32)> = (0..n).map(|i| (0x100 + i, NO_INDEX)).collect();
        t.push((0, 0));
        table_prog(&t, &[])
    } else {
        // "owner:index,..." and "Lhexword:index" for CM listeners
        let (mut t, mut ls) = (Vec::new(), Vec::new());
        for e in spec.split(',').filter(|s| !s.is_empty()) {
            let (o, i) = e.split_once(':').unwrap();
            match o.strip_prefix('L') {
                Some(w) => ls.push((u32::from_str_radix(w, 16).unwrap(), i.parse().unwrap())),
                None => t.push((o.parse().unwrap(), i.parse().unwrap())),
            }
        }
        table_prog(&t, &ls)
    };
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut _,
    };
    // SAFETY: fprog points at `prog`, alive for the call; the kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if r == 0 {
        Ok(prog.len())
    } else {
        Err(errno())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn abstract_name(addr: Ipv4Addr, id: u32) -> String {
    // SAFETY: geteuid has no preconditions.
    format!("softrdma-probe/{}/{addr}/{id}", unsafe { libc::geteuid() })
}

// ---------------------------------------------------------------- child

fn child(id: u32, addr: Ipv4Addr, reuse: bool) {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    if reuse {
        s.set_reuse_port(true).unwrap();
    }
    if let Err(e) = s.bind(&SocketAddrV4::new(addr, PORT).into()) {
        println!("bindfail {} {e}", e.raw_os_error().unwrap_or(0));
        return;
    }
    let _ = s.set_recv_buffer_size(4 << 20);
    // Liveness: an abstract unix listener named after this member; the kernel removes the name
    // and resets connections to it when the process dies, however it dies.
    let ul =
        UnixListener::bind_addr(&UnixAddr::from_abstract_name(abstract_name(addr, id)).unwrap())
            .unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in ul.incoming().flatten() {
            held.push(c);
        }
    });
    let sock: Arc<UdpSocket> = Arc::new(s.into());
    let count = Arc::new(AtomicU64::new(0));
    {
        let (sock, count) = (sock.clone(), count.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                if n < 8 || (n >= 16 && buf[0] == PROBE_OPCODE) {
                    let seq = if n >= 16 {
                        u32::from_be_bytes(buf[12..16].try_into().unwrap())
                    } else {
                        NO_INDEX
                    };
                    let mut r = [0u8; 8];
                    r[..4].copy_from_slice(&id.to_be_bytes());
                    r[4..].copy_from_slice(&seq.to_be_bytes());
                    let _ = sock.send_to(&r, from);
                }
            }
        });
    }
    println!("ready {id} {}", std::process::id());
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut w = line.split_whitespace();
        match w.next() {
            Some("attach") => match attach(sock.as_raw_fd(), w.next().unwrap_or("none")) {
                Ok(n) => println!("attached {n}"),
                Err(e) => println!("attachfail {e}"),
            },
            Some("count") => println!("count {}", count.swap(0, Ordering::Relaxed)),
            _ => break,
        }
        std::io::stdout().flush().unwrap();
    }
    std::process::exit(0);
}

// ---------------------------------------------------------------- parent side

struct Member {
    id: u32,
    proc: Child,
    stdin: ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Member {
    fn cmd(&mut self, c: &str) -> String {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().to_string()
    }
}

/// Spawn a member and wait until it is bound (or failed to bind). `wrap` runs it under another
/// program (setpriv) with the given executable path.
fn spawn(
    id: u32,
    addr: Ipv4Addr,
    reuse: bool,
    wrap: Option<(&[&str], &str)>,
) -> Result<Member, String> {
    let me = std::env::current_exe().unwrap();
    let mut c = match wrap {
        Some((pre, exe)) => {
            let mut c = Command::new(pre[0]);
            c.args(&pre[1..]).arg(exe);
            c
        }
        None => Command::new(me),
    };
    c.arg(if reuse { "child" } else { "child-noreuse" })
        .arg(id.to_string())
        .arg(addr.to_string());
    let mut proc = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = proc.stdin.take().unwrap();
    let mut out = BufReader::new(proc.stdout.take().unwrap());
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    if l.starts_with("ready") {
        Ok(Member {
            id,
            proc,
            stdin,
            out,
        })
    } else {
        let _ = proc.wait();
        Err(l.trim().to_string())
    }
}

struct Senders {
    socks: Vec<UdpSocket>,
    dst: SocketAddr,
    seq: u32,
}

impl Senders {
    /// With `netns` (a name under /run/netns, root only), the sockets are made in that network
    /// namespace, so the datagrams arrive through a real device (veth) rather than loopback.
    fn new(addr: Ipv4Addr, netns: Option<&str>) -> Senders {
        let back = netns.map(|n| {
            let here = std::fs::File::open("/proc/self/ns/net").unwrap();
            let there = std::fs::File::open(format!("/run/netns/{n}")).unwrap();
            // SAFETY: setns on a live namespace fd; only this thread moves.
            assert_eq!(
                unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            here
        });
        let from = if netns.is_some() {
            Ipv4Addr::UNSPECIFIED
        } else {
            addr
        };
        let socks = (0..8)
            .map(|_| {
                let s = UdpSocket::bind((from, 0)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                s
            })
            .collect();
        if let Some(here) = back {
            // SAFETY: as above, back to where we came from.
            assert_eq!(
                unsafe { libc::setns(here.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
        }
        Senders {
            socks,
            dst: SocketAddr::V4(SocketAddrV4::new(addr, PORT)),
            seq: 0,
        }
    }

    /// Send one probe to `qpn` from each of the 8 source ports; the member id that answered
    /// each, or None (dropped / no answer).
    fn probe(&mut self, qpn: u32) -> Vec<Option<u32>> {
        self.socks
            .iter()
            .map(|s| {
                self.seq += 1;
                let mut d = [0u8; 16];
                d[0] = PROBE_OPCODE;
                d[4..8].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
                d[12..16].copy_from_slice(&self.seq.to_be_bytes());
                s.send_to(&d, self.dst).unwrap();
                recv_id(s, self.seq)
            })
            .collect()
    }

    /// A fake CM MAD to QP1: attribute id, payload word 48..52 and word 56..60.
    fn mad(&mut self, attr: u16, w48: u32, w56: u32) -> Vec<Option<u32>> {
        let mut d = [0u8; 64];
        d[0] = PROBE_OPCODE;
        d[4..8].copy_from_slice(&1u32.to_be_bytes());
        d[36..38].copy_from_slice(&attr.to_be_bytes());
        d[48..52].copy_from_slice(&w48.to_be_bytes());
        d[56..60].copy_from_slice(&w56.to_be_bytes());
        self.socks
            .iter()
            .map(|s| {
                self.seq += 1;
                d[12..16].copy_from_slice(&self.seq.to_be_bytes());
                s.send_to(&d, self.dst).unwrap();
                recv_id(s, self.seq)
            })
            .collect()
    }

    /// A 3-byte datagram: shorter than the word the program loads.
    fn short(&mut self) -> Vec<Option<u32>> {
        self.socks
            .iter()
            .map(|s| {
                s.send_to(&[PROBE_OPCODE, 0, 0], self.dst).unwrap();
                recv_id(s, NO_INDEX)
            })
            .collect()
    }
}

/// The id in the answer carrying `seq`; answers to earlier, timed-out datagrams are skipped.
fn recv_id(s: &UdpSocket, seq: u32) -> Option<u32> {
    let mut r = [0u8; 8];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        if let Ok(8) = s.recv(&mut r) {
            if u32::from_be_bytes(r[4..].try_into().unwrap()) == seq {
                return Some(u32::from_be_bytes(r[..4].try_into().unwrap()));
            }
        }
    }
    None
}

fn show(label: &str, v: &[Option<u32>]) {
    let s: Vec<String> = v
        .iter()
        .map(|x| x.map_or("-".into(), |i| format!("c{i}")))
        .collect();
    let mut h: BTreeMap<String, usize> = BTreeMap::new();
    for x in &s {
        *h.entry(x.clone()).or_default() += 1;
    }
    println!("  {label:<34} -> [{}]  {h:?}", s.join(" "));
}

/// Who is at group index k, by probe QPN 0xFE00kk; None if the probes disagree (hash fallback).
fn discover(tx: &mut Senders, n: u32) -> Vec<Option<u32>> {
    (0..n)
        .map(|k| {
            let v = tx.probe(PROBE_OWNER << 16 | k);
            show(
                &format!("probe index {k} (qpn {:#08x})", PROBE_OWNER << 16 | k),
                &v,
            );
            if v.iter().all(|x| *x == v[0]) {
                v[0]
            } else {
                None
            }
        })
        .collect()
}

fn owner_qpn(owner: u32) -> u32 {
    owner << 16 | 0x0011
}

fn send_owners(tx: &mut Senders, owners: &[u32]) {
    for &o in owners {
        show(
            &format!("dest QPN {:#08x} (owner {o})", owner_qpn(o)),
            &tx.probe(owner_qpn(o)),
        );
    }
}

fn kill9(m: &mut Member) {
    // SAFETY: kill on a child pid we spawned and have not reaped.
    unsafe { libc::kill(m.proc.id() as i32, libc::SIGKILL) };
    let _ = m.proc.wait();
}

fn steer_and_crash(addr: Ipv4Addr, netns: Option<&str>) {
    println!("== 1. steering: members c0..c3 join in order (group index = join order); owner of c_i = 10+i");
    let mut ms: Vec<Member> = (0..4)
        .map(|i| spawn(i, addr, true, None).unwrap())
        .collect();
    let mut tx = Senders::new(addr, netns);
    println!(" no program (kernel hash of the 4-tuple):");
    send_owners(&mut tx, &[10]);
    let t: String = (0..4).map(|i| format!("{}:{i},", 10 + i)).collect();
    println!(
        " c0: attach table {t} -> {}",
        ms[0].cmd(&format!("attach {t}"))
    );
    send_owners(&mut tx, &[10, 11, 12, 13, 20]);
    discover(&mut tx, 6);
    show("3-byte datagram (load past end)", &tx.short());
    println!(" QP1: c3 attaches the table plus listener rdma_cm TCP port 20000 (word 0x01064e20) -> index 2");
    println!(" c3 -> {}", ms[3].cmd(&format!("attach {t}L01064e20:2")));
    show(
        "QP1 REQ, service port 20000",
        &tx.mad(0x0010, 0, 0x0106_4e20),
    );
    show(
        "QP1 SIDR_REQ, service port 20000",
        &tx.mad(0x0017, 0, 0x0106_4e20),
    );
    show(
        "QP1 REQ, port 20001 (no listener)",
        &tx.mad(0x0010, 0, 0x0106_4e21),
    );
    show(
        "QP1 REP, remote comm ID 0x0b123456",
        &tx.mad(0x0013, 0x0b12_3456, 0),
    );
    show(
        "QP1 DREQ, remote comm ID 0x0d000001",
        &tx.mad(0x0015, 0x0d00_0001, 0),
    );
    send_owners(&mut tx, &[10, 13]);
    discover(&mut tx, 1);

    println!("== 2. crash: kill -9 c1 (index 1, the last member c3 is index 3)");
    let mut watch =
        UnixStream::connect_addr(&UnixAddr::from_abstract_name(abstract_name(addr, 1)).unwrap())
            .unwrap();
    let t0 = Instant::now();
    let mut c1 = ms.remove(1);
    kill9(&mut c1);
    let mut b = [0u8; 1];
    let r = watch.read(&mut b);
    println!(
        " watcher's unix stream to c1: {:?} after {:?} (EOF/reset = death noticed)",
        r.map_err(|e| e.kind()),
        t0.elapsed()
    );
    println!(" with the old table:");
    send_owners(&mut tx, &[10, 11, 12, 13]);
    let found = discover(&mut tx, 4);
    // rebuild: member id i owns owner 10+i, at the index where it answered
    let t: String = found
        .iter()
        .enumerate()
        .filter_map(|(k, m)| m.map(|i| format!("{}:{k},", 10 + i)))
        .collect();
    let c2 = ms.iter_mut().find(|m| m.id == 2).unwrap();
    println!(
        " c2 (not the first attacher) attaches rebuilt table {t} -> {}",
        c2.cmd(&format!("attach {t}"))
    );
    send_owners(&mut tx, &[10, 11, 12, 13]);

    println!("== 2b. graceful exit of c2 (the member that attached the program), then c4 joins");
    let mut c2 = ms.remove(ms.iter().position(|m| m.id == 2).unwrap());
    let _ = c2.cmd("exit");
    let _ = c2.proc.wait();
    ms.push(spawn(4, addr, true, None).unwrap());
    discover(&mut tx, 4);
    send_owners(&mut tx, &[10, 13]);

    println!("== 2c. hijack by a same-uid member: c4 attaches `ret 0`");
    println!(
        " c4 -> {}",
        ms.iter_mut()
            .find(|m| m.id == 4)
            .unwrap()
            .cmd("attach zero")
    );
    send_owners(&mut tx, &[10, 13]);

    println!("== 3. a second member under another uid (nobody) / a socket without SO_REUSEPORT");
    let tmp = format!("/tmp/reuseport_probe.{}", std::process::id());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0
        && std::fs::copy(std::env::current_exe().unwrap(), &tmp).is_ok()
    {
        let pre = [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ];
        match spawn(9, addr, true, Some((&pre, &tmp))) {
            Ok(mut m) => {
                println!(" nobody JOINED the root group (unexpected)");
                let _ = m.cmd("exit");
            }
            Err(e) => println!(" nobody, SO_REUSEPORT: {e}"),
        }
        let _ = std::fs::remove_file(&tmp);
    } else {
        println!(" (not root: skipped; run the whole probe as two users by hand)");
    }
    match spawn(8, addr, false, None) {
        Ok(_) => println!(" same uid without SO_REUSEPORT JOINED (unexpected)"),
        Err(e) => println!(" same uid, no SO_REUSEPORT: {e}"),
    }

    println!("== 2d. all members exit; a new group of two: is the old program gone?");
    for mut m in ms.drain(..) {
        kill9(&mut m);
    }
    let mut ms: Vec<Member> = (5..7)
        .map(|i| spawn(i, addr, true, None).unwrap())
        .collect();
    discover(&mut tx, 2);
    for mut m in ms.drain(..) {
        kill9(&mut m);
    }
}

fn bench(addr: Ipv4Addr, secs: f64) {
    println!("== 4. throughput, 64-byte datagrams, one sender thread, receivers in child processes, {secs}s each");
    // (label, members, reuseport, program)
    let cases: [(&str, u32, bool, Option<&str>); 5] = [
        ("plain socket, no SO_REUSEPORT", 1, false, None),
        ("reuseport group of 2, no program", 2, true, None),
        ("group of 2, owner table program", 2, true, Some("0:0,1:1")),
        (
            "group of 2, 256-entry owner chain",
            2,
            true,
            Some("chain256"),
        ),
        (
            "group of 2, 2000-entry owner chain",
            2,
            true,
            Some("chain2000"),
        ),
    ];
    for (label, n, reuse, prog) in cases {
        let mut ms: Vec<Member> = (0..n)
            .map(|i| spawn(100 + i, addr, reuse, None).unwrap())
            .collect();
        let att = prog.map(|p| ms[0].cmd(&format!("attach {p}")));
        let s = UdpSocket::bind((addr, 0)).unwrap();
        let mut d = [0u8; 64];
        d[0] = 0x64; // UD SEND only: not a probe, no answer
        d[4..8].copy_from_slice(&0x0000_0011u32.to_be_bytes()); // owner 0 -> index 0
        let dst = SocketAddrV4::new(addr, PORT);
        let t0 = Instant::now();
        let mut sent = 0u64;
        while t0.elapsed().as_secs_f64() < secs {
            for _ in 0..64 {
                if s.send_to(&d, dst).is_ok() {
                    sent += 1;
                }
            }
        }
        let el = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(200));
        let got: Vec<u64> = ms
            .iter_mut()
            .map(|m| m.cmd("count")[6..].parse().unwrap())
            .collect();
        let total: u64 = got.iter().sum();
        println!(
            "  {label:<44} sent {:>9.0}/s  received {:>9.0}/s  per member {got:?}{}",
            sent as f64 / el,
            total as f64 / el,
            att.map_or(String::new(), |a| format!("  ({a} insns)"))
        );
        for mut m in ms {
            kill9(&mut m);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let addr: Ipv4Addr = flag("--addr").map_or(Ipv4Addr::LOCALHOST, |a| a.parse().unwrap());
    let netns = flag("--from-netns");
    let secs: f64 = flag("--secs").map_or(2.0, |s| s.parse().unwrap());
    match args.get(1).map(String::as_str) {
        Some("child") => child(args[2].parse().unwrap(), args[3].parse().unwrap(), true),
        Some("child-noreuse") => child(args[2].parse().unwrap(), args[3].parse().unwrap(), false),
        Some("bench") => bench(addr, secs),
        Some("steer") => steer_and_crash(addr, netns.as_deref()),
        Some("all") => {
            // SAFETY: geteuid has no preconditions.
            println!("euid {} addr {addr}", unsafe { libc::geteuid() });
            steer_and_crash(addr, netns.as_deref());
            bench(addr, secs);
        }
        _ => eprintln!("usage: reuseport_probe all|steer|bench [--addr A] [--secs S]"),
    }
}
