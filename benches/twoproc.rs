//! softrdma against raw UDP between **two processes**, in one run, with the ratios against the
//! targets of issue 8 ("Speed"):
//!
//! ```text
//! cargo bench --bench twoproc                       # the loopback device
//! SOFTRDMA_BENCH_DEV=srxe1 cargo bench --bench twoproc   # another device (or: -- --dev srxe1)
//! SOFTRDMA_BENCH_SECS=2 cargo bench --bench twoproc      # seconds per throughput item (3)
//! SOFTRDMA_BENCH_EXTRA=0 cargo bench --bench twoproc     # skip the scaling items
//! SOFTRDMA_BENCH_ONLY=bw-write,lat-udp cargo bench --bench twoproc   # only these items
//! SOFTRDMA_BENCH_NETNS=0 cargo bench --bench twoproc     # stay in the host's namespace
//! ```
//!
//! Item keys: bw-write, bw-write-poll, bw-read, bw-read-poll, bw-send, udp-plain, udp-mmsg,
//! udp-gso, lat-send, lat-write, lat-read, lat-atomic, lat-read-sleep, lat-atomic-sleep,
//! lat-udp, scale.
//!
//! ```text
//! ```
//!
//! The benchmark re-executes its own binary as the second process (the "server", selected by
//! the `SOFTRDMA_TWOPROC_ROLE` environment variable) and drives it with one-line text commands
//! over the child's stdin/stdout: set up an endpoint (context, PD, CQ, QPs, one 64 KiB MR) and
//! swap QPNs, GID, address and rkey; start a behaviour (sleep, busy-poll, receive and re-post,
//! echo, ...); end it. Every RC item gets a fresh connected pair. Both processes open the same
//! device (they share its address, as processes share a device of rdma_rxe).
//!
//! On the loopback device, when it may (as root), the benchmark first moves into a private
//! network namespace with only `lo` up: every process of the host that uses softrdma on
//! 127.0.0.1 shares one UDP 4791 reuseport group, and test suites running meanwhile (other
//! builds, crash tests) would otherwise join the benchmark's group.
//!
//! Nothing is asserted: this is a benchmark, not a test. Every item is bounded in time.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use softrdma::verbs::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcOpcode,
    WcStatus,
};
use softrdma::verbs::{
    CompletionQueue, Context, Device, MemoryRegion, ProtectionDomain, QpInitAttr, QpType,
    QueuePair, RecvWr, SendWr, WorkCompletion,
};

const ROLE_ENV: &str = "SOFTRDMA_TWOPROC_ROLE";
const DEV_ENV: &str = "SOFTRDMA_BENCH_DEV";
const SECS_ENV: &str = "SOFTRDMA_BENCH_SECS";
const EXTRA_ENV: &str = "SOFTRDMA_BENCH_EXTRA";
const ONLY_ENV: &str = "SOFTRDMA_BENCH_ONLY";
const NETNS_ENV: &str = "SOFTRDMA_BENCH_NETNS";

/// Message size of the throughput items, and the MR size of every endpoint.
const BW_LEN: usize = 64 << 10;
const BW_DEPTH: u64 = 16;
/// Raw UDP: datagram (and GSO segment) size.
const UDP_DGRAM: usize = 4096;
/// GSO super-datagram: 15 segments of 4 KiB (16 would exceed the 65,507-byte UDP maximum).
const GSO_SEGS: usize = 15;
/// `sendmmsg`/`recvmmsg` batch.
const MMSG_BATCH: usize = 16;
const LAT_ITERS: usize = 10_000;
const LAT_WARMUP: usize = 1_000;
/// Bound on one latency item.
const LAT_TIME: Duration = Duration::from_secs(4);
/// Failure bound for any single wait.
const WAIT: Duration = Duration::from_secs(10);
/// Offsets in the 64 KiB MR used by the latency items.
const OFF_WSRC: usize = 0;
const OFF_WDST: usize = 64;
const OFF_ATOMIC: usize = 128;
const OFF_LOCAL: usize = 256;
/// The number of QPs of the scaling item.
const MANY_QPS: usize = 1000;

const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

const ALL: AccessFlags = AccessFlags::all();

// ---------------------------------------------------------------------------------------------
// Endpoints (both processes)

fn pick_device() -> Device {
    let devs = softrdma::devices().expect("device list");
    let want = std::env::var(DEV_ENV).ok().or_else(|| {
        let args: Vec<String> = std::env::args().collect();
        args.iter()
            .position(|a| a == "--dev")
            .and_then(|i| args.get(i + 1).cloned())
    });
    match want {
        Some(name) => devs
            .into_iter()
            .find(|d| d.name() == name || d.ifname() == name)
            .unwrap_or_else(|| panic!("no device named {name}")),
        None => devs
            .into_iter()
            .find(|d| d.addr().is_loopback())
            .expect("a loopback device"),
    }
}

/// One process's endpoint: a context, one PD, CQs, QPs and one 64 KiB MR.
struct Side {
    ctx: Context,
    _pd: ProtectionDomain,
    /// One CQ shared by every QP, or one per QP (`cq_per_qp`).
    cqs: Vec<CompletionQueue>,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    /// VmRSS (kB) just before the QPs were created.
    rss_before_qps: u64,
}

