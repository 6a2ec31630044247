//! End-to-end RC scenarios over a clean simulated link: every opcode, multi-packet messages at
//! each MTU, scatter/gather, zero-length, inline, signaled/unsignaled, PSN wrap.

use softrdma::transport::sim::*;
use softrdma::transport::*;

const ALL: AccessFlags = AccessFlags::all();

fn sim(o: ConnectOpts) -> Sim {
    let mut s = Sim::new(1, LinkConfig::default(), QpCaps::default());
    s.connect(o);
    s
}

fn ok(c: &Completion, wr_id: u64, opcode: WcOpcode, len: u32) {
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (wr_id, WcStatus::Success, opcode, len),
        "{c:?}"
    );
}

#[test]
fn send_single_packet() {
    let mut s = sim(ConnectOpts::default());
    let src = s.ends[0].mem.register(64, ALL);
    let dst = s.ends[1].mem.register(64, ALL);
    let data = pattern(1, 64);
    s.ends[0].mem.write(src.addr, &data);
    s.ends[1]
        .qp
        .post_recv(recv_wr(7, vec![dst.sge(0, 64)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(9, SendOp::Send, vec![src.sge(0, 64)]))
        .unwrap();
    assert!(s.run_idle(1000));
    let sc = s.ends[0].take(CqSide::Send);
    assert_eq!(sc.len(), 1);
    ok(&sc[0], 9, WcOpcode::Send, 64);
    let rc = s.ends[1].take(CqSide::Recv);
    assert_eq!(rc.len(), 1);
    ok(&rc[0], 7, WcOpcode::Recv, 64);
    assert_eq!(rc[0].src_qp, Sim::QPN[0]);
    assert_eq!(rc[0].qp_num, Sim::QPN[1]);
    assert_eq!(s.ends[1].mem.read(dst.addr, 64), data);
}

/// Split `len` bytes into `k` SGEs placed with gaps in `mr` (so a wrong offset shows).
fn split(mr: &MemRegion, len: usize, k: usize) -> Vec<Sge> {
    let k = k.max(1);
    let mut v = Vec::new();
    let mut off = 0u64;
    let mut left = len;
    for i in 0..k {
        let l = if i == k - 1 {
            left
        } else {
            (len / k).min(left)
        };
        v.push(mr.sge(off, l as u32));
        off += l as u64 + 24;
        left -= l;
    }
    v
}

fn gathered(mem: &VecMemory, sges: &[Sge]) -> Vec<u8> {
    sges.iter()
        .flat_map(|s| mem.read(s.addr, s.length as usize))
        .collect()
}

fn scatter_in(mem: &VecMemory, sges: &[Sge], data: &[u8]) {
    let mut at = 0;
    for s in sges {
        mem.write(s.addr, &data[at..at + s.length as usize]);
        at += s.length as usize;
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
}

/// Run one message of `op` with `len` bytes, `k` SGEs on each side, and check data and
/// completions on both sides.
fn roundtrip(o: ConnectOpts, op: Op, len: usize, k: usize) {
    let mut s = sim(o);
    let lmr = s.ends[0].mem.register(len + 64 * k + 64, ALL);
    let rmr = s.ends[1].mem.register(len + 64 * k + 64, ALL);
    let lsg = split(&lmr, len, k);
    let data = pattern(len as u64 ^ k as u64, len);
    let imm = 0xdead_beef;
    match op {
        Op::Read => scatter_in(&s.ends[1].mem, &[rmr.sge(8, len as u32)], &data),
        _ => scatter_in(&s.ends[0].mem, &lsg, &data),
    }
    let rsg = split(&rmr, len, k);
    if matches!(op, Op::Send | Op::SendImm | Op::WriteImm) {
        s.ends[1].qp.post_recv(recv_wr(100, rsg.clone())).unwrap();
    }
    let sop = match op {
        Op::Send => SendOp::Send,
        Op::SendImm => SendOp::SendWithImm { imm },
        Op::Write => SendOp::RdmaWrite {
            remote_addr: rmr.addr + 8,
            rkey: rmr.rkey,
        },
        Op::WriteImm => SendOp::RdmaWriteWithImm {
            remote_addr: rmr.addr + 8,
            rkey: rmr.rkey,
            imm,
        },
        Op::Read => SendOp::RdmaRead {
            remote_addr: rmr.addr + 8,
            rkey: rmr.rkey,
        },
    };
    s.ends[0]
        .qp
        .post_send(send_wr(1, sop, lsg.clone()))
        .unwrap();
    assert!(s.run_idle(100_000), "livelock {op:?} len {len}");
    let sc = s.ends[0].take(CqSide::Send);
    let wop = match op {
        Op::Send | Op::SendImm => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
    };
    assert_eq!(sc.len(), 1, "{op:?} {len}: {sc:?}");
    ok(&sc[0], 1, wop, len as u32);
    let rc = s.ends[1].take(CqSide::Recv);
    match op {
        Op::Send | Op::SendImm => {
            assert_eq!(rc.len(), 1);
            ok(&rc[0], 100, WcOpcode::Recv, len as u32);
            assert_eq!(rc[0].imm_data, matches!(op, Op::SendImm).then_some(imm));
            assert_eq!(gathered(&s.ends[1].mem, &rsg), data);
        }
        Op::WriteImm => {
            assert_eq!(rc.len(), 1);
            ok(&rc[0], 100, WcOpcode::RecvRdmaWithImm, len as u32);
            assert_eq!(rc[0].imm_data, Some(imm));
            assert_eq!(s.ends[1].mem.read(rmr.addr + 8, len), data);
        }
        Op::Write => {
            assert!(rc.is_empty());
            assert_eq!(s.ends[1].mem.read(rmr.addr + 8, len), data);
        }
        Op::Read => {
            assert!(rc.is_empty());
            assert_eq!(gathered(&s.ends[0].mem, &lsg), data);
        }
    }
    // Nothing else was written around the target.
    if matches!(op, Op::Write | Op::WriteImm) {
        assert_eq!(s.ends[1].mem.read(rmr.addr, 8), vec![0; 8]);
        assert_eq!(s.ends[1].mem.read(rmr.addr + 8 + len as u64, 8), vec![0; 8]);
    }
}

#[test]
fn every_op_multi_packet_every_mtu() {
    for mtu in [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ] {
        let m = mtu.bytes();
        for len in [1, m - 1, m, m + 1, 3 * m, 5 * m + 7] {
            for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read] {
                roundtrip(
                    ConnectOpts {
                        mtu,
                        ..Default::default()
                    },
                    op,
                    len,
                    1,
                );
            }
        }
    }
}

#[test]
fn scatter_gather_both_sides() {
    for k in [2, 3, 4] {
        for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read] {
            roundtrip(
                ConnectOpts {
                    mtu: Mtu::Mtu256,
                    ..Default::default()
                },
                op,
                1000,
                k,
            );
        }
    }
}

#[test]
fn zero_length_messages() {
    for op in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read] {
        roundtrip(ConnectOpts::default(), op, 0, 1);
    }
}

