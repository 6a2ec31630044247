//! Mixed traffic over a seeded lossy, duplicating, reordering link: every operation executes
//! exactly once, in order, with the right data and completions.

use softrdma::transport::sim::*;
use softrdma::transport::*;
use softrdma::wire::Opcode;

const ALL: AccessFlags = AccessFlags::all();
const SLOT: u64 = 6000;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

fn same(got: &[u8], want: &[u8], seed: u64, op: usize) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "seed {seed} op {op}: data differs at byte {at:?} of {}",
            want.len()
        );
    }
}

fn run(seed: u64, cfg: LinkConfig, n: usize, mtu: Mtu, bidir: bool) {
    run_with(seed, cfg, n, mtu, bidir, false)
}

/// `split`: the requesters send each packet of a WRITE as a message of its own
/// (`RcQp::set_split_writes`, what a device that batches with UDP GSO does).
fn run_with(seed: u64, cfg: LinkConfig, n: usize, mtu: Mtu, bidir: bool, split: bool) {
    let caps = QpCaps {
        max_send_wr: 2048,
        max_recv_wr: 2048,
        ..QpCaps::default()
    };
    let mut s = Sim::with_qps(seed, cfg, |qpn| {
        let mut qp = RcQp::new(qpn, caps, false);
        qp.set_split_writes(split);
        qp
    });
    // Opcodes sent: WRITE Last (only a WRITE without immediate ends with it) and WRITE Only, to
    // check which way the WRITEs went.
    let opcodes = std::rc::Rc::new(std::cell::Cell::new([0u32; 2]));
    let seen = opcodes.clone();
    s.link.filter = Some(Box::new(move |_, b| {
        let mut c = seen.get();
        match b[0] {
            op if op == Opcode::RC_RDMA_WRITE_LAST.0 => c[0] += 1,
            op if op == Opcode::RC_RDMA_WRITE_ONLY.0 => c[1] += 1,
            _ => {}
        }
        seen.set(c);
        false
    }));
    s.connect(ConnectOpts {
        mtu,
        timeout: 8,
        psn: [0xff_ff00, 0x7f_fff0],
        ..Default::default()
    });
    let sides: &[usize] = if bidir { &[0, 1] } else { &[0] };
    let mut checks = Vec::new();
    let mut regions = Vec::new();
    for i in 0..2 {
        let src = s.ends[i].mem.register(n * SLOT as usize, ALL); // local data, read targets
        let rsrc = s.ends[i].mem.register(n * SLOT as usize, ALL); // what the peer reads
        let dst = s.ends[i].mem.register(n * SLOT as usize, ALL); // receives, write targets
        let ctr = s.ends[i].mem.register(4096, ALL); // atomics
        regions.push((src, rsrc, dst, ctr));
    }
    for &a in sides {
        let b = 1 - a;
        let mut rng = XorShift64::new(seed * 31 + a as u64);
        let (src, _, _, _) = regions[a];
        let (_, psrc, pdst, pctr) = regions[b];
        let mut ops = Vec::new();
        let mut adds = 0u64;
        let mut chain = 0u64;
        for i in 0..n {
            let kind = match rng.below(7) {
                0 => Kind::Send,
                1 => Kind::SendImm,
                2 => Kind::Write,
                3 => Kind::WriteImm,
                4 => Kind::Read,
                5 => Kind::FetchAdd,
                _ => Kind::CmpSwap,
            };
            let len = match rng.below(4) {
                0 => 0,
                1 => rng.below(64) as usize,
                _ => rng.below(5000) as usize,
            };
            let off = i as u64 * SLOT;
            let data = pattern(seed ^ (i as u64) << 8 ^ a as u64, len);
            let local = src.sge(off, len as u32);
            let remote = pdst.addr + off;
            let wr = match kind {
                Kind::Send | Kind::SendImm => {
                    s.ends[a].mem.write(local.addr, &data);
                    s.ends[b]
                        .qp
                        .post_recv(recv_wr(i as u64, vec![pdst.sge(off, SLOT as u32)]))
                        .unwrap();
                    let op = if let Kind::Send = kind {
                        SendOp::Send
                    } else {
                        SendOp::SendWithImm { imm: i as u32 }
                    };
                    send_wr(i as u64, op, vec![local])
                }
                Kind::Write | Kind::WriteImm => {
                    s.ends[a].mem.write(local.addr, &data);
                    let op = if let Kind::Write = kind {
                        SendOp::RdmaWrite {
                            remote_addr: remote,
                            rkey: pdst.rkey,
                        }
                    } else {
                        s.ends[b].qp.post_recv(recv_wr(i as u64, vec![])).unwrap();
                        SendOp::RdmaWriteWithImm {
                            remote_addr: remote,
                            rkey: pdst.rkey,
                            imm: i as u32,
                        }
                    };
                    // Split the local side into two SGEs for good measure.
                    let h = len as u32 / 2;
                    send_wr(
                        i as u64,
                        op,
                        vec![src.sge(off, h), src.sge(off + h as u64, len as u32 - h)],
                    )
                }
                Kind::Read => {
                    s.ends[b].mem.write(psrc.addr + off, &data);
                    send_wr(
                        i as u64,
                        SendOp::RdmaRead {
                            remote_addr: psrc.addr + off,
                            rkey: psrc.rkey,
                        },
                        vec![local],
                    )
                }
                Kind::FetchAdd => {
                    let add = rng.below(1000) + 1;
                    let want = adds;
                    adds += add;
                    ops.push((i, kind, len, data.clone(), want));
                    s.ends[a]
                        .qp
                        .post_send(send_wr(
                            i as u64,
                            SendOp::FetchAdd {
                                remote_addr: pctr.addr,
                                rkey: pctr.rkey,
                                add,
                            },
                            vec![src.sge(off, 8)],
                        ))
                        .unwrap();
                    continue;
                }
                Kind::CmpSwap => {
                    let want = chain;
                    chain += 1;
                    ops.push((i, kind, len, data.clone(), want));
                    let op = SendOp::CompareSwap {
                        remote_addr: pctr.addr + 8,
                        rkey: pctr.rkey,
                        compare: want,
                        swap: want + 1,
                    };
                    s.ends[a]
                        .qp
                        .post_send(send_wr(i as u64, op, vec![src.sge(off, 8)]))
                        .unwrap();
                    continue;
                }
            };
            ops.push((i, kind, len, data, 0));
            s.ends[a].qp.post_send(wr).unwrap();
        }
        checks.push((a, ops, adds, chain));
    }
    let total: usize = checks.iter().map(|c| c.1.len()).sum();
    let done = s.run_until(5_000_000, |s| {
        s.ends
            .iter()
            .map(|e| {
                e.completions
                    .iter()
                    .filter(|c| c.side == CqSide::Send)
                    .count()
            })
            .sum::<usize>()
            >= total
    });
    assert!(
        done,
        "seed {seed}: not done after {} steps, {:?} sim time, stats {:?}",
        s.steps,
        s.elapsed(),
        s.link.stats
    );
    // Let stragglers (duplicates) arrive: nothing may change afterwards.
    assert!(s.run_idle(1_000_000), "seed {seed}: never idle");
    for (a, ops, adds, chain) in checks {
        let b = 1 - a;
        let (src, _, _, _) = regions[a];
        let (_, _, pdst, pctr) = regions[b];
        let sc = s.ends[a].take(CqSide::Send);
        let rc = s.ends[b].take(CqSide::Recv);
        assert_eq!(sc.len(), ops.len(), "seed {seed}: send completions");
        let mut rc_it = rc.iter();
        for ((i, kind, len, data, want), c) in ops.iter().zip(&sc) {
            assert_eq!(c.wr_id, *i as u64, "seed {seed}: completion order");
            assert_eq!(c.status, WcStatus::Success, "seed {seed}: {c:?}");
            let off = *i as u64 * SLOT;
            match kind {
                Kind::Send | Kind::SendImm => {
                    let r = rc_it.next().expect("recv completion");
                    assert_eq!(
                        (r.wr_id, r.status, r.opcode, r.byte_len as usize),
                        (*i as u64, WcStatus::Success, WcOpcode::Recv, *len)
                    );
                    assert_eq!(
                        r.imm_data,
                        matches!(kind, Kind::SendImm).then_some(*i as u32)
                    );
                    same(&s.ends[b].mem.read(pdst.addr + off, *len), data, seed, *i);
                }
                Kind::Write | Kind::WriteImm => {
                    if let Kind::WriteImm = kind {
                        let r = rc_it.next().expect("recv completion");
                        assert_eq!(
                            (r.wr_id, r.opcode, r.byte_len as usize, r.imm_data),
                            (*i as u64, WcOpcode::RecvRdmaWithImm, *len, Some(*i as u32))
                        );
                    }
                    same(&s.ends[b].mem.read(pdst.addr + off, *len), data, seed, *i);
                }
                Kind::Read => same(&s.ends[a].mem.read(src.addr + off, *len), data, seed, *i),
                Kind::FetchAdd | Kind::CmpSwap => {
                    let got = u64::from_ne_bytes(
                        s.ends[a].mem.read(src.addr + off, 8).try_into().unwrap(),
                    );
                    assert_eq!(got, *want, "seed {seed} op {i} {kind:?}: atomic executed more than once or out of order");
                }
            }
        }
        assert!(
            rc_it.next().is_none(),
            "seed {seed}: extra receive completions"
        );
        let ctr = |o| u64::from_ne_bytes(s.ends[b].mem.read(pctr.addr + o, 8).try_into().unwrap());
        assert_eq!(ctr(0), adds, "seed {seed}: fetch-add total");
        assert_eq!(ctr(8), chain, "seed {seed}: compare-swap chain");
    }
    if cfg.loss > 0.0 {
        assert!(
            s.link.stats.dropped > 10 && s.link.stats.duplicated > 10,
            "{:?}",
            s.link.stats
        );
    }
    eprintln!(
        "seed {seed}: {:?} in {:?} simulated, {} steps",
        s.link.stats,
        s.elapsed(),
        s.steps
    );
    assert_eq!(s.ends[0].qp.state(), QpState::Rts);
    assert_eq!(s.ends[1].qp.state(), QpState::Rts);
    let [last, only] = opcodes.get();
    if split {
        assert_eq!(last, 0, "seed {seed}: a split WRITE ended with WRITE Last");
        assert!(only > n as u32 / 7, "seed {seed}: {only} WRITE Only");
    } else {
        assert!(last > 0, "seed {seed}: no multi-packet WRITE was sent");
    }
}