impl Side {
    fn new(ctx: Context, nqp: usize, cq_per_qp: bool) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let ncq = if cq_per_qp { nqp } else { 1 };
        let cqs: Vec<_> = (0..ncq)
            .map(|_| ctx.create_cq(4096, None).unwrap())
            .collect();
        // Memory the program owns, registered as a C program registers it (`ibv_reg_mr`): the
        // transport copies without a lock, and a side can spin on it as perftest does.
        let buf: &'static mut [u8] = Box::leak(vec![0u8; BW_LEN].into_boxed_slice());
        // SAFETY: the buffer is leaked (never freed, never moved) and this program holds no
        // reference into it: every access goes through the region (`read`/`write`).
        let mr =
            unsafe { pd.register_raw_iova(buf.as_mut_ptr(), BW_LEN, buf.as_ptr() as u64, ALL) }
                .unwrap();
        let rss_before_qps = rss_kb();
        let qps = (0..nqp)
            .map(|i| {
                let cq = &cqs[i % ncq];
                pd.create_qp(&QpInitAttr {
                    send_cq: cq,
                    recv_cq: cq,
                    cap: QpCaps::default(),
                    qp_type: QpType::Rc,
                    sq_sig_all: true,
                    srq: None,
                })
                .unwrap()
            })
            .collect();
        Side {
            ctx,
            _pd: pd,
            cqs,
            qps,
            mr,
            rss_before_qps,
        }
    }

    /// `GID QPN,QPN,... ADDR RKEY`
    fn info(&self) -> String {
        let gid: String = self.ctx.gid().iter().map(|b| format!("{b:02x}")).collect();
        let qpns: Vec<String> = self.qps.iter().map(|q| q.qp_num().to_string()).collect();
        format!(
            "{gid} {} {} {}",
            qpns.join(","),
            self.mr.addr(),
            self.mr.rkey()
        )
    }

    /// Connect QP i to the peer's QP i.
    fn connect(&self, peer: &Peer) {
        let mtu = self.ctx.query_port(1).unwrap().active_mtu;
        for (qp, &qpn) in self.qps.iter().zip(&peer.qpns) {
            connect(qp, qpn, peer.gid, mtu);
        }
    }

    fn cq(&self) -> &CompletionQueue {
        &self.cqs[0]
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    fn post_send(&self, qp: usize, wr_id: u64, op: SendOp, off: usize, len: usize) {
        let inline = matches!(op, SendOp::Send | SendOp::RdmaWrite { .. }) && len <= 64;
        self.qps[qp]
            .post_send(&[SendWr {
                wr_id,
                op,
                sg_list: &[self.sge(off, len)],
                flags: if inline {
                    SendFlags::SIGNALED | SendFlags::INLINE
                } else {
                    SendFlags::SIGNALED
                },
            }])
            .unwrap();
    }

    fn post_recv(&self, len: usize) {
        self.qps[0]
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[self.sge(0, len)],
            }])
            .unwrap();
    }

    /// The byte at `off` of the MR.
    fn byte(&self, off: usize) -> u8 {
        let mut b = [0u8];
        self.mr.read(off, &mut b).unwrap();
        b[0]
    }
}

struct Peer {
    gid: [u8; 16],
    qpns: Vec<u32>,
    addr: u64,
    rkey: u32,
}

impl Peer {
    fn parse(words: &[&str]) -> Peer {
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&words[0][2 * i..2 * i + 2], 16).unwrap();
        }
        Peer {
            gid,
            qpns: words[1].split(',').map(|q| q.parse().unwrap()).collect(),
            addr: words[2].parse().unwrap(),
            rkey: words[3].parse().unwrap(),
        }
    }
}

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at `gid`, 16 READs/atomics outstanding.
fn connect(qp: &QueuePair, remote_qpn: u32, gid: [u8; 16], mtu: Mtu) {
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(mtu),
        dest_qp_num: Some(remote_qpn),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(1),
        ah_attr: Some(AddressVector {
            dgid: gid,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(16),
        ..Default::default()
    })
    .unwrap();
}

/// Busy-poll one successful completion (`None` once `stop` is set).
fn wait_cq(cq: &CompletionQueue, stop: Option<&AtomicBool>) -> Option<WorkCompletion> {
    let t0 = Instant::now();
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            return Some(wc[0]);
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return None;
        }
        assert!(
            stop.is_some() || t0.elapsed() < WAIT,
            "no completion within {WAIT:?}"
        );
        std::hint::spin_loop();
    }
}

/// Busy-poll until a completion of `op` (skipping others, e.g. send completions).
fn wait_for(cq: &CompletionQueue, op: WcOpcode, stop: Option<&AtomicBool>) -> bool {
    loop {
        match wait_cq(cq, stop) {
            Some(wc) if wc.opcode == op => return true,
            Some(_) => {}
            None => return false,
        }
    }
}

