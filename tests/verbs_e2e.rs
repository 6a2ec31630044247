//! End to end over loopback between two contexts (two UDP endpoints, 127.0.0.x each).
mod verbs_util;

use std::time::{Duration, Instant};

use softrdma::transport::{AccessFlags, Mtu, SendFlags, SendOp, Sge, WcOpcode, WcStatus};
use softrdma::verbs::{AsyncEvent, RecvWr, SendWr};
use verbs_util::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_u64(mr: &softrdma::verbs::MemoryRegion, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

/// A fresh pcap file for the test `tag` (one per process).
fn pcap_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "softrdma-verbs-e2e-{tag}-{}.pcap",
        std::process::id()
    ))
}

/// A context on the loopback device that records its traffic into `path`.
fn captured_ctx(path: &std::path::Path) -> softrdma::verbs::Context {
    let opts = softrdma::verbs::ContextOptions {
        pcap: Some(path.to_path_buf()),
    };
    loopback_dev()
        .open_with(&opts)
        .expect("open with a capture")
}

/// The datagrams of the capture at `path` in its order, each as its IPv4+UDP header and UDP
/// payload (the file is removed; its contexts must be gone, so that it is flushed).
fn captured(path: &std::path::Path) -> Vec<([u8; 28], Vec<u8>)> {
    use softrdma::wire::{ethernet, pcap::PcapSlice};
    let data = std::fs::read(path).unwrap();
    let _ = std::fs::remove_file(path);
    PcapSlice::new(&data)
        .unwrap()
        .map(|rec| {
            let (h, p) = ethernet::split_ipv4_udp(rec.unwrap().data).unwrap();
            (h, p.to_vec())
        })
        .collect()
}

#[test]
fn send_recv_small_large_inline_and_immediate() {
    let (a, b) = pair();
    let ma = a.mr(1 << 16);
    let mb = b.mr(1 << 16);
    // Small.
    ma.write(0, b"hello, rdma").unwrap();
    b.post_recv(7, &[sge(&mb, 0, 4096)]);
    a.post_send(1, SendOp::Send, &[sge(&ma, 0, 11)]);
    let wc = a.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let wc = b.wait();
    assert_eq!(
        (
            wc.wr_id,
            wc.status,
            wc.opcode,
            wc.byte_len,
            wc.src_qp,
            wc.qp_num
        ),
        (
            7,
            WcStatus::Success,
            WcOpcode::Recv,
            11,
            a.qp.qp_num(),
            b.qp.qp_num()
        )
    );
    assert_eq!(&mb.lock().unwrap()[..11], b"hello, rdma");

    // Large (multi-packet at MTU 1024) with immediate data.
    let data = pattern(50_000, 3);
    ma.write(0, &data).unwrap();
    b.post_recv(8, &[sge(&mb, 0, 1 << 16)]);
    a.post_send(
        2,
        SendOp::SendWithImm { imm: 0x1234_5678 },
        &[sge(&ma, 0, data.len())],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!(
        (wc.byte_len, wc.imm_data),
        (data.len() as u32, Some(0x1234_5678))
    );
    assert_eq!(&mb.lock().unwrap()[..data.len()], &data[..]);

    // Inline: the source may change right after posting.
    ma.write(0, b"inline!").unwrap();
    b.post_recv(9, &[sge(&mb, 0, 64)]);
    a.qp.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg_list: &[sge(&ma, 0, 7)],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    }])
    .unwrap();
    ma.write(0, b"CHANGED").unwrap();
    assert_eq!(a.wait().wr_id, 3);
    assert_eq!(b.wait().byte_len, 7);
    assert_eq!(&mb.lock().unwrap()[..7], b"inline!");
}