#[test]
fn clean_link_mixed_ops() {
    run(1, LinkConfig::default(), 300, Mtu::Mtu1024, true);
}

#[test]
fn lossy_link_mixed_ops_several_seeds() {
    for seed in 1..=6 {
        run(
            seed,
            LinkConfig::lossy(0.10, 0.10, 0.10),
            300,
            Mtu::Mtu1024,
            seed % 2 == 0,
        );
    }
}

#[test]
fn lossy_link_split_writes() {
    // Every packet of a WRITE a message of its own: the same bytes land, once, in order, and
    // the WRITEs with immediate (not split) still report their whole length.
    run_with(7, LinkConfig::default(), 300, Mtu::Mtu1024, true, true);
    for seed in 30..=33 {
        run_with(
            seed,
            LinkConfig::lossy(0.10, 0.10, 0.10),
            300,
            Mtu::Mtu256,
            seed % 2 == 0,
            true,
        );
    }
}

#[test]
fn lossy_link_small_mtu() {
    for seed in 10..=12 {
        run(
            seed,
            LinkConfig::lossy(0.10, 0.05, 0.2),
            200,
            Mtu::Mtu256,
            true,
        );
    }
}

#[test]
fn lossy_link_large_mtu_heavy_reorder() {
    for seed in 20..=22 {
        run(
            seed,
            LinkConfig::lossy(0.05, 0.10, 0.5),
            200,
            Mtu::Mtu4096,
            false,
        );
    }
}

