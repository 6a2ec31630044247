//! Unreliable Connected QPs over the seeded simulated link (`transport::sim`, `Sim::new_uc`).
//!
//! Lossless: every SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM of many packets
//! arrives, in order, with the right data and completions, both ways.
//! Lossy: the link drops packets (chosen by a seeded filter that records which PSNs it dropped),
//! so the test knows which messages lost a packet. Exactly the messages that lost nothing
//! complete at the receiver, in order and intact; a message that lost a packet produces no
//! completion and consumes no receive WQE; every send completes successfully anyway (UC has no
//! acknowledgements).
//! Duplicating and reordering too: whatever completes is an intact message.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use softrdma::transport::sim::*;
use softrdma::transport::*;
use softrdma::wire::{Packet, Psn};

const ALL: AccessFlags = AccessFlags::all();
/// Bytes per message slot in the source, receive and WRITE target regions.
const SLOT: u64 = 6000;
/// First PSN of side 0 and side 1: both wrap through 2^24 during the runs.
const PSN: [u32; 2] = [0xff_ffc0, 0xff_ffe0];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
}

impl Kind {
    /// Whether the message consumes a receive WQE and produces a receive completion.
    fn completes(self) -> bool {
        self != Kind::Write
    }
}

/// One message sent from side `from`.
#[derive(Debug)]
struct Msg {
    kind: Kind,
    data: Vec<u8>,
    solicited: bool,
    /// Its PSNs on the wire: `first .. first + npkts`.
    first: Psn,
    npkts: u32,
}

/// The regions of one side.
#[derive(Clone, Copy)]
struct Regions {
    /// What this side sends from.
    src: MemRegion,
    /// Receive buffers, one slot per receive WQE.
    recv: MemRegion,
    /// RDMA WRITE targets, one slot per message index.
    target: MemRegion,
}

fn regions(s: &mut Sim<UcQp>, n: usize) -> [Regions; 2] {
    let mk = |m: &VecMemory| Regions {
        src: m.register(n * SLOT as usize, ALL),
        recv: m.register(n * SLOT as usize, ALL),
        target: m.register(n * SLOT as usize, ALL),
    };
    [mk(&s.ends[0].mem), mk(&s.ends[1].mem)]
}

/// Post `n` random messages from side `a` to side `b`, and as many receive WQEs at `b` as
/// there are messages that complete there (wr_id = WQE index, one receive slot each).
fn post_traffic(
    s: &mut Sim<UcQp>,
    r: &[Regions; 2],
    a: usize,
    n: usize,
    seed: u64,
    mtu: Mtu,
    kinds: &[Kind],
) -> Vec<Msg> {
    let b = 1 - a;
    let mut rng = XorShift64::new(seed * 131 + a as u64);
    let mut psn = Psn::new(PSN[a]);
    let mut msgs = Vec::new();
    let mut recvs = 0u64;
    for i in 0..n {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let mut len = match rng.below(4) {
            0 => 0,
            1 => rng.below(64) as usize,
            _ => rng.below(5000) as usize,
        };
        if kind == Kind::Send {
            // A plain SEND names its message index in its first 4 bytes.
            len = len.max(4);
        }
        let mut data = pattern(seed ^ (i as u64) << 12 ^ a as u64, len);
        if kind == Kind::Send {
            data[..4].copy_from_slice(&(i as u32).to_le_bytes());
        }
        let off = i as u64 * SLOT;
        s.ends[a].mem.write(r[a].src.addr + off, &data);
        let remote_addr = r[b].target.addr + off;
        let rkey = r[b].target.rkey;
        let op = match kind {
            Kind::Send => SendOp::Send,
            Kind::SendImm => SendOp::SendWithImm { imm: i as u32 },
            Kind::Write => SendOp::RdmaWrite { remote_addr, rkey },
            Kind::WriteImm => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: i as u32,
            },
        };
        if kind.completes() {
            let k = recvs;
            recvs += 1;
            s.ends[b]
                .qp
                .post_recv(recv_wr(k, vec![r[b].recv.sge(k * SLOT, SLOT as u32)]))
                .unwrap();
        }
        // Two SGEs for good measure.
        let h = len as u32 / 2;
        let mut wr = send_wr(
            i as u64,
            op,
            vec![
                r[a].src.sge(off, h),
                r[a].src.sge(off + h as u64, len as u32 - h),
            ],
        );
        let solicited = rng.below(2) == 0;
        wr.flags.set(SendFlags::SOLICITED, solicited);
        s.ends[a].qp.post_send(wr).unwrap();
        let npkts = (len.div_ceil(mtu.bytes()) as u32).max(1);
        msgs.push(Msg {
            kind,
            data,
            solicited,
            first: psn,
            npkts,
        });
        psn = psn.add(npkts);
    }
    msgs
}

fn new_sim(seed: u64, cfg: LinkConfig, mtu: Mtu) -> Sim<UcQp> {
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        ..QpCaps::default()
    };
    let mut s = Sim::new_uc(seed, cfg, caps);
    s.connect_uc(ConnectOpts {
        mtu,
        access: ALL,
        psn: PSN,
        ..Default::default()
    });
    s
}

