//! Loopback latency and throughput of the Verbs API, next to a raw-UDP baseline, in one run:
//!
//! ```text
//! cargo bench --bench loopback
//! ```
//!
//! Two contexts on the loopback device (two endpoints 127.0.0.x) with one connected RC QP pair
//! at the device's active MTU. WRITE and READ targets are served by the passive context's
//! progress thread; SEND/RECV has a second thread that polls and re-posts. No timing is
//! asserted; every item is bounded to a few seconds.
//!
//! `SOFTRDMA_BENCH_RAW=1` registers each side's buffer with `register_raw` (memory the bench
//! owns, reached without a lock) instead of `alloc_mr`.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma::verbs::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcOpcode,
    WcStatus,
};
use softrdma::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, SendWr, WorkCompletion,
};

const LAT_ITERS: usize = 2000;
const LAT_WARMUP: usize = 200;
const BW_LEN: usize = 64 << 10;
const BW_DEPTH: u64 = 16;
/// Bytes moved per throughput item (64 KiB x 16384 = 1 GiB), cut short after `BW_TIME`.
const BW_BYTES: u64 = 1 << 30;
const BW_TIME: Duration = Duration::from_secs(3);
const UDP_DGRAM: usize = 4096;
/// Failure bound for any single wait.
const WAIT: Duration = Duration::from_secs(10);

/// One side: context, PD, CQ, QP, one registered buffer.
struct End {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    /// The memory of a raw `mr` (declared after it: dropped after it is deregistered).
    _raw: Option<Vec<u8>>,
}

/// `SOFTRDMA_BENCH_RAW=1`: raw regions over the bench's own memory.
fn raw_mrs() -> bool {
    std::env::var_os("SOFTRDMA_BENCH_RAW").is_some_and(|v| v == "1")
}

fn end(ctx: Context) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (mr, raw) = if raw_mrs() {
        let mut buf = vec![0u8; BW_LEN];
        let p = buf.as_mut_ptr();
        // SAFETY: `buf` lives in the same `End`, dropped after the region; the bench never
        // touches it otherwise.
        let mr = unsafe { pd.register_raw_iova(p, BW_LEN, p as u64, all) }.unwrap();
        (mr, Some(buf))
    } else {
        (pd.alloc_mr(BW_LEN, all).unwrap(), None)
    };
    End {
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
        _raw: raw,
    }
}

/// RESET -> INIT -> RTR -> RTS of `a` towards `b`, 16 READs outstanding each way.
fn connect(a: &End, b: &End, mtu: Mtu) {
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
        ..Default::default()
    })
    .unwrap();
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(mtu),
        dest_qp_num: Some(b.qp.qp_num()),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(1),
        ah_attr: Some(AddressVector {
            dgid: b.ctx.gid(),
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    a.qp.modify(&QpAttr {
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

/// A fresh connected pair (client, server) and the path MTU used.
fn pair() -> (End, End, Mtu) {
    let devs = softrdma::devices().expect("device list");
    let dev = devs
        .iter()
        .find(|d| d.addr().is_loopback())
        .expect("a loopback device");
    let (a, b) = (end(dev.open().unwrap()), end(dev.open().unwrap()));
    let mtu = a.ctx.query_port(1).unwrap().active_mtu;
    connect(&a, &b, mtu);
    connect(&b, &a, mtu);
    (a, b, mtu)
}

fn sge(mr: &MemoryRegion, len: usize) -> Sge {
    Sge {
        addr: mr.addr(),
        length: len as u32,
        lkey: mr.lkey(),
    }
}

fn post_send(e: &End, wr_id: u64, op: SendOp, len: usize) {
    let inline = matches!(op, SendOp::Send) && len <= 64;
    e.qp.post_send(&[SendWr {
        wr_id,
        op,
        sg_list: &[sge(&e.mr, len)],
        flags: if inline {
            SendFlags::SIGNALED | SendFlags::INLINE
        } else {
            SendFlags::SIGNALED
        },
    }])
    .unwrap();
}

fn post_recv(e: &End, len: usize) {
    e.qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: &[sge(&e.mr, len)],
    }])
    .unwrap();
}

/// Busy-poll one successful completion.
fn wait(e: &End) -> WorkCompletion {
    let t0 = Instant::now();
    let mut wc = [WorkCompletion::default()];
    loop {
        if e.cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            return wc[0];
        }
        assert!(t0.elapsed() < WAIT, "no completion within {WAIT:?}");
        std::hint::spin_loop();
    }
}

