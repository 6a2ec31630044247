//! The limits a device advertises are the limits it enforces (issue 7, item 6): `max_pd` and
//! `max_cq` objects can exist at once and no more; a message of `max_msg_sz` bytes is
//! accepted and one byte more is refused.

mod verbs_util;

use softrdma::transport::{PostError, SendFlags, SendOp, Sge};
use softrdma::verbs::{SendWr, VerbsError};
use verbs_util::*;

#[test]
fn max_pd_and_max_cq_are_enforced_and_freed_slots_reused() {
    let ctx = loopback_ctx();
    let attr = ctx.query_device();
    let mut pds = Vec::new();
    for _ in 0..attr.max_pd {
        pds.push(ctx.alloc_pd().expect("a PD within max_pd"));
    }
    let Err(err) = ctx.alloc_pd() else {
        panic!("one PD over max_pd was allocated")
    };
    assert!(matches!(err, VerbsError::NoResources(_)), "{err:?}");
    assert_eq!(err.errno(), libc::ENOMEM);
    pds.pop();
    pds.push(ctx.alloc_pd().expect("a freed PD slot is reused"));

    let mut cqs = Vec::new();
    for _ in 0..attr.max_cq {
        cqs.push(ctx.create_cq(1, None).expect("a CQ within max_cq"));
    }
    let Err(err) = ctx.create_cq(1, None) else {
        panic!("one CQ over max_cq was created")
    };
    assert!(matches!(err, VerbsError::NoResources(_)), "{err:?}");
    // A clone is another handle to the same CQ, not another CQ: dropping it frees nothing.
    let extra = cqs[0].clone();
    drop(extra);
    assert!(ctx.create_cq(1, None).is_err());
    cqs.pop();
    cqs.push(ctx.create_cq(1, None).expect("a freed CQ slot is reused"));
}

#[test]
fn a_message_of_max_msg_sz_is_accepted_and_one_byte_more_refused() {
    let (a, _b) = pair();
    let max = a.ctx.query_port(1).unwrap().max_msg_sz;
    assert_eq!(max, 1 << 31);
    let mr = a.mr(64);
    // Two SGEs adding up to the length; the post checks lengths, the data moves later (this
    // test never lets it: the QP is destroyed first).
    let post = |total: u64| {
        let first = (total / 2) as u32;
        let second = (total - first as u64) as u32;
        let sges = [
            Sge {
                addr: mr.addr(),
                length: first,
                lkey: mr.lkey(),
            },
            Sge {
                addr: mr.addr(),
                length: second,
                lkey: mr.lkey(),
            },
        ];
        a.qp.post_send(&[SendWr {
            wr_id: total,
            op: SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            sg_list: &sges,
            flags: SendFlags::default(),
        }])
    };
    let err = post(max + 1).expect_err("max_msg_sz + 1 bytes");
    assert!(
        matches!(
            err,
            VerbsError::Post {
                index: 0,
                error: PostError::MessageTooLong(n)
            } if n == max + 1
        ),
        "{err:?}"
    );
    post(max).expect("a max_msg_sz message is accepted");
}