#[test]
fn scatter_gather_lists() {
    let (a, b) = pair();
    let ma = a.mr(8192);
    let ma2 = a.mr(8192);
    let mb = b.mr(8192);
    let mb2 = b.mr(8192);
    ma.write(100, &pattern(1000, 1)).unwrap();
    ma2.write(0, &pattern(2000, 2)).unwrap();
    // Gather from two MRs, scatter into two MRs with different split points.
    b.post_recv(1, &[sge(&mb, 0, 1500), sge(&mb2, 4000, 3000)]);
    a.post_send(1, SendOp::Send, &[sge(&ma, 100, 1000), sge(&ma2, 0, 2000)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 3000));
    let mut want = pattern(1000, 1);
    want.extend(pattern(2000, 2));
    assert_eq!(&mb.lock().unwrap()[..1500], &want[..1500]);
    assert_eq!(&mb2.lock().unwrap()[4000..5500], &want[1500..]);

    // RDMA WRITE gathering three pieces; RDMA READ scattering into two.
    let w = [sge(&ma, 100, 10), sge(&ma2, 0, 20), sge(&ma, 200, 30)];
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 6000,
            rkey: mb.rkey(),
        },
        &w,
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    let mut got = vec![0u8; 60];
    mb.read(6000, &mut got).unwrap();
    assert_eq!(&got[..10], &ma.lock().unwrap()[100..110]);
    assert_eq!(&got[10..30], &ma2.lock().unwrap()[..20]);
    assert_eq!(&got[30..], &ma.lock().unwrap()[200..230]);
    a.post_send(
        3,
        SendOp::RdmaRead {
            remote_addr: mb.addr() + 6000,
            rkey: mb.rkey(),
        },
        &[sge(&ma, 7000, 25), sge(&ma2, 7000, 35)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&ma.lock().unwrap()[7000..7025], &got[..25]);
    assert_eq!(&ma2.lock().unwrap()[7000..7035], &got[25..]);
    // A receive too small for the message: local length error at the receiver.
    b.post_recv(4, &[sge(&mb, 0, 10)]);
    a.post_send(4, SendOp::Send, &[sge(&ma, 0, 100)]);
    let wc = b.wait();
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::LocLenErr));
    let wc = a.wait();
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RemInvReqErr));
}

#[test]
fn rdma_write_read_and_write_with_imm() {
    let (a, b) = pair();
    let len = 200_000;
    let ma = a.mr(len);
    let mb = b.mr(len);
    let data = pattern(len, 9);
    ma.write(0, &data).unwrap();
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[sge(&ma, 0, len)],
    );
    let wc = a.wait();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaWrite, len as u32)
    );
    assert!(mb.lock().unwrap()[..] == data[..]);
    assert!(
        b.cq.is_empty(),
        "a plain WRITE consumes no receive and raises no completion"
    );

    // READ it back into a zeroed region.
    let back = a.mr(len);
    a.post_send(
        2,
        SendOp::RdmaRead {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[sge(&back, 0, len)],
    );
    let wc = a.wait();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, len as u32)
    );
    assert!(back.lock().unwrap()[..] == data[..]);

    // WRITE with immediate: consumes a receive; its byte_len is the write's length.
    b.post_recv(5, &[]);
    a.post_send(
        3,
        SendOp::RdmaWriteWithImm {
            remote_addr: mb.addr() + 10,
            rkey: mb.rkey(),
            imm: 77,
        },
        &[sge(&ma, 0, 5)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data, wc.byte_len),
        (5, WcOpcode::RecvRdmaWithImm, Some(77), 5)
    );
    // Zero-length WRITE.
    a.post_send(
        4,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
}