#[test]
fn lossy_link_with_receiver_not_ready() {
    // The receiver posts its receive buffers slowly: the sender meets RNR NAKs (some lost,
    // some duplicated) and must still deliver every SEND exactly once, in order.
    for seed in 30..=33 {
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            ..QpCaps::default()
        };
        let mut s = Sim::new(seed, LinkConfig::lossy(0.1, 0.1, 0.1), caps);
        s.connect(ConnectOpts {
            mtu: Mtu::Mtu512,
            timeout: 8,
            rnr_retry: 7,
            min_rnr_timer: 2,
            ..Default::default()
        });
        let rnr = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let rnr2 = rnr.clone();
        s.link.filter = Some(Box::new(move |_, b| {
            if let Ok(p) = softrdma::wire::Packet::parse(b) {
                if matches!(
                    p.aeth.map(|a| a.syndrome),
                    Some(softrdma::wire::Syndrome::RnrNak { .. })
                ) {
                    rnr2.set(rnr2.get() + 1);
                }
            }
            false
        }));
        let n = 100usize;
        let src = s.ends[0].mem.register(n * 2048, ALL);
        let dst = s.ends[1].mem.register(n * 2048, ALL);
        for i in 0..n {
            let data = pattern(i as u64 + seed, 1 + i * 13 % 1500);
            s.ends[0].mem.write(src.addr + i as u64 * 2048, &data);
            s.ends[0]
                .qp
                .post_send(send_wr(
                    i as u64,
                    SendOp::SendWithImm { imm: i as u32 },
                    vec![src.sge(i as u64 * 2048, data.len() as u32)],
                ))
                .unwrap();
        }
        let mut posted = 0;
        let mut steps = 0;
        while s.ends[0].completions.len() < n {
            steps += 1;
            assert!(steps < 2_000_000, "seed {seed}: livelock");
            if steps % 40 == 0 && posted < n {
                s.ends[1]
                    .qp
                    .post_recv(recv_wr(
                        posted as u64,
                        vec![dst.sge(posted as u64 * 2048, 2048)],
                    ))
                    .unwrap();
                posted += 1;
            }
            s.step();
        }
        assert!(s.run_idle(1_000_000));
        assert!(
            rnr.get() > 10,
            "seed {seed}: the receiver was never not ready ({})",
            rnr.get()
        );
        let sc = s.ends[0].take(CqSide::Send);
        assert!(
            sc.iter()
                .enumerate()
                .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success),
            "seed {seed}: {sc:?}"
        );
        let rc = s.ends[1].take(CqSide::Recv);
        assert_eq!(rc.len(), n);
        for (i, c) in rc.iter().enumerate() {
            let data = pattern(i as u64 + seed, 1 + i * 13 % 1500);
            assert_eq!(
                (c.wr_id, c.status, c.byte_len, c.imm_data),
                (
                    i as u64,
                    WcStatus::Success,
                    data.len() as u32,
                    Some(i as u32)
                )
            );
            same(
                &s.ends[1].mem.read(dst.addr + i as u64 * 2048, data.len()),
                &data,
                seed,
                i,
            );
        }
    }
}

