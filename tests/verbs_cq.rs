//! Completion queues and completion channels: capacity, overrun, notification through a real
//! epoll on the channel's fd, get/ack, destroy rules.
mod verbs_util;

use std::os::fd::RawFd;

use softrdma::transport::{QpAttr, QpCaps, QpState, WcOpcode, WcStatus};
use softrdma::verbs::{
    AsyncEvent, CompletionQueue, Context, QpInitAttr, QpType, QueuePair, RecvWr, VerbsError,
    WorkCompletion,
};
use verbs_util::*;

/// A QP on `cq` moved straight to ERR: every receive posted to it completes at once with
/// WR_FLUSH_ERR, which makes completions without any network.
fn err_qp(ctx: &Context, cq: &CompletionQueue) -> QueuePair {
    let pd = ctx.alloc_pd().unwrap();
    let qp = rc_qp(&pd, cq);
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    qp
}

fn flush_one(qp: &QueuePair, wr_id: u64) {
    qp.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[],
    }])
    .unwrap();
}

struct Epoll(RawFd);

impl Epoll {
    fn new(fd: RawFd) -> Epoll {
        // SAFETY: plain syscalls on descriptors this test owns.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 42,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
            Epoll(ep)
        }
    }
    /// Number of ready fds within `ms`.
    fn wait(&self, ms: i32) -> i32 {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` is a live array of 4 events.
        let n = unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), 4, ms) };
        assert!(n >= 0);
        if n > 0 {
            assert_eq!({ evs[0].u64 }, 42);
        }
        n
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: closing the epoll fd we created.
        unsafe { libc::close(self.0) };
    }
}

#[test]
fn capacity_and_limits() {
    let ctx = loopback_ctx();
    for n in [1u32, 5, 100, 4096] {
        assert!(ctx.create_cq(n, None).unwrap().capacity() >= n as usize);
    }
    assert!(matches!(
        ctx.create_cq(0, None),
        Err(VerbsError::InvalidArgument(_))
    ));
    let max = ctx.query_device().max_cqe;
    assert!(ctx.create_cq(max + 1, None).is_err());
}

#[test]
fn poll_fills_the_callers_buffer_in_order() {
    let ctx = loopback_ctx();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = err_qp(&ctx, &cq);
    for i in 0..5 {
        flush_one(&qp, i);
    }
    let mut wc = [WorkCompletion::default(); 3];
    assert_eq!(cq.poll(&mut wc).unwrap(), 3);
    assert_eq!(wc.map(|c| c.wr_id), [0, 1, 2]);
    assert!(wc
        .iter()
        .all(|c| c.status == WcStatus::WrFlushErr && c.opcode == WcOpcode::Recv));
    assert_eq!(wc[0].qp_num, qp.qp_num());
    assert_eq!(cq.poll(&mut wc).unwrap(), 2);
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(cq.poll(&mut []).unwrap(), 0);
}

#[test]
fn overrun_puts_the_cq_in_error_with_an_async_event() {
    let ctx = loopback_ctx();
    let cq = ctx.create_cq(2, None).unwrap();
    let cap = cq.capacity();
    let qp = err_qp(&ctx, &cq);
    for i in 0..cap as u64 + 1 {
        flush_one(&qp, i);
    }
    assert!(cq.is_overrun());
    let mut wc = [WorkCompletion::default(); 8];
    let e = cq.poll(&mut wc).unwrap_err();
    assert!(matches!(e, VerbsError::CqOverrun), "{e}");
    let mut saw = false;
    while let Some(ev) = ctx.poll_async_event() {
        saw |= ev == AsyncEvent::CqErr { cq: cq.id() };
    }
    assert!(saw);
}

#[test]
fn channel_notifies_through_epoll_get_and_ack() {
    let ctx = loopback_ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    let other = ctx.create_cq(16, Some(&ch)).unwrap();
    let qp = err_qp(&ctx, &cq);
    let ep = Epoll::new(ch.fd());

    // Not armed: a completion raises no event.
    flush_one(&qp, 1);
    assert_eq!(ep.wait(0), 0);
    assert_eq!(cq.poll(&mut [WorkCompletion::default()]).unwrap(), 1);

    // Armed: the next completion makes the fd readable and queues the CQ.
    cq.req_notify(false).unwrap();
    assert_eq!(ep.wait(0), 0);
    flush_one(&qp, 2);
    assert_eq!(ep.wait(10_000), 1);
    let got = ch.get_cq_event().unwrap();
    assert_eq!(got, cq);
    assert_ne!(got, other);
    assert_eq!(ep.wait(0), 0, "one event per arming");

    // One-shot: not re-armed, so the next completion raises nothing.
    flush_one(&qp, 3);
    assert_eq!(ep.wait(0), 0);
    ch.set_nonblocking(true).unwrap();
    assert!(matches!(ch.get_cq_event(), Err(VerbsError::WouldBlock)));

    // Solicited-only arming still fires for error completions (IBA 11.4.2.2).
    cq.req_notify(true).unwrap();
    flush_one(&qp, 4);
    assert_eq!(ep.wait(10_000), 1);
    assert_eq!(ch.get_cq_event().unwrap(), cq);

    // Unacknowledged events keep the CQ from being destroyed (and so does the QP).
    drop(qp);
    let (e, cq) = cq.destroy().unwrap_err();
    assert!(matches!(e, VerbsError::Busy(_)), "{e}");
    assert_eq!(e.errno(), libc::EBUSY);
    cq.ack_events(1);
    let (_, cq) = cq.destroy().unwrap_err();
    cq.ack_events(1);
    cq.destroy().unwrap();
}

#[test]
fn blocking_get_cq_event_wakes_when_a_completion_arrives() {
    let ctx = loopback_ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    let qp = err_qp(&ctx, &cq);
    cq.req_notify(false).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        flush_one(&qp, 9);
        qp
    });
    let got = ch.get_cq_event().unwrap();
    assert_eq!(got, cq);
    cq.ack_events(1);
    assert_eq!(wait_cq(&cq).wr_id, 9);
    drop(t.join().unwrap());
}

#[test]
fn req_notify_needs_a_channel_and_a_cq_in_use_cannot_be_destroyed() {
    let ctx = loopback_ctx();
    let cq = ctx.create_cq(4, None).unwrap();
    assert!(cq.req_notify(false).is_err());
    let qp = err_qp(&ctx, &cq);
    let (e, cq) = cq.destroy().unwrap_err();
    assert!(matches!(e, VerbsError::Busy(_)));
    drop(qp);
    cq.destroy().unwrap();
}

#[test]
fn cq_and_channel_must_share_the_context() {
    let a = loopback_ctx();
    let b = loopback_ctx();
    let ch = a.create_comp_channel().unwrap();
    assert!(b.create_cq(4, Some(&ch)).is_err());
    let cq_b = b.create_cq(4, None).unwrap();
    let pd_a = a.alloc_pd().unwrap();
    assert!(pd_a
        .create_qp(&QpInitAttr {
            send_cq: &cq_b,
            recv_cq: &cq_b,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .is_err());
}