#[test]
fn psn_wraps_across_24_bits() {
    for op in [Op::Send, Op::Write, Op::Read, Op::WriteImm] {
        let o = ConnectOpts {
            mtu: Mtu::Mtu256,
            psn: [0xff_fffd, 0xff_fffe],
            ..Default::default()
        };
        roundtrip(o, op, 256 * 6 + 3, 2);
    }
}

#[test]
fn large_message_uses_many_acks() {
    // 1 MiB at 1024 MTU: 1024 packets, more than the 128-PSN window.
    roundtrip(ConnectOpts::default(), Op::Write, 1 << 20, 1);
    roundtrip(ConnectOpts::default(), Op::Send, 300_000, 3);
    roundtrip(ConnectOpts::default(), Op::Read, 1 << 20, 2);
}

#[test]
fn atomics_end_to_end() {
    let mut s = sim(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, ALL);
    let rmr = s.ends[1].mem.register(64, ALL);
    s.ends[1].mem.write(rmr.addr + 8, &100u64.to_ne_bytes());
    let cs = |compare, swap| SendOp::CompareSwap {
        remote_addr: rmr.addr + 8,
        rkey: rmr.rkey,
        compare,
        swap,
    };
    s.ends[0]
        .qp
        .post_send(send_wr(
            1,
            SendOp::FetchAdd {
                remote_addr: rmr.addr + 8,
                rkey: rmr.rkey,
                add: 5,
            },
            vec![lmr.sge(0, 8)],
        ))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(2, cs(105, 7), vec![lmr.sge(8, 8)]))
        .unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(3, cs(105, 9), vec![lmr.sge(16, 8)]))
        .unwrap();
    assert!(s.run_idle(1000));
    let sc = s.ends[0].take(CqSide::Send);
    assert_eq!(sc.len(), 3);
    ok(&sc[0], 1, WcOpcode::FetchAdd, 8);
    ok(&sc[1], 2, WcOpcode::CompSwap, 8);
    ok(&sc[2], 3, WcOpcode::CompSwap, 8);
    let rd = |a: u64| u64::from_ne_bytes(s.ends[0].mem.read(a, 8).try_into().unwrap());
    assert_eq!(rd(lmr.addr), 100);
    assert_eq!(rd(lmr.addr + 8), 105);
    assert_eq!(
        rd(lmr.addr + 16),
        7,
        "failed compare returns the current value"
    );
    assert_eq!(
        u64::from_ne_bytes(s.ends[1].mem.read(rmr.addr + 8, 8).try_into().unwrap()),
        7
    );
}

