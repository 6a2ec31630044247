//! Shared receive queues through the Verbs API over loopback: several RC QPs (and UD QPs) on
//! one SRQ, completions naming the receiving QP, the limit event, the last-WQE event, RNR on an
//! empty SRQ, and the errors of create / post / modify / destroy.
//!
//! Nothing here depends on timing: every wait is for a completion or a counter, bounded only to
//! fail instead of hang.
mod verbs_util;

use std::time::Instant;

use softrdma::transport::{
    AccessFlags, AddressVector, Mtu, PostError, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge,
    WcOpcode, WcStatus,
};
use softrdma::verbs::{
    AhAttr, AsyncEvent, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr,
    QpType, QueuePair, RecvWr, SendWr, SharedReceiveQueue, SrqAttr, SrqInitAttr, UdSendWr,
    VerbsError, GRH_LEN,
};
use verbs_util::{loopback_ctx, wait_cq, ALL, WAIT};

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at `remote_gid`, with `rnr_retry`.
fn connect(qp: &QueuePair, remote_qpn: u32, remote_gid: [u8; 16], rnr_retry: u8) {
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
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(remote_qpn),
        rq_psn: Some(0x300),
        max_dest_rd_atomic: Some(1),
        // 1.28 ms between RNR retries: no packet storm while an SRQ stays empty.
        min_rnr_timer: Some(14),
        ah_attr: Some(AddressVector {
            dgid: remote_gid,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0x300),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(rnr_retry),
        max_rd_atomic: Some(1),
        ..Default::default()
    })
    .unwrap();
}

fn create_qp(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    qp_type: QpType,
    srq: Option<&SharedReceiveQueue>,
) -> softrdma::verbs::Result<QueuePair> {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCaps::default(),
        qp_type,
        sq_sig_all: false,
        srq,
    })
}

