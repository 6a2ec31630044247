//! Shared receive queues in the sans-IO transport: RC and UD QPs that take their receive WQEs
//! from one `Srq` lent to them with each packet, as the engine does.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use softrdma::transport::sim::{pattern, recv_wr, send_wr, MemRegion, VecMemory};
use softrdma::transport::ud::{net_header_v4, UdDest, UdQp};
use softrdma::transport::*;
use softrdma::wire::ipv4::Ipv4Udp;
use softrdma::wire::{Opcode, Packet, Syndrome, ROCE_V2_PORT};

const ALL: AccessFlags = AccessFlags::all();

/// Requesters A1, A2 connected to responders B1, B2, which share one SRQ.
const A: [u32; 2] = [0x11, 0x12];
const B: [u32; 2] = [0x21, 0x22];

struct Rig {
    now: Instant,
    mem: VecMemory,
    a: [RcQp; 2],
    b: [RcQp; 2],
    srq: Srq,
    /// Completions polled so far, per QP.
    a_wc: [Vec<Completion>; 2],
    b_wc: [Vec<Completion>; 2],
}

fn connect(qp: &mut RcQp, now: Instant, dest: u32, mtu: Mtu, rnr_retry: u8) {
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(ALL),
            ..Default::default()
        },
        now,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rtr),
            ah_attr: Some(AddressVector {
                port_num: 1,
                ..Default::default()
            }),
            path_mtu: Some(mtu),
            dest_qp_num: Some(dest),
            rq_psn: Some(0x100),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        },
        now,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0x100),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(rnr_retry),
            max_rd_atomic: Some(4),
            ..Default::default()
        },
        now,
    )
    .unwrap();
}

impl Rig {
    fn new(mtu: Mtu, srq_wr: u32, rnr_retry: u8) -> Rig {
        let now = Instant::now();
        let caps = QpCaps::default();
        let mut a = [RcQp::new(A[0], caps, false), RcQp::new(A[1], caps, false)];
        let mut b = [
            RcQp::with_srq(B[0], caps, false),
            RcQp::with_srq(B[1], caps, false),
        ];
        for i in 0..2 {
            connect(&mut a[i], now, B[i], mtu, rnr_retry);
            connect(&mut b[i], now, A[i], mtu, rnr_retry);
        }
        Rig {
            now,
            mem: VecMemory::new(),
            a,
            b,
            srq: Srq::new(srq_wr, 4, 0).unwrap(),
            a_wc: [Vec::new(), Vec::new()],
            b_wc: [Vec::new(), Vec::new()],
        }
    }

    /// The packets requester `i` has to send now.
    fn a_out(&mut self, i: usize) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut buf = vec![0u8; 4200];
        while let Some(n) = self.a[i].poll_transmit(self.now, &self.mem, &mut buf) {
            v.push(buf[..n].to_vec());
        }
        v
    }

    /// Feed packets to responder `i` (with the SRQ), then deliver its answers to requester `i`.
    fn deliver(&mut self, i: usize, pkts: &[Vec<u8>]) {
        for p in pkts {
            let pkt = Packet::parse(p).unwrap();
            self.b[i].handle_packet_srq(self.now, &pkt, &self.mem, &mut self.srq);
        }
        let mut buf = vec![0u8; 4200];
        while let Some(n) = self.b[i].poll_transmit(self.now, &self.mem, &mut buf) {
            let pkt = Packet::parse(&buf[..n]).unwrap();
            self.a[i].handle_packet(self.now, &pkt, &self.mem);
        }
        self.collect();
    }

    /// Run pair `i` until idle.
    fn run(&mut self, i: usize) {
        for _ in 0..1000 {
            let out = self.a_out(i);
            if out.is_empty() {
                self.collect();
                return;
            }
            self.deliver(i, &out);
        }
        panic!("pair {i} never went idle");
    }

    fn collect(&mut self) {
        for i in 0..2 {
            while let Some(c) = self.a[i].poll_completion() {
                self.a_wc[i].push(c);
            }
            while let Some(c) = self.b[i].poll_completion() {
                self.b_wc[i].push(c);
            }
        }
    }

    fn post_srq(&mut self, wr_id: u64, sges: Vec<Sge>) {
        self.srq.post_recv(recv_wr(wr_id, sges)).unwrap();
    }

    fn send(&mut self, i: usize, wr_id: u64, sges: Vec<Sge>) {
        self.a[i]
            .post_send(send_wr(wr_id, SendOp::Send, sges))
            .unwrap();
    }
}