/// Wait until the byte at `off` of our MR is `want`, as perftest's `ib_write_lat` watches the
/// last byte of its buffer: polling `cq` meanwhile (which drives the transport and reaps our
/// own send completions), or, with `spin`, without calling into the library at all — exactly
/// what `ib_write_lat` does between reaping its own send completion and posting its next WRITE
/// (the peer's WRITE lands only if the progress thread drives the transport meanwhile).
fn wait_byte(s: &Side, off: usize, want: u8, spin: bool, stop: Option<&AtomicBool>) -> bool {
    let t0 = Instant::now();
    let mut wc = [WorkCompletion::default(); 4];
    loop {
        if !spin {
            let k = s.cq().poll(&mut wc).unwrap();
            for c in &wc[..k] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
            }
        }
        if s.byte(off) == want {
            return true;
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return false;
        }
        assert!(
            stop.is_some() || t0.elapsed() < WAIT,
            "no WRITE within {WAIT:?}"
        );
        std::hint::spin_loop();
    }
}

/// The counter byte of ping-pong iteration `i`: 1..=255, never equal to the previous one.
fn counter(i: usize) -> u8 {
    (i % 255 + 1) as u8
}

/// The rate of a UDP socket's buffer as softrdma sets its own.
fn udp_socket(ip: IpAddr) -> UdpSocket {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap();
    let s2 = socket2::SockRef::from(&s);
    let _ = s2.set_recv_buffer_size(8 << 20);
    let _ = s2.set_send_buffer_size(8 << 20);
    s
}

fn setsockopt_int(s: &UdpSocket, level: libc::c_int, opt: libc::c_int, v: libc::c_int) {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

// ---------------------------------------------------------------------------------------------
// The server process

enum Done {
    Side(Side),
    /// Raw UDP receiver: bytes, datagrams (or GRO buffers), seconds from first to last.
    Udp(u64, u64, f64),
    Nothing,
}

fn server_main() {
    let dev = pick_device();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut side: Option<Side> = None;
    let mut worker: Option<(Arc<AtomicBool>, JoinHandle<Done>)> = None;
    let reply = |out: &mut std::io::StdoutLock, s: String| {
        writeln!(out, "{s}").unwrap();
        out.flush().unwrap();
    };
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "setup" => {
                let nqp: usize = w[1].parse().unwrap();
                let s = Side::new(dev.open().unwrap(), nqp, false);
                s.connect(&Peer::parse(&w[2..]));
                reply(&mut out, s.info());
                side = Some(s);
            }
            "run" => {
                let s = side.take().unwrap();
                let stop = Arc::new(AtomicBool::new(false));
                let st = stop.clone();
                let n: usize = w.get(2).map_or(0, |n| n.parse().unwrap());
                let h = match w[1] {
                    // The application sleeps (here: in read(2) on the pipe); the progress thread
                    // serves the peer.
                    "sleep" => {
                        side = Some(s);
                        reply(&mut out, "started".into());
                        continue;
                    }
                    "poll" => thread::spawn(move || {
                        let mut wc = [WorkCompletion::default(); 16];
                        while !st.load(Ordering::Relaxed) {
                            s.cq().poll(&mut wc).unwrap();
                            std::hint::spin_loop();
                        }
                        Done::Side(s)
                    }),
                    "sink" => {
                        for _ in 0..2 * BW_DEPTH {
                            s.post_recv(BW_LEN);
                        }
                        thread::spawn(move || {
                            let mut wc = [WorkCompletion::default(); 16];
                            while !st.load(Ordering::Relaxed) {
                                let k = s.cq().poll(&mut wc).unwrap();
                                for c in &wc[..k] {
                                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                                    if c.opcode == WcOpcode::Recv {
                                        s.post_recv(BW_LEN);
                                    }
                                }
                                std::hint::spin_loop();
                            }
                            Done::Side(s)
                        })
                    }
                    "sendecho" => {
                        for _ in 0..64 {
                            s.post_recv(64);
                        }
                        thread::spawn(move || {
                            for i in 0..n {
                                if !wait_for(s.cq(), WcOpcode::Recv, Some(&st)) {
                                    break;
                                }
                                s.post_recv(64);
                                s.post_send(0, i as u64, SendOp::Send, OFF_LOCAL, 8);
                            }
                            Done::Side(s)
                        })
                    }
                    "writeecho" | "writeecho-spin" => {
                        let peer = (w[3].parse().unwrap(), w[4].parse().unwrap());
                        let spin = w[1] == "writeecho-spin";
                        thread::spawn(move || {
                            let (remote, rkey): (u64, u32) = peer;
                            let op = SendOp::RdmaWrite {
                                remote_addr: remote + OFF_WDST as u64,
                                rkey,
                            };
                            for i in 0..n {
                                if !wait_byte(&s, OFF_WDST + 1, counter(i), spin, Some(&st)) {
                                    break;
                                }
                                s.mr.write(OFF_WSRC, &[0, counter(i)]).unwrap();
                                s.post_send(0, i as u64, op, OFF_WSRC, 2);
                                if spin && !wait_for(s.cq(), WcOpcode::RdmaWrite, Some(&st)) {
                                    break;
                                }
                            }
                            Done::Side(s)
                        })
                    }
                    other => panic!("unknown behaviour {other}"),
                };
                worker = Some((stop, h));
                reply(&mut out, "started".into());
            }
            "udp" => {
                let ip: IpAddr = dev.addr().into();
                let sock = udp_socket(ip);
                let port = sock.local_addr().unwrap().port();
                let stop = Arc::new(AtomicBool::new(false));
                let st = stop.clone();
                let h = match w[1] {
                    "echo" => {
                        let n: usize = w[2].parse().unwrap();
                        let peer: u16 = w[3].parse().unwrap();
                        sock.connect(SocketAddr::new(ip, peer)).unwrap();
                        sock.set_nonblocking(true).unwrap();
                        thread::spawn(move || {
                            let mut buf = [0u8; 64];
                            'outer: for _ in 0..n {
                                while sock.recv(&mut buf).is_err() {
                                    if st.load(Ordering::Relaxed) {
                                        break 'outer;
                                    }
                                    std::hint::spin_loop();
                                }
                                sock.send(&buf[..8]).unwrap();
                            }
                            Done::Nothing
                        })
                    }
                    kind @ ("plain" | "mmsg" | "gro") => {
                        let kind = kind.to_string();
                        sock.set_read_timeout(Some(Duration::from_millis(20)))
                            .unwrap();
                        if kind == "gro" {
                            setsockopt_int(&sock, libc::SOL_UDP, UDP_GRO, 1);
                        }
                        thread::spawn(move || udp_sink(&sock, &kind, &st))
                    }
                    other => panic!("unknown UDP behaviour {other}"),
                };
                worker = Some((stop, h));
                reply(&mut out, port.to_string());
            }
            "end" => {
                let mut msg = "ok".to_string();
                if let Some((stop, h)) = worker.take() {
                    stop.store(true, Ordering::Relaxed);
                    match h.join().unwrap() {
                        Done::Side(s) => drop(s),
                        Done::Udp(bytes, n, secs) => msg = format!("ok {bytes} {n} {secs}"),
                        Done::Nothing => {}
                    }
                }
                side = None;
                reply(&mut out, msg);
            }
            "rss" => reply(&mut out, rss_kb().to_string()),
            "quit" => break,
            other => panic!("unknown command {other}"),
        }
    }
    // Do not wait for anything: the client is gone or done.
    std::process::exit(0);
}