/// Drop the `nth` packet (0-based) whose opcode is `op`, once.
fn drop_nth(s: &mut Sim, op: u8, nth: u32) -> std::rc::Rc<std::cell::Cell<u32>> {
    let seen = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let seen2 = seen.clone();
    s.link.filter = Some(Box::new(move |_, b| {
        if b[0] == op {
            let k = seen2.get();
            seen2.set(k + 1);
            return k == nth;
        }
        false
    }));
    seen
}

#[test]
fn targeted_losses_recover() {
    use softrdma::wire::Opcode;
    // (opcode to drop, which one): first/middle/last read responses, atomic ACK, ACKs,
    // request packets of every position, READ requests.
    let cases: &[(Opcode, u32)] = &[
        (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 0),
        (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1),
        (Opcode::RC_RDMA_READ_RESPONSE_LAST, 0),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, 0),
        (Opcode::RC_ACKNOWLEDGE, 0),
        (Opcode::RC_RDMA_WRITE_MIDDLE, 1),
        (Opcode::RC_SEND_FIRST, 0),
        (Opcode::RC_SEND_MIDDLE, 0),
        (Opcode::RC_SEND_LAST, 0),
        (Opcode::RC_RDMA_WRITE_FIRST, 0),
        (Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 0),
        (Opcode::RC_RDMA_READ_REQUEST, 0),
        (Opcode::RC_RDMA_READ_REQUEST, 1),
        (Opcode::RC_FETCH_ADD, 0),
    ];
    for &(op, nth) in cases {
        let mut s = Sim::new(5, LinkConfig::default(), QpCaps::default());
        s.connect(ConnectOpts {
            mtu: Mtu::Mtu256,
            timeout: 6,
            retry_cnt: 2,
            ..Default::default()
        });
        let seen = drop_nth(&mut s, op.0, nth);
        let l = s.ends[0].mem.register(1 << 16, ALL);
        let r = s.ends[1].mem.register(1 << 16, ALL);
        let data = pattern(op.0 as u64, 1000);
        s.ends[1].mem.write(r.addr, &data);
        s.ends[0].mem.write(l.addr + 8192, &data);
        s.ends[1].mem.write(r.addr + 4096, &10u64.to_ne_bytes());
        s.ends[1]
            .qp
            .post_recv(recv_wr(1, vec![r.sge(16384, 2000)]))
            .unwrap();
        s.ends[1].qp.post_recv(recv_wr(2, vec![])).unwrap();
        let qp = &mut s.ends[0].qp;
        qp.post_send(send_wr(
            1,
            SendOp::RdmaRead {
                remote_addr: r.addr,
                rkey: r.rkey,
            },
            vec![l.sge(0, 1000)],
        ))
        .unwrap();
        qp.post_send(send_wr(
            2,
            SendOp::RdmaRead {
                remote_addr: r.addr,
                rkey: r.rkey,
            },
            vec![l.sge(2048, 100)],
        ))
        .unwrap();
        qp.post_send(send_wr(
            3,
            SendOp::FetchAdd {
                remote_addr: r.addr + 4096,
                rkey: r.rkey,
                add: 5,
            },
            vec![l.sge(4096, 8)],
        ))
        .unwrap();
        qp.post_send(send_wr(4, SendOp::Send, vec![l.sge(8192, 1000)]))
            .unwrap();
        qp.post_send(send_wr(
            5,
            SendOp::RdmaWriteWithImm {
                remote_addr: r.addr + 20000,
                rkey: r.rkey,
                imm: 9,
            },
            vec![l.sge(8192, 1000)],
        ))
        .unwrap();
        assert!(s.run_idle(100_000), "{op:?}");
        assert!(seen.get() > nth, "{op:?} #{nth} never crossed the link");
        let sc = s.ends[0].take(CqSide::Send);
        assert_eq!(
            sc.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "{op:?}"
        );
        same(&s.ends[0].mem.read(l.addr, 1000), &data, 0, 1);
        same(&s.ends[0].mem.read(l.addr + 2048, 100), &data[..100], 0, 2);
        assert_eq!(
            s.ends[0].mem.read(l.addr + 4096, 8),
            10u64.to_ne_bytes().to_vec(),
            "{op:?}: original value"
        );
        assert_eq!(
            s.ends[1].mem.read(r.addr + 4096, 8),
            15u64.to_ne_bytes().to_vec(),
            "{op:?}: fetch-add executed once"
        );
        same(&s.ends[1].mem.read(r.addr + 16384, 1000), &data, 0, 4);
        same(&s.ends[1].mem.read(r.addr + 20000, 1000), &data, 0, 5);
        let rc = s.ends[1].take(CqSide::Recv);
        assert_eq!(
            rc.iter()
                .map(|c| (c.wr_id, c.status, c.byte_len))
                .collect::<Vec<_>>(),
            vec![(1, WcStatus::Success, 1000), (2, WcStatus::Success, 1000)],
            "{op:?}"
        );
    }
}