fn sge(mr: &MemoryRegion, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

fn srq_attr(max_wr: u32, max_sge: u32) -> SrqInitAttr {
    SrqInitAttr {
        max_wr,
        max_sge,
        srq_limit: 0,
    }
}

/// Message bytes that say who sent it: sender `i`, message `j`.
fn payload(i: usize, j: usize) -> Vec<u8> {
    (0..MSG)
        .map(|k| (i as u8) << 6 | (j as u8) << 4 | (k as u8 & 0xf))
        .collect()
}

const MSG: usize = 48;
/// Bytes per receive buffer.
const SLOT: usize = 64;

/// Senders (one context, their own RC QPs) connected one to one to receiver QPs that share an
/// SRQ (another context).
struct Fan {
    sctx: Context,
    _spd: ProtectionDomain,
    scq: CompletionQueue,
    sqps: Vec<QueuePair>,
    smr: MemoryRegion,
    rctx: Context,
    rpd: ProtectionDomain,
    rcq: CompletionQueue,
    rqps: Vec<QueuePair>,
    rmr: MemoryRegion,
    // Dropped after the QPs that use it (fields drop in order).
    srq: SharedReceiveQueue,
}

impl Fan {
    fn new(n: usize, srq_wr: u32, rnr_retry: u8) -> Fan {
        let sctx = loopback_ctx();
        let rctx = loopback_ctx();
        let spd = sctx.alloc_pd().unwrap();
        let rpd = rctx.alloc_pd().unwrap();
        let scq = sctx.create_cq(1024, None).unwrap();
        let rcq = rctx.create_cq(1024, None).unwrap();
        let srq = rpd.create_srq(srq_attr(srq_wr, 1)).unwrap();
        let mut sqps = Vec::new();
        let mut rqps = Vec::new();
        for _ in 0..n {
            sqps.push(create_qp(&spd, &scq, QpType::Rc, None).unwrap());
            rqps.push(create_qp(&rpd, &rcq, QpType::Rc, Some(&srq)).unwrap());
        }
        for (s, r) in sqps.iter().zip(&rqps) {
            connect(s, r.qp_num(), rctx.gid(), rnr_retry);
            connect(r, s.qp_num(), sctx.gid(), rnr_retry);
        }
        let smr = spd.alloc_mr(n * 4 * SLOT, ALL).unwrap();
        let rmr = rpd.alloc_mr(srq_wr as usize * SLOT, ALL).unwrap();
        Fan {
            sctx,
            _spd: spd,
            scq,
            sqps,
            smr,
            rctx,
            rpd,
            rcq,
            rqps,
            rmr,
            srq,
        }
    }

    /// Post receive WQE `wr_id` into buffer slot `wr_id`.
    fn post_srq(&self, wr_id: u64) {
        self.srq
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: &[sge(&self.rmr, wr_id as usize * SLOT, SLOT)],
            }])
            .unwrap();
    }

    /// Sender `i` sends message `j` (signaled).
    fn send(&self, i: usize, j: usize) {
        let off = (i * 4 + j) * SLOT;
        self.smr.lock().unwrap()[off..off + MSG].copy_from_slice(&payload(i, j));
        self.sqps[i]
            .post_send(&[SendWr {
                wr_id: (i * 100 + j) as u64,
                op: SendOp::Send,
                sg_list: &[sge(&self.smr, off, MSG)],
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
    }
}

#[test]
fn qps_sharing_an_srq_receive_and_each_completion_names_its_qp() {
    const N: usize = 6;
    const PER: usize = 3;
    let f = Fan::new(N, (N * PER) as u32, 7);
    for k in 0..(N * PER) as u64 {
        f.post_srq(k);
    }
    for j in 0..PER {
        for i in 0..N {
            f.send(i, j);
        }
    }
    let mut per_qp = vec![Vec::new(); N];
    let mut wr_ids = Vec::new();
    for _ in 0..N * PER {
        let wc = wait_cq(&f.rcq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::Recv, MSG as u32));
        let i = f
            .rqps
            .iter()
            .position(|q| q.qp_num() == wc.qp_num)
            .unwrap_or_else(|| panic!("qp_num {:#x} is none of the SRQ's QPs", wc.qp_num));
        assert_eq!(wc.src_qp, f.sqps[i].qp_num(), "the peer of QP {i}");
        // The buffer of the WQE it took holds a message of the sender connected to that QP.
        let off = wc.wr_id as usize * SLOT;
        let data = f.rmr.lock().unwrap()[off..off + MSG].to_vec();
        let j = (data[0] >> 4 & 3) as usize;
        assert_eq!(data, payload(i, j), "WQE {} went to QP {i}", wc.wr_id);
        per_qp[i].push(j);
        wr_ids.push(wc.wr_id);
    }
    for (i, js) in per_qp.iter().enumerate() {
        assert_eq!(
            js,
            &(0..PER).collect::<Vec<_>>(),
            "QP {i}: its messages in order"
        );
    }
    wr_ids.sort_unstable();
    assert_eq!(
        wr_ids,
        (0..(N * PER) as u64).collect::<Vec<_>>(),
        "each WQE once"
    );
    assert_eq!(f.srq.posted().unwrap(), 0);
    for _ in 0..N * PER {
        assert_eq!(wait_cq(&f.scq).status, WcStatus::Success);
    }
    assert_eq!(f.rctx.poll_async_event(), None);
}

#[test]
fn srq_limit_event_fires_once_when_armed_then_disarms() {
    let f = Fan::new(2, 8, 7);
    for k in 0..5 {
        f.post_srq(k);
    }
    f.srq.modify(None, Some(3)).unwrap();
    assert_eq!(
        f.srq.query().unwrap(),
        SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 3
        }
    );
    // The engine raises the event as it takes the WQE, before the completion reaches the CQ:
    // once the receive completion is seen, the event (if any) is queued.
    let mut events = Vec::new();
    for j in 0..4 {
        f.send(j % 2, j / 2);
        assert_eq!(wait_cq(&f.rcq).status, WcStatus::Success);
        events.push(f.rctx.poll_async_event());
    }
    let fired = Some(AsyncEvent::SrqLimitReached { srq: f.srq.id() });
    // 5 posted: the takes leave 4, 3, 2 (below 3: the event), 1.
    assert_eq!(events, vec![None, None, fired, None]);
    assert_eq!(f.srq.query().unwrap().srq_limit, 0, "disarmed");
    // Armed again above the count: the next take fires it.
    f.srq.modify(None, Some(5)).unwrap();
    f.send(0, 2);
    assert_eq!(wait_cq(&f.rcq).status, WcStatus::Success);
    assert_eq!(f.rctx.poll_async_event(), fired);
    assert_eq!(f.rctx.poll_async_event(), None);
}