#[test]
fn atomics() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    mb.write(8, &100u64.to_ne_bytes()).unwrap();
    let target = mb.addr() + 8;
    a.post_send(
        1,
        SendOp::FetchAdd {
            remote_addr: target,
            rkey: mb.rkey(),
            add: 5,
        },
        &[sge(&ma, 0, 8)],
    );
    let wc = a.wait();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!((read_u64(&ma, 0), read_u64(&mb, 8)), (100, 105));
    a.post_send(
        2,
        SendOp::CompareSwap {
            remote_addr: target,
            rkey: mb.rkey(),
            compare: 105,
            swap: 1,
        },
        &[sge(&ma, 16, 8)],
    );
    assert_eq!(a.wait().opcode, WcOpcode::CompSwap);
    assert_eq!((read_u64(&ma, 16), read_u64(&mb, 8)), (105, 1));
    a.post_send(
        3,
        SendOp::CompareSwap {
            remote_addr: target,
            rkey: mb.rkey(),
            compare: 105,
            swap: 2,
        },
        &[sge(&ma, 16, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!((read_u64(&ma, 16), read_u64(&mb, 8)), (1, 1));
    // A burst of fetch-adds from both sides' perspective: all atomic.
    for i in 0..50 {
        a.qp.post_send(&[SendWr {
            wr_id: 100 + i,
            op: SendOp::FetchAdd {
                remote_addr: target,
                rkey: mb.rkey(),
                add: 1,
            },
            sg_list: &[sge(&ma, 24, 8)],
            flags: if i == 49 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
        }])
        .unwrap();
    }
    assert_eq!(a.wait().wr_id, 149);
    assert_eq!(read_u64(&mb, 8), 51);
    // Misaligned: remote invalid request.
    a.post_send(
        4,
        SendOp::FetchAdd {
            remote_addr: target + 1,
            rkey: mb.rkey(),
            add: 1,
        },
        &[sge(&ma, 0, 8)],
    );
    let st = a.wait().status;
    assert!(
        matches!(st, WcStatus::RemInvReqErr | WcStatus::RemAccessErr),
        "{st:?}"
    );
}

#[test]
fn bad_rkey_is_a_remote_access_error_and_the_qp_fails() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey() ^ 0x5a5a,
        },
        &[sge(&ma, 0, 8)],
    );
    // A second WR behind it is flushed.
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[sge(&ma, 0, 8)],
    );
    let wc = a.wait();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
    let wc = a.wait();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state().unwrap(), softrdma::transport::QpState::Err);
    // The transport, not a verb, put the QP in ERR: an async event says so.
    let deadline = Instant::now() + WAIT;
    loop {
        match a.ctx.poll_async_event() {
            Some(AsyncEvent::QpFatal { qp_num }) if qp_num == a.qp.qp_num() => break,
            _ => {}
        }
        assert!(Instant::now() < deadline, "no QP_FATAL event");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn remote_access_rights_are_enforced() {
    let (a, b) = pair();
    let ma = a.mr(64);
    // Readable only: a WRITE to it fails.
    let ro = b.pd.alloc_mr(64, AccessFlags::REMOTE_READ).unwrap();
    a.post_send(
        1,
        SendOp::RdmaRead {
            remote_addr: ro.addr(),
            rkey: ro.rkey(),
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: ro.addr(),
            rkey: ro.rkey(),
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::RemAccessErr);
}

#[test]
fn out_of_bounds_and_other_pd_keys_are_refused() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 60,
            rkey: mb.rkey(),
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::RemAccessErr);
    // A key from another PD of the same context is invalid for b's QP.
    let (a, b) = pair();
    let ma = a.mr(64);
    let other_pd = b.ctx.alloc_pd().unwrap();
    let foreign = other_pd.alloc_mr(64, ALL).unwrap();
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: foreign.addr(),
            rkey: foreign.rkey(),
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::RemAccessErr);
    let _ = b;
}

#[test]
fn local_protection_error_for_a_bad_lkey() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    let bad = Sge {
        addr: ma.addr(),
        length: 8,
        lkey: ma.lkey().wrapping_add(1),
    };
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &[bad],
    );
    let wc = a.wait();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocProtErr));
}

#[test]
fn deregistered_mr_refuses_later_writes() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    let (addr, rkey) = (mb.addr(), mb.rkey());
    a.post_send(
        1,
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    mb.deregister();
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        &[sge(&ma, 0, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::RemAccessErr);
}

#[test]
fn rnr_until_a_receive_is_posted() {
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    a.post_send(1, SendOp::Send, &[sge(&ma, 0, 16)]);
    // No receive yet: the requester gets RNR NAKs and retries (rnr_retry 7 = forever).
    std::thread::sleep(Duration::from_millis(30));
    assert!(a.cq.is_empty());
    b.post_recv(2, &[sge(&mb, 0, 64)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(b.wait().byte_len, 16);
}

/// The passive side never calls into the library after setup: its progress thread serves
/// READ, WRITE and atomics on its own.
#[test]
fn passive_side_is_served_by_its_progress_thread() {
    let (a, b) = pair();
    let ma = a.mr(4096);
    let mb = b.mr(4096);
    mb.write(0, &pattern(2048, 5)).unwrap();
    let (addr, rkey) = (mb.addr(), mb.rkey());
    // From here on, only `a` is used (b stays alive but untouched on this thread).
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3600));
        drop(b);
    });
    a.post_send(
        1,
        SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        },
        &[sge(&ma, 0, 2048)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&ma.lock().unwrap()[..2048], &pattern(2048, 5)[..]);
    a.post_send(
        2,
        SendOp::RdmaWrite {
            remote_addr: addr + 2048,
            rkey,
        },
        &[sge(&ma, 0, 1024)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    a.post_send(
        3,
        SendOp::FetchAdd {
            remote_addr: addr + 4000,
            rkey,
            add: 9,
        },
        &[sge(&ma, 4000, 8)],
    );
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&mb.lock().unwrap()[2048..3072], &pattern(2048, 5)[..1024]);
    assert_eq!(read_u64(&mb, 4000), 9);
    drop(t);
}

