//! The QP state machine: transitions, required/optional attributes, ranges, posting rules per
//! state, query, SQD, RESET.

use std::time::Instant;

use softrdma::transport::sim::*;
use softrdma::transport::*;

fn qp() -> RcQp {
    RcQp::new(0x33, QpCaps::default(), false)
}

fn to_init() -> QpAttr {
    QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::all()),
        ..Default::default()
    }
}

fn to_rtr() -> QpAttr {
    QpAttr {
        qp_state: Some(QpState::Rtr),
        ah_attr: Some(AddressVector {
            port_num: 1,
            dgid: [7; 16],
            ..Default::default()
        }),
        path_mtu: Some(Mtu::Mtu2048),
        dest_qp_num: Some(0x44),
        rq_psn: Some(0x123),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(12),
        ..Default::default()
    }
}

fn to_rts() -> QpAttr {
    QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0x456),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(6),
        max_rd_atomic: Some(2),
        ..Default::default()
    }
}

fn st(s: QpState) -> QpAttr {
    QpAttr {
        qp_state: Some(s),
        ..Default::default()
    }
}

fn rts_qp(now: Instant) -> RcQp {
    let mut q = qp();
    q.modify(&to_init(), now).unwrap();
    q.modify(&to_rtr(), now).unwrap();
    q.modify(&to_rts(), now).unwrap();
    q
}

fn wr(id: u64) -> SendWqe {
    send_wr(
        id,
        SendOp::Send,
        vec![Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        }],
    )
}

#[test]
fn full_bring_up_and_query() {
    let now = Instant::now();
    let q = rts_qp(now);
    assert_eq!(q.state(), QpState::Rts);
    let a = q.query();
    assert_eq!(a.qp_state, Some(QpState::Rts));
    assert_eq!(a.path_mtu, Some(Mtu::Mtu2048));
    assert_eq!(a.dest_qp_num, Some(0x44));
    assert_eq!(a.rq_psn, Some(0x123));
    assert_eq!(a.sq_psn, Some(0x456));
    assert_eq!(a.timeout, Some(14));
    assert_eq!(a.retry_cnt, Some(7));
    assert_eq!(a.rnr_retry, Some(6));
    assert_eq!(a.min_rnr_timer, Some(12));
    assert_eq!(a.max_rd_atomic, Some(2));
    assert_eq!(a.max_dest_rd_atomic, Some(4));
    assert_eq!(a.qp_access_flags, Some(AccessFlags::all()));
    assert_eq!(a.port_num, Some(1));
    assert_eq!(q.destination().unwrap().dgid, [7; 16]);
}

#[test]
fn invalid_transitions() {
    let now = Instant::now();
    let mut q = qp();
    for to in [QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe] {
        assert_eq!(
            q.modify(&st(to), now),
            Err(QpError::InvalidTransition {
                from: QpState::Reset,
                to
            })
        );
    }
    q.modify(&to_init(), now).unwrap();
    assert_eq!(
        q.modify(&to_rts(), now),
        Err(QpError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Rts
        })
    );
    assert_eq!(
        q.modify(&st(QpState::Sqd), now),
        Err(QpError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Sqd
        })
    );
    q.modify(&to_rtr(), now).unwrap();
    assert_eq!(
        q.modify(&st(QpState::Sqd), now),
        Err(QpError::InvalidTransition {
            from: QpState::Rtr,
            to: QpState::Sqd
        })
    );
    assert_eq!(
        q.modify(&to_init(), now),
        Err(QpError::InvalidTransition {
            from: QpState::Rtr,
            to: QpState::Init
        })
    );
    // RTR -> RTR is not a transition either (no qp_state means "stay").
    assert_eq!(
        q.modify(&QpAttr::default(), now),
        Err(QpError::InvalidTransition {
            from: QpState::Rtr,
            to: QpState::Rtr
        })
    );
    q.modify(&to_rts(), now).unwrap();
    assert_eq!(
        q.modify(&st(QpState::Rtr), now),
        Err(QpError::InvalidTransition {
            from: QpState::Rts,
            to: QpState::Rtr
        })
    );
    q.modify(&st(QpState::Err), now).unwrap();
    assert_eq!(
        q.modify(&st(QpState::Rts), now),
        Err(QpError::InvalidTransition {
            from: QpState::Err,
            to: QpState::Rts
        })
    );
    // Anything -> RESET, and RESET -> ERR.
    q.modify(&st(QpState::Reset), now).unwrap();
    q.modify(&st(QpState::Err), now).unwrap();
    q.modify(&st(QpState::Reset), now).unwrap();
    assert_eq!(q.state(), QpState::Reset);
}