/// Receive until `stop`: bytes, receive calls' worth of units, seconds from first to last.
fn udp_sink(sock: &UdpSocket, kind: &str, stop: &AtomicBool) -> Done {
    let mut bufs = vec![0u8; MMSG_BATCH * UDP_DGRAM.max(BW_LEN / MMSG_BATCH)];
    let (mut bytes, mut n) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    // recvmmsg: one iovec of 4 KiB per message.
    let mut iovs: Vec<libc::iovec> = (0..MMSG_BATCH)
        .map(|i| libc::iovec {
            iov_base: bufs[i * UDP_DGRAM..].as_mut_ptr() as *mut libc::c_void,
            iov_len: UDP_DGRAM,
        })
        .collect();
    // SAFETY: all-zero is a valid mmsghdr.
    let mut hdrs: Vec<libc::mmsghdr> = (0..MMSG_BATCH)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (h, iov) in hdrs.iter_mut().zip(iovs.iter_mut()) {
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
    }
    while !stop.load(Ordering::Relaxed) {
        let got: u64 = if kind == "mmsg" {
            // SAFETY: `hdrs` points at live iovecs over `bufs`, which outlive the call.
            let r = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    MMSG_BATCH as u32,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if r <= 0 {
                continue;
            }
            n += r as u64;
            hdrs[..r as usize].iter().map(|h| h.msg_len as u64).sum()
        } else {
            match sock.recv(&mut bufs[..BW_LEN]) {
                Ok(len) => {
                    n += 1;
                    len as u64
                }
                Err(_) => continue,
            }
        };
        last = Instant::now();
        first.get_or_insert(last);
        bytes += got;
    }
    let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
    Done::Udp(bytes, n, secs)
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The client process

struct Server {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

impl Server {
    fn spawn() -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ROLE_ENV, "server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server process");
        let tx = child.stdin.take().unwrap();
        let rx = BufReader::new(child.stdout.take().unwrap());
        Server { child, tx, rx }
    }

    fn call(&mut self, cmd: &str) -> String {
        writeln!(self.tx, "{cmd}").unwrap();
        self.tx.flush().unwrap();
        let mut line = String::new();
        self.rx.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the server process died (on {cmd:?})");
        line.trim_end().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = writeln!(self.tx, "quit");
        let _ = self.tx.flush();
        let _ = self.child.wait();
    }
}

struct Bench {
    dev: Device,
    srv: Server,
    bw_time: Duration,
}

#[derive(Clone, Copy)]
struct Lat {
    median: f64,
    p99: f64,
    n: usize,
}

/// Time up to `LAT_ITERS` calls of `op` (bounded by `LAT_TIME`) after `LAT_WARMUP` untimed ones.
fn lat(mut op: impl FnMut(usize)) -> Lat {
    for i in 0..LAT_WARMUP {
        op(i);
    }
    let t0 = Instant::now();
    let mut us = Vec::with_capacity(LAT_ITERS);
    for i in LAT_WARMUP..LAT_WARMUP + LAT_ITERS {
        let t = Instant::now();
        op(i);
        us.push(t.elapsed().as_secs_f64() * 1e6);
        if t0.elapsed() > LAT_TIME {
            break;
        }
    }
    us.sort_by(|a, b| a.total_cmp(b));
    Lat {
        median: us[us.len() / 2],
        p99: us[us.len() * 99 / 100],
        n: us.len(),
    }
}