/// Many messages both ways with a window of outstanding work, the receiver waiting on its CQ
/// while the sender busy-polls, across both contexts' progress threads.
#[test]
fn ping_pong_many() {
    let (a, b) = pair();
    let ma = a.mr(1 << 16);
    let mb = b.mr(1 << 16);
    const N: u64 = 2000;
    let bt = std::thread::spawn(move || {
        for i in 0..32 {
            b.post_recv(i, &[sge(&mb, (i as usize % 32) * 1024, 1024)]);
        }
        let mut got = 0;
        while got < N {
            let wc = b.wait();
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                got += 1;
                let slot = (wc.wr_id as usize % 32) * 1024;
                let v = u64::from_ne_bytes(mb.lock().unwrap()[slot..slot + 8].try_into().unwrap());
                assert_eq!(v, got - 1);
                b.post_recv(wc.wr_id + 32, &[sge(&mb, slot, 1024)]);
                // Echo it back.
                b.post_send(v, SendOp::Send, &[sge(&mb, slot, 8)]);
            }
        }
        // Drain the remaining send completions.
        let mut sends = 0;
        let _ = &mut sends;
        (b, mb)
    });
    for i in 0..32 {
        a.post_recv(
            1_000_000 + i,
            &[sge(&ma, 32768 + (i as usize) * 1024, 1024)],
        );
    }
    let mut sent = 0u64;
    let mut echoed = 0u64;
    let mut inflight = 0;
    while echoed < N {
        while sent < N && inflight < 16 {
            ma.write(0, &sent.to_ne_bytes()).unwrap();
            // Inline so the source slot can be reused at once.
            a.qp.post_send(&[SendWr {
                wr_id: sent,
                op: SendOp::Send,
                sg_list: &[sge(&ma, 0, 8)],
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            }])
            .unwrap();
            sent += 1;
            inflight += 1;
        }
        let wc = a.wait();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        match wc.opcode {
            WcOpcode::Send => inflight -= 1,
            WcOpcode::Recv => {
                echoed += 1;
                let slot = 32768 + ((wc.wr_id - 1_000_000) as usize % 32) * 1024;
                a.post_recv(wc.wr_id + 32, &[sge(&ma, slot, 1024)]);
            }
            o => panic!("{o:?}"),
        }
    }
    let (_b, _mb) = bt.join().unwrap();
}

/// A receiver that sleeps on its completion channel (epoll-free: blocking get_cq_event) while
/// its progress thread delivers; solicited-only arming skips unsolicited messages.
#[test]
fn channel_wait_and_solicited_events() {
    let a = End::new(loopback_ctx());
    let bctx = loopback_ctx();
    let ch = bctx.create_comp_channel().unwrap();
    let bpd = bctx.alloc_pd().unwrap();
    let bcq = bctx.create_cq(64, Some(&ch)).unwrap();
    let bqp = bpd
        .create_qp(&softrdma::verbs::QpInitAttr {
            send_cq: &bcq,
            recv_cq: &bcq,
            cap: Default::default(),
            qp_type: softrdma::verbs::QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    connect(&a.qp, 1, bqp.qp_num(), 2, bctx.gid());
    connect(&bqp, 2, a.qp.qp_num(), 1, a.ctx.gid());
    let ma = a.mr(64);
    let mb = bpd.alloc_mr(64, ALL).unwrap();
    for i in 0..3 {
        bqp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[sge(&mb, 0, 64)],
        }])
        .unwrap();
    }
    bcq.req_notify(true).unwrap();
    // Unsolicited: completes, but raises no event.
    a.post_send(1, SendOp::Send, &[sge(&ma, 0, 8)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    // Solicited: raises the event.
    a.qp.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &[sge(&ma, 0, 8)],
        flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
    }])
    .unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    let cq = ch.get_cq_event().unwrap();
    assert_eq!(cq, bcq);
    cq.ack_events(1);
    let mut wc = [Default::default(); 4];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 2);
    assert_eq!((wc[0].wr_id, wc[0].solicited), (0, false));
    assert_eq!((wc[1].wr_id, wc[1].solicited), (1, true));
}

