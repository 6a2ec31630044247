//! Queue pair creation limits and the state machine as the verbs see it.
mod verbs_util;

use softrdma::transport::{
    AccessFlags, PostError, QpAttr, QpCaps, QpError, QpState, SendFlags, SendOp, WcStatus,
};
use softrdma::verbs::{QpInitAttr, QpType, RecvWr, SendWr, VerbsError};
use verbs_util::*;

#[test]
fn qpns_start_at_0x11_and_caps_are_checked() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let dev = ctx.query_device();
    let mk = |cap: QpCaps| {
        pd.create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
    };
    let q1 = mk(QpCaps::default()).unwrap();
    let q2 = mk(QpCaps::default()).unwrap();
    assert!(q1.qp_num() >= 0x11 && q2.qp_num() >= 0x11);
    assert_ne!(q1.qp_num(), q2.qp_num());
    assert!(q1.caps().max_inline_data >= QpCaps::default().max_inline_data);
    for bad in [
        QpCaps {
            max_send_wr: dev.max_qp_wr + 1,
            ..QpCaps::default()
        },
        QpCaps {
            max_recv_wr: dev.max_qp_wr + 1,
            ..QpCaps::default()
        },
        QpCaps {
            max_send_sge: dev.max_sge + 1,
            ..QpCaps::default()
        },
        QpCaps {
            max_recv_sge: dev.max_sge + 1,
            ..QpCaps::default()
        },
        QpCaps {
            max_inline_data: 1 << 20,
            ..QpCaps::default()
        },
    ] {
        let e = mk(bad).unwrap_err();
        assert!(matches!(e, VerbsError::InvalidArgument(_)), "{bad:?}: {e}");
    }
}

#[test]
fn state_machine_errors() {
    let ctx = loopback_ctx();
    let e = End::new(ctx);
    assert_eq!(e.qp.state().unwrap(), QpState::Reset);
    // RESET -> RTR is no transition.
    let err =
        e.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(err, VerbsError::Qp(QpError::InvalidTransition { .. })),
        "{err}"
    );
    assert_eq!(err.errno(), libc::EINVAL);
    // RESET -> INIT without its required attributes.
    let err =
        e.qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(err, VerbsError::Qp(QpError::MissingAttr(_))),
        "{err}"
    );
    // An attribute the transition does not take.
    let err =
        e.qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(AccessFlags::NONE),
            sq_psn: Some(1),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(err, VerbsError::Qp(QpError::UnexpectedAttr(_))),
        "{err}"
    );
    // Wrong current state.
    let err =
        e.qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            cur_qp_state: Some(QpState::Rts),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, VerbsError::Qp(_)), "{err}");
    assert_eq!(
        e.qp.state().unwrap(),
        QpState::Reset,
        "failed modifies change nothing"
    );

    // Posting in RESET fails at WR 0 (bad_wr).
    let mr = e.mr(64);
    let sg = [sge(&mr, 0, 8)];
    let err =
        e.qp.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &sg,
            flags: SendFlags::default(),
        }])
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Post {
                index: 0,
                error: PostError::InvalidState(QpState::Reset)
            }
        ),
        "{err}"
    );
    assert_eq!(err.bad_wr(), Some(0));
    let err =
        e.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &sg,
        }])
        .unwrap_err();
    assert_eq!(err.bad_wr(), Some(0));

    // INIT accepts receives but not sends.
    e.qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(e.qp.state().unwrap(), QpState::Init);
    e.qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &sg,
    }])
    .unwrap();
    assert!(e
        .qp
        .post_send(&[SendWr {
            wr_id: 3,
            op: SendOp::Send,
            sg_list: &sg,
            flags: SendFlags::default()
        }])
        .is_err());
    let q = e.qp.query().unwrap();
    assert_eq!(q.qp_state, Some(QpState::Init));
    assert_eq!(q.qp_access_flags, Some(AccessFlags::REMOTE_WRITE));

    // To ERR: the posted receive is flushed.
    e.qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    let wc = e.wait();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    // ERR -> RESET -> INIT again.
    e.qp.modify(&QpAttr {
        qp_state: Some(QpState::Reset),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(e.qp.state().unwrap(), QpState::Reset);
    // A verb-made change to ERR is no async event.
    assert_eq!(e.ctx.poll_async_event(), None);
}

#[test]
fn a_list_of_wrs_stops_at_the_first_bad_one() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    let one = [sge(&ma, 0, 8)];
    let three = [
        sge(&ma, 0, 8),
        sge(&ma, 8, 8),
        sge(&ma, 16, 8),
        sge(&ma, 24, 8),
        sge(&ma, 32, 8),
    ]; // more than max_send_sge (4)
    let write = SendOp::RdmaWrite {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    let sig = SendFlags::SIGNALED;
    let err =
        a.qp.post_send(&[
            SendWr {
                wr_id: 1,
                op: write,
                sg_list: &one,
                flags: sig,
            },
            SendWr {
                wr_id: 2,
                op: write,
                sg_list: &three,
                flags: sig,
            },
            SendWr {
                wr_id: 3,
                op: write,
                sg_list: &one,
                flags: sig,
            },
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Post {
                index: 1,
                error: PostError::TooManySge { .. }
            }
        ),
        "{err}"
    );
    // The first was posted and completes; the third was not.
    assert_eq!(a.wait().wr_id, 1);
    // Inline data is read at post time: a bad lkey is a bad WR.
    let bad = [softrdma::transport::Sge {
        addr: ma.addr(),
        length: 8,
        lkey: ma.lkey() ^ 1,
    }];
    let inl = SendFlags::SIGNALED | SendFlags::INLINE;
    let err =
        a.qp.post_send(&[
            SendWr {
                wr_id: 4,
                op: SendOp::Send,
                sg_list: &one,
                flags: inl,
            },
            SendWr {
                wr_id: 5,
                op: SendOp::Send,
                sg_list: &bad,
                flags: inl,
            },
        ])
        .unwrap_err();
    assert!(
        matches!(err, VerbsError::PostInline { index: 1, .. }),
        "{err}"
    );
    b.post_recv(9, &[sge(&mb, 0, 64)]);
    assert_eq!(a.wait().wr_id, 4);
    assert_eq!(b.wait().wr_id, 9);
    // Atomics need exactly 8 bytes.
    let err =
        a.qp.post_send(&[SendWr {
            wr_id: 6,
            op: SendOp::FetchAdd {
                remote_addr: mb.addr(),
                rkey: mb.rkey(),
                add: 1,
            },
            sg_list: &[sge(&ma, 0, 4)],
            flags: sig,
        }])
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Post {
                index: 0,
                error: PostError::BadAtomicLength
            }
        ),
        "{err}"
    );
}

#[test]
fn query_reports_what_connect_set() {
    let (a, b) = pair();
    let q = a.qp.query().unwrap();
    assert_eq!(q.qp_state, Some(QpState::Rts));
    assert_eq!(q.dest_qp_num, Some(b.qp.qp_num()));
    assert_eq!(q.ah_attr.unwrap().dgid, b.ctx.gid());
    assert_eq!(q.sq_psn, Some(100));
    assert_eq!(q.rq_psn, Some(200));
}
