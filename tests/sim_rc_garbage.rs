//! Hostile and nonsensical packets: random parseable packets in every state, responses nobody
//! asked for, requests with PSNs far away. Nothing panics; a healthy connection stays healthy
//! when the garbage cannot be mistaken for its own traffic.

use softrdma::transport::sim::*;
use softrdma::transport::*;
use softrdma::wire::{Aeth, AtomicAckEth, Bth, NakCode, Opcode, Packet, Psn, Reth, Syndrome};

const ALL: AccessFlags = AccessFlags::all();

const RC_OPCODES: [u8; 23] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17,
];

fn drain(s: &mut Sim, side: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    let e = &mut s.ends[side];
    for _ in 0..10_000 {
        match e.qp.poll_transmit(s.now, &e.mem, &mut buf) {
            Some(n) => {
                // Whatever the QP sends must itself be a well-formed packet.
                Packet::parse(&buf[..n]).expect("QP emitted an unparseable packet");
                out.push(buf[..n].to_vec());
            }
            None => break,
        }
    }
    while let Some(c) = e.qp.poll_completion() {
        e.completions.push(c);
    }
    out
}

fn random_packet(rng: &mut XorShift64, qpn: u32, near: Psn) -> Vec<u8> {
    let len = 12 + rng.below(400) as usize;
    let mut b = vec![0u8; len];
    rng.fill(&mut b);
    b[0] = RC_OPCODES[rng.below(RC_OPCODES.len() as u64) as usize];
    b[1] &= 0xf0; // TVer 0
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    if rng.below(10) != 0 {
        b[2..4].copy_from_slice(&[0xff, 0xff]); // mostly the right partition
    }
    let psn = match rng.below(3) {
        0 => near.add(rng.below(8) as u32).sub(4),
        1 => near,
        _ => Psn::new(rng.next_u64() as u32),
    };
    b[9..12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
    b
}

#[test]
fn random_packets_never_panic_in_any_state() {
    for seed in 0..20u64 {
        let mut rng = XorShift64::new(seed);
        let mut s = Sim::new(seed, LinkConfig::default(), QpCaps::default());
        let states = [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Err,
        ];
        let target = states[(seed % 5) as usize];
        if target != QpState::Reset {
            s.connect(ConnectOpts {
                mtu: Mtu::Mtu256,
                psn: [0x10, 0xff_fff0],
                ..Default::default()
            });
        }
        let lmr = s.ends[1].mem.register(1 << 16, ALL);
        let rmr = s.ends[0].mem.register(1 << 16, ALL);
        if target == QpState::Rts {
            // Side 1 has work in flight that garbage may hit.
            for i in 0..4 {
                s.ends[0]
                    .qp
                    .post_recv(recv_wr(i, vec![rmr.sge(0, 4096)]))
                    .unwrap();
            }
            s.ends[1]
                .qp
                .post_send(send_wr(1, SendOp::Send, vec![lmr.sge(0, 1000)]))
                .unwrap();
            s.ends[1]
                .qp
                .post_send(send_wr(
                    2,
                    SendOp::RdmaRead {
                        remote_addr: rmr.addr,
                        rkey: rmr.rkey,
                    },
                    vec![lmr.sge(0, 2000)],
                ))
                .unwrap();
            s.ends[1]
                .qp
                .post_send(send_wr(
                    3,
                    SendOp::FetchAdd {
                        remote_addr: rmr.addr,
                        rkey: rmr.rkey,
                        add: 1,
                    },
                    vec![lmr.sge(0, 8)],
                ))
                .unwrap();
            drain(&mut s, 1);
        }
        if target == QpState::Init || target == QpState::Rtr || target == QpState::Err {
            s.ends[1]
                .qp
                .modify(
                    &QpAttr {
                        qp_state: Some(QpState::Reset),
                        ..Default::default()
                    },
                    s.now,
                )
                .unwrap();
            let st = if target == QpState::Err {
                QpState::Err
            } else {
                QpState::Init
            };
            if st == QpState::Err {
                s.ends[1]
                    .qp
                    .modify(
                        &QpAttr {
                            qp_state: Some(QpState::Err),
                            ..Default::default()
                        },
                        s.now,
                    )
                    .unwrap();
            } else {
                s.ends[1]
                    .qp
                    .modify(
                        &QpAttr {
                            qp_state: Some(QpState::Init),
                            pkey_index: Some(0),
                            port_num: Some(1),
                            qp_access_flags: Some(ALL),
                            ..Default::default()
                        },
                        s.now,
                    )
                    .unwrap();
            }
            if target == QpState::Rtr {
                s.ends[1]
                    .qp
                    .modify(
                        &QpAttr {
                            qp_state: Some(QpState::Rtr),
                            ah_attr: Some(AddressVector::default()),
                            path_mtu: Some(Mtu::Mtu256),
                            dest_qp_num: Some(Sim::QPN[0]),
                            rq_psn: Some(0x10),
                            max_dest_rd_atomic: Some(1),
                            min_rnr_timer: Some(0),
                            ..Default::default()
                        },
                        s.now,
                    )
                    .unwrap();
            }
        }
        let mut sent = 0;
        for i in 0..3000 {
            let near = Psn::new(if i % 2 == 0 { 0x10 } else { 0xff_fff0 });
            let bytes = random_packet(&mut rng, Sim::QPN[1], near);
            if let Ok(pkt) = Packet::parse(&bytes) {
                let e = &mut s.ends[1];
                e.qp.handle_packet(s.now, &pkt, &e.mem);
                sent += 1;
            }
            drain(&mut s, 1);
            if i % 100 == 0 {
                if let Some(t) = s.ends[1].qp.poll_timeout() {
                    s.now = t;
                    s.ends[1].qp.handle_timeout(s.now);
                }
            }
        }
        assert!(sent > 1000, "most random packets should parse ({sent})");
    }
}

/// An RTS pair with nothing outstanding.
fn idle_pair() -> (Sim, MemRegion, MemRegion) {
    let mut s = Sim::new(1, LinkConfig::default(), QpCaps::default());
    s.connect(ConnectOpts {
        psn: [0x100, 0x200],
        ..Default::default()
    });
    let a = s.ends[0].mem.register(8192, ALL);
    let b = s.ends[1].mem.register(8192, ALL);
    (s, a, b)
}

fn inject(s: &mut Sim, side: usize, pkt: Packet<'_>) {
    let mut buf = vec![0u8; 8192];
    let n = pkt.emit(&mut buf).unwrap();
    let p = Packet::parse(&buf[..n]).unwrap();
    let e = &mut s.ends[side];
    e.qp.handle_packet(s.now, &p, &e.mem);
}

fn works_after(s: &mut Sim, a: &MemRegion, b: &MemRegion) {
    s.ends[0].mem.write(a.addr, &pattern(77, 3000));
    s.ends[0]
        .qp
        .post_send(send_wr(
            42,
            SendOp::RdmaWrite {
                remote_addr: b.addr,
                rkey: b.rkey,
            },
            vec![a.sge(0, 3000)],
        ))
        .unwrap();
    assert!(s.run_idle(100_000));
    let c = s.ends[0].take(CqSide::Send);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(42, WcStatus::Success)]
    );
    assert_eq!(s.ends[1].mem.read(b.addr, 3000), pattern(77, 3000));
}