/// Busy-poll until a completion of `op` (skipping others, e.g. send completions).
fn wait_for(e: &End, op: WcOpcode) {
    while wait(e).opcode != op {}
}

// ---------------------------------------------------------------------------------------------
// Latency

struct Lat {
    median: f64,
    p99: f64,
}

/// Time `LAT_ITERS` calls of `op` after `LAT_WARMUP` untimed ones.
fn lat(mut op: impl FnMut()) -> Lat {
    for _ in 0..LAT_WARMUP {
        op();
    }
    let mut us: Vec<f64> = (0..LAT_ITERS)
        .map(|_| {
            let t = Instant::now();
            op();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(|a, b| a.total_cmp(b));
    Lat {
        median: us[us.len() / 2],
        p99: us[us.len() * 99 / 100],
    }
}

/// SEND/RECV ping-pong round trip; the server thread echoes every message.
fn lat_send() -> Lat {
    let (a, b, _) = pair();
    for _ in 0..64 {
        post_recv(&a, 64);
        post_recv(&b, 64);
    }
    let server = thread::spawn(move || {
        for i in 0..LAT_WARMUP + LAT_ITERS {
            wait_for(&b, WcOpcode::Recv);
            post_recv(&b, 64);
            post_send(&b, i as u64, SendOp::Send, 8);
        }
        b // keep the endpoint alive until the client is done
    });
    let r = lat(|| {
        post_send(&a, 0, SendOp::Send, 8);
        wait_for(&a, WcOpcode::Recv);
        post_recv(&a, 64);
    });
    drop(server.join().unwrap());
    r
}

/// One-sided operation latency (post, poll the completion); passive peer.
fn lat_one_sided(read: bool) -> Lat {
    let (a, b, _) = pair();
    let (remote_addr, rkey) = (b.mr.addr(), b.mr.rkey());
    let op = if read {
        SendOp::RdmaRead { remote_addr, rkey }
    } else {
        SendOp::RdmaWrite { remote_addr, rkey }
    };
    let r = lat(|| {
        post_send(&a, 0, op, 8);
        wait(&a);
    });
    drop(b);
    r
}

/// Busy-polled UDP ping-pong of 8 bytes between two non-blocking sockets on 127.0.0.1.
fn lat_udp() -> Lat {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(c.local_addr().unwrap()).unwrap();
    c.connect(s.local_addr().unwrap()).unwrap();
    s.set_nonblocking(true).unwrap();
    c.set_nonblocking(true).unwrap();
    let spin_recv = |sock: &UdpSocket| {
        let mut buf = [0u8; 64];
        let t0 = Instant::now();
        while sock.recv(&mut buf).is_err() {
            assert!(t0.elapsed() < WAIT, "UDP ping-pong stalled");
            std::hint::spin_loop();
        }
    };
    let server = thread::spawn(move || {
        for _ in 0..LAT_WARMUP + LAT_ITERS {
            spin_recv(&s);
            s.send(&[0u8; 8]).unwrap();
        }
    });
    let r = lat(|| {
        c.send(&[0u8; 8]).unwrap();
        spin_recv(&c);
    });
    server.join().unwrap();
    r
}

// ---------------------------------------------------------------------------------------------
// Throughput

struct Bw {
    bytes: u64,
    /// Wire packets: one per path-MTU payload (UDP: one per datagram).
    pkts: u64,
    secs: f64,
    note: String,
}

/// Keep `depth` 64 KiB operations outstanding until `BW_BYTES` (or `BW_TIME`) is done.
fn bw_client(a: &End, op: SendOp, depth: u64, mtu: Mtu) -> Bw {
    let n = BW_BYTES / BW_LEN as u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let t0 = Instant::now();
    while done < posted || posted == 0 {
        while posted < n && posted - done < depth && t0.elapsed() < BW_TIME {
            post_send(a, posted, op, BW_LEN);
            posted += 1;
        }
        wait(a);
        done += 1;
    }
    Bw {
        bytes: done * BW_LEN as u64,
        pkts: done * BW_LEN.div_ceil(mtu.bytes()) as u64,
        secs: t0.elapsed().as_secs_f64(),
        note: String::new(),
    }
}

fn bw_one_sided(read: bool) -> Bw {
    let (a, b, mtu) = pair();
    let (remote_addr, rkey) = (b.mr.addr(), b.mr.rkey());
    let op = if read {
        SendOp::RdmaRead { remote_addr, rkey }
    } else {
        SendOp::RdmaWrite { remote_addr, rkey }
    };
    let r = bw_client(&a, op, BW_DEPTH, mtu);
    drop(b);
    r
}

/// SEND 64 KiB, 16 outstanding; the receiver thread polls and re-posts its receives.
fn bw_send() -> Bw {
    let (a, b, mtu) = pair();
    for _ in 0..2 * BW_DEPTH {
        post_recv(&b, BW_LEN);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = thread::spawn(move || {
        let mut wc = [WorkCompletion::default(); 16];
        while !stop2.load(Ordering::Relaxed) {
            let n = b.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                post_recv(&b, BW_LEN);
            }
            std::hint::spin_loop();
        }
        b
    });
    let r = bw_client(&a, SendOp::Send, BW_DEPTH, mtu);
    stop.store(true, Ordering::Relaxed);
    drop(server.join().unwrap());
    r
}

/// One thread blasts 4 KiB datagrams (same byte volume) at a receiver thread that counts them.
fn bw_udp() -> Bw {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let n = BW_BYTES / UDP_DGRAM as u64;
    let receiver = thread::spawn(move || {
        let mut buf = vec![0u8; UDP_DGRAM];
        let (mut got, mut last) = (0u64, Instant::now());
        // Stop at the full count, or once the sender has gone quiet (the rest was dropped).
        while got < n {
            match rx.recv(&mut buf) {
                Ok(_) => {
                    got += 1;
                    last = Instant::now();
                }
                Err(_) => break,
            }
        }
        (got, last)
    });
    let buf = vec![0u8; UDP_DGRAM];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < n && t0.elapsed() < BW_TIME {
        if tx.send(&buf).is_ok() {
            sent += 1;
        }
    }
    let (got, last) = receiver.join().unwrap();
    Bw {
        bytes: got * UDP_DGRAM as u64,
        pkts: got,
        secs: (last - t0).as_secs_f64(),
        note: format!("{got} of {sent} datagrams received"),
    }
}

/// A named benchmark item.
type Item<T> = (&'static str, fn() -> T);

fn main() {
    let mtu = pair().2;
    println!(
        "softrdma loopback benchmark: RC over two contexts on 127.0.0.x, path MTU {}, {} CPUs, {} MRs\n",
        mtu.bytes(),
        thread::available_parallelism().map_or(0, |n| n.get()),
        if raw_mrs() { "raw" } else { "owned" }
    );

    println!("latency, 8 bytes, {LAT_ITERS} iterations after {LAT_WARMUP} warm-up");
    println!("  {:<34} {:>10} {:>10}", "", "median µs", "p99 µs");
    let lats: [Item<Lat>; 4] = [
        ("RC SEND/RECV ping-pong (round trip)", lat_send),
        ("RC RDMA WRITE (to completion)", || lat_one_sided(false)),
        ("RC RDMA READ", || lat_one_sided(true)),
        ("raw UDP ping-pong (round trip)", lat_udp),
    ];
    for (name, f) in lats {
        let r = f();
        println!("  {name:<34} {:>10.1} {:>10.1}", r.median, r.p99);
    }

    println!(
        "\nthroughput, 64 KiB messages (UDP: 4 KiB datagrams), up to {} MiB or {BW_TIME:?} each",
        BW_BYTES >> 20
    );
    println!("  {:<34} {:>10} {:>10} {:>8}", "", "MB/s", "Mpps", "secs");
    println!("  (Mpps: packets of one path MTU each, UDP: datagrams)");
    let bws: [Item<Bw>; 4] = [
        ("RC RDMA WRITE, 16 outstanding", || bw_one_sided(false)),
        ("RC SEND, 16 outstanding", bw_send),
        ("RC RDMA READ, 16 outstanding", || bw_one_sided(true)),
        ("raw UDP blast, 4 KiB datagrams", bw_udp),
    ];
    for (name, f) in bws {
        let r = f();
        let row = format!(
            "  {name:<34} {:>10.0} {:>10.3} {:>8.2}  {}",
            r.bytes as f64 / r.secs / 1e6,
            r.pkts as f64 / r.secs / 1e6,
            r.secs,
            r.note
        );
        println!("{}", row.trim_end());
    }
}