/// Run until both sides completed all their sends, then until idle.
fn run(s: &mut Sim<UcQp>, sent: [usize; 2], what: &str) {
    let done = s.run_until(10_000_000, |s| {
        (0..2).all(|i| {
            s.ends[i]
                .completions
                .iter()
                .filter(|c| c.side == CqSide::Send)
                .count()
                >= sent[i]
        })
    });
    assert!(done, "{what}: sends not done, link {:?}", s.link.stats);
    assert!(s.run_idle(1_000_000), "{what}: never idle");
}

/// The sender's view: every WR completed successfully, in order, with its opcode and length.
fn check_sends(s: &mut Sim<UcQp>, a: usize, msgs: &[Msg], what: &str) {
    let sc = s.ends[a].take(CqSide::Send);
    assert_eq!(sc.len(), msgs.len(), "{what}: send completions");
    for (i, (c, m)) in sc.iter().zip(msgs).enumerate() {
        let op = match m.kind {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            _ => WcOpcode::RdmaWrite,
        };
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len),
            (i as u64, WcStatus::Success, op, m.data.len() as u32),
            "{what}: send completion {i}"
        );
    }
}

/// The receiver's view: the message index of each receive completion, after checking that the
/// completion and the data it announces are exactly those of that message. Receive WQEs are
/// consumed in order, one per completion, none skipped.
fn check_receives(
    s: &mut Sim<UcQp>,
    r: &[Regions; 2],
    b: usize,
    msgs: &[Msg],
    what: &str,
) -> Vec<usize> {
    let rc = s.ends[b].take(CqSide::Recv);
    let mem = &s.ends[b].mem;
    let mut got = Vec::new();
    for (k, c) in rc.iter().enumerate() {
        assert_eq!(c.status, WcStatus::Success, "{what}: receive {k}: {c:?}");
        assert_eq!(c.wr_id, k as u64, "{what}: a receive WQE was skipped");
        assert_eq!(c.src_qp, Sim::QPN[1 - b]);
        let slot = r[b].recv.addr + k as u64 * SLOT;
        let i = match c.imm_data {
            Some(imm) => imm as usize,
            None => u32::from_le_bytes(mem.read(slot, 4).try_into().unwrap()) as usize,
        };
        let m = &msgs[i];
        let len = m.data.len();
        assert_eq!(c.byte_len as usize, len, "{what}: message {i} length");
        match m.kind {
            Kind::Send => assert_eq!(c.imm_data, None),
            Kind::SendImm | Kind::WriteImm => assert_eq!(c.imm_data, Some(i as u32)),
            Kind::Write => panic!("{what}: a plain WRITE completed at the receiver"),
        }
        let (opcode, at) = match m.kind {
            Kind::WriteImm => (
                WcOpcode::RecvRdmaWithImm,
                r[b].target.addr + i as u64 * SLOT,
            ),
            _ => (WcOpcode::Recv, slot),
        };
        assert_eq!(c.opcode, opcode, "{what}: message {i}");
        assert_eq!(c.solicited, m.solicited, "{what}: message {i}");
        if mem.read(at, len) != m.data {
            panic!(
                "{what}: message {i} ({:?}, {len} bytes) completed with other data",
                m.kind
            );
        }
        got.push(i);
    }
    got
}

#[test]
fn lossless_messages_of_every_kind_arrive_in_order_both_ways() {
    let kinds = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm];
    for (seed, mtu) in [(1, Mtu::Mtu256), (2, Mtu::Mtu1024), (3, Mtu::Mtu4096)] {
        let what = format!("seed {seed} {mtu:?}");
        let n = 150;
        let mut s = new_sim(seed, LinkConfig::default(), mtu);
        let r = regions(&mut s, n);
        let m0 = post_traffic(&mut s, &r, 0, n, seed, mtu, &kinds);
        let m1 = post_traffic(&mut s, &r, 1, n, seed + 100, mtu, &kinds);
        run(&mut s, [n, n], &what);
        for (a, msgs) in [(0, &m0), (1, &m1)] {
            let b = 1 - a;
            check_sends(&mut s, a, msgs, &what);
            let got = check_receives(&mut s, &r, b, msgs, &what);
            let want: Vec<usize> = (0..n).filter(|&i| msgs[i].kind.completes()).collect();
            assert_eq!(got, want, "{what}: every message, in order");
            // Plain WRITEs landed too.
            for (i, m) in msgs.iter().enumerate() {
                if m.kind == Kind::Write {
                    let at = r[b].target.addr + i as u64 * SLOT;
                    assert!(
                        s.ends[b].mem.read(at, m.data.len()) == m.data,
                        "{what}: write {i}"
                    );
                }
            }
            assert_eq!(s.ends[b].qp.drops(), UcDrops::default(), "{what}");
        }
        // Multi-packet messages were in the mix, and the PSNs wrapped.
        assert!(m0.iter().any(|m| m.npkts > 1), "{what}");
        assert!(
            s.ends[0].qp.query().sq_psn.unwrap() < PSN[0],
            "{what}: PSN wrapped"
        );
    }
}