#[test]
fn inline_and_unsignaled() {
    let mut s = sim(ConnectOpts {
        mtu: Mtu::Mtu256,
        ..Default::default()
    });
    let rmr = s.ends[1].mem.register(4096, ALL);
    let data = pattern(5, 200);
    for i in 0..4u64 {
        s.ends[1]
            .qp
            .post_recv(recv_wr(10 + i, vec![rmr.sge(i * 1024, 1024)]))
            .unwrap();
    }
    let inline = |wr_id, signaled| SendWqe {
        wr_id,
        op: SendOp::Send,
        flags: if signaled {
            SendFlags::INLINE | SendFlags::SIGNALED
        } else {
            SendFlags::INLINE
        },
        sg_list: vec![].into(),
        inline_data: data.clone(),
    };
    s.ends[0].qp.post_send(inline(1, false)).unwrap();
    s.ends[0].qp.post_send(inline(2, true)).unwrap();
    s.ends[0].qp.post_send(inline(3, false)).unwrap();
    // Inline data is copied at post time: an SGE-less WQE works without any local MR.
    assert!(s.run_idle(1000));
    let sc = s.ends[0].take(CqSide::Send);
    assert_eq!(sc.len(), 1, "only the signaled WQE completes: {sc:?}");
    ok(&sc[0], 2, WcOpcode::Send, 200);
    let rc = s.ends[1].take(CqSide::Recv);
    assert_eq!(
        rc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );
    for i in 0..3 {
        assert_eq!(s.ends[1].mem.read(rmr.addr + i * 1024, 200), data);
    }
    // Too long inline is refused at post time.
    let mut w = inline(4, true);
    w.inline_data = vec![0; 257];
    assert_eq!(
        s.ends[0].qp.post_send(w),
        Err(PostError::InlineTooLong { got: 257, max: 256 })
    );
}

#[test]
fn sq_sig_all_signals_everything() {
    let mut s = Sim::new(1, LinkConfig::default(), QpCaps::default());
    s.ends[0].qp = RcQp::new(Sim::QPN[0], QpCaps::default(), true);
    s.connect(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, ALL);
    let rmr = s.ends[1].mem.register(64, ALL);
    let mut w = send_wr(
        5,
        SendOp::RdmaWrite {
            remote_addr: rmr.addr,
            rkey: rmr.rkey,
        },
        vec![lmr.sge(0, 16)],
    );
    w.flags.set(SendFlags::SIGNALED, false);
    s.ends[0].qp.post_send(w).unwrap();
    assert!(s.run_idle(1000));
    assert_eq!(s.ends[0].take(CqSide::Send).len(), 1);
}

#[test]
fn solicited_bit_reaches_receiver() {
    let mut s = sim(ConnectOpts::default());
    let lmr = s.ends[0].mem.register(64, ALL);
    let rmr = s.ends[1].mem.register(64, ALL);
    s.ends[1]
        .qp
        .post_recv(recv_wr(1, vec![rmr.sge(0, 64)]))
        .unwrap();
    s.ends[1]
        .qp
        .post_recv(recv_wr(2, vec![rmr.sge(0, 64)]))
        .unwrap();
    let mut w = send_wr(1, SendOp::Send, vec![lmr.sge(0, 8)]);
    w.flags.insert(SendFlags::SOLICITED);
    s.ends[0].qp.post_send(w).unwrap();
    s.ends[0]
        .qp
        .post_send(send_wr(2, SendOp::Send, vec![lmr.sge(0, 8)]))
        .unwrap();
    assert!(s.run_idle(1000));
    let rc = s.ends[1].take(CqSide::Recv);
    assert_eq!(
        rc.iter().map(|c| c.solicited).collect::<Vec<_>>(),
        vec![true, false]
    );
}

#[test]
#[allow(clippy::needless_range_loop)]
fn bidirectional_traffic() {
    let mut s = sim(ConnectOpts {
        mtu: Mtu::Mtu512,
        ..Default::default()
    });
    let m: Vec<_> = (0..2)
        .map(|i| s.ends[i].mem.register(1 << 16, ALL))
        .collect();
    for i in 0..2 {
        let data = pattern(i as u64, 5000);
        s.ends[i].mem.write(m[i].addr, &data);
        s.ends[1 - i]
            .qp
            .post_recv(recv_wr(1, vec![m[1 - i].sge(8192, 5000)]))
            .unwrap();
    }
    for i in 0..2 {
        s.ends[i]
            .qp
            .post_send(send_wr(1, SendOp::Send, vec![m[i].sge(0, 5000)]))
            .unwrap();
        s.ends[i]
            .qp
            .post_send(send_wr(
                2,
                SendOp::RdmaRead {
                    remote_addr: m[1 - i].addr,
                    rkey: m[1 - i].rkey,
                },
                vec![m[i].sge(20000, 5000)],
            ))
            .unwrap();
    }
    assert!(s.run_idle(10_000));
    for i in 0..2 {
        let peer = pattern((1 - i) as u64, 5000);
        assert_eq!(s.ends[i].mem.read(m[i].addr + 8192, 5000), peer);
        assert_eq!(s.ends[i].mem.read(m[i].addr + 20000, 5000), peer);
        assert_eq!(s.ends[i].take(CqSide::Send).len(), 2);
        assert_eq!(s.ends[i].take(CqSide::Recv).len(), 1);
    }
}
