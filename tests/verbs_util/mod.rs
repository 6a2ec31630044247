//! Helpers shared by the `verbs_*` integration tests: two endpoints over loopback with a
//! connected RC QP pair, and bounded waits for completions.
#![allow(dead_code)]

pub mod child;

use std::time::{Duration, Instant};

use softrdma::transport::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge,
};
use softrdma::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, SendWr, WorkCompletion,
};

/// Failure bound for waits: generous, so a loaded machine never trips it.
pub const WAIT: Duration = Duration::from_secs(30);

pub const ALL: AccessFlags = AccessFlags::all();

/// The loopback device (`srxe0`).
pub fn loopback_ctx() -> Context {
    loopback_dev().open().expect("open the loopback device")
}

/// The loopback device, to open with options.
pub fn loopback_dev() -> softrdma::verbs::Device {
    softrdma::devices()
        .expect("device list")
        .into_iter()
        .find(|d| d.addr().is_loopback())
        .expect("a loopback device")
}

/// One side: context, PD, CQ, QP.
pub struct End {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
}

impl End {
    pub fn new(ctx: Context) -> End {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = rc_qp(&pd, &cq);
        End { ctx, pd, cq, qp }
    }

    pub fn mr(&self, len: usize) -> MemoryRegion {
        self.pd.alloc_mr(len, ALL).unwrap()
    }

    /// Poll until one completion arrives (bounded by [`WAIT`]).
    pub fn wait(&self) -> WorkCompletion {
        wait_cq(&self.cq)
    }

    pub fn post_send(&self, wr_id: u64, op: SendOp, sges: &[Sge]) {
        self.qp
            .post_send(&[SendWr {
                wr_id,
                op,
                sg_list: sges,
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
    }

    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) {
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: sges,
            }])
            .unwrap();
    }
}

/// An RC QP of `pd` completing into `cq` (send and receive), default caps.
pub fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCaps::default(),
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })
    .unwrap()
}

pub fn wait_cq(cq: &CompletionQueue) -> WorkCompletion {
    let t0 = Instant::now();
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        assert!(t0.elapsed() < WAIT, "no completion within {WAIT:?}");
        std::thread::yield_now();
    }
}

pub fn sge(mr: &MemoryRegion, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

/// RESET -> INIT -> RTR -> RTS towards a peer, sent from GID index 0.
pub fn connect(
    qp: &QueuePair,
    local_psn: u32,
    remote_qpn: u32,
    remote_psn: u32,
    remote_gid: [u8; 16],
) {
    connect_from(qp, 0, local_psn, remote_qpn, remote_psn, remote_gid)
}

/// RESET -> INIT -> RTR -> RTS towards a peer, sent from GID `sgid_index`.
pub fn connect_from(
    qp: &QueuePair,
    sgid_index: u8,
    local_psn: u32,
    remote_qpn: u32,
    remote_psn: u32,
    remote_gid: [u8; 16],
) {
    let to = (remote_qpn, remote_psn, remote_gid);
    connect_path(qp, sgid_index, local_psn, to, 14, Mtu::Mtu1024)
}

/// RESET -> INIT -> RTR -> RTS towards `(remote QPN, remote PSN, remote GID)`, sent from GID
/// `sgid_index`, with local ACK timeout `timeout` (4.096 µs x 2^timeout) and path MTU `mtu`.
pub fn connect_path(
    qp: &QueuePair,
    sgid_index: u8,
    local_psn: u32,
    (remote_qpn, remote_psn, remote_gid): (u32, u32, [u8; 16]),
    timeout: u8,
    mtu: Mtu,
) {
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
        rq_psn: Some(remote_psn),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(1),
        ah_attr: Some(AddressVector {
            dgid: remote_gid,
            sgid_index,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(local_psn),
        timeout: Some(timeout),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(16),
        ..Default::default()
    })
    .unwrap();
}

/// Two endpoints in this process with connected QPs.
pub fn pair() -> (End, End) {
    pair_of(loopback_ctx(), loopback_ctx())
}

/// Endpoints on `a` and `b` with connected QPs (A's PSNs start at 100, B's at 200).
pub fn pair_of(a: Context, b: Context) -> (End, End) {
    let (a, b) = (End::new(a), End::new(b));
    connect(&a.qp, 100, b.qp.qp_num(), 200, b.ctx.gid());
    connect(&b.qp, 200, a.qp.qp_num(), 100, a.ctx.gid());
    (a, b)
}