#[test]
fn missing_and_unexpected_attributes() {
    let now = Instant::now();
    let mut q = qp();
    assert_eq!(
        q.modify(
            &QpAttr {
                port_num: None,
                ..to_init()
            },
            now
        ),
        Err(QpError::MissingAttr("port_num"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                pkey_index: None,
                ..to_init()
            },
            now
        ),
        Err(QpError::MissingAttr("pkey_index"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                qp_access_flags: None,
                ..to_init()
            },
            now
        ),
        Err(QpError::MissingAttr("qp_access_flags"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                sq_psn: Some(1),
                ..to_init()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("sq_psn"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                cur_qp_state: Some(QpState::Reset),
                ..to_init()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("cur_qp_state"))
    );
    assert_eq!(q.state(), QpState::Reset, "a failed modify changes nothing");
    q.modify(&to_init(), now).unwrap();
    // INIT -> INIT with optional attributes only.
    q.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Some(AccessFlags::REMOTE_READ),
            ..Default::default()
        },
        now,
    )
    .unwrap();
    assert_eq!(q.query().qp_access_flags, Some(AccessFlags::REMOTE_READ));
    assert_eq!(
        q.modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                path_mtu: Some(Mtu::Mtu256),
                ..Default::default()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("path_mtu"))
    );
    for (a, name) in [
        (
            QpAttr {
                ah_attr: None,
                ..to_rtr()
            },
            "ah_attr",
        ),
        (
            QpAttr {
                path_mtu: None,
                ..to_rtr()
            },
            "path_mtu",
        ),
        (
            QpAttr {
                dest_qp_num: None,
                ..to_rtr()
            },
            "dest_qp_num",
        ),
        (
            QpAttr {
                rq_psn: None,
                ..to_rtr()
            },
            "rq_psn",
        ),
        (
            QpAttr {
                max_dest_rd_atomic: None,
                ..to_rtr()
            },
            "max_dest_rd_atomic",
        ),
        (
            QpAttr {
                min_rnr_timer: None,
                ..to_rtr()
            },
            "min_rnr_timer",
        ),
    ] {
        assert_eq!(q.modify(&a, now), Err(QpError::MissingAttr(name)));
    }
    assert_eq!(
        q.modify(
            &QpAttr {
                qkey: Some(1),
                ..to_rtr()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("qkey"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                timeout: Some(1),
                ..to_rtr()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("timeout"))
    );
    q.modify(&to_rtr(), now).unwrap();
    for (a, name) in [
        (
            QpAttr {
                sq_psn: None,
                ..to_rts()
            },
            "sq_psn",
        ),
        (
            QpAttr {
                timeout: None,
                ..to_rts()
            },
            "timeout",
        ),
        (
            QpAttr {
                retry_cnt: None,
                ..to_rts()
            },
            "retry_cnt",
        ),
        (
            QpAttr {
                rnr_retry: None,
                ..to_rts()
            },
            "rnr_retry",
        ),
        (
            QpAttr {
                max_rd_atomic: None,
                ..to_rts()
            },
            "max_rd_atomic",
        ),
    ] {
        assert_eq!(q.modify(&a, now), Err(QpError::MissingAttr(name)));
    }
    assert_eq!(
        q.modify(
            &QpAttr {
                rq_psn: Some(1),
                ..to_rts()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("rq_psn"))
    );
    // RTR -> RTS accepts the optional cur_qp_state and min_rnr_timer.
    q.modify(
        &QpAttr {
            cur_qp_state: Some(QpState::Rtr),
            min_rnr_timer: Some(3),
            ..to_rts()
        },
        now,
    )
    .unwrap();
    assert_eq!(q.query().min_rnr_timer, Some(3));
    // RTS -> RTS: only the optional few.
    assert_eq!(
        q.modify(
            &QpAttr {
                timeout: Some(3),
                ..Default::default()
            },
            now
        ),
        Err(QpError::UnexpectedAttr("timeout"))
    );
    q.modify(
        &QpAttr {
            min_rnr_timer: Some(5),
            ..Default::default()
        },
        now,
    )
    .unwrap();
    // Into ERR nothing else is allowed.
    assert_eq!(
        q.modify(
            &QpAttr {
                timeout: Some(3),
                ..st(QpState::Err)
            },
            now
        ),
        Err(QpError::UnexpectedAttr("timeout"))
    );
}

#[test]
fn attribute_ranges() {
    let now = Instant::now();
    let mut q = qp();
    assert_eq!(
        q.modify(
            &QpAttr {
                port_num: Some(2),
                ..to_init()
            },
            now
        ),
        Err(QpError::BadAttr("port_num"))
    );
    q.modify(&to_init(), now).unwrap();
    assert_eq!(
        q.modify(
            &QpAttr {
                min_rnr_timer: Some(32),
                ..to_rtr()
            },
            now
        ),
        Err(QpError::BadAttr("min_rnr_timer"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                dest_qp_num: Some(1 << 24),
                ..to_rtr()
            },
            now
        ),
        Err(QpError::BadAttr("dest_qp_num"))
    );
    q.modify(&to_rtr(), now).unwrap();
    assert_eq!(
        q.modify(
            &QpAttr {
                retry_cnt: Some(8),
                ..to_rts()
            },
            now
        ),
        Err(QpError::BadAttr("retry_cnt"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                rnr_retry: Some(8),
                ..to_rts()
            },
            now
        ),
        Err(QpError::BadAttr("rnr_retry"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                timeout: Some(32),
                ..to_rts()
            },
            now
        ),
        Err(QpError::BadAttr("timeout"))
    );
    assert_eq!(
        q.modify(
            &QpAttr {
                max_rd_atomic: Some(200),
                ..to_rts()
            },
            now
        ),
        Err(QpError::BadAttr("max_rd_atomic"))
    );
    assert_eq!(q.state(), QpState::Rtr);
    q.modify(
        &QpAttr {
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            timeout: Some(31),
            ..to_rts()
        },
        now,
    )
    .unwrap();
}

#[test]
fn current_state_mismatch() {
    let now = Instant::now();
    let mut q = rts_qp(now);
    assert_eq!(
        q.modify(
            &QpAttr {
                cur_qp_state: Some(QpState::Sqd),
                ..Default::default()
            },
            now
        ),
        Err(QpError::WrongCurrentState {
            expected: QpState::Sqd,
            actual: QpState::Rts
        })
    );
    q.modify(
        &QpAttr {
            cur_qp_state: Some(QpState::Rts),
            ..Default::default()
        },
        now,
    )
    .unwrap();
}

#[test]
fn posting_depends_on_state() {
    let now = Instant::now();
    let mut q = qp();
    let rwr = || recv_wr(1, vec![]);
    assert_eq!(
        q.post_send(wr(1)),
        Err(PostError::InvalidState(QpState::Reset))
    );
    assert_eq!(
        q.post_recv(rwr()),
        Err(PostError::InvalidState(QpState::Reset))
    );
    q.modify(&to_init(), now).unwrap();
    assert_eq!(
        q.post_send(wr(1)),
        Err(PostError::InvalidState(QpState::Init))
    );
    q.post_recv(rwr()).unwrap();
    q.modify(&to_rtr(), now).unwrap();
    assert_eq!(
        q.post_send(wr(1)),
        Err(PostError::InvalidState(QpState::Rtr))
    );
    q.post_recv(rwr()).unwrap();
    q.modify(&to_rts(), now).unwrap();
    q.post_send(wr(1)).unwrap();
    q.post_recv(rwr()).unwrap();
    q.modify(&st(QpState::Sqd), now).unwrap();
    q.post_send(wr(2)).unwrap();
    q.post_recv(rwr()).unwrap();
    // The receives posted in INIT and RTR survive into RTS and are flushed on ERR.
    q.modify(&st(QpState::Err), now).unwrap();
    let mut n = (0, 0);
    while let Some(c) = q.poll_completion() {
        assert_eq!(c.status, WcStatus::WrFlushErr);
        match c.side {
            CqSide::Send => n.0 += 1,
            CqSide::Recv => n.1 += 1,
        }
    }
    assert_eq!(n, (2, 4));
}

#[test]
fn post_time_checks() {
    let now = Instant::now();
    let caps = QpCaps {
        max_send_wr: 3,
        max_recv_wr: 2,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 16,
    };
    let mut q = RcQp::new(1, caps, false);
    q.modify(&to_init(), now).unwrap();
    q.modify(&to_rtr(), now).unwrap();
    q.modify(&to_rts(), now).unwrap();
    let sge = Sge {
        addr: 0,
        length: 8,
        lkey: 1,
    };
    assert_eq!(
        q.post_send(send_wr(1, SendOp::Send, vec![sge; 3])),
        Err(PostError::TooManySge { got: 3, max: 2 })
    );
    assert_eq!(
        q.post_send(send_wr(
            1,
            SendOp::Send,
            vec![
                Sge {
                    length: 1 << 30,
                    ..sge
                },
                Sge {
                    length: (1 << 30) + 1,
                    ..sge
                }
            ]
        )),
        // max_msg_sz (2^31) itself is allowed: tests/verbs_limits.rs.
        Err(PostError::MessageTooLong((1 << 31) + 1))
    );
    assert_eq!(
        q.post_send(send_wr(
            1,
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: 0,
                add: 1
            },
            vec![Sge { length: 4, ..sge }]
        )),
        Err(PostError::BadAtomicLength)
    );
    assert_eq!(
        q.post_send(send_wr(
            1,
            SendOp::CompareSwap {
                remote_addr: 0,
                rkey: 0,
                compare: 0,
                swap: 1
            },
            vec![]
        )),
        Err(PostError::BadAtomicLength)
    );
    let mut w = send_wr(1, SendOp::Send, vec![]);
    w.flags.insert(SendFlags::INLINE);
    w.inline_data = vec![0; 17];
    assert_eq!(
        q.post_send(w),
        Err(PostError::InlineTooLong { got: 17, max: 16 })
    );
    assert_eq!(
        q.post_recv(recv_wr(1, vec![sge; 2])),
        Err(PostError::TooManySge { got: 2, max: 1 })
    );
    for i in 0..3 {
        q.post_send(send_wr(i, SendOp::Send, vec![sge])).unwrap();
    }
    assert_eq!(
        q.post_send(send_wr(9, SendOp::Send, vec![sge])),
        Err(PostError::QueueFull)
    );
    q.post_recv(recv_wr(1, vec![sge])).unwrap();
    q.post_recv(recv_wr(2, vec![sge])).unwrap();
    assert_eq!(
        q.post_recv(recv_wr(3, vec![sge])),
        Err(PostError::QueueFull)
    );
    // Flushed completions still hold their slot until polled.
    q.modify(&st(QpState::Err), now).unwrap();
    assert_eq!(
        q.post_send(send_wr(9, SendOp::Send, vec![sge])),
        Err(PostError::QueueFull)
    );
    while q.poll_completion().is_some() {}
    q.post_send(send_wr(9, SendOp::Send, vec![sge])).unwrap();
}

#[test]
fn send_queue_depth_counts_unpolled_completions() {
    let caps = QpCaps {
        max_send_wr: 4,
        ..QpCaps::default()
    };
    let mut s = Sim::new(3, LinkConfig::default(), caps);
    s.connect(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, AccessFlags::all());
    let rmr = s.ends[1].mem.register(64, AccessFlags::all());
    let w = |i| {
        send_wr(
            i,
            SendOp::RdmaWrite {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 8)],
        )
    };
    for i in 0..4 {
        s.ends[0].qp.post_send(w(i)).unwrap();
    }
    assert_eq!(s.ends[0].qp.post_send(w(5)), Err(PostError::QueueFull));
    // Run without polling the CQ: the completions still occupy the queue.
    let mut buf = vec![0u8; 8192];
    for _ in 0..100 {
        for i in 0..2 {
            let e = &mut s.ends[i];
            if let Some(n) = e.qp.poll_transmit(s.now, &e.mem, &mut buf) {
                let pkt = softrdma::wire::Packet::parse(&buf[..n]).unwrap();
                let peer = &mut s.ends[1 - i];
                peer.qp.handle_packet(s.now, &pkt, &peer.mem);
            }
        }
    }
    assert_eq!(s.ends[0].qp.post_send(w(5)), Err(PostError::QueueFull));
    assert!(s.ends[0].qp.poll_completion().is_some());
    s.ends[0].qp.post_send(w(5)).unwrap();
}