/// Packet capture: two contexts sharing one pcap file record each datagram once, with a valid
/// ICRC over the IPv4/UDP header they were sent with.
#[test]
fn pcap_capture_of_both_contexts() {
    use softrdma::wire::{icrc, Packet};
    let path = pcap_path("both");
    {
        let (a, b) = pair_of(captured_ctx(&path), captured_ctx(&path));
        let ma = a.mr(4096);
        let mb = b.mr(4096);
        b.post_recv(1, &[sge(&mb, 0, 4096)]);
        a.post_send(1, SendOp::Send, &[sge(&ma, 0, 3000)]); // 3 packets at MTU 1024
        assert_eq!(a.wait().status, WcStatus::Success);
        assert_eq!(b.wait().status, WcStatus::Success);
        a.post_send(
            2,
            SendOp::RdmaRead {
                remote_addr: mb.addr(),
                rkey: mb.rkey(),
            },
            &[sge(&ma, 0, 8)],
        );
        assert_eq!(a.wait().status, WcStatus::Success);
        // Contexts drop here and flush the file.
    }
    let recs = captured(&path);
    for (ip_udp, payload) in &recs {
        icrc::verify_v4(ip_udp, payload).expect("valid ICRC");
        Packet::parse(payload).unwrap();
    }
    // SEND: 3 packets + ACK(s); READ: request + response. Each recorded once.
    let n = recs.len();
    assert!((6..=8).contains(&n), "{n} records");
}

/// A context that captures alone records what it receives from another context on the same
/// address (every process on a host shares its address, loopback included): both directions
/// are in its file. Two contexts that share a file record a datagram between them once (above).
#[test]
fn capture_shows_what_comes_from_a_context_sharing_the_address() {
    use softrdma::wire::Packet;
    let path = pcap_path("sharer");
    let (a_qpn, b_qpn);
    {
        let (a, b) = pair_of(loopback_ctx(), captured_ctx(&path));
        assert_eq!(a.ctx.gid(), b.ctx.gid(), "one address");
        (a_qpn, b_qpn) = (a.qp.qp_num(), b.qp.qp_num());
        let (ma, mb) = (a.mr(64), b.mr(64));
        for i in 0..3 {
            b.post_recv(i, &[sge(&mb, 0, 64)]);
            a.post_send(i, SendOp::Send, &[sge(&ma, 0, 8)]);
            assert_eq!(a.wait().status, WcStatus::Success);
            assert_eq!(b.wait().status, WcStatus::Success);
        }
        a.post_recv(9, &[sge(&ma, 0, 64)]);
        b.post_send(9, SendOp::Send, &[sge(&mb, 0, 8)]);
        assert_eq!(b.wait().status, WcStatus::Success);
        assert_eq!(a.wait().status, WcStatus::Success);
    }
    // (opcode, destination QP) of every record.
    let recs: Vec<(u8, u32)> = captured(&path)
        .iter()
        .map(|(_, payload)| {
            let p = Packet::parse(payload).unwrap();
            (p.bth.opcode.0, p.bth.dest_qpn)
        })
        .collect();
    let count = |op: u8, qpn: u32| recs.iter().filter(|&&r| r == (op, qpn)).count();
    // A's three SENDs to B and its ACK of B's SEND came in; B's SEND and ACKs went out. (At
    // least: on a loaded machine a late ACK can draw a probe, sent and answered again.)
    assert!(count(0x04, b_qpn) >= 3, "{recs:?}");
    assert!(count(0x04, a_qpn) >= 1, "{recs:?}");
    assert!(count(0x11, a_qpn) >= 1, "{recs:?}");
    assert!(count(0x11, b_qpn) >= 1, "{recs:?}");
}

