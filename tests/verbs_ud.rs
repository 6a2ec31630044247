//! UD queue pairs through the Verbs API, between two contexts over loopback (127.0.0.x each):
//! SENDs both ways with the GRH area and `src_qp`, immediate data, Q_Key checks, an AH built
//! from a received completion, and the errors a post or an AH can get.
mod verbs_util;

use std::time::{Duration, Instant};

use softrdma::transport::{
    AccessFlags, PostError, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcOpcode, WcStatus,
};
use softrdma::verbs::{
    AddressHandle, AhAttr, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr,
    QpType, QueuePair, RecvWr, SendWr, UdSendWr, VerbsError, WorkCompletion, GRH_LEN,
};
use verbs_util::{loopback_ctx, wait_cq};

const QKEY: u32 = 0x1111_1111;

struct UdEnd {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

impl UdEnd {
    /// A UD QP in RTS with Q_Key `qkey`, and a 64 KiB MR.
    fn new(qkey: u32) -> UdEnd {
        let e = UdEnd::reset();
        e.to_rts(qkey);
        e
    }

    fn reset() -> UdEnd {
        let ctx = loopback_ctx();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps::default(),
                qp_type: QpType::Ud,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        let mr = pd.alloc_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
        UdEnd {
            ctx,
            pd,
            cq,
            qp,
            mr,
        }
    }

    fn to_init(&self, qkey: u32) {
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qkey: Some(qkey),
                ..Default::default()
            })
            .unwrap();
    }

    fn to_rts(&self, qkey: u32) {
        self.to_init(qkey);
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            })
            .unwrap();
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(0x1234),
                ..Default::default()
            })
            .unwrap();
    }

    /// An AH toward `peer`'s GID.
    fn ah_to(&self, peer: &UdEnd) -> AddressHandle {
        self.pd
            .create_ah(&AhAttr {
                dgid: peer.ctx.gid(),
                sgid_index: 0,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            })
            .unwrap()
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    fn post_recv(&self, wr_id: u64, off: usize, len: usize) {
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: &[self.sge(off, len)],
            }])
            .unwrap();
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        wr_id: u64,
        op: SendOp,
        off: usize,
        len: usize,
        ah: &AddressHandle,
        qpn: u32,
        qkey: u32,
    ) -> softrdma::verbs::Result<()> {
        self.qp.post_send_ud(&[UdSendWr {
            wr_id,
            op,
            sg_list: &[self.sge(off, len)],
            flags: SendFlags::SIGNALED,
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        }])
    }

    fn wait(&self) -> WorkCompletion {
        wait_cq(&self.cq)
    }

    /// Poll for `d`; panics on any completion.
    fn expect_nothing(&self, d: Duration) {
        let t0 = Instant::now();
        let mut wc = [WorkCompletion::default()];
        while t0.elapsed() < d {
            let n = self.cq.poll(&mut wc).unwrap();
            assert_eq!(n, 0, "unexpected completion {:?}", wc[0]);
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn ipv4_of(gid: [u8; 16]) -> [u8; 4] {
    softrdma::verbs::ipv4_from_gid(&gid).unwrap().octets()
}

#[test]
fn ud_send_both_ways_with_grh_src_qp_and_immediate() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(QKEY);
    assert_eq!(a.qp.qp_type(), QpType::Ud);
    let ah_ab = a.ah_to(&b);

    // A -> B: payload lands after the 40-byte GRH area.
    a.mr.write(0, b"hello over UD").unwrap();
    b.post_recv(7, 0, 4096 + GRH_LEN);
    a.send(1, SendOp::Send, 0, 13, &ah_ab, b.qp.qp_num(), QKEY)
        .unwrap();
    let wc = a.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.grh),
        (1, WcStatus::Success, WcOpcode::Send, None)
    );
    let wc = b.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, (GRH_LEN + 13) as u32)
    );
    assert_eq!((wc.src_qp, wc.qp_num), (a.qp.qp_num(), b.qp.qp_num()));
    assert_eq!(wc.imm_data, None);
    let grh = wc.grh.expect("a UD receive carries the GRH");
    assert_eq!(grh.sgid, a.ctx.gid());
    {
        let m = b.mr.lock().unwrap();
        assert_eq!(&m[GRH_LEN..GRH_LEN + 13], b"hello over UD");
        // RoCEv2/IPv4: 20 zero bytes, then the IPv4 header (source address at its bytes 12..16).
        assert!(m[..20].iter().all(|&x| x == 0));
        assert_eq!(m[20] >> 4, 4);
        assert_eq!(m[32..36], ipv4_of(a.ctx.gid()));
        assert_eq!(m[36..40], ipv4_of(b.ctx.gid()));
    }

    // B -> A with immediate data, to an AH built from the completion (ibv_init_ah_from_wc).
    let ah_ba = b.pd.create_ah_from_wc(1, &wc).unwrap();
    assert_eq!(ah_ba.attr().dgid, a.ctx.gid());
    let ah_ba2 = AddressHandle::from_completion(&b.pd, 1, &wc).unwrap();
    assert_eq!(ah_ba2.attr(), ah_ba.attr());
    b.mr.write(1000, b"reply").unwrap();
    a.post_recv(9, 8192, 100);
    b.send(
        2,
        SendOp::SendWithImm { imm: 0xdead_beef },
        1000,
        5,
        &ah_ba,
        wc.src_qp,
        QKEY,
    )
    .unwrap();
    assert_eq!(b.wait().status, WcStatus::Success);
    let wc = a.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data, wc.src_qp),
        (
            9,
            WcStatus::Success,
            (GRH_LEN + 5) as u32,
            Some(0xdead_beef),
            b.qp.qp_num()
        )
    );
    assert_eq!(wc.grh.unwrap().sgid, b.ctx.gid());
    assert_eq!(
        &a.mr.lock().unwrap()[8192 + GRH_LEN..8192 + GRH_LEN + 5],
        b"reply"
    );

    // A zero-byte message: just the GRH area.
    b.post_recv(10, 0, 64);
    a.send(3, SendOp::Send, 0, 0, &ah_ab, b.qp.qp_num(), QKEY)
        .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!((wc.wr_id, wc.byte_len), (10, GRH_LEN as u32));

    // A full-MTU message (loopback's port MTU is 4096).
    let mtu = a.ctx.query_port(1).unwrap().active_mtu.bytes();
    b.post_recv(11, 0, mtu + GRH_LEN);
    a.send(4, SendOp::Send, 0, mtu, &ah_ab, b.qp.qp_num(), QKEY)
        .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(b.wait().byte_len as usize, mtu + GRH_LEN);
}