#[test]
fn two_qps_take_receive_wqes_from_one_srq_in_order() {
    let mut r = Rig::new(Mtu::Mtu1024, 8, 7);
    let src = r.mem.register(3 * 64, ALL);
    let dst = r.mem.register(4 * 64, ALL);
    for k in 0..3u64 {
        r.mem.write(src.addr + k * 64, &pattern(k, 64));
    }
    for k in 0..4u64 {
        r.post_srq(100 + k, vec![dst.sge(k * 64, 64)]);
    }
    r.send(0, 1, vec![src.sge(0, 64)]);
    r.run(0);
    r.send(1, 2, vec![src.sge(64, 64)]);
    r.run(1);
    r.send(0, 3, vec![src.sge(128, 64)]);
    r.run(0);
    assert_eq!(r.srq.len(), 1, "three WQEs taken, one left");
    let got: Vec<_> = (0..2)
        .map(|i| {
            r.b_wc[i]
                .iter()
                .map(|c| (c.wr_id, c.status, c.qp_num, c.src_qp, c.byte_len))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        got[0],
        vec![
            (100, WcStatus::Success, B[0], A[0], 64),
            (102, WcStatus::Success, B[0], A[0], 64)
        ]
    );
    assert_eq!(got[1], vec![(101, WcStatus::Success, B[1], A[1], 64)]);
    assert_eq!(r.mem.read(dst.addr, 64), pattern(0, 64));
    assert_eq!(r.mem.read(dst.addr + 64, 64), pattern(1, 64));
    assert_eq!(r.mem.read(dst.addr + 128, 64), pattern(2, 64));
    for i in 0..2 {
        assert!(r.a_wc[i].iter().all(|c| c.status == WcStatus::Success));
    }
}

#[test]
fn interleaved_multi_packet_messages_each_take_a_wqe_at_their_first_packet() {
    let mut r = Rig::new(Mtu::Mtu256, 8, 7);
    let src = r.mem.register(2 * 600, ALL);
    let dst = r.mem.register(2 * 600, ALL);
    r.mem.write(src.addr, &pattern(1, 600));
    r.mem.write(src.addr + 600, &pattern(2, 600));
    r.post_srq(100, vec![dst.sge(0, 600)]);
    r.post_srq(101, vec![dst.sge(600, 600)]);
    r.send(0, 1, vec![src.sge(0, 600)]);
    r.send(1, 2, vec![src.sge(600, 600)]);
    let p0 = r.a_out(0);
    let p1 = r.a_out(1);
    assert_eq!((p0.len(), p1.len()), (3, 3), "FIRST, MIDDLE, LAST each");
    // B1's FIRST takes the head WQE, then B2's FIRST the next; their rest arrive afterwards.
    r.deliver(0, &p0[..1]);
    assert_eq!(r.srq.len(), 1);
    r.deliver(1, &p1[..1]);
    assert!(r.srq.is_empty());
    r.deliver(1, &p1[1..]);
    r.deliver(0, &p0[1..]);
    r.run(0);
    r.run(1);
    let ids: Vec<_> = (0..2)
        .map(|i| {
            r.b_wc[i]
                .iter()
                .map(|c| (c.wr_id, c.status, c.qp_num, c.byte_len))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(ids[0], vec![(100, WcStatus::Success, B[0], 600)]);
    assert_eq!(ids[1], vec![(101, WcStatus::Success, B[1], 600)]);
    assert_eq!(r.mem.read(dst.addr, 600), pattern(1, 600));
    assert_eq!(r.mem.read(dst.addr + 600, 600), pattern(2, 600));
}

/// The AETH syndromes of the responder's answers to `pkts`.
fn answers(r: &mut Rig, i: usize, pkts: &[Vec<u8>]) -> Vec<Syndrome> {
    for p in pkts {
        let pkt = Packet::parse(p).unwrap();
        r.b[i].handle_packet_srq(r.now, &pkt, &r.mem, &mut r.srq);
    }
    let mut v = Vec::new();
    let mut buf = vec![0u8; 4200];
    while let Some(n) = r.b[i].poll_transmit(r.now, &r.mem, &mut buf) {
        let pkt = Packet::parse(&buf[..n]).unwrap();
        assert_eq!(pkt.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        v.push(pkt.aeth.unwrap().syndrome);
        r.a[i].handle_packet(r.now, &pkt, &r.mem);
    }
    v
}

#[test]
fn empty_srq_answers_rnr_then_the_retry_lands_after_a_post() {
    let mut r = Rig::new(Mtu::Mtu1024, 4, 7);
    let src = r.mem.register(32, ALL);
    let dst = r.mem.register(32, ALL);
    r.mem.write(src.addr, &pattern(9, 32));
    r.send(0, 1, vec![src.sge(0, 32)]);
    let out = r.a_out(0);
    assert_eq!(
        answers(&mut r, 0, &out),
        vec![Syndrome::RnrNak { timer: 1 }],
        "no WQE on the SRQ: RNR NAK"
    );
    r.collect();
    assert!(r.b_wc[0].is_empty() && r.a_wc[0].is_empty());
    // The requester waits for its RNR timer; meanwhile a WQE is posted to the SRQ.
    r.post_srq(7, vec![dst.sge(0, 32)]);
    let t = r.a[0].poll_timeout().expect("RNR timer armed");
    r.now = t.max(r.now) + Duration::from_micros(1);
    r.a[0].handle_timeout(r.now);
    r.run(0);
    assert_eq!(r.b_wc[0].len(), 1);
    assert_eq!(
        (r.b_wc[0][0].wr_id, r.b_wc[0][0].status, r.b_wc[0][0].qp_num),
        (7, WcStatus::Success, B[0])
    );
    assert_eq!(r.a_wc[0].len(), 1);
    assert_eq!(r.a_wc[0][0].status, WcStatus::Success);
    assert_eq!(r.mem.read(dst.addr, 32), pattern(9, 32));
}

#[test]
fn rdma_write_with_immediate_takes_its_wqe_from_the_srq() {
    let mut r = Rig::new(Mtu::Mtu1024, 4, 7);
    let src = r.mem.register(16, ALL);
    let dst = r.mem.register(16, ALL);
    r.mem.write(src.addr, &pattern(4, 16));
    r.a[1]
        .post_send(send_wr(
            5,
            SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr,
                rkey: dst.rkey,
                imm: 0xabcd,
            },
            vec![src.sge(0, 16)],
        ))
        .unwrap();
    let out = r.a_out(1);
    assert_eq!(
        answers(&mut r, 1, &out),
        vec![Syndrome::RnrNak { timer: 1 }]
    );
    assert_eq!(
        r.mem.read(dst.addr, 16),
        vec![0; 16],
        "no data before a WQE"
    );
    r.post_srq(8, vec![]);
    let t = r.a[1].poll_timeout().expect("RNR timer armed");
    r.now = t.max(r.now) + Duration::from_micros(1);
    r.a[1].handle_timeout(r.now);
    r.run(1);
    let c = r.b_wc[1][0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.imm_data, c.qp_num),
        (
            8,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(0xabcd),
            B[1]
        )
    );
    assert_eq!(r.mem.read(dst.addr, 16), pattern(4, 16));
}

#[test]
fn error_flushes_only_the_wqe_a_message_in_progress_took() {
    let mut r = Rig::new(Mtu::Mtu256, 8, 7);
    let src = r.mem.register(600, ALL);
    let dst = r.mem.register(4 * 600, ALL);
    for k in 0..4u64 {
        r.post_srq(100 + k, vec![dst.sge(k * 600, 600)]);
    }
    r.send(0, 1, vec![src.sge(0, 600)]);
    let p = r.a_out(0);
    r.deliver(0, &p[..1]);
    assert_eq!(r.srq.len(), 3);
    r.b[0]
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            r.now,
        )
        .unwrap();
    r.collect();
    let flushed: Vec<_> = r.b_wc[0]
        .iter()
        .map(|c| (c.wr_id, c.status, c.side, c.qp_num))
        .collect();
    assert_eq!(
        flushed,
        vec![(100, WcStatus::WrFlushErr, CqSide::Recv, B[0])],
        "only the WQE B1 held"
    );
    assert_eq!(r.srq.len(), 3, "the SRQ's WQEs stay for the other QPs");
    // B2 still receives from it.
    r.send(1, 2, vec![src.sge(0, 600)]);
    r.run(1);
    assert_eq!(r.b_wc[1][0].wr_id, 101);
    assert_eq!(r.b_wc[1][0].status, WcStatus::Success);
}

#[test]
fn srq_qp_has_no_receive_queue_of_its_own() {
    let caps = QpCaps {
        max_recv_wr: 64,
        ..QpCaps::default()
    };
    let mut qp = RcQp::with_srq(0x30, caps, false);
    assert!(qp.uses_srq());
    assert_eq!((qp.caps().max_recv_wr, qp.caps().max_recv_sge), (0, 0));
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(ALL),
            ..Default::default()
        },
        Instant::now(),
    )
    .unwrap();
    assert_eq!(qp.post_recv(recv_wr(1, vec![])), Err(PostError::HasSrq));
    let mut ud = UdQp::with_srq(0x31, caps, false, Mtu::Mtu1024);
    assert!(ud.uses_srq());
    assert_eq!(ud.post_recv(recv_wr(1, vec![])), Err(PostError::HasSrq));
}