/// A busy-polling receiver's ACK waits to go out behind its answer (the ping-pong's round trip
/// loses the ACK's send), but never waits on an application that stops calling in: a receiver
/// that takes its completion and then neither answers nor polls still acknowledges within
/// milliseconds (the progress thread's next look), before the sender has to probe for it.
#[test]
fn held_ack_goes_out_when_the_receiver_stops_calling_in() {
    let a = End::new(loopback_ctx());
    let b = End::new(loopback_ctx());
    let (ga, gb) = (a.ctx.gid(), b.ctx.gid());
    connect_path(&a.qp, 0, 1, (b.qp.qp_num(), 2, gb), 20, Mtu::Mtu1024);
    connect_path(&b.qp, 0, 2, (a.qp.qp_num(), 1, ga), 20, Mtu::Mtu1024);
    let ma = a.mr(64);
    let mb = b.mr(64);
    let mut waits = Vec::new();
    for i in 0..20 {
        b.post_recv(i, &[sge(&mb, 0, 64)]);
        a.post_send(i, SendOp::Send, &[sge(&ma, 0, 8)]);
        // B busy-polls for the message, then goes quiet: no answer, no poll, no channel.
        let wc = b.wait();
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, i));
        let t0 = Instant::now();
        let wc = a.wait();
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, i));
        waits.push(t0.elapsed());
    }
    waits.sort();
    eprintln!("ACK waits: {waits:?}");
    // Served at the progress thread's next look (every 2 ms), not at the retransmission
    // (4.3 s) nor at A's tail-loss probe (10 ms): A sent each SEND once (a stray probe or two
    // allowed, for a machine too loaded to run the look on time).
    let sent = a.ctx.stats().unwrap().tx_packets;
    assert!(
        sent <= 22,
        "A sent {sent} packets for 20 SENDs; ACK waits {waits:?}"
    );
    assert!(waits[waits.len() - 1] < Duration::from_secs(2), "{waits:?}");
    // The ACKs were held (B received in its own polls), so the bound above was tested.
    assert!(b.ctx.stats().unwrap().tx_acks_held > 0);
}

/// A capture shows the order packets left in: a device that captures does not hold its ACKs
/// behind the application's answer (its capture is written as packets are built, so a held ACK
/// would be recorded before an answer that overtook it on the wire). B busy-polls and answers
/// at once, the case where an uncaptured device holds (see
/// `held_ack_goes_out_when_the_receiver_stops_calling_in`); captured, it holds nothing, and its
/// capture shows each ACK before the answer it preceded.
#[test]
fn capture_shows_the_order_packets_left_in() {
    use softrdma::wire::Packet;
    let pb = pcap_path("order");
    let (a_qpn, held);
    {
        let (a, b) = pair_of(loopback_ctx(), captured_ctx(&pb));
        let (ma, mb) = (a.mr(64), b.mr(64));
        let wait_recv = |e: &End| loop {
            let wc = e.wait();
            assert_eq!(wc.status, WcStatus::Success);
            if wc.opcode == WcOpcode::Recv {
                return;
            }
        };
        for i in 0..20 {
            a.post_recv(i, &[sge(&ma, 32, 32)]);
            b.post_recv(i, &[sge(&mb, 32, 32)]);
            a.post_send(i, SendOp::Send, &[sge(&ma, 0, 8)]);
            // B busy-polls for the message and answers at once, as a ping-pong does.
            wait_recv(&b);
            b.post_send(i, SendOp::Send, &[sge(&mb, 0, 8)]);
            wait_recv(&a);
        }
        a_qpn = a.qp.qp_num();
        held = b.ctx.stats().unwrap().tx_acks_held;
        // The contexts drop here; B's flushes its file.
    }
    assert_eq!(held, 0, "a captured device held ACKs");
    // B's packets to A's QP, in the capture's order: (opcode, PSN).
    let to_a: Vec<(u8, u32)> = captured(&pb)
        .iter()
        .map(|(_, payload)| {
            let p = Packet::parse(payload).unwrap();
            (p.bth.opcode.0, p.bth.dest_qpn, p.bth.psn.value())
        })
        .filter(|&(_, qpn, _)| qpn == a_qpn)
        .map(|(op, _, psn)| (op, psn))
        .collect();
    // ACK of A's SEND i (PSN 100 + i), then B's answer (PSN 200 + i): the order they were
    // sent.
    let want: Vec<(u8, u32)> = (0..20u32)
        .flat_map(|i| [(0x11, 100 + i), (0x04, 200 + i)])
        .collect();
    assert_eq!(to_a, want);
}

