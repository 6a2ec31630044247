//! The CPU cost of one RC SEND/RECV ping-pong round trip, both ends driven by one thread, against
//! the same exchange of raw UDP datagrams:
//!
//! ```text
//! cargo bench --bench hop                 # SOFTRDMA_HOP_ITERS=200000 by default
//! SOFTRDMA_HOP_ONLY=rc perf record -g target/release/deps/hop-* --bench   # or =raw
//! ```
//!
//! Two contexts on the loopback device in this process, a connected RC QP pair, 8-byte SENDs:
//! A posts, B polls until the message is there, re-posts its receive and answers, A polls until
//! the answer is there and re-posts. On loopback the kernel delivers a datagram into the peer's
//! socket within the sender's system call, so nothing waits on another CPU or thread: the time
//! per round trip is the CPU work of the exchange (both ends' kernel and user space), with no
//! idle polling in it, which makes the profile of this benchmark the profile of the work itself.
//! The twoproc benchmark measures the latency between two processes; this one what each round
//! trip costs. Nothing is asserted.

use std::net::UdpSocket;
use std::time::Instant;

use softrdma::transport::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcOpcode,
    WcStatus,
};
use softrdma::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, SendWr, WorkCompletion,
};

const WARMUP: usize = 2_000;

struct End {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

impl End {
    fn new() -> End {
        let dev = softrdma::devices()
            .expect("device list")
            .into_iter()
            .find(|d| d.addr().is_loopback())
            .expect("a loopback device");
        let ctx = dev.open().expect("open the loopback device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps::default(),
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        let mr = pd
            .alloc_mr(
                4096,
                AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0),
            )
            .unwrap();
        End {
            ctx,
            _pd: pd,
            cq,
            qp,
            mr,
        }
    }

    fn connect(&self, psn: u32, peer: &End, peer_psn: u32) {
        let qp = &self.qp;
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        })
        .unwrap();
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::Mtu4096),
            dest_qp_num: Some(peer.qp.qp_num()),
            rq_psn: Some(peer_psn),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(1),
            ah_attr: Some(AddressVector {
                dgid: peer.ctx.gid(),
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..Default::default()
        })
        .unwrap();
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn post_recv(&self) {
        let sge = [self.sge(1024, 64)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &sge,
            }])
            .unwrap();
    }

    /// A signaled 8-byte SEND (perftest's latency tests signal every one).
    fn send(&self) {
        let sge = [self.sge(0, 8)];
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags {
                    signaled: true,
                    ..Default::default()
                },
            }])
            .unwrap();
    }

    /// Poll until a receive completion is there (send completions are reaped on the way).
    /// `peer` is polled too when this CQ is empty, as its own process would poll it: an end
    /// that stops polling has its progress thread take over its datagrams (a thread wake-up per
    /// datagram), which is not what a busy-polling application pays.
    fn wait_recv(&self, peer: &End) {
        let mut wc = [WorkCompletion::default(); 4];
        loop {
            let n = self.cq.poll(&mut wc).expect("poll");
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                if c.opcode == WcOpcode::Recv {
                    return;
                }
            }
            if n == 0 {
                let n = peer.cq.poll(&mut wc).expect("poll");
                for c in &wc[..n] {
                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                    assert_ne!(c.opcode, WcOpcode::Recv, "the peer's message came early");
                }
            }
        }
    }
}

fn softrdma_round_trips(iters: usize) -> f64 {
    let a = End::new();
    let b = End::new();
    a.connect(1, &b, 2);
    b.connect(2, &a, 1);
    for _ in 0..8 {
        a.post_recv();
        b.post_recv();
    }
    let mut t0 = Instant::now();
    for i in 0..WARMUP + iters {
        if i == WARMUP {
            t0 = Instant::now();
        }
        a.send();
        b.wait_recv(&a);
        b.post_recv();
        b.send();
        a.wait_recv(&b);
        a.post_recv();
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn raw_round_trips(iters: usize) -> f64 {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let msg = [7u8; 8];
    let mut buf = [0u8; 64];
    let recv = |s: &UdpSocket, buf: &mut [u8]| loop {
        if s.recv(buf).is_ok() {
            return;
        }
    };
    let mut t0 = Instant::now();
    for i in 0..WARMUP + iters {
        if i == WARMUP {
            t0 = Instant::now();
        }
        a.send(&msg).unwrap();
        recv(&b, &mut buf);
        b.send(&msg).unwrap();
        recv(&a, &mut buf);
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let iters = std::env::var("SOFTRDMA_HOP_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    // SOFTRDMA_HOP_ONLY=raw or =rc: one of the two (to profile it alone).
    let only = std::env::var("SOFTRDMA_HOP_ONLY").unwrap_or_default();
    println!("CPU cost of one 8-byte ping-pong round trip, both ends on one thread ({iters} round trips)");
    let raw = if only == "rc" {
        f64::NAN
    } else {
        raw_round_trips(iters)
    };
    println!("  raw UDP (send, recv, send, recv)          {:8.0} ns", raw);
    if only == "raw" {
        return;
    }
    let rc = softrdma_round_trips(iters);
    println!(
        "  softrdma RC SEND/RECV, signaled           {:8.0} ns   ({:.2}x raw)",
        rc,
        rc / raw
    );
}