/// Throughput result in MB/s and a note.
struct Bw {
    mbs: f64,
    note: String,
}

impl Bench {
    /// A fresh endpoint here and one in the server, connected QP to QP; `run` the server's
    /// behaviour, call `f`, then end the server's side.
    fn rc<T>(
        &mut self,
        nqp: usize,
        cq_per_qp: bool,
        run: &str,
        f: impl FnOnce(&Side, &Peer) -> T,
    ) -> T {
        let me = Side::new(self.dev.open().unwrap(), nqp, cq_per_qp);
        let reply = self.srv.call(&format!("setup {nqp} {}", me.info()));
        let peer = Peer::parse(&reply.split_whitespace().collect::<Vec<_>>());
        me.connect(&peer);
        let run = run.replace("{peer}", &format!("{} {}", me.mr.addr(), me.mr.rkey()));
        assert_eq!(self.srv.call(&format!("run {run}")), "started");
        let r = f(&me, &peer);
        assert_eq!(self.srv.call("end"), "ok");
        r
    }

    // --- latency ---

    fn lat_send(&mut self) -> Lat {
        let n = LAT_WARMUP + LAT_ITERS;
        self.rc(1, false, &format!("sendecho {n}"), |me, _| {
            for _ in 0..64 {
                me.post_recv(64);
            }
            lat(|i| {
                me.post_send(0, i as u64, SendOp::Send, OFF_LOCAL, 8);
                wait_for(me.cq(), WcOpcode::Recv, None);
                me.post_recv(64);
            })
        })
    }

    /// The WRITE ping-pong. `spin`: as perftest's `ib_write_lat` runs it — each side waits for
    /// its WRITE's completion, then spins on its memory without calling into the library (the
    /// peer's WRITE lands only if the progress thread drives the transport); otherwise each side
    /// polls its CQ while it watches its memory.
    fn lat_write(&mut self, spin: bool) -> Lat {
        let n = LAT_WARMUP + LAT_ITERS;
        let server = if spin { "writeecho-spin" } else { "writeecho" };
        self.rc(1, false, &format!("{server} {n} {{peer}}"), |me, peer| {
            let op = SendOp::RdmaWrite {
                remote_addr: peer.addr + OFF_WDST as u64,
                rkey: peer.rkey,
            };
            lat(|i| {
                me.mr.write(OFF_WSRC, &[0, counter(i)]).unwrap();
                me.post_send(0, i as u64, op, OFF_WSRC, 2);
                if spin {
                    wait_for(me.cq(), WcOpcode::RdmaWrite, None);
                }
                wait_byte(me, OFF_WDST + 1, counter(i), spin, None);
            })
        })
    }

    /// One 8-byte READ or fetch-and-add, post to completion; the server polls or sleeps.
    fn lat_one_sided(&mut self, atomic: bool, server: &str) -> Lat {
        self.rc(1, false, server, |me, peer| {
            let op = if atomic {
                SendOp::FetchAdd {
                    remote_addr: peer.addr + OFF_ATOMIC as u64,
                    rkey: peer.rkey,
                    add: 1,
                }
            } else {
                SendOp::RdmaRead {
                    remote_addr: peer.addr,
                    rkey: peer.rkey,
                }
            };
            lat(|i| {
                me.post_send(0, i as u64, op, OFF_LOCAL, 8);
                wait_cq(me.cq(), None);
            })
        })
    }

    fn lat_udp(&mut self) -> Lat {
        let ip: IpAddr = self.dev.addr().into();
        let sock = udp_socket(ip);
        let me = sock.local_addr().unwrap().port();
        let n = LAT_WARMUP + LAT_ITERS;
        let port: u16 = self
            .srv
            .call(&format!("udp echo {n} {me}"))
            .parse()
            .unwrap();
        sock.connect(SocketAddr::new(ip, port)).unwrap();
        sock.set_nonblocking(true).unwrap();
        let r = lat(|_| {
            let mut buf = [0u8; 64];
            sock.send(&[0u8; 8]).unwrap();
            let t0 = Instant::now();
            while sock.recv(&mut buf).is_err() {
                assert!(t0.elapsed() < WAIT, "UDP ping-pong stalled");
                std::hint::spin_loop();
            }
        });
        assert_eq!(self.srv.call("end"), "ok");
        r
    }

    // --- throughput ---