#[test]
fn limit_event_fires_once_as_qps_drain_the_srq() {
    let mut r = Rig::new(Mtu::Mtu1024, 8, 7);
    let src = r.mem.register(8, ALL);
    let dst = r.mem.register(8 * 8, ALL);
    for k in 0..6u64 {
        r.post_srq(k, vec![dst.sge(k * 8, 8)]);
    }
    r.srq.modify(None, Some(4)).unwrap();
    let mut fired = Vec::new();
    for k in 0..5u64 {
        let i = (k % 2) as usize;
        r.send(i, k, vec![src.sge(0, 8)]);
        r.run(i);
        fired.push(r.srq.take_limit_event());
    }
    // 6 posted: takes leave 5, 4, 3 (below 4: fires), 2, 1.
    assert_eq!(fired, vec![false, false, true, false, false]);
    assert_eq!(r.srq.limit(), 0);
}

// ---------------------------------------------------------------------------------------------
// UD

fn ud_rts(qp: &mut UdQp) {
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qkey: Some(0x1111),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0),
        ..Default::default()
    })
    .unwrap();
}

fn ud_send(from: &mut UdQp, mem: &VecMemory, mr: &MemRegion, to: u32) -> Vec<u8> {
    from.post_send(
        send_wr(1, SendOp::Send, vec![mr.sge(0, 16)]),
        UdDest {
            av: AddressVector {
                dgid: Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped().octets(),
                port_num: 1,
                ..Default::default()
            },
            remote_qpn: to,
            remote_qkey: 0x1111,
        },
    )
    .unwrap();
    let mut buf = vec![0u8; 2048];
    let t = from.poll_transmit(mem, &mut buf).unwrap();
    while from.poll_completion().is_some() {}
    buf.truncate(t.len);
    buf
}

