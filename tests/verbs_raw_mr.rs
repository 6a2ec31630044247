//! Raw memory regions (`ProtectionDomain::register_raw`, the `ibv_reg_mr` of a C program): a
//! peer's WRITE, READ, SEND and atomics land in and come from the caller's memory; the iova is
//! the region's address; deregistration under fire never lets the transport touch the memory
//! again; atomics are atomic across QPs, threads and the application.
mod verbs_util;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma::transport::{AccessFlags, QpState, SendFlags, SendOp, Sge, WcOpcode, WcStatus};
use softrdma::verbs::{
    AsyncEvent, MemError, MemoryRegion, ProtectionDomain, QpCaps, QpInitAttr, QpType, RecvWr,
    SendWr, VerbsError,
};
use verbs_util::*;

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; the tests only pass its address around.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Mapping { ptr: p.cast(), len }
    }

    /// Make every page inaccessible: any later touch kills the process with SIGSEGV.
    fn protect_none(&self) {
        // SAFETY: the mapping is ours and still mapped.
        let r = unsafe { libc::mprotect(self.ptr.cast(), self.len, libc::PROT_NONE) };
        assert_eq!(r, 0, "mprotect");
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; no region over it is registered any more (each test
        // drops its regions first).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Register `len` bytes at `ptr` with `iova = ptr`, all access rights.
fn raw(pd: &ProtectionDomain, ptr: *mut u8, len: usize) -> MemoryRegion {
    // SAFETY: every caller keeps the memory mapped until the region is dropped and reads it
    // only through `peek` after the completions that wrote it.
    unsafe { pd.register_raw_iova(ptr, len, ptr as u64, ALL) }.unwrap()
}

/// Copy `n` bytes at `ptr + off` out of caller memory (no reference into it is made).
fn peek(ptr: *const u8, off: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: callers pass memory they own, mapped, with no transport write in flight.
    unsafe { std::ptr::copy_nonoverlapping(ptr.add(off), v.as_mut_ptr(), n) };
    v
}

/// Copy `src` into caller memory at `ptr + off`.
fn poke(ptr: *mut u8, off: usize, src: &[u8]) {
    // SAFETY: as for `peek`.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.add(off), src.len()) };
}

fn peek_u64(ptr: *const u8, off: usize) -> u64 {
    u64::from_ne_bytes(peek(ptr, off, 8).try_into().unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn raw_sge(mr: &MemoryRegion, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr() + off,
        length: len,
        lkey: mr.lkey(),
    }
}

/// Post one signaled WR and wait for its completion.
fn run(e: &End, wr_id: u64, op: SendOp, sges: &[Sge]) -> softrdma::verbs::WorkCompletion {
    e.post_send(wr_id, op, sges);
    let wc = e.wait();
    assert_eq!(wc.wr_id, wr_id);
    wc
}

/// Wait (bounded) until `ctx` reports QP_FATAL for `qpn`.
fn wait_qp_fatal(e: &End) {
    let deadline = Instant::now() + WAIT;
    loop {
        match e.ctx.poll_async_event() {
            Some(AsyncEvent::QpFatal { qp_num }) if qp_num == e.qp.qp_num() => return,
            _ => {}
        }
        assert!(Instant::now() < deadline, "no QP_FATAL event");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn write_read_send_and_atomics_use_caller_memory() {
    let (a, b) = pair();
    // The requester's memory is an mmap'ed area, the responder's a Vec: both the caller's.
    let la = Mapping::new(4 * page_size());
    let mut vb = vec![0u8; 20_000];
    let pb = vb.as_mut_ptr();
    let ma = raw(&a.pd, la.ptr, la.len);
    let mb = raw(&b.pd, pb, vb.len());
    assert_eq!((ma.addr(), ma.len()), (la.ptr as u64, la.len));
    assert_eq!((mb.addr(), mb.len()), (pb as u64, 20_000));

    // RDMA WRITE, several packets at MTU 1024, gathered from a's memory into b's.
    let data = pattern(5000, 1);
    poke(la.ptr, 0, &data);
    let wc = run(
        &a,
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 100,
            rkey: mb.rkey(),
        },
        &[raw_sge(&ma, 0, 5000)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(peek(pb, 100, 5000), data);
    assert_eq!(
        peek(pb, 0, 100),
        vec![0; 100],
        "nothing written before the target"
    );
    assert_eq!(peek(pb, 5100, 8), vec![0; 8], "nothing written after it");

    // RDMA READ from b's memory (the application wrote it directly) into two SGEs of a's.
    let data = pattern(3000, 2);
    poke(pb, 10_000, &data);
    let wc = run(
        &a,
        2,
        SendOp::RdmaRead {
            remote_addr: mb.addr() + 10_000,
            rkey: mb.rkey(),
        },
        &[raw_sge(&ma, 8192, 1000), raw_sge(&ma, 12_000, 2000)],
    );
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 3000));
    assert_eq!(peek(la.ptr, 8192, 1000), data[..1000]);
    assert_eq!(peek(la.ptr, 12_000, 2000), data[1000..]);

    // SEND into a raw receive buffer split over two SGEs.
    let data = pattern(2500, 3);
    poke(la.ptr, 0, &data);
    b.post_recv(7, &[raw_sge(&mb, 15_000, 1500), raw_sge(&mb, 17_000, 1500)]);
    let wc = run(&a, 3, SendOp::Send, &[raw_sge(&ma, 0, 2500)]);
    assert_eq!(wc.status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 2500)
    );
    assert_eq!(peek(pb, 15_000, 1500), data[..1500]);
    assert_eq!(peek(pb, 17_000, 1000), data[1500..]);

    // Atomics on a word of b's memory; the original lands in a's.
    // An 8-byte aligned word (a Vec<u8>'s buffer need not be aligned).
    let word = 4096 + (8 - (mb.addr() + 4096) % 8) % 8;
    poke(pb, word as usize, &100u64.to_ne_bytes());
    let wc = run(
        &a,
        4,
        SendOp::FetchAdd {
            remote_addr: mb.addr() + word,
            rkey: mb.rkey(),
            add: 5,
        },
        &[raw_sge(&ma, 64, 8)],
    );
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(
        (peek_u64(la.ptr, 64), peek_u64(pb, word as usize)),
        (100, 105)
    );
    let wc = run(
        &a,
        5,
        SendOp::CompareSwap {
            remote_addr: mb.addr() + word,
            rkey: mb.rkey(),
            compare: 105,
            swap: 7,
        },
        &[raw_sge(&ma, 72, 8)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(
        (peek_u64(la.ptr, 72), peek_u64(pb, word as usize)),
        (105, 7)
    );
    let wc = run(
        &a,
        6,
        SendOp::CompareSwap {
            remote_addr: mb.addr() + word,
            rkey: mb.rkey(),
            compare: 105,
            swap: 9,
        },
        &[raw_sge(&ma, 72, 8)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!((peek_u64(la.ptr, 72), peek_u64(pb, word as usize)), (7, 7));

    // MemoryRegion::read/write reach the same memory.
    let mut got = [0u8; 4];
    mb.read(100, &mut got).unwrap();
    assert_eq!(got, pattern(5000, 1)[..4]);
    mb.write(0, b"abcd").unwrap();
    assert_eq!(peek(pb, 0, 4), b"abcd");
    assert!(mb.read(19_998, &mut got).is_err());
    assert!(mb.write(19_998, b"abcd").is_err());

    // A misaligned atomic is still a remote invalid request (the QP fails after it).
    a.post_send(
        8,
        SendOp::FetchAdd {
            remote_addr: mb.addr() + word + 4,
            rkey: mb.rkey(),
            add: 1,
        },
        &[raw_sge(&ma, 64, 8)],
    );
    let st = a.wait().status;
    assert!(
        matches!(st, WcStatus::RemInvReqErr | WcStatus::RemAccessErr),
        "{st:?}"
    );
    assert_eq!(peek_u64(pb, word as usize), 7);

    drop((ma, mb));
    drop(vb);
}

#[test]
fn iova_names_the_region_and_bounds_are_checked_against_it() {
    let page = page_size();
    let lb = Mapping::new(2 * page);
    let la = Mapping::new(page);
    // Same offset within a page as the address (as the kernel requires), far from it.
    let iova_b = 0x5a5a_0000_0000u64 + 3 * page as u64;
    let iova_a = 0x1234_0000_0000u64;
    let len_b = 2 * page - 64;
    let (a, b) = pair();
    // SAFETY: the mappings outlive the regions (dropped at the end of the test).
    let ma = unsafe { a.pd.register_raw_iova(la.ptr, la.len, iova_a, ALL) }.unwrap();
    // SAFETY: as above.
    let mb = unsafe { b.pd.register_raw_iova(lb.ptr, len_b, iova_b, ALL) }.unwrap();
    assert_eq!((ma.addr(), mb.addr(), mb.len()), (iova_a, iova_b, len_b));

    // WRITE: local SGE and remote address by iova; the bytes land at address + offset.
    poke(la.ptr, 0, b"via the iova");
    let wc = run(
        &a,
        1,
        SendOp::RdmaWrite {
            remote_addr: iova_b + 1000,
            rkey: mb.rkey(),
        },
        &[raw_sge(&ma, 0, 12)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(peek(lb.ptr, 1000, 12), b"via the iova");

    // READ of the region's last bytes (iova + len - 16).
    poke(lb.ptr, len_b - 16, b"the last sixteen");
    let wc = run(
        &a,
        2,
        SendOp::RdmaRead {
            remote_addr: iova_b + len_b as u64 - 16,
            rkey: mb.rkey(),
        },
        &[raw_sge(&ma, 100, 16)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(peek(la.ptr, 100, 16), b"the last sixteen");

    // Atomic at an iova.
    let wc = run(
        &a,
        3,
        SendOp::FetchAdd {
            remote_addr: iova_b + 8,
            rkey: mb.rkey(),
            add: 3,
        },
        &[raw_sge(&ma, 200, 8)],
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!((peek_u64(la.ptr, 200), peek_u64(lb.ptr, 8)), (0, 3));

    // A local SGE naming the memory's real address is outside the region: a protection error.
    a.post_send(
        4,
        SendOp::RdmaWrite {
            remote_addr: iova_b,
            rkey: mb.rkey(),
        },
        &[Sge {
            addr: la.ptr as u64,
            length: 8,
            lkey: ma.lkey(),
        }],
    );
    assert_eq!(a.wait().status, WcStatus::LocProtErr);

    // Remote accesses: by real address, and across the iova range's end, are refused.
    for (i, (remote_addr, len)) in [
        (lb.ptr as u64, 8u32),          // the memory's own address
        (iova_b + len_b as u64 - 4, 8), // crosses the end (the mapping goes on: 64 bytes)
        (iova_b - 8, 8),                // before the start
        (iova_b + len_b as u64, 1),     // one past the end
    ]
    .into_iter()
    .enumerate()
    {
        let (a, b) = pair();
        // SAFETY: as above.
        let ma = unsafe { a.pd.register_raw_iova(la.ptr, la.len, iova_a, ALL) }.unwrap();
        // SAFETY: as above.
        let mb = unsafe { b.pd.register_raw_iova(lb.ptr, len_b, iova_b, ALL) }.unwrap();
        let wc = run(
            &a,
            i as u64,
            SendOp::RdmaWrite {
                remote_addr,
                rkey: mb.rkey(),
            },
            &[raw_sge(&ma, 0, len)],
        );
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{remote_addr:#x}+{len}");
        drop((ma, mb));
    }
    assert_eq!(
        peek(lb.ptr, len_b - 8, 72),
        [&b"the last sixteen"[8..], &[0u8; 64][..]].concat(),
        "nothing was written around the region"
    );
    drop((ma, mb));
}

#[test]
fn registration_checks() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let page = page_size() as u64;
    let mut v = vec![0u64; 64];
    let p = v.as_mut_ptr().cast::<u8>();
    let len = 64 * 8;
    let einval = |r: softrdma::verbs::Result<MemoryRegion>| {
        let e = r.unwrap_err();
        assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
    };
    // SAFETY (every register_raw below): `v` outlives the regions, which are dropped at once.
    unsafe {
        // The access-flag rules of register().
        einval(pd.register_raw_iova(p, len, p as u64, AccessFlags::REMOTE_WRITE));
        einval(pd.register_raw_iova(p, len, p as u64, AccessFlags::REMOTE_ATOMIC));
        einval(pd.register_raw_iova(p, len, p as u64, AccessFlags::from_bits_retain(1 << 20)));
        // The iova keeps the address's offset within a page.
        einval(pd.register_raw_iova(p, len, p as u64 + 8, ALL));
        einval(pd.register_raw_iova(p, len, p as u64 + page + 1, ALL));
        // Null with a length; overflowing ranges; above max_mr_size.
        einval(pd.register_raw_iova(std::ptr::null_mut(), 8, 0, ALL));
        let top = (usize::MAX - 16) as *mut u8; // refused before any access
        einval(pd.register_raw_iova(top, 64, top as u64, ALL));
        einval(pd.register_raw_iova(
            p,
            page as usize,
            u64::MAX - (page - 1) + (p as u64 % page),
            ALL,
        ));
        let max = ctx.query_device().max_mr_size;
        einval(pd.register_raw_iova(p, max as usize + 1, p as u64, ALL));
        // Zero-length regions are allowed (rdma_rxe allows them), at any address.
        let z = pd
            .register_raw_iova(std::ptr::null_mut(), 0, 0, ALL)
            .unwrap();
        assert!(z.is_empty() && z.lkey() != 0);
        let z2 = pd
            .register_raw_iova(p, 0, p as u64, AccessFlags::NONE)
            .unwrap();
        assert_ne!(z.lkey(), z2.lkey());
        // Read-only registration: read works, write is refused (the memory may be read-only).
        let ro = pd
            .register_raw_iova(p, len, p as u64, AccessFlags::REMOTE_READ)
            .unwrap();
        assert!(ro.write(0, b"x").is_err());
        let mut b = [1u8; 8];
        ro.read(0, &mut b).unwrap();
        assert_eq!(b, [0; 8]);
        // A raw region has no lock: an error, not a panic.
        assert!(matches!(ro.lock(), Err(VerbsError::InvalidArgument(_))));
    }
    drop(v);
}

/// Raw regions count against max_mr with the others.
#[test]
fn raw_regions_count_against_max_mr() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let max = ctx.query_device().max_mr as usize;
    let owned = pd.alloc_mr(8, ALL).unwrap();
    // Zero-length raw regions: no memory to keep alive.
    let mut mrs: Vec<MemoryRegion> = (1..max)
        .map(|_| {
            unsafe { pd.register_raw_iova(std::ptr::null_mut(), 0, 0, AccessFlags::NONE) }.unwrap()
        })
        .collect();
    let full = |r: softrdma::verbs::Result<MemoryRegion>| {
        assert!(matches!(r, Err(VerbsError::NoResources(_))))
    };
    // SAFETY: zero-length.
    full(unsafe { pd.register_raw_iova(std::ptr::null_mut(), 0, 0, AccessFlags::NONE) });
    full(pd.alloc_mr(8, ALL));
    mrs.pop();
    // SAFETY: zero-length.
    mrs.push(
        unsafe { pd.register_raw_iova(std::ptr::null_mut(), 0, 0, AccessFlags::NONE) }.unwrap(),
    );
    drop(owned);
    let _owned = pd.alloc_mr(8, ALL).unwrap();
}

/// A peer keeps writing into a raw mmap'ed region; it is deregistered and, at once, made
/// inaccessible (PROT_NONE): the transport must never touch it again (the process would die of
/// SIGSEGV), the peer's WRITE in progress fails with a remote access error and the rest flush,
/// and the local side is in order.
#[test]
fn deregistration_under_fire() {
    const ROUNDS: usize = 3;
    const LEN: usize = 8192;
    const DEPTH: u64 = 4;
    for _ in 0..ROUNDS {
        let (a, b) = pair();
        let region = Mapping::new(16 * page_size());
        let mb = raw(&b.pd, region.ptr, region.len);
        let (remote_addr, rkey) = (mb.addr(), mb.rkey());
        let span = (region.len - LEN) as u64;
        let done = Arc::new(AtomicU64::new(0));
        let done2 = done.clone();
        let peer = std::thread::spawn(move || {
            let ma = a.mr(LEN);
            ma.write(0, &pattern(LEN, 9)).unwrap();
            let (mut posted, mut ok) = (0u64, 0u64);
            let mut failed = Vec::new();
            // Keep DEPTH WRITEs outstanding until one fails; then collect the rest.
            loop {
                while failed.is_empty() && posted - ok < DEPTH {
                    a.post_send(
                        posted,
                        SendOp::RdmaWrite {
                            remote_addr: remote_addr + (posted * 4096) % span,
                            rkey,
                        },
                        &[sge(&ma, 0, LEN)],
                    );
                    posted += 1;
                }
                let wc = a.wait();
                if wc.status == WcStatus::Success && failed.is_empty() {
                    ok += 1;
                    done2.store(ok, Ordering::Release);
                } else {
                    failed.push((wc.wr_id, wc.status));
                }
                if ok + failed.len() as u64 == posted {
                    break;
                }
            }
            (a, ok, posted, failed)
        });
        // Under fire: the peer has completed writes and keeps DEPTH more going.
        let t0 = Instant::now();
        while done.load(Ordering::Acquire) < 20 {
            assert!(t0.elapsed() < WAIT, "the peer's writes do not complete");
            std::thread::yield_now();
        }
        mb.deregister();
        region.protect_none();
        let (a, ok, posted, failed) = peer.join().unwrap();
        assert!(ok >= 20);
        // The first failure is the remote access error, in order; everything after it flushed.
        assert_eq!(failed[0], (ok, WcStatus::RemAccessErr), "{failed:?}");
        for (i, &(wr_id, st)) in failed.iter().enumerate().skip(1) {
            assert_eq!((wr_id, st), (ok + i as u64, WcStatus::WrFlushErr));
        }
        assert_eq!(ok + failed.len() as u64, posted);
        assert_eq!(a.qp.state().unwrap(), QpState::Err);

        // The local side: its QP failed (a responder error) and says so; no completion of its
        // own; its context goes on serving new regions and connections.
        assert_eq!(b.qp.state().unwrap(), QpState::Err);
        wait_qp_fatal(&b);
        assert!(b.cq.is_empty());
        // The peer keeps trying the dead rkey on fresh connections: refused each time.
        for i in 0..3 {
            let (a2, b2) = (End::new(a.ctx.clone()), End::new(b.ctx.clone()));
            connect(&a2.qp, 1, b2.qp.qp_num(), 2, b2.ctx.gid());
            connect(&b2.qp, 2, a2.qp.qp_num(), 1, a2.ctx.gid());
            let src = a2.mr(64);
            let wc = run(
                &a2,
                i,
                SendOp::RdmaWrite { remote_addr, rkey },
                &[sge(&src, 0, 64)],
            );
            assert_eq!(wc.status, WcStatus::RemAccessErr);
        }
        // A fresh raw region on the same PD, through a new QP of the same context, works.
        let mut v = vec![0u8; 64];
        let fresh = raw(&b.pd, v.as_mut_ptr(), 64);
        let a3 = End::new(a.ctx.clone());
        let b3 =
            b.pd.create_qp(&QpInitAttr {
                send_cq: &b.cq,
                recv_cq: &b.cq,
                cap: QpCaps::default(),
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        connect(&a3.qp, 3, b3.qp_num(), 4, b.ctx.gid());
        connect(&b3, 4, a3.qp.qp_num(), 3, a3.ctx.gid());
        let src = a3.mr(64);
        src.write(0, b"still alive").unwrap();
        let wc = run(
            &a3,
            9,
            SendOp::RdmaWrite {
                remote_addr: fresh.addr(),
                rkey: fresh.rkey(),
            },
            &[sge(&src, 0, 11)],
        );
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(peek(v.as_ptr(), 0, 11), b"still alive");
        drop(fresh);
        drop(v);
        drop(region);
    }
}

/// Which memory a scenario registers.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Owned,
    Raw,
}

/// A deregistered region of `kind` on `e`'s PD: its (addr, lkey), the memory made inaccessible
/// if it is raw (so any touch by the transport would kill the process).
fn dead_region(e: &End, kind: Kind, keep: &mut Vec<Mapping>) -> (u64, u32) {
    let mr = match kind {
        Kind::Owned => e.mr(64),
        Kind::Raw => {
            let m = Mapping::new(page_size());
            let mr = raw(&e.pd, m.ptr, 64);
            keep.push(m);
            mr
        }
    };
    let r = (mr.addr(), mr.lkey());
    mr.deregister();
    if let Kind::Raw = kind {
        keep.last().unwrap().protect_none();
    }
    r
}

/// A local work request naming a deregistered region: the same outcome for raw as for owned
/// regions (rdma-core/rxe: a gather or scatter through an invalid lkey is a local protection
/// error), and the memory is not touched.
#[test]
fn local_wrs_with_a_deregistered_lkey_fail_as_for_owned_regions() {
    let mut keep = Vec::new();
    let mut outcomes = Vec::new();
    for kind in [Kind::Owned, Kind::Raw] {
        // Send side: the gather fails.
        let (a, b) = pair();
        let mb = b.mr(64);
        let (addr, lkey) = dead_region(&a, kind, &mut keep);
        let dead = Sge {
            addr,
            length: 8,
            lkey,
        };
        let write = run(
            &a,
            1,
            SendOp::RdmaWrite {
                remote_addr: mb.addr(),
                rkey: mb.rkey(),
            },
            &[dead],
        )
        .status;
        // Inline: refused at post time.
        let e =
            a.qp.post_send(&[SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg_list: &[dead],
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            }])
            .unwrap_err();
        let inline = match e {
            VerbsError::PostInline { index: 0, error } => error,
            e => panic!("{kind:?}: {e}"),
        };
        // READ response scattered into it: fails too.
        let (a, b) = pair();
        let mb = b.mr(64);
        let (addr, lkey) = dead_region(&a, kind, &mut keep);
        let read = run(
            &a,
            3,
            SendOp::RdmaRead {
                remote_addr: mb.addr(),
                rkey: mb.rkey(),
            },
            &[Sge {
                addr,
                length: 8,
                lkey,
            }],
        )
        .status;
        // Receive side: a receive WR scattering into it.
        let (a, b) = pair();
        let ma = a.mr(64);
        let (addr, lkey) = dead_region(&b, kind, &mut keep);
        b.qp.post_recv(&[RecvWr {
            wr_id: 4,
            sg_list: &[Sge {
                addr,
                length: 64,
                lkey,
            }],
        }])
        .unwrap();
        a.post_send(5, SendOp::Send, &[sge(&ma, 0, 8)]);
        let recv = b.wait();
        assert_eq!(recv.wr_id, 4);
        outcomes.push((write, inline, read, recv.status));
    }
    assert_eq!(
        outcomes[0],
        (
            WcStatus::LocProtErr,
            // An inline post says why the key is unknown now.
            MemError::Deregistered,
            WcStatus::LocProtErr,
            WcStatus::LocProtErr
        )
    );
    assert_eq!(outcomes[1], outcomes[0], "raw as owned");
    drop(keep);
}

/// Two QPs, driven from two threads, fetch-and-add 1 on the same raw word N times each while
/// the application adds to it with its own atomics: every original value is distinct and the
/// word ends at the sum.
#[test]
fn atomics_on_a_raw_word_are_atomic_across_qps_threads_and_the_application() {
    const N: usize = 400;
    const DEPTH: usize = 8;
    let b = End::new(loopback_ctx());
    let word = Box::new(AtomicU64::new(0));
    let wp = word.as_ptr().cast::<u8>();
    let mb = raw(&b.pd, wp, 8);
    let qb2 =
        b.pd.create_qp(&QpInitAttr {
            send_cq: &b.cq,
            recv_cq: &b.cq,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let a1 = End::new(loopback_ctx());
    let a2 = End::new(loopback_ctx());
    connect(&a1.qp, 10, b.qp.qp_num(), 20, b.ctx.gid());
    connect(&b.qp, 20, a1.qp.qp_num(), 10, a1.ctx.gid());
    connect(&a2.qp, 30, qb2.qp_num(), 40, b.ctx.gid());
    connect(&qb2, 40, a2.qp.qp_num(), 30, a2.ctx.gid());
    let (remote_addr, rkey) = (mb.addr(), mb.rkey());
    let started = Arc::new(AtomicUsize::new(0));
    let requester = |a: End, started: Arc<AtomicUsize>| {
        std::thread::spawn(move || {
            // Each fetch-add returns its original into its own slot of a raw result array.
            let mut results = vec![u64::MAX; N];
            let rp = results.as_mut_ptr().cast::<u8>();
            let mr = raw(&a.pd, rp, N * 8);
            started.fetch_add(1, Ordering::AcqRel);
            let (mut posted, mut done) = (0usize, 0usize);
            while done < N {
                while posted < N && posted - done < DEPTH {
                    a.post_send(
                        posted as u64,
                        SendOp::FetchAdd {
                            remote_addr,
                            rkey,
                            add: 1,
                        },
                        &[raw_sge(&mr, posted as u64 * 8, 8)],
                    );
                    posted += 1;
                }
                let wc = a.wait();
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done += 1;
            }
            drop(mr);
            (a, results)
        })
    };
    let t1 = requester(a1, started.clone());
    let t2 = requester(a2, started.clone());
    // The application's own atomics on the word, for as long as the requesters run.
    while started.load(Ordering::Acquire) < 2 {
        std::thread::yield_now();
    }
    let mut mine = Vec::new();
    while !(t1.is_finished() && t2.is_finished()) {
        mine.push(word.fetch_add(1, Ordering::SeqCst));
        std::thread::yield_now();
    }
    let (_a1, r1) = t1.join().unwrap();
    let (_a2, r2) = t2.join().unwrap();
    drop(mb);
    let total = (2 * N + mine.len()) as u64;
    assert_eq!(word.load(Ordering::SeqCst), total);
    let all: HashSet<u64> = r1.iter().chain(&r2).chain(&mine).copied().collect();
    assert_eq!(
        all.len(),
        total as usize,
        "every original value is distinct"
    );
    assert!(all.iter().all(|&v| v < total));
    drop(qb2);
}