#[test]
fn sqd_holds_new_work_until_rts() {
    let mut s = Sim::new(3, LinkConfig::default(), QpCaps::default());
    s.connect(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, AccessFlags::all());
    let rmr = s.ends[1].mem.register(64, AccessFlags::all());
    s.ends[0].qp.modify(&st(QpState::Sqd), s.now).unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 8)],
        ))
        .unwrap();
    assert!(s.run_idle(1000));
    assert_eq!(s.link.stats.sent, 0);
    assert!(s.ends[0].completions.is_empty());
    // SQD -> SQD may change timers; SQD -> RTS resumes.
    s.ends[0]
        .qp
        .modify(
            &QpAttr {
                timeout: Some(9),
                retry_cnt: Some(3),
                ..Default::default()
            },
            s.now,
        )
        .unwrap();
    assert_eq!(s.ends[0].qp.query().timeout, Some(9));
    s.ends[0].qp.modify(&st(QpState::Rts), s.now).unwrap();
    assert!(s.run_idle(1000));
    assert_eq!(s.ends[0].take(CqSide::Send).len(), 1);
}

#[test]
fn reset_clears_and_reconnect_works() {
    let mut s = Sim::new(3, LinkConfig::default(), QpCaps::default());
    s.connect(ConnectOpts::default());
    s.link.blackhole = [true, true];
    let lmr = s.ends[0].mem.register(64, AccessFlags::all());
    let rmr = s.ends[1].mem.register(64, AccessFlags::all());
    s.ends[0]
        .qp
        .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 8)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_recv(recv_wr(2, vec![lmr.sge(0, 8)]))
        .unwrap();
    s.step();
    for i in 0..2 {
        s.ends[i].qp.modify(&st(QpState::Reset), s.now).unwrap();
        assert_eq!(s.ends[i].qp.poll_timeout(), None);
    }
    // RESET drops queued work without completions.
    assert_eq!(s.ends[0].qp.poll_completion(), None);
    s.link.blackhole = [false, false];
    s.connect(ConnectOpts {
        psn: [5, 6],
        ..Default::default()
    });
    s.ends[0]
        .qp
        .post_send(send_wr(
            3,
            SendOp::RdmaWrite {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 8)],
        ))
        .unwrap();
    assert!(s.run_until(10_000, |s| !s.ends[0].completions.is_empty()));
    let c = s.ends[0].take(CqSide::Send);
    assert_eq!((c[0].wr_id, c[0].status), (3, WcStatus::Success));
}
