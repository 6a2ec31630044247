//! Error paths: remote access errors, local protection and length errors, RNR, retry
//! exhaustion, flushing on ERR, misaligned atomics.

use std::cell::Cell;
use std::rc::Rc;

use softrdma::transport::sim::*;
use softrdma::transport::*;
use softrdma::wire::{Packet, Syndrome};

const ALL: AccessFlags = AccessFlags::all();
const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn sim(o: ConnectOpts) -> Sim {
    let mut s = Sim::new(7, LinkConfig::default(), QpCaps::default());
    s.connect(o);
    s
}

fn statuses(v: &[Completion]) -> Vec<(u64, WcStatus)> {
    v.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// Post a failing WQE (wr 1) followed by two more (wr 2, 3), run, and return the send completions.
fn fail_then_flush(s: &mut Sim, bad: SendWqe, lmr: &MemRegion, rmr: &MemRegion) -> Vec<Completion> {
    s.ends[0].qp.post_send(bad).unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 8)],
        ))
        .unwrap();
    let mut w = send_wr(
        3,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 8)],
    );
    w.flags.set(SendFlags::SIGNALED, false); // error completions are generated for unsignaled WRs too
    s.ends[0].qp.post_send(w).unwrap();
    assert!(s.run_idle(100_000));
    s.ends[0].take(CqSide::Send)
}

/// What [`fail_then_flush`] returned: the failing WR completed with `status`, the two behind
/// it flushed.
fn assert_failed_then_flushed(sc: &[Completion], status: WcStatus) {
    assert_eq!(
        statuses(sc),
        vec![
            (1, status),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

fn setup(o: ConnectOpts, remote_access: AccessFlags) -> (Sim, MemRegion, MemRegion) {
    let s = sim(o);
    let lmr = s.ends[0].mem.register(8192, ALL);
    let rmr = s.ends[1].mem.register(8192, remote_access);
    s.ends[0].mem.write(lmr.addr, &pattern(3, 8192));
    (s, lmr, rmr)
}

fn remote_unchanged(s: &Sim, rmr: &MemRegion) {
    assert_eq!(
        s.ends[1].mem.read(rmr.addr, rmr.len as usize),
        vec![0; rmr.len as usize],
        "remote memory changed"
    );
}

#[test]
fn bad_rkey_is_remote_access_error_and_nothing_changes() {
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey ^ 0x100,
        },
        vec![lmr.sge(0, 3000)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_failed_then_flushed(&sc, WcStatus::RemAccessErr);
    assert_eq!(sc[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(s.ends[0].qp.state(), QpState::Err);
    assert_eq!(s.ends[1].qp.state(), QpState::Err);
    remote_unchanged(&s, &rmr);
}

#[test]
fn out_of_bounds_remote_address() {
    // The message runs 1 byte past the end of the region.
    let (mut s, lmr, rmr) = setup(
        ConnectOpts {
            mtu: Mtu::Mtu256,
            ..Default::default()
        },
        ALL,
    );
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr + 8192 - 999,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 1000)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::RemAccessErr);
    remote_unchanged(&s, &rmr);

    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    let bad = send_wr(
        1,
        SendOp::RdmaRead {
            remote_addr: rmr.addr - 8,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 16)],
    );
    let before = s.ends[0].mem.read(lmr.addr, 16);
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(statuses(&sc)[0], (1, WcStatus::RemAccessErr));
    assert_eq!(s.ends[0].mem.read(lmr.addr, 16), before);
}

#[test]
fn write_to_read_only_mr() {
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), LW | AccessFlags::REMOTE_READ);
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 100)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::RemAccessErr);
    remote_unchanged(&s, &rmr);
}

#[test]
fn read_from_mr_without_remote_read() {
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), LW | AccessFlags::REMOTE_WRITE);
    let bad = send_wr(
        1,
        SendOp::RdmaRead {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 100)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::RemAccessErr);
}

#[test]
fn qp_without_remote_write_access() {
    let o = ConnectOpts {
        access: LW | AccessFlags::REMOTE_READ,
        ..Default::default()
    };
    let (mut s, lmr, rmr) = setup(o, ALL);
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 100)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::RemAccessErr);
    remote_unchanged(&s, &rmr);
}