/// On a device that batches with UDP GSO (loopback), a multi-packet RDMA WRITE leaves as one
/// RDMA WRITE Only per packet, each with a RETH for its part and AckReq on the last only, so
/// that all of its packets have one length and share GSO messages; the peer's memory gets the
/// same bytes. A WRITE with immediate stays one message (First, Middle, Last with immediate)
/// and its receive completion reports the whole length.
#[test]
fn a_write_leaves_as_a_message_per_packet_on_a_gso_device() {
    use softrdma::wire::{Opcode, Packet};
    let pb = pcap_path("split");
    let mtu = 1024; // `connect`'s path MTU
    let len = 3 * mtu + 100;
    let (b_qpn, rkey, base);
    {
        let (a, b) = pair_of(captured_ctx(&pb), loopback_ctx());
        let (ma, mb) = (a.mr(2 * len), b.mr(2 * len));
        let data = pattern(len, 4);
        ma.write(0, &data).unwrap();
        (b_qpn, rkey, base) = (b.qp.qp_num(), mb.rkey(), mb.addr());
        let write = SendOp::RdmaWrite {
            remote_addr: base,
            rkey,
        };
        a.post_send(1, write, &[sge(&ma, 0, len)]);
        let wc = a.wait();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
        assert!(mb.lock().unwrap()[..len] == data[..]);
        b.post_recv(2, &[sge(&mb, 0, 8)]);
        let imm = SendOp::RdmaWriteWithImm {
            remote_addr: base + len as u64,
            rkey,
            imm: 9,
        };
        a.post_send(2, imm, &[sge(&ma, 0, len)]);
        assert_eq!(a.wait().status, WcStatus::Success);
        let wc = b.wait();
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len, wc.imm_data),
            (
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                len as u32,
                Some(9)
            )
        );
        assert!(mb.lock().unwrap()[len..] == data[..]);
    }
    // A's packets to B's QP, each PSN's first transmission (on a loaded machine a late ACK can
    // draw a probe, the last packet again): (opcode, RETH va offset and length, AckReq).
    type Seen = (Opcode, Option<(u64, u32)>, bool);
    let mut psns = std::collections::HashSet::new();
    let to_b: Vec<Seen> = captured(&pb)
        .iter()
        .map(|(_, payload)| {
            let p = Packet::parse(payload).unwrap();
            assert_eq!(p.reth.map_or(rkey, |r| r.rkey), rkey);
            (
                p.bth.dest_qpn,
                p.bth.psn.value(),
                (
                    p.bth.opcode,
                    p.reth.map(|r| (r.va - base, r.dma_len)),
                    p.bth.ack_req,
                ),
            )
        })
        .filter(|&(qpn, psn, _)| qpn == b_qpn && psns.insert(psn))
        .map(|(_, _, seen)| seen)
        .collect();
    let (m, l) = (mtu as u64, len as u32);
    let w = |off: u64, n: u32, ack| (Opcode::RC_RDMA_WRITE_ONLY, Some((off, n)), ack);
    assert_eq!(
        to_b,
        vec![
            w(0, 1024, false),
            w(m, 1024, false),
            w(2 * m, 1024, false),
            w(3 * m, 100, true),
            (Opcode::RC_RDMA_WRITE_FIRST, Some((len as u64, l)), false),
            (Opcode::RC_RDMA_WRITE_MIDDLE, None, false),
            (Opcode::RC_RDMA_WRITE_MIDDLE, None, false),
            (Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, None, true),
        ]
    );
}