/// A drop filter that loses a packet toward side 1 with probability `p`, recording its PSN.
fn recording_filter(seed: u64, p: f64, dropped: Rc<RefCell<BTreeSet<u32>>>) -> DropFilter {
    let mut rng = XorShift64::new(seed ^ 0x5eed);
    Box::new(move |to, data| {
        if to != 1 || !rng.chance(p) {
            return false;
        }
        let psn = Packet::parse(data).expect("a valid packet").bth.psn.value();
        dropped.borrow_mut().insert(psn);
        true
    })
}

#[test]
fn loss_drops_exactly_the_messages_that_lost_a_packet() {
    let kinds = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm];
    for (seed, mtu, p) in [
        (11, Mtu::Mtu256, 0.02),
        (12, Mtu::Mtu1024, 0.05),
        (13, Mtu::Mtu256, 0.10),
        (14, Mtu::Mtu4096, 0.20),
    ] {
        let what = format!("seed {seed} {mtu:?} loss {p}");
        let n = 300;
        let mut s = new_sim(seed, LinkConfig::default(), mtu);
        let dropped = Rc::new(RefCell::new(BTreeSet::new()));
        s.link.filter = Some(recording_filter(seed, p, dropped.clone()));
        let r = regions(&mut s, n);
        let msgs = post_traffic(&mut s, &r, 0, n, seed, mtu, &kinds);
        run(&mut s, [n, 0], &what);
        // The sender saw no loss: UC completes at transmission.
        check_sends(&mut s, 0, &msgs, &what);
        let dropped = dropped.borrow();
        assert!(!dropped.is_empty(), "{what}: the filter dropped nothing");
        let intact = |m: &Msg| (0..m.npkts).all(|k| !dropped.contains(&m.first.add(k).value()));
        let got = check_receives(&mut s, &r, 1, &msgs, &what);
        let want: Vec<usize> = (0..n)
            .filter(|&i| msgs[i].kind.completes() && intact(&msgs[i]))
            .collect();
        assert_eq!(
            got, want,
            "{what}: exactly the intact messages complete, in order"
        );
        let lost = (0..n).filter(|&i| !intact(&msgs[i])).count();
        assert!(
            lost > 0 && got.len() > n / 4,
            "{what}: lost {lost}, got {}",
            got.len()
        );
        // Plain WRITEs that lost nothing landed whole.
        for (i, m) in msgs.iter().enumerate() {
            if m.kind == Kind::Write && intact(m) {
                let at = r[1].target.addr + i as u64 * SLOT;
                assert!(
                    s.ends[1].mem.read(at, m.data.len()) == m.data,
                    "{what}: write {i}"
                );
            }
        }
        let d = s.ends[1].qp.drops();
        assert_eq!(
            (d.invalid, d.no_wqe, d.access, d.length),
            (0, 0, 0, 0),
            "{what}"
        );
        assert!(d.broken > 0, "{what}: {d:?}");
        assert_eq!(s.ends[1].qp.state(), QpState::Rts);
    }
}

#[test]
fn duplication_and_reordering_never_complete_a_corrupted_message() {
    let kinds = [Kind::Send, Kind::SendImm, Kind::WriteImm];
    for seed in 21..25 {
        let what = format!("seed {seed}");
        let n = 200;
        let mtu = Mtu::Mtu256;
        let mut s = new_sim(seed, LinkConfig::lossy(0.03, 0.05, 0.2), mtu);
        let r = regions(&mut s, n);
        let msgs = post_traffic(&mut s, &r, 0, n, seed, mtu, &kinds);
        run(&mut s, [n, 0], &what);
        check_sends(&mut s, 0, &msgs, &what);
        // Every completion is one intact message (a duplicated or late FIRST/ONLY may start a
        // message again, as in rxe, so neither order nor uniqueness is asserted here).
        let got = check_receives(&mut s, &r, 1, &msgs, &what);
        assert!(got.len() > n / 4, "{what}: only {} arrived", got.len());
        let d = s.ends[1].qp.drops();
        assert!(d.broken > 0 && s.link.stats.duplicated > 0, "{what}: {d:?}");
    }
}

#[test]
fn read_and_atomics_are_refused_on_uc() {
    let mut s = new_sim(1, LinkConfig::default(), Mtu::Mtu1024);
    let sge = Sge {
        addr: 0,
        length: 8,
        lkey: 1,
    };
    for op in [
        SendOp::RdmaRead {
            remote_addr: 0x1000,
            rkey: 1,
        },
        SendOp::CompareSwap {
            remote_addr: 0x1000,
            rkey: 1,
            compare: 0,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: 0x1000,
            rkey: 1,
            add: 1,
        },
    ] {
        assert_eq!(
            s.ends[0].qp.post_send(send_wr(1, op, vec![sge])),
            Err(PostError::UnsupportedOp),
            "{op:?}"
        );
    }
    assert!(s.run_idle(100));
    assert_eq!(s.link.stats.sent, 0);
    assert!(s.ends[0].completions.is_empty());
}