#[test]
fn ud_qps_on_one_srq_receive_and_drop_when_it_is_empty() {
    let mem = VecMemory::new();
    let src = mem.register(16, ALL);
    let dst = mem.register(2 * 64, ALL);
    mem.write(src.addr, &pattern(3, 16));
    let mut a = UdQp::new(0x40, QpCaps::default(), false, Mtu::Mtu1024);
    let mut b = [
        UdQp::with_srq(0x41, QpCaps::default(), false, Mtu::Mtu1024),
        UdQp::with_srq(0x42, QpCaps::default(), false, Mtu::Mtu1024),
    ];
    ud_rts(&mut a);
    for q in &mut b {
        ud_rts(q);
    }
    let mut srq = Srq::new(4, 1, 0).unwrap();
    srq.post_recv(recv_wr(10, vec![dst.sge(0, 64)])).unwrap();
    srq.post_recv(recv_wr(11, vec![dst.sge(64, 64)])).unwrap();
    let mut h = [0u8; 28];
    Ipv4Udp::new(
        Ipv4Addr::new(10, 0, 0, 1),
        0xc000,
        Ipv4Addr::new(10, 0, 0, 2),
        ROCE_V2_PORT,
        64,
    )
    .emit(&mut h);
    let net = net_header_v4(&h).unwrap();
    for (i, q) in b.iter_mut().enumerate().rev() {
        let p = ud_send(&mut a, &mem, &src, 0x41 + i as u32);
        q.handle_packet_srq(&Packet::parse(&p).unwrap(), &net, &mem, &mut srq);
    }
    let c1 = b[1].poll_completion().unwrap().wc;
    let c0 = b[0].poll_completion().unwrap().wc;
    assert_eq!(
        (c1.wr_id, c1.status, c1.qp_num, c1.src_qp, c1.byte_len),
        (10, WcStatus::Success, 0x42, 0x40, 40 + 16)
    );
    assert_eq!(
        (c0.wr_id, c0.status, c0.qp_num, c0.src_qp),
        (11, WcStatus::Success, 0x41, 0x40)
    );
    assert_eq!(mem.read(dst.addr + 40, 16), pattern(3, 16));
    assert_eq!(mem.read(dst.addr + 64 + 40, 16), pattern(3, 16));
    // Empty SRQ: the datagram is dropped (UD has no RNR).
    let p = ud_send(&mut a, &mem, &src, 0x41);
    b[0].handle_packet_srq(&Packet::parse(&p).unwrap(), &net, &mem, &mut srq);
    assert!(b[0].poll_completion().is_none());
    assert_eq!(b[0].drops().no_wqe, 1);
    // To ERR: nothing of the SRQ's is flushed.
    srq.post_recv(recv_wr(12, vec![dst.sge(0, 64)])).unwrap();
    b[0].modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    assert!(b[0].poll_completion().is_none());
    assert_eq!(srq.len(), 1);
}