#[test]
fn qp_without_remote_atomic_access() {
    let o = ConnectOpts {
        access: LW | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    let (mut s, lmr, rmr) = setup(o, ALL);
    let bad = send_wr(
        1,
        SendOp::FetchAdd {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
            add: 1,
        },
        vec![lmr.sge(0, 8)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::RemAccessErr);
    assert_eq!(sc[0].opcode, WcOpcode::FetchAdd);
    remote_unchanged(&s, &rmr);
}

#[test]
fn misaligned_atomic_is_invalid_request() {
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    let bad = send_wr(
        1,
        SendOp::CompareSwap {
            remote_addr: rmr.addr + 4,
            rkey: rmr.rkey,
            compare: 0,
            swap: 5,
        },
        vec![lmr.sge(0, 8)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_failed_then_flushed(&sc, WcStatus::RemInvReqErr);
    remote_unchanged(&s, &rmr);
}

#[test]
fn bad_lkey_is_local_protection_error() {
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![Sge {
            lkey: lmr.lkey + 0x1000,
            ..lmr.sge(0, 100)
        }],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_failed_then_flushed(&sc, WcStatus::LocProtErr);
    assert_eq!(s.ends[0].qp.state(), QpState::Err);
    // Nothing was sent, so the peer is untouched.
    assert_eq!(s.ends[1].qp.state(), QpState::Rts);
    remote_unchanged(&s, &rmr);

    // Local SGE past the end of its region.
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    let bad = send_wr(1, SendOp::Send, vec![lmr.sge(8000, 300)]);
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(sc[0].status, WcStatus::LocProtErr);
}

#[test]
fn read_into_mr_without_local_write() {
    let mut s = sim(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, AccessFlags::NONE);
    let rmr = s.ends[1].mem.register(64, ALL);
    s.ends[0]
        .qp
        .post_send(send_wr(
            1,
            SendOp::RdmaRead {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 64)],
        ))
        .unwrap();
    assert!(s.run_idle(10_000));
    assert_eq!(
        statuses(&s.ends[0].take(CqSide::Send)),
        vec![(1, WcStatus::LocProtErr)]
    );
    assert_eq!(s.ends[0].qp.state(), QpState::Err);
}

#[test]
fn receive_buffer_too_small() {
    let mut s = sim(ConnectOpts {
        mtu: Mtu::Mtu256,
        ..Default::default()
    });
    let lmr = s.ends[0].mem.register(4096, ALL);
    let rmr = s.ends[1].mem.register(4096, ALL);
    s.ends[1]
        .qp
        .post_recv(recv_wr(10, vec![rmr.sge(0, 300), rmr.sge(1000, 200)]))
        .unwrap();
    s.ends[1]
        .qp
        .post_recv(recv_wr(11, vec![rmr.sge(2000, 2000)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 501)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(2, SendOp::Send, vec![lmr.sge(0, 10)]))
        .unwrap();
    assert!(s.run_idle(10_000));
    assert_eq!(
        statuses(&s.ends[1].take(CqSide::Recv)),
        vec![(10, WcStatus::LocLenErr), (11, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        statuses(&s.ends[0].take(CqSide::Send)),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(s.ends[1].qp.state(), QpState::Err);
    assert_eq!(s.ends[0].qp.state(), QpState::Err);
}

/// Counts RNR NAKs crossing the link.
fn count_rnr(s: &mut Sim) -> Rc<Cell<u32>> {
    let n = Rc::new(Cell::new(0));
    let n2 = n.clone();
    s.link.filter = Some(Box::new(move |_, bytes| {
        if let Ok(p) = Packet::parse(bytes) {
            if let Some(a) = p.aeth {
                if matches!(a.syndrome, Syndrome::RnrNak { .. })
                    && p.payload.is_empty()
                    && p.atomic_ack_eth.is_none()
                {
                    n2.set(n2.get() + 1);
                }
            }
        }
        false
    }));
    n
}

#[test]
fn rnr_then_success_once_receive_posted() {
    for imm in [false, true] {
        let mut s = sim(ConnectOpts {
            mtu: Mtu::Mtu256,
            rnr_retry: 7,
            min_rnr_timer: 4,
            ..Default::default()
        });
        let rnr = count_rnr(&mut s);
        let lmr = s.ends[0].mem.register(4096, ALL);
        let rmr = s.ends[1].mem.register(4096, ALL);
        let data = pattern(9, 1000);
        s.ends[0].mem.write(lmr.addr, &data);
        let op = if imm {
            SendOp::RdmaWriteWithImm {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
                imm: 5,
            }
        } else {
            SendOp::Send
        };
        s.ends[0]
            .qp
            .post_send(send_wr(1, op, vec![lmr.sge(0, 1000)]))
            .unwrap();
        // rnr_retry 7 is infinite: keep going until several RNR NAKs were seen.
        assert!(s.run_until(100_000, |_| rnr.get() >= 5));
        assert!(s.ends[0].completions.is_empty());
        s.ends[1]
            .qp
            .post_recv(recv_wr(20, vec![rmr.sge(2048, 2048)]))
            .unwrap();
        assert!(s.run_idle(100_000));
        assert_eq!(
            statuses(&s.ends[0].take(CqSide::Send)),
            vec![(1, WcStatus::Success)]
        );
        let rc = s.ends[1].take(CqSide::Recv);
        assert_eq!(statuses(&rc), vec![(20, WcStatus::Success)]);
        assert_eq!(rc[0].byte_len, 1000);
        let at = if imm { rmr.addr } else { rmr.addr + 2048 };
        assert_eq!(s.ends[1].mem.read(at, 1000), data);
        // The RNR timer (code 4 = 40 µs) was honoured between attempts.
        assert!(s.elapsed() >= std::time::Duration::from_micros(5 * 40));
    }
}

#[test]
fn rnr_retry_exhausted() {
    let mut s = sim(ConnectOpts {
        rnr_retry: 3,
        min_rnr_timer: 1,
        ..Default::default()
    });
    let rnr = count_rnr(&mut s);
    let lmr = s.ends[0].mem.register(64, ALL);
    s.ends[0]
        .qp
        .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 64)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(2, SendOp::Send, vec![lmr.sge(0, 64)]))
        .unwrap();
    assert!(s.run_idle(100_000));
    assert_eq!(
        statuses(&s.ends[0].take(CqSide::Send)),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // The first try and three retries each met an RNR NAK.
    assert_eq!(rnr.get(), 4);
    assert_eq!(
        s.ends[1].qp.state(),
        QpState::Rts,
        "RNR is not an error at the responder"
    );
}

#[test]
fn peer_gone_is_retry_exceeded() {
    let mut s = sim(ConnectOpts {
        retry_cnt: 3,
        timeout: 12,
        ..Default::default()
    });
    s.link.blackhole[1] = true;
    let lmr = s.ends[0].mem.register(64, ALL);
    s.ends[0]
        .qp
        .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 64)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(
            2,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            vec![lmr.sge(0, 64)],
        ))
        .unwrap();
    assert!(s.run_idle(100_000));
    assert_eq!(
        statuses(&s.ends[0].take(CqSide::Send)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // Each packet went out once and was retried retry_cnt times, by the local ACK timeout;
    // the tail-loss probes (one packet each, before a timeout) consumed no retry.
    let st = s.ends[0].qp.stats();
    assert_eq!(st.timeouts, 3);
    assert!(st.probes >= 1, "{st:?}");
    assert_eq!(s.link.stats.sent, 2 * 4 + st.probes);
    // 4 timeouts of 4.096 µs × 2^12 each.
    let to = std::time::Duration::from_nanos(4096 << 12);
    assert!(
        s.elapsed() >= to * 4 && s.elapsed() < to * 5,
        "{:?}",
        s.elapsed()
    );
}

#[test]
fn timeout_zero_waits_forever() {
    let mut s = sim(ConnectOpts {
        retry_cnt: 0,
        timeout: 0,
        ..Default::default()
    });
    s.link.blackhole[1] = true;
    let lmr = s.ends[0].mem.register(64, ALL);
    s.ends[0]
        .qp
        .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 64)]))
        .unwrap();
    assert!(s.run_idle(1000));
    assert!(s.ends[0].completions.is_empty());
    assert_eq!(s.ends[0].qp.poll_timeout(), None);
    assert_eq!(s.ends[0].qp.state(), QpState::Rts);
}

#[test]
fn flush_on_err_covers_everything() {
    let mut s = sim(ConnectOpts::default());
    s.link.blackhole = [true, true];
    let lmr = s.ends[0].mem.register(64, ALL);
    for i in 0..5 {
        let mut w = send_wr(i, SendOp::Send, vec![lmr.sge(0, 8)]);
        w.flags.set(SendFlags::SIGNALED, i % 2 == 0);
        s.ends[0].qp.post_send(w).unwrap();
        s.ends[0]
            .qp
            .post_recv(recv_wr(100 + i, vec![lmr.sge(0, 8)]))
            .unwrap();
    }
    s.step();
    s.ends[0]
        .qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            s.now,
        )
        .unwrap();
    let mut got = Vec::new();
    while let Some(c) = s.ends[0].qp.poll_completion() {
        got.push(c);
    }
    let send: Vec<_> = got.iter().filter(|c| c.side == CqSide::Send).collect();
    let recv: Vec<_> = got.iter().filter(|c| c.side == CqSide::Recv).collect();
    assert_eq!(
        send.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (0..5)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        recv.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        (0..5)
            .map(|i| (100 + i, WcStatus::WrFlushErr, WcOpcode::Recv))
            .collect::<Vec<_>>()
    );
    assert!(got.iter().all(|c| c.qp_num == Sim::QPN[0]));
    // Posting in ERR is accepted and flushed at once.
    s.ends[0]
        .qp
        .post_send(send_wr(9, SendOp::Send, vec![lmr.sge(0, 8)]))
        .unwrap();
    s.ends[0].qp.post_recv(recv_wr(99, vec![])).unwrap();
    let c1 = s.ends[0].qp.poll_completion().unwrap();
    let c2 = s.ends[0].qp.poll_completion().unwrap();
    assert_eq!(
        (c1.wr_id, c1.status, c1.side),
        (9, WcStatus::WrFlushErr, CqSide::Send)
    );
    assert_eq!(
        (c2.wr_id, c2.status, c2.side),
        (99, WcStatus::WrFlushErr, CqSide::Recv)
    );
    let mut buf = vec![0u8; 8192];
    assert_eq!(
        s.ends[0].qp.poll_transmit(s.now, &s.ends[0].mem, &mut buf),
        None
    );
    assert_eq!(s.ends[0].qp.poll_timeout(), None);
}

#[test]
fn remote_error_after_successful_messages() {
    // Earlier WQEs complete normally; only the failing one and the rest are in error.
    let (mut s, lmr, rmr) = setup(ConnectOpts::default(), ALL);
    s.ends[0]
        .qp
        .post_send(send_wr(
            0,
            SendOp::RdmaWrite {
                remote_addr: rmr.addr,
                rkey: rmr.rkey,
            },
            vec![lmr.sge(0, 2000)],
        ))
        .unwrap();
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: 0xdead,
        },
        vec![lmr.sge(0, 8)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_eq!(
        statuses(&sc),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        s.ends[1].mem.read(rmr.addr, 2000),
        s.ends[0].mem.read(lmr.addr, 2000)
    );
}

/// A WRITE split into a message per packet (`RcQp::set_split_writes`) whose range runs past the
/// remote region: the packets before the refused one have landed (a single message would have
/// been refused whole at its First), and the rest goes as for any remote access error: the WR
/// completes with REM_ACCESS_ERR, the ones behind it flush, and the responder's QP is in ERR.
#[test]
fn split_write_refused_part_way() {
    let mut s = Sim::with_qps(7, LinkConfig::default(), |qpn| {
        let mut qp = RcQp::new(qpn, QpCaps::default(), false);
        qp.set_split_writes(true);
        qp
    });
    s.connect(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(8192, ALL);
    let rmr = s.ends[1].mem.register(3000, ALL);
    let data = pattern(3, 8192);
    s.ends[0].mem.write(lmr.addr, &data);
    // Three packets at MTU 1024: [0, 1024) and [1024, 2048) fit, [2048, 3072) does not.
    let bad = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 3072)],
    );
    let sc = fail_then_flush(&mut s, bad, &lmr, &rmr);
    assert_failed_then_flushed(&sc, WcStatus::RemAccessErr);
    assert_eq!(s.ends[0].qp.state(), QpState::Err);
    assert_eq!(s.ends[1].qp.state(), QpState::Err);
    assert_eq!(s.ends[1].mem.read(rmr.addr, 2048), data[..2048]);
    assert_eq!(s.ends[1].mem.read(rmr.addr + 2048, 952), vec![0; 952]);
}