#[test]
fn lossy_link_one_outstanding_read() {
    // max_rd_atomic 1 on both sides: READs and atomics strictly one at a time.
    let caps = QpCaps {
        max_send_wr: 512,
        ..QpCaps::default()
    };
    let mut s = Sim::new(44, LinkConfig::lossy(0.1, 0.1, 0.1), caps);
    s.connect(ConnectOpts {
        mtu: Mtu::Mtu512,
        timeout: 8,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..Default::default()
    });
    let l = s.ends[0].mem.register(1 << 20, ALL);
    let r = s.ends[1].mem.register(1 << 20, ALL);
    let data = pattern(44, 1 << 20);
    s.ends[1].mem.write(r.addr, &data);
    for i in 0..200u64 {
        let op = if i % 3 == 0 {
            SendOp::FetchAdd {
                remote_addr: r.addr + (1 << 20) - 8,
                rkey: r.rkey,
                add: 1,
            }
        } else {
            SendOp::RdmaRead {
                remote_addr: r.addr + i * 4096,
                rkey: r.rkey,
            }
        };
        let len = if i % 3 == 0 { 8 } else { 4096 };
        s.ends[0]
            .qp
            .post_send(send_wr(i, op, vec![l.sge(i * 4096, len)]))
            .unwrap();
    }
    assert!(s.run_until(2_000_000, |s| s.ends[0].completions.len() == 200));
    assert!(s.ends[0]
        .completions
        .iter()
        .enumerate()
        .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success));
    for i in (0..200u64).filter(|i| i % 3 != 0) {
        same(
            &s.ends[0].mem.read(l.addr + i * 4096, 4096),
            &data[i as usize * 4096..][..4096],
            44,
            i as usize,
        );
    }
    let last = u64::from_ne_bytes(
        s.ends[1]
            .mem
            .read(r.addr + (1 << 20) - 8, 8)
            .try_into()
            .unwrap(),
    );
    let orig = u64::from_ne_bytes(data[(1 << 20) - 8..].try_into().unwrap());
    assert_eq!(
        last,
        orig.wrapping_add(67),
        "67 fetch-adds, each exactly once"
    );
}