#[test]
fn post_recv_on_a_qp_with_an_srq_fails() {
    let f = Fan::new(1, 4, 7);
    let qp = &f.rqps[0];
    assert!(qp.has_srq());
    assert_eq!((qp.caps().max_recv_wr, qp.caps().max_recv_sge), (0, 0));
    let e = qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&f.rmr, 0, 8)],
        }])
        .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EINVAL);
    // A UD QP on the SRQ too.
    let ud = create_qp(&f.rpd, &f.rcq, QpType::Ud, Some(&f.srq)).unwrap();
    let e = ud
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[],
        }])
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // The QPs without one still post.
    assert!(!f.sqps[0].has_srq());
}

#[test]
fn srq_must_come_from_the_qps_protection_domain_and_context() {
    let f = Fan::new(1, 4, 7);
    let other_pd = f.rctx.alloc_pd().unwrap();
    let e = create_qp(&other_pd, &f.rcq, QpType::Rc, Some(&f.srq)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let spd = f.sctx.alloc_pd().unwrap();
    let e = create_qp(&spd, &f.scq, QpType::Rc, Some(&f.srq)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn destroy_while_a_qp_uses_the_srq_is_busy() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let srq = pd.create_srq(srq_attr(4, 1)).unwrap();
    let a = create_qp(&pd, &cq, QpType::Rc, Some(&srq)).unwrap();
    let b = create_qp(&pd, &cq, QpType::Ud, Some(&srq)).unwrap();
    let (e, srq) = srq.destroy().unwrap_err();
    assert!(matches!(e, VerbsError::Busy(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EBUSY);
    drop(a);
    let (e, srq) = srq.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "one QP still uses it");
    drop(b);
    srq.destroy().unwrap();
    // An SRQ dropped while QPs use it lives on until they go: they keep working.
    let srq = pd.create_srq(srq_attr(4, 1)).unwrap();
    let c = create_qp(&pd, &cq, QpType::Rc, Some(&srq)).unwrap();
    drop(srq);
    c.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn rnr_while_the_srq_is_empty_then_success_once_a_wqe_is_posted() {
    // rnr_retry 0: the first RNR NAK fails the send, which shows the empty SRQ answered RNR.
    let f = Fan::new(1, 4, 0);
    f.send(0, 0);
    let wc = wait_cq(&f.scq);
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr, "{wc:?}");
    assert!(f.rcq.poll_one().unwrap().is_none(), "nothing received");

    // rnr_retry 7 (infinite): the sender retries until a WQE is posted.
    let f = Fan::new(1, 4, 7);
    let before = f.rctx.stats().unwrap().tx_packets;
    f.send(0, 0);
    // The receiver sends nothing but RNR NAKs while its SRQ is empty: wait for one.
    let t0 = Instant::now();
    while f.rctx.stats().unwrap().tx_packets == before {
        assert!(t0.elapsed() < WAIT, "no RNR NAK within {WAIT:?}");
        std::thread::yield_now();
    }
    assert!(f.rcq.poll_one().unwrap().is_none(), "nothing received yet");
    assert!(
        f.scq.poll_one().unwrap().is_none(),
        "the send is still retrying"
    );
    f.post_srq(3);
    let wc = wait_cq(&f.rcq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        (3, WcStatus::Success, f.rqps[0].qp_num())
    );
    assert_eq!(
        f.rmr.lock().unwrap()[3 * SLOT..3 * SLOT + MSG],
        payload(0, 0)[..]
    );
    assert_eq!(wait_cq(&f.scq).status, WcStatus::Success);
}

#[test]
fn max_wr_and_max_sge_limits_are_enforced() {
    let ctx = loopback_ctx();
    let dev = ctx.query_device();
    assert_eq!(
        (dev.max_srq, dev.max_srq_wr, dev.max_srq_sge),
        (0x1000, 0x4000, 27),
        "as rdma_rxe reports them"
    );
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let einval = |r: softrdma::verbs::Result<SharedReceiveQueue>| {
        assert_eq!(r.unwrap_err().errno(), libc::EINVAL);
    };
    einval(pd.create_srq(srq_attr(0, 1)));
    einval(pd.create_srq(srq_attr(dev.max_srq_wr + 1, 1)));
    einval(pd.create_srq(srq_attr(4, dev.max_srq_sge + 1)));
    einval(pd.create_srq(SrqInitAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 5,
    }));
    // The largest is fine; max_sge 0 is granted as 1.
    let big = pd
        .create_srq(srq_attr(dev.max_srq_wr, dev.max_srq_sge))
        .unwrap();
    assert_eq!(
        big.query().unwrap(),
        SrqAttr {
            max_wr: dev.max_srq_wr,
            max_sge: dev.max_srq_sge,
            srq_limit: 0
        }
    );
    assert_eq!(
        pd.create_srq(srq_attr(1, 0))
            .unwrap()
            .query()
            .unwrap()
            .max_sge,
        1
    );

    let srq = pd.create_srq(srq_attr(2, 2)).unwrap();
    let one = [sge(&mr, 0, 8)];
    let three = [sge(&mr, 0, 8), sge(&mr, 8, 8), sge(&mr, 16, 8)];
    // Too many SGEs: EINVAL at that WR; the ones before it are posted.
    let e = srq
        .post_recv(&[
            RecvWr {
                wr_id: 1,
                sg_list: &one,
            },
            RecvWr {
                wr_id: 2,
                sg_list: &three,
            },
        ])
        .unwrap_err();
    assert!(matches!(
        e,
        VerbsError::Post {
            index: 1,
            error: PostError::TooManySge { got: 3, max: 2 }
        }
    ));
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(srq.posted().unwrap(), 1);
    // Full: ENOMEM at the WR that does not fit.
    let e = srq
        .post_recv(&[
            RecvWr {
                wr_id: 3,
                sg_list: &one,
            },
            RecvWr {
                wr_id: 4,
                sg_list: &one,
            },
        ])
        .unwrap_err();
    assert!(matches!(
        e,
        VerbsError::Post {
            index: 1,
            error: PostError::QueueFull
        }
    ));
    assert_eq!(e.errno(), libc::ENOMEM);
    assert_eq!(e.bad_wr(), Some(1));
    assert_eq!(srq.posted().unwrap(), 2);

    // IBV_SRQ_MAX_WR resizes, as rxe does: not below the WQEs posted, not above the device.
    assert_eq!(srq.modify(Some(1), None).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(srq.modify(Some(0), None).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        srq.modify(Some(dev.max_srq_wr + 1), None)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    srq.modify(Some(3), None).unwrap();
    assert_eq!(srq.query().unwrap().max_wr, 3);
    srq.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &one,
    }])
    .unwrap();
    assert_eq!(srq.posted().unwrap(), 3);
    // IBV_SRQ_LIMIT: at most max_wr; a bad modify changes nothing.
    assert_eq!(srq.modify(None, Some(4)).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        srq.modify(Some(8), Some(9)).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        srq.query().unwrap(),
        SrqAttr {
            max_wr: 3,
            max_sge: 2,
            srq_limit: 0
        }
    );
    srq.modify(Some(8), Some(8)).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 8);
    // Not below an armed limit.
    assert_eq!(srq.modify(Some(7), None).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn a_qp_on_an_srq_entering_error_raises_last_wqe_reached_and_flushes_nothing_of_the_srq() {
    let f = Fan::new(2, 8, 7);
    for k in 0..4 {
        f.post_srq(k);
    }
    let qp = &f.rqps[0];
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        f.rctx.poll_async_event(),
        Some(AsyncEvent::QpLastWqeReached {
            qp_num: qp.qp_num()
        })
    );
    // Flushing happens within modify: nothing of the SRQ's was completed.
    assert!(f.rcq.poll_one().unwrap().is_none());
    assert_eq!(f.srq.posted().unwrap(), 4);
    // Once per entry into ERR.
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(f.rctx.poll_async_event(), None);
    // The other QP on the SRQ still receives.
    f.send(1, 0);
    let wc = wait_cq(&f.rcq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        (0, WcStatus::Success, f.rqps[1].qp_num())
    );
    // A transport error (an RDMA WRITE with a bad rkey) moves the other QP to ERR: QP_FATAL,
    // then LAST_WQE_REACHED.
    f.sqps[1]
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::RdmaWrite {
                remote_addr: f.rmr.addr(),
                rkey: 0xdead_beef,
            },
            sg_list: &[sge(&f.smr, 0, 8)],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    assert_eq!(wait_cq(&f.scq).status, WcStatus::Success, "the first SEND");
    assert_eq!(wait_cq(&f.scq).status, WcStatus::RemAccessErr);
    let t0 = Instant::now();
    let mut events = Vec::new();
    while events.len() < 2 {
        assert!(t0.elapsed() < WAIT, "events so far: {events:?}");
        match f.rctx.poll_async_event() {
            Some(e) => events.push(e),
            None => std::thread::yield_now(),
        }
    }
    let qpn = f.rqps[1].qp_num();
    assert_eq!(
        events,
        vec![
            AsyncEvent::QpFatal { qp_num: qpn },
            AsyncEvent::QpLastWqeReached { qp_num: qpn }
        ]
    );
    assert_eq!(f.srq.posted().unwrap(), 3, "still the SRQ's");
}

#[test]
fn ud_qps_on_one_srq_receive_and_completions_name_the_qp() {
    let sctx = loopback_ctx();
    let rctx = loopback_ctx();
    let spd = sctx.alloc_pd().unwrap();
    let rpd = rctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(64, None).unwrap();
    let rcq = rctx.create_cq(64, None).unwrap();
    let srq = rpd.create_srq(srq_attr(8, 1)).unwrap();
    let sender = create_qp(&spd, &scq, QpType::Ud, None).unwrap();
    let rqps = [
        create_qp(&rpd, &rcq, QpType::Ud, Some(&srq)).unwrap(),
        create_qp(&rpd, &rcq, QpType::Ud, Some(&srq)).unwrap(),
    ];
    const QKEY: u32 = 0x2222;
    for qp in rqps.iter().chain([&sender]) {
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qkey: Some(QKEY),
            ..Default::default()
        })
        .unwrap();
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        })
        .unwrap();
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(1),
            ..Default::default()
        })
        .unwrap();
    }
    let smr = spd.alloc_mr(256, ALL).unwrap();
    let rmr = rpd.alloc_mr(4 * 256, ALL).unwrap();
    for k in 0..4u64 {
        srq.post_recv(&[RecvWr {
            wr_id: k,
            sg_list: &[sge(&rmr, k as usize * 256, 256)],
        }])
        .unwrap();
    }
    let ah = spd
        .create_ah(&AhAttr {
            dgid: rctx.gid(),
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    for (n, i) in [1usize, 0, 1].into_iter().enumerate() {
        smr.lock().unwrap()[..32].fill(0x40 + n as u8);
        sender
            .post_send_ud(&[UdSendWr {
                wr_id: n as u64,
                op: SendOp::SendWithImm { imm: i as u32 },
                sg_list: &[sge(&smr, 0, 32)],
                flags: SendFlags::SIGNALED,
                ah: &ah,
                remote_qpn: rqps[i].qp_num(),
                remote_qkey: QKEY,
            }])
            .unwrap();
        assert_eq!(wait_cq(&scq).status, WcStatus::Success);
        // Datagrams are not ordered across QPs: take each before sending the next.
        let wc = wait_cq(&rcq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num, wc.src_qp, wc.imm_data),
            (
                n as u64,
                WcStatus::Success,
                rqps[i].qp_num(),
                sender.qp_num(),
                Some(i as u32)
            )
        );
        assert_eq!(wc.byte_len as usize, GRH_LEN + 32);
        let off = n * 256 + GRH_LEN;
        assert_eq!(rmr.lock().unwrap()[off..off + 32], [0x40 + n as u8; 32]);
    }
    assert_eq!(srq.posted().unwrap(), 1);
}