    /// Keep `BW_DEPTH` 64 KiB operations outstanding for `bw_time`, round-robin over the QPs.
    fn bw_client(
        me: &Side,
        qps: std::ops::Range<usize>,
        cq: usize,
        op: SendOp,
        t: Duration,
    ) -> (u64, f64) {
        let nqp = qps.len() as u64;
        let (mut posted, mut done) = (0u64, 0u64);
        let t0 = Instant::now();
        let mut wc = [WorkCompletion::default(); 16];
        // Until the time is up and every posted operation has completed.
        while done < posted || t0.elapsed() < t {
            while posted - done < BW_DEPTH && t0.elapsed() < t {
                let qp = qps.start + (posted % nqp) as usize;
                me.post_send(qp, posted, op, 0, BW_LEN);
                posted += 1;
            }
            let t1 = Instant::now();
            loop {
                let k = me.cqs[cq].poll(&mut wc).unwrap();
                for c in &wc[..k] {
                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                }
                done += k as u64;
                if k > 0 {
                    break;
                }
                assert!(t1.elapsed() < WAIT, "no completion within {WAIT:?}");
                std::hint::spin_loop();
            }
        }
        (done * BW_LEN as u64, t0.elapsed().as_secs_f64())
    }

    fn op(kind: &str, peer: &Peer) -> SendOp {
        match kind {
            "write" => SendOp::RdmaWrite {
                remote_addr: peer.addr,
                rkey: peer.rkey,
            },
            "read" => SendOp::RdmaRead {
                remote_addr: peer.addr,
                rkey: peer.rkey,
            },
            _ => SendOp::Send,
        }
    }

    /// WRITE/READ/SEND, one QP (or `nqp` round-robin), the server doing `server`.
    fn bw_rc(&mut self, kind: &str, server: &str, nqp: usize) -> Bw {
        let t = self.bw_time;
        let mut rss = 0;
        let (bytes, secs, tx, rx) = self.rc(nqp, false, server, |me, peer| {
            // This process's VmRSS with `nqp` connected, idle QPs against just before them.
            rss = rss_kb().saturating_sub(me.rss_before_qps);
            let s0 = me.ctx.stats().unwrap();
            let (b, secs) = Self::bw_client(me, 0..nqp, 0, Self::op(kind, peer), t);
            let s1 = me.ctx.stats().unwrap();
            (
                b,
                secs,
                s1.tx_packets - s0.tx_packets,
                s1.rx_packets - s0.rx_packets,
            )
        });
        // Packets per 64 KiB message seen by this (the requesting) side: WRITE/SEND send 16
        // data packets and get ACKs back; READ sends one request and gets 16 responses.
        let msgs = (bytes / BW_LEN as u64).max(1) as f64;
        let mut note = format!(
            "{} MiB in {secs:.2} s; client tx {:.1} rx {:.1} pkts/msg",
            bytes >> 20,
            tx as f64 / msgs,
            rx as f64 / msgs
        );
        if nqp > 1 {
            let per = rss as f64 / nqp as f64;
            note += &format!("; {nqp} idle QPs: VmRSS +{rss} kB = {per:.1} kB per QP");
        }
        Bw {
            mbs: bytes as f64 / secs / 1e6,
            note,
        }
    }

    /// Two QPs with a CQ each on one context, each driven by its own thread; aggregate WRITE.
    fn bw_two_threads(&mut self) -> Bw {
        let t = self.bw_time;
        let (bytes, secs) = self.rc(2, true, "sleep", |me, peer| {
            let op = Self::op("write", peer);
            thread::scope(|sc| {
                let hs: Vec<_> = (0..2)
                    .map(|k| sc.spawn(move || Self::bw_client(me, k..k + 1, k, op, t)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .fold((0, 0f64), |a, b| (a.0 + b.0, a.1.max(b.1)))
            })
        });
        Bw {
            mbs: bytes as f64 / secs / 1e6,
            note: format!("{} MiB in {secs:.2} s", bytes >> 20),
        }
    }

    /// Raw UDP from here to a receiver in the server for `bw_time`, the same bytes as 4 KiB
    /// datagrams: `plain` send/recv, `mmsg` sendmmsg/recvmmsg, `gso` UDP_SEGMENT + UDP_GRO.
    fn bw_udp(&mut self, kind: &str) -> Bw {
        let ip: IpAddr = self.dev.addr().into();
        let sink = if kind == "gso" { "gro" } else { kind };
        let port: u16 = self.srv.call(&format!("udp {sink}")).parse().unwrap();
        let sock = udp_socket(ip);
        sock.connect(SocketAddr::new(ip, port)).unwrap();
        let fd = sock.as_raw_fd();
        let buf = vec![0u8; BW_LEN];
        let mut iovs: Vec<libc::iovec> = (0..MMSG_BATCH)
            .map(|i| libc::iovec {
                iov_base: buf[i * UDP_DGRAM..].as_ptr() as *mut libc::c_void,
                iov_len: UDP_DGRAM,
            })
            .collect();
        // SAFETY: all-zero is a valid mmsghdr.
        let mut hdrs: Vec<libc::mmsghdr> = (0..MMSG_BATCH)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (h, iov) in hdrs.iter_mut().zip(iovs.iter_mut()) {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        if kind == "gso" {
            setsockopt_int(&sock, libc::SOL_UDP, UDP_SEGMENT, UDP_DGRAM as libc::c_int);
        }
        let t0 = Instant::now();
        let mut sent = 0u64;
        while t0.elapsed() < self.bw_time {
            sent += match kind {
                "plain" => sock.send(&buf[..UDP_DGRAM]).map_or(0, |n| n as u64),
                "gso" => sock
                    .send(&buf[..GSO_SEGS * UDP_DGRAM])
                    .map_or(0, |n| n as u64),
                _ => {
                    // SAFETY: `hdrs` points at live iovecs over `buf`, which outlive the call.
                    let r = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), MMSG_BATCH as u32, 0) };
                    hdrs[..r.max(0) as usize]
                        .iter()
                        .map(|h| h.msg_len as u64)
                        .sum()
                }
            };
        }
        // Let the receiver drain, then stop it.
        thread::sleep(Duration::from_millis(100));
        let r = self.srv.call("end");
        let w: Vec<&str> = r.split_whitespace().collect();
        let (bytes, n, secs): (u64, u64, f64) = (
            w[1].parse().unwrap(),
            w[2].parse().unwrap(),
            w[3].parse().unwrap(),
        );
        let unit = if kind == "gso" {
            "GRO buffers"
        } else {
            "datagrams"
        };
        Bw {
            mbs: bytes as f64 / secs.max(1e-9) / 1e6,
            note: format!(
                "{:.0}% of sent bytes received, {:.1} KiB per receive ({n} {unit})",
                100.0 * bytes as f64 / sent.max(1) as f64,
                bytes as f64 / n.max(1) as f64 / 1024.0
            ),
        }
    }
}