#[test]
fn responses_nobody_asked_for_are_ignored() {
    let (mut s, a, b) = idle_pair();
    let qpn = Sim::QPN[0];
    for psn in [0x0ffu32, 0x100, 0x101, 0x7f_ffff, 0x80_0100, 0] {
        let psn = Psn::new(psn);
        for syn in [
            Syndrome::Ack { credits: 0x1f },
            Syndrome::RnrNak { timer: 3 },
            Syndrome::Nak(NakCode::PsnSequenceError),
            Syndrome::Nak(NakCode::InvalidRequest),
            Syndrome::Nak(NakCode::RemoteAccessError),
            Syndrome::Nak(NakCode::RemoteOperationalError),
            Syndrome::Reserved(0x40),
        ] {
            let mut p = Packet::new(Bth::new(Opcode::RC_ACKNOWLEDGE, qpn, psn), &[]);
            p.aeth = Some(Aeth {
                syndrome: syn,
                msn: 5,
            });
            inject(&mut s, 0, p);
        }
        let data = [1u8; 64];
        for op in [
            Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        ] {
            let mut p = Packet::new(Bth::new(op, qpn, psn), &data);
            p.aeth = Some(Aeth {
                syndrome: Syndrome::Ack { credits: 0 },
                msn: 1,
            });
            inject(&mut s, 0, p);
        }
        let mut p = Packet::new(Bth::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, qpn, psn), &[]);
        p.atomic_ack_eth = Some(AtomicAckEth { orig: 9 });
        inject(&mut s, 0, p);
    }
    // Packets for another QP number are not ours.
    let mut p = Packet::new(
        Bth::new(Opcode::RC_ACKNOWLEDGE, qpn + 1, Psn::new(0x100)),
        &[],
    );
    p.aeth = Some(Aeth {
        syndrome: Syndrome::Nak(NakCode::InvalidRequest),
        msn: 0,
    });
    inject(&mut s, 0, p);
    // And packets from another partition are dropped, however they look.
    let mut p = Packet::new(Bth::new(Opcode::RC_ACKNOWLEDGE, qpn, Psn::new(0x100)), &[]);
    p.bth.pkey = 0x8001;
    p.aeth = Some(Aeth {
        syndrome: Syndrome::Nak(NakCode::InvalidRequest),
        msn: 0,
    });
    inject(&mut s, 0, p);
    assert_eq!(s.ends[0].qp.state(), QpState::Rts);
    assert!(drain(&mut s, 0).is_empty(), "nothing to answer");
    assert!(s.ends[0].completions.is_empty());
    assert_eq!(s.ends[0].qp.poll_timeout(), None);
    works_after(&mut s, &a, &b);
}