#[test]
fn one_ud_qp_talks_to_two_peers() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(QKEY);
    let c = UdEnd::new(QKEY);
    let (ah_b, ah_c) = (a.ah_to(&b), a.ah_to(&c));
    b.post_recv(1, 0, 200);
    c.post_recv(2, 0, 200);
    a.mr.write(0, b"to b").unwrap();
    a.mr.write(100, b"to c").unwrap();
    // Two WRs in one post, each to its own address.
    a.qp.post_send_ud(&[
        UdSendWr {
            wr_id: 10,
            op: SendOp::Send,
            sg_list: &[a.sge(0, 4)],
            flags: SendFlags::default(),
            ah: &ah_b,
            remote_qpn: b.qp.qp_num(),
            remote_qkey: QKEY,
        },
        UdSendWr {
            wr_id: 11,
            op: SendOp::Send,
            sg_list: &[a.sge(100, 4)],
            flags: SendFlags::SIGNALED,
            ah: &ah_c,
            remote_qpn: c.qp.qp_num(),
            remote_qkey: QKEY,
        },
    ])
    .unwrap();
    assert_eq!(a.wait().wr_id, 11, "only the signaled WR completes");
    assert_eq!(b.wait().src_qp, a.qp.qp_num());
    assert_eq!(c.wait().src_qp, a.qp.qp_num());
    assert_eq!(&b.mr.lock().unwrap()[GRH_LEN..GRH_LEN + 4], b"to b");
    assert_eq!(&c.mr.lock().unwrap()[GRH_LEN..GRH_LEN + 4], b"to c");
}