fn secs_env() -> Duration {
    let s: f64 = std::env::var(SECS_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

fn print_lat(name: &str, l: &Lat) {
    println!(
        "  {name:<46} {:>9.1} {:>9.1}   ({} samples)",
        l.median, l.p99, l.n
    );
}

fn print_bw(name: &str, b: &Bw) {
    println!("  {name:<46} {:>9.0}   {}", b.mbs, b.note);
}

/// `SOFTRDMA_BENCH_ONLY=bw-write,lat-udp,...`: run only these items (for profiling one).
fn wanted(key: &str) -> bool {
    match std::env::var(ONLY_ENV) {
        Ok(list) => list.split(',').any(|k| k.trim() == key),
        Err(_) => true,
    }
}

/// Move into a new network namespace with `lo` up (as root, loopback device only).
fn private_netns() -> Result<(), String> {
    let chosen = std::env::var(DEV_ENV).is_ok() || std::env::args().any(|a| a == "--dev");
    if chosen || std::env::var(NETNS_ENV).is_ok_and(|v| v == "0") {
        return Err("a device was chosen or SOFTRDMA_BENCH_NETNS=0".into());
    }
    // SAFETY: unshare has no memory-safety preconditions; no other thread exists yet.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq naming "lo"; results are checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        let ok = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) == 0 && {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) == 0
        };
        libc::close(fd);
        if !ok {
            return Err(format!("lo up: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn client_main() {
    let ns = private_netns();
    let dev = pick_device();
    let mut b = Bench {
        srv: Server::spawn(),
        bw_time: secs_env(),
        dev,
    };
    let mtu = {
        let ctx = b.dev.open().unwrap();
        ctx.query_port(1).unwrap().active_mtu
    };
    println!(
        "softrdma two-process benchmark: device {} ({}), path MTU {}, {} CPUs, server pid {}",
        b.dev.name(),
        b.dev.addr(),
        mtu.bytes(),
        thread::available_parallelism().map_or(0, |n| n.get()),
        b.srv.child.id()
    );
    match ns {
        Ok(()) => println!("private network namespace (only lo)"),
        Err(e) => println!("host network namespace ({e})"),
    }
    let extra = std::env::var(EXTRA_ENV).map_or(true, |v| v != "0");

    println!(
        "\nthroughput, 64 KiB messages, {BW_DEPTH} outstanding, {:?} per item",
        b.bw_time
    );
    println!("  {:<46} {:>9}", "", "MB/s");
    let bw = |b: &mut Bench, key: &str, name: &str, f: fn(&mut Bench) -> Bw| {
        wanted(key).then(|| {
            let r = f(b);
            print_bw(name, &r);
            r.mbs
        })
    };
    let write = bw(&mut b, "bw-write", "RC WRITE (server asleep)", |b| {
        b.bw_rc("write", "sleep", 1)
    });
    bw(
        &mut b,
        "bw-write-poll",
        "RC WRITE (server busy-polls its CQ)",
        |b| b.bw_rc("write", "poll", 1),
    );
    let read = bw(&mut b, "bw-read", "RC READ (server asleep)", |b| {
        b.bw_rc("read", "sleep", 1)
    });
    bw(
        &mut b,
        "bw-read-poll",
        "RC READ (server busy-polls its CQ)",
        |b| b.bw_rc("read", "poll", 1),
    );
    let send = bw(
        &mut b,
        "bw-send",
        "RC SEND (server polls and re-posts)",
        |b| b.bw_rc("send", "sink", 1),
    );
    let udp = [
        bw(
            &mut b,
            "udp-plain",
            "raw UDP send/recv, 4 KiB datagrams",
            |b| b.bw_udp("plain"),
        )
        .map(|v| ("send/recv", v)),
        bw(
            &mut b,
            "udp-mmsg",
            "raw UDP sendmmsg/recvmmsg, 16 x 4 KiB",
            |b| b.bw_udp("mmsg"),
        )
        .map(|v| ("sendmmsg/recvmmsg", v)),
        bw(&mut b, "udp-gso", "raw UDP GSO 15 x 4 KiB + GRO", |b| {
            b.bw_udp("gso")
        })
        .map(|v| ("GSO+GRO", v)),
    ];
    let best = udp
        .iter()
        .flatten()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1));

    println!(
        "\nlatency, up to {LAT_ITERS} iterations after {LAT_WARMUP} warm-up (round trips; \
         perftest's *_lat print half of a ping-pong)"
    );
    println!("  {:<46} {:>9} {:>9}", "", "median µs", "p99 µs");
    let lt = |b: &mut Bench, key: &str, name: &str, f: fn(&mut Bench) -> Lat| {
        wanted(key).then(|| {
            let r = f(b);
            print_lat(name, &r);
            r.median
        })
    };
    let l_send = lt(&mut b, "lat-send", "RC SEND/RECV ping-pong, 8 B", |b| {
        b.lat_send()
    });
    let l_write = lt(
        &mut b,
        "lat-write",
        "RC WRITE ping-pong, 2 B (ib_write_lat style)",
        |b| b.lat_write(false),
    );
    let l_write_spin = lt(
        &mut b,
        "lat-write-spin",
        "  the same, spinning on memory as ib_write_lat",
        |b| b.lat_write(true),
    );
    let l_read = lt(
        &mut b,
        "lat-read",
        "RC READ, 8 B (server busy-polls)",
        |b| b.lat_one_sided(false, "poll"),
    );
    let l_atomic = lt(
        &mut b,
        "lat-atomic",
        "RC fetch-and-add, 8 B (server busy-polls)",
        |b| b.lat_one_sided(true, "poll"),
    );
    let l_read_s = lt(
        &mut b,
        "lat-read-sleep",
        "RC READ, 8 B (server asleep)",
        |b| b.lat_one_sided(false, "sleep"),
    );
    let l_atomic_s = lt(
        &mut b,
        "lat-atomic-sleep",
        "RC fetch-and-add, 8 B (server asleep)",
        |b| b.lat_one_sided(true, "sleep"),
    );
    let l_udp = lt(
        &mut b,
        "lat-udp",
        "raw UDP ping-pong, 8 B, busy-polled",
        |b| b.lat_udp(),
    );

    if extra && wanted("scale") {
        println!("\nscaling, RC WRITE 64 KiB, {BW_DEPTH} outstanding in all, server asleep");
        println!("  {:<46} {:>9}", "", "MB/s");
        let one = b.bw_rc("write", "sleep", 1);
        print_bw("one QP pair, one thread", &one);
        let two = b.bw_two_threads();
        print_bw("two QP pairs, two threads (one context)", &two);
        let many = b.bw_rc("write", "sleep", MANY_QPS);
        print_bw(
            &format!("{MANY_QPS} QP pairs, round-robin, one thread"),
            &many,
        );
        println!(
            "  two pairs / one: {:.2}x; {MANY_QPS} pairs / one: {:.2}x",
            two.mbs / one.mbs,
            many.mbs / one.mbs
        );
    }

    println!(
        "\ntargets (issue 8); baselines: best raw UDP throughput ({}), busy-polled raw UDP \
         ping-pong median",
        best.map_or("-", |b| b.0)
    );
    println!(
        "  {:<40} {:>10} {:>10} {:>7} {:>8}  met",
        "", "softrdma", "baseline", "ratio", "target"
    );
    let best = best.map(|b| b.1);
    let row = |name: &str, v: Option<f64>, base: Option<f64>, higher: bool, target: f64| {
        let t = format!("{}{target:.2}", if higher { ">=" } else { "<=" });
        let (Some(v), Some(base)) = (v, base) else {
            println!("  {name:<40} {:>10} {:>10} {:>7} {t:>8}  -", "-", "-", "-");
            return;
        };
        let ratio = v / base;
        let met = if higher {
            ratio >= target
        } else {
            ratio <= target
        };
        println!(
            "  {name:<40} {v:>10.1} {base:>10.1} {ratio:>7.2} {t:>8}  {}",
            if met { "yes" } else { "NO" }
        );
    };
    row("WRITE MB/s (server asleep)", write, best, true, 0.70);
    row("READ MB/s (server asleep)", read, best, true, 0.70);
    row("SEND MB/s", send, best, true, 0.70);
    row("SEND/RECV ping-pong µs", l_send, l_udp, false, 1.3);
    row("WRITE ping-pong µs", l_write, l_udp, false, 1.3);
    row(
        "  spinning on memory (ib_write_lat)",
        l_write_spin,
        l_udp,
        false,
        1.3,
    );
    row("READ µs (server busy-polls)", l_read, l_udp, false, 2.0);
    row(
        "fetch-and-add µs (server busy-polls)",
        l_atomic,
        l_udp,
        false,
        2.0,
    );
    row(
        "READ µs, passive side (asleep)",
        l_read_s,
        l_udp,
        false,
        2.0,
    );
    row(
        "fetch-and-add µs, passive side (asleep)",
        l_atomic_s,
        l_udp,
        false,
        2.0,
    );
}

fn main() {
    if std::env::var(ROLE_ENV).is_ok_and(|r| r == "server") {
        server_main();
    } else {
        client_main();
    }
}