#[test]
fn responses_for_unsent_psns_while_busy_are_ignored() {
    let (mut s, a, b) = idle_pair();
    s.link.blackhole = [true, true];
    s.ends[0]
        .qp
        .post_send(send_wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: b.addr,
                rkey: b.rkey,
            },
            vec![a.sge(0, 100)],
        ))
        .unwrap();
    s.step();
    // PSN 0x100 is outstanding; acknowledge PSNs beyond what was sent, and old ones.
    for psn in [0x101u32, 0x150, 0xff] {
        let mut p = Packet::new(
            Bth::new(Opcode::RC_ACKNOWLEDGE, Sim::QPN[0], Psn::new(psn)),
            &[],
        );
        p.aeth = Some(Aeth {
            syndrome: Syndrome::Ack { credits: 0x1f },
            msn: 0,
        });
        inject(&mut s, 0, p);
        let mut p = Packet::new(
            Bth::new(Opcode::RC_ACKNOWLEDGE, Sim::QPN[0], Psn::new(psn)),
            &[],
        );
        p.aeth = Some(Aeth {
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn: 0,
        });
        inject(&mut s, 0, p);
    }
    assert!(s.ends[0].qp.poll_completion().is_none());
    assert_eq!(s.ends[0].qp.state(), QpState::Rts);
    s.link.blackhole = [false, false];
    assert!(s.run_idle(100_000));
    let c = s.ends[0].take(CqSide::Send);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
}

#[test]
fn requests_with_far_away_psns() {
    let (mut s, a, b) = idle_pair();
    let qpn = Sim::QPN[1];
    // Side 1 expects PSN 0x100 from side 0.
    let data = [5u8; 16];
    let mut nak = 0;
    for psn in [0x101u32, 0x7000, 0x80_00ff, 0x10_0000] {
        let mut p = Packet::new(
            Bth::new(Opcode::RC_RDMA_WRITE_ONLY, qpn, Psn::new(psn)),
            &data,
        );
        p.reth = Some(Reth {
            va: b.addr,
            rkey: b.rkey,
            dma_len: 16,
        });
        p.bth.ack_req = true;
        inject(&mut s, 1, p);
        for bytes in drain(&mut s, 1) {
            let r = Packet::parse(&bytes).unwrap();
            let aeth = r.aeth.unwrap();
            if aeth.syndrome == Syndrome::Nak(NakCode::PsnSequenceError) {
                assert_eq!(r.bth.psn, Psn::new(0x100));
                nak += 1;
            }
        }
    }
    assert_eq!(
        nak, 1,
        "one sequence NAK, then silence until back in sequence"
    );
    // Nothing was written by out-of-sequence or duplicate-looking garbage.
    assert_eq!(s.ends[1].mem.read(b.addr, 16), vec![0; 16]);
    assert_eq!(s.ends[1].qp.state(), QpState::Rts);
    // A duplicate READ that matches no remembered READ is dropped silently.
    let mut p = Packet::new(
        Bth::new(Opcode::RC_RDMA_READ_REQUEST, qpn, Psn::new(0xf0)),
        &[],
    );
    p.reth = Some(Reth {
        va: b.addr,
        rkey: b.rkey,
        dma_len: 64,
    });
    inject(&mut s, 1, p);
    // And a duplicate atomic with nothing saved is not executed.
    let mut p = Packet::new(Bth::new(Opcode::RC_FETCH_ADD, qpn, Psn::new(0xf1)), &[]);
    p.atomic_eth = Some(softrdma::wire::AtomicEth {
        va: b.addr,
        rkey: b.rkey,
        swap_add: 1,
        compare: 0,
    });
    inject(&mut s, 1, p);
    assert!(drain(&mut s, 1)
        .iter()
        .all(|b| Packet::parse(b).unwrap().bth.opcode == Opcode::RC_ACKNOWLEDGE));
    assert_eq!(s.ends[1].mem.read(b.addr, 16), vec![0; 16]);
    works_after(&mut s, &a, &b);
}

#[test]
fn wrong_opcode_sequence_is_invalid_request() {
    let (mut s, _a, b) = idle_pair();
    let qpn = Sim::QPN[1];
    let data = [5u8; 1024];
    // A MIDDLE without a FIRST, in sequence.
    let p = Packet::new(
        Bth::new(Opcode::RC_SEND_MIDDLE, qpn, Psn::new(0x100)),
        &data,
    );
    s.ends[1]
        .qp
        .post_recv(recv_wr(1, vec![b.sge(0, 4096)]))
        .unwrap();
    inject(&mut s, 1, p);
    let out = drain(&mut s, 1);
    assert_eq!(out.len(), 1);
    let r = Packet::parse(&out[0]).unwrap();
    assert_eq!(
        r.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    assert_eq!(r.bth.psn, Psn::new(0x100));
    assert_eq!(s.ends[1].qp.state(), QpState::Err);
    assert_eq!(
        s.ends[1]
            .take(CqSide::Recv)
            .iter()
            .map(|c| c.status)
            .collect::<Vec<_>>(),
        vec![WcStatus::WrFlushErr]
    );
}