#[test]
fn qkey_mismatch_is_dropped_and_high_bit_uses_own_qkey() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(QKEY);
    let ah = a.ah_to(&b);
    b.post_recv(1, 0, 200);
    // Wrong Q_Key: the sender completes, the receiver sees nothing and keeps its WQE.
    a.send(1, SendOp::Send, 0, 8, &ah, b.qp.qp_num(), 0x2222_2222)
        .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    b.expect_nothing(Duration::from_millis(300));
    // The high bit: A's own Q_Key (QKEY) goes on the wire, which B accepts.
    a.send(2, SendOp::Send, 0, 8, &ah, b.qp.qp_num(), 0x8000_0000)
        .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.src_qp),
        (1, WcStatus::Success, a.qp.qp_num())
    );
    // A QP whose own Q_Key differs: its high-bit sends are refused by B.
    let c = UdEnd::new(0x3333_3333);
    let ah_cb = c.ah_to(&b);
    b.post_recv(2, 0, 200);
    c.send(3, SendOp::Send, 0, 8, &ah_cb, b.qp.qp_num(), 0x8000_0000)
        .unwrap();
    assert_eq!(c.wait().status, WcStatus::Success);
    b.expect_nothing(Duration::from_millis(300));
    // Q_Key can change in RTS.
    b.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        qkey: Some(0x3333_3333),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(b.qp.query().unwrap().qkey, Some(0x3333_3333));
    c.send(4, SendOp::Send, 0, 8, &ah_cb, b.qp.qp_num(), 0x8000_0000)
        .unwrap();
    assert_eq!(c.wait().status, WcStatus::Success);
    assert_eq!(b.wait().src_qp, c.qp.qp_num());
}

#[test]
fn packets_to_qp1_never_reach_an_application_ud_qp() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(0x8001_0000); // the GSI Q_Key, as a GSI sender would use
    let ah = a.ah_to(&b);
    b.post_recv(1, 0, 300);
    // a and b share the loopback device's address with other tests' contexts: QP1 packets
    // are steered by the MAD's remote communication ID (its top byte is the owner's slot, the
    // top byte of its QPNs), so address this one to b's.
    let mut mad = [0u8; 256];
    mad[28] = (b.qp.qp_num() >> 16) as u8; // data offset 4 of the MAD: remote comm ID
    a.mr.write(0, &mad).unwrap();
    let gsi = || b.ctx.stats().unwrap().rx_gsi;
    let before = gsi();
    a.send(1, SendOp::Send, 0, 256, &ah, 1, 0x8001_0000)
        .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    b.expect_nothing(Duration::from_millis(300));
    let t0 = Instant::now();
    // It reached the endpoint, where the GSI QP (the CM) took it.
    while gsi() == before {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the QP1 packet never arrived"
        );
        b.ctx.drive();
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn message_larger_than_mtu_is_refused_at_post() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(QKEY);
    let ah = a.ah_to(&b);
    let mtu = a.ctx.query_port(1).unwrap().active_mtu.bytes();
    let e = a
        .send(1, SendOp::Send, 0, mtu + 1, &ah, b.qp.qp_num(), QKEY)
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Post {
                index: 0,
                error: PostError::MessageTooLong(n)
            } if n == mtu as u64 + 1
        ),
        "{e:?}"
    );
    assert_eq!(e.errno(), libc::EINVAL);
    // Nothing was queued, nothing completes; the QP still works.
    a.expect_nothing(Duration::from_millis(50));
    b.post_recv(1, 0, 100);
    a.send(2, SendOp::Send, 0, 10, &ah, b.qp.qp_num(), QKEY)
        .unwrap();
    assert_eq!(a.wait().wr_id, 2);
    assert_eq!(b.wait().status, WcStatus::Success);
}