/// The responder takes a WQE from the QP's own receive queue at a message's first packet too:
/// that WQE still counts against `max_recv_wr` until its completion is polled.
#[test]
fn own_receive_queue_counts_the_wqe_a_message_in_progress_took() {
    let now = Instant::now();
    let mem = VecMemory::new();
    let caps = QpCaps {
        max_recv_wr: 2,
        ..QpCaps::default()
    };
    let mut a = RcQp::new(A[0], caps, false);
    let mut b = RcQp::new(B[0], caps, false);
    connect(&mut a, now, B[0], Mtu::Mtu256, 7);
    connect(&mut b, now, A[0], Mtu::Mtu256, 7);
    let src = mem.register(600, ALL);
    let dst = mem.register(1200, ALL);
    mem.write(src.addr, &pattern(5, 600));
    b.post_recv(recv_wr(1, vec![dst.sge(0, 600)])).unwrap();
    b.post_recv(recv_wr(2, vec![dst.sge(600, 600)])).unwrap();
    a.post_send(send_wr(9, SendOp::Send, vec![src.sge(0, 600)]))
        .unwrap();
    let mut buf = vec![0u8; 4200];
    let mut pkts = Vec::new();
    while let Some(n) = a.poll_transmit(now, &mem, &mut buf) {
        pkts.push(buf[..n].to_vec());
    }
    assert_eq!(pkts.len(), 3);
    b.handle_packet(now, &Packet::parse(&pkts[0]).unwrap(), &mem);
    assert_eq!(
        b.post_recv(recv_wr(3, vec![dst.sge(0, 8)])),
        Err(PostError::QueueFull),
        "the WQE the message took still occupies its slot"
    );
    for p in &pkts[1..] {
        b.handle_packet(now, &Packet::parse(p).unwrap(), &mem);
    }
    assert_eq!(
        b.post_recv(recv_wr(3, vec![dst.sge(0, 8)])),
        Err(PostError::QueueFull),
        "until its completion is polled"
    );
    let c = b.poll_completion().unwrap();
    assert_eq!((c.wr_id, c.status, c.byte_len), (1, WcStatus::Success, 600));
    b.post_recv(recv_wr(3, vec![dst.sge(0, 8)])).unwrap();
    assert_eq!(mem.read(dst.addr, 600), pattern(5, 600));
}
