//! Memory regions: access-flag rules, keys, bounds, alignment, protection domains.
mod verbs_util;

use std::collections::HashSet;

use softrdma::transport::AccessFlags;
use softrdma::verbs::VerbsError;
use verbs_util::*;

#[test]
fn remote_write_or_atomic_needs_local_write() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    for bad in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    ] {
        let e = pd.alloc_mr(64, bad).unwrap_err();
        assert!(matches!(e, VerbsError::InvalidArgument(_)), "{bad:?}: {e}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    for ok in [
        AccessFlags::NONE,
        AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_READ,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        ALL,
    ] {
        let mr = pd.alloc_mr(64, ok).unwrap();
        assert_eq!(mr.access(), ok);
    }
    assert!(pd
        .alloc_mr(64, AccessFlags::from_bits_retain(1 << 20))
        .is_err());
}

#[test]
fn keys_are_unique_and_not_sequential() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mrs: Vec<_> = (0..500).map(|_| pd.alloc_mr(8, ALL).unwrap()).collect();
    let keys: HashSet<u32> = mrs.iter().map(|m| m.rkey()).collect();
    assert_eq!(keys.len(), mrs.len());
    assert!(mrs.iter().all(|m| m.lkey() == m.rkey() && m.rkey() != 0));
    // Not guessable from one another: consecutive keys do not differ by a constant.
    let diffs: HashSet<u32> = mrs
        .windows(2)
        .map(|w| w[1].rkey().wrapping_sub(w[0].rkey()))
        .collect();
    assert!(diffs.len() > 400);
}

#[test]
fn alloc_mr_is_zeroed_and_aligned() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    for len in [0usize, 1, 63, 64, 4097, 1 << 20] {
        let mr = pd.alloc_mr(len, ALL).unwrap();
        assert_eq!(mr.len(), len);
        assert_eq!(mr.addr() % 64, 0, "len {len}");
        assert!(mr.lock().unwrap().iter().all(|&b| b == 0));
        assert_eq!(mr.lock().unwrap().len(), len);
    }
}

#[test]
fn register_owns_the_buffer_and_reads_writes_are_bounded() {
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let v = b"0123456789".to_vec();
    let ptr = v.as_ptr() as u64;
    let mr = pd.register(v, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        mr.addr(),
        ptr,
        "the VA is the buffer's address, as with ibv_reg_mr"
    );
    assert_eq!(mr.len(), 10);
    let mut b = [0u8; 4];
    mr.read(6, &mut b).unwrap();
    assert_eq!(&b, b"6789");
    assert!(mr.read(7, &mut b).is_err());
    assert!(mr.read(usize::MAX, &mut b).is_err());
    mr.write(0, b"ab").unwrap();
    assert!(mr.write(9, b"ab").is_err());
    mr.lock().unwrap()[2] = b'!';
    assert_eq!(&mr.lock().unwrap()[..4], b"ab!3");
    let boxed: Box<[u8]> = vec![1u8; 16].into_boxed_slice();
    let mr2 = pd.register(boxed, AccessFlags::NONE).unwrap();
    assert_eq!(mr2.lock().unwrap()[15], 1);
}

#[test]
fn many_threads_touch_one_region() {
    // The per-MR lock makes concurrent access data-race free.
    let ctx = loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mr = std::sync::Arc::new(pd.alloc_mr(8, ALL).unwrap());
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let mr = mr.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    let mut g = mr.lock().unwrap();
                    let v = u64::from_ne_bytes(g[..8].try_into().unwrap()) + 1;
                    g[..8].copy_from_slice(&v.to_ne_bytes());
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut b = [0u8; 8];
    mr.read(0, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 4000);
}

/// Holding a region's guard while calling into the library cannot deadlock (the transport may
/// need that very lock): polling works (the progress thread drives meanwhile); verbs that need
/// the engine fail with `Busy` on that thread instead of hanging.
#[test]
fn holding_a_guard_while_polling_and_posting_does_not_deadlock() {
    use softrdma::transport::{SendOp, WcStatus};
    let (a, b) = pair();
    let ma = a.mr(64);
    let mb = b.mr(64);
    ma.write(0, b"guarded!").unwrap();
    b.post_recv(1, &[sge(&mb, 0, 64)]);
    a.post_send(1, SendOp::Send, &[sge(&ma, 0, 8)]);
    {
        let g = ma.lock().unwrap();
        assert_eq!(&g[..8], b"guarded!");
        // Posting needs the engine: refused while the guard lives.
        let e =
            a.qp.post_recv(&[softrdma::verbs::RecvWr {
                wr_id: 5,
                sg_list: &[],
            }])
            .unwrap_err();
        assert!(matches!(e, VerbsError::Busy(_)), "{e}");
        assert!(a.qp.query().is_err());
        // Polling is fine; the progress threads move the SEND along (reading `ma` waits for
        // the guard) — poll a bounded number of times, without asserting on timing.
        let mut wc = [Default::default()];
        for _ in 0..1000 {
            let _ = a.cq.poll(&mut wc).unwrap();
        }
        drop(g);
    }
    // The send completes once the guard is gone (possibly already polled above).
    let got = b.wait();
    assert_eq!((got.status, got.byte_len), (WcStatus::Success, 8));
    assert_eq!(&mb.lock().unwrap()[..8], b"guarded!");
    // Dropping a QP while holding a guard does not hang either.
    let g = ma.lock().unwrap();
    drop(a);
    drop(g);
}