#[test]
fn posting_in_the_wrong_state_or_with_the_wrong_api_fails() {
    let peer = UdEnd::new(QKEY);
    let a = UdEnd::reset();
    let ah = a.ah_to(&peer);
    // RESET: no receives, no sends.
    assert!(matches!(
        a.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[a.sge(0, 100)],
        }]),
        Err(VerbsError::Post {
            error: PostError::InvalidState(QpState::Reset),
            ..
        })
    ));
    let send = |a: &UdEnd| a.send(1, SendOp::Send, 0, 8, &ah, peer.qp.qp_num(), QKEY);
    assert!(matches!(
        send(&a),
        Err(VerbsError::Post {
            error: PostError::InvalidState(QpState::Reset),
            ..
        })
    ));
    // INIT: receives yes, sends no.
    a.to_init(QKEY);
    a.post_recv(1, 0, 100);
    assert!(matches!(
        send(&a),
        Err(VerbsError::Post {
            error: PostError::InvalidState(QpState::Init),
            ..
        })
    ));
    // RC-only attributes are refused on UD.
    assert!(a
        .qp
        .modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(softrdma::transport::Mtu::Mtu1024),
            ..Default::default()
        })
        .is_err());
    // RTS needs sq_psn.
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    assert!(a
        .qp
        .modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            ..Default::default()
        })
        .is_err());
    // The RC post_send has no destination: refused on a UD QP.
    let e =
        a.qp.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[a.sge(0, 8)],
            flags: SendFlags::default(),
        }])
        .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    // Only SEND and SEND_WITH_IMM exist on UD.
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(1),
        ..Default::default()
    })
    .unwrap();
    let q = a.qp.query().unwrap();
    assert_eq!(
        (q.qp_state, q.qkey, q.sq_psn, q.port_num),
        (Some(QpState::Rts), Some(QKEY), Some(1), Some(1))
    );
    let e =
        a.qp.post_send_ud(&[UdSendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            sg_list: &[a.sge(0, 8)],
            flags: SendFlags::default(),
            ah: &ah,
            remote_qpn: peer.qp.qp_num(),
            remote_qkey: QKEY,
        }])
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Post {
                error: PostError::UnsupportedOp,
                ..
            }
        ),
        "{e:?}"
    );
    // ERR: posted WRs complete flushed.
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    let wc = a.wait();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
}

#[test]
fn post_send_ud_needs_a_ud_qp_and_an_ah_of_its_pd() {
    let a = UdEnd::new(QKEY);
    let b = UdEnd::new(QKEY);
    // An AH of another PD (here: another context) is refused.
    let foreign = b.ah_to(&a);
    let e = a
        .send(1, SendOp::Send, 0, 8, &foreign, b.qp.qp_num(), QKEY)
        .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    let pd2 = a.ctx.alloc_pd().unwrap();
    let other_pd = pd2
        .create_ah(&AhAttr {
            dgid: b.ctx.gid(),
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    assert!(a
        .send(1, SendOp::Send, 0, 8, &other_pd, b.qp.qp_num(), QKEY)
        .is_err());
    // An RC QP has no post_send_ud.
    let rc =
        a.pd.create_qp(&QpInitAttr {
            send_cq: &a.cq,
            recv_cq: &a.cq,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let ah = a.ah_to(&b);
    let e = rc
        .post_send_ud(&[UdSendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[],
            flags: SendFlags::default(),
            ah: &ah,
            remote_qpn: b.qp.qp_num(),
            remote_qkey: QKEY,
        }])
        .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
}

#[test]
fn address_handle_attribute_checks() {
    let a = UdEnd::new(QKEY);
    let gid = a.ctx.gid();
    let ok = AhAttr {
        dgid: gid,
        port_num: 1,
        ..Default::default()
    };
    assert_eq!(a.pd.create_ah(&ok).unwrap().attr(), ok);
    // RoCE: no LID-only AH (a zero GID). (IPv6 AHs: tests/verbs_ipv6.rs.)
    let e = a.pd.create_ah(&AhAttr {
        dgid: [0; 16],
        ..ok
    });
    assert!(matches!(e, Err(VerbsError::InvalidArgument(_))));
    assert!(a.pd.create_ah(&AhAttr { port_num: 2, ..ok }).is_err());
    let len = a.ctx.query_port(1).unwrap().gid_tbl_len;
    assert!(a
        .pd
        .create_ah(&AhAttr {
            sgid_index: len as u8,
            ..ok
        })
        .is_err());
    // A send completion has no GRH to answer.
    let wc = WorkCompletion::default();
    assert!(a.pd.create_ah_from_wc(1, &wc).is_err());
}
