//! The Rust API's conveniences keep the semantics of the raw verbs under them: typed queue
//! pairs and their work-request builders, buffers as types with their bounds, one-call
//! connections (verbs and rdma_cm), completions as results, owned and borrowed registration,
//! and the errors a NIC would give (`max_rd_atomic` 0, an access the peer does not grant).
mod verbs_util;

use std::time::Duration;

use softrdma::rdma_cm::{
    CmaError, Connection, ConnectionOptions, EventChannel, Listener, PortSpace,
};
use softrdma::verbs::*;

const T: Duration = Duration::from_secs(30);
const ALL: AccessFlags = AccessFlags::all();

struct Pair {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    a: Qp<Rc>,
    b: Qp<Rc>,
}

fn pair_with(opts: &ConnectOptions) -> Pair {
    let ctx = verbs_util::loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let a = pd.create_rc_qp(&cq).unwrap();
    let b = pd.create_rc_qp(&cq).unwrap();
    a.connect(&b.endpoint(), opts).unwrap();
    b.connect(&a.endpoint(), opts).unwrap();
    Pair {
        _ctx: ctx,
        pd,
        cq,
        a,
        b,
    }
}

fn pair() -> Pair {
    pair_with(&ConnectOptions::default())
}

#[test]
fn builders_move_the_bytes_and_complete_with_their_ids() {
    let p = pair();
    let mr = p.pd.alloc_mr(1 << 16, ALL).unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    mr.write(0, &data).unwrap();
    // A gather from two pieces into one remote range, with immediate: a receive is needed.
    p.b.recv(mr.slice(60_000..60_064).unwrap())
        .id(9)
        .post()
        .unwrap();
    let remote = mr.remote(10_000..20_000).unwrap();
    p.a.write(mr.slice(..3000).unwrap(), remote)
        .also(mr.slice(3000..5000).unwrap())
        .imm(77)
        .id(1)
        .post()
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(p.cq.wait(T).unwrap().ok().unwrap());
    }
    seen.sort_by_key(|wc| wc.wr_id);
    assert_eq!((seen[0].wr_id, seen[0].opcode), (1, WcOpcode::RdmaWrite));
    assert_eq!(
        (
            seen[1].wr_id,
            seen[1].opcode,
            seen[1].imm(),
            seen[1].byte_len
        ),
        (9, WcOpcode::RecvRdmaWithImm, Some(77), 5000)
    );
    let mut got = vec![0u8; 5000];
    mr.read(10_000, &mut got).unwrap();
    assert_eq!(got, data);
    // READ it back elsewhere, fenced behind nothing in particular.
    p.a.read(mr.slice(30_000..35_000).unwrap(), remote)
        .fence()
        .id(2)
        .post()
        .unwrap();
    let wc = p.cq.wait(T).unwrap().ok().unwrap();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len),
        (2, WcOpcode::RdmaRead, 5000)
    );
    mr.read(30_000, &mut got).unwrap();
    assert_eq!(got, data);
    // Atomics on an aligned word.
    let word = mr.remote(40_000..40_008).unwrap();
    p.a.fetch_add(mr.slice(40_008..40_016).unwrap(), word, 3)
        .post()
        .unwrap();
    p.cq.wait(T).unwrap().ok().unwrap();
    p.a.compare_swap(mr.slice(40_008..40_016).unwrap(), word, 3, 10)
        .post()
        .unwrap();
    p.cq.wait(T).unwrap().ok().unwrap();
    let mut w = [0u8; 8];
    mr.read(40_000, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 10);
}

#[test]
fn unsignaled_requests_complete_only_on_error_and_drain_empties_the_cq() {
    let p = pair();
    let mr = p.pd.alloc_mr(4096, ALL).unwrap();
    for i in 0..10 {
        p.a.write(mr.slice(..8).unwrap(), mr.remote(8..16).unwrap())
            .id(i)
            .unsignaled()
            .post()
            .unwrap();
    }
    p.a.write(mr.slice(..8).unwrap(), mr.remote(8..16).unwrap())
        .id(10)
        .post()
        .unwrap();
    let wc = p.cq.wait(T).unwrap().ok().unwrap();
    assert_eq!(wc.wr_id, 10, "the unsignaled ones gave no completion");
    assert_eq!(p.cq.drain().count(), 0);
}

#[test]
fn bounds_are_checked_where_buffers_are_cut_and_posted() {
    let p = pair();
    let mr = p.pd.alloc_mr(4096, ALL).unwrap();
    assert!(matches!(
        mr.slice(4000..4097),
        Err(VerbsError::OutOfBounds { size: 4096, .. })
    ));
    let backwards = std::ops::Range { start: 10, end: 5 };
    assert!(mr.slice(backwards).is_err());
    let r = mr.remote(0..100).unwrap();
    assert!(r.slice(50..101).is_err());
    assert_eq!(r.slice(50..).unwrap().len, 50);
    // The local side longer than the remote buffer: refused before anything is sent.
    let e = p.a.write(mr.slice(..200).unwrap(), r).post().unwrap_err();
    assert!(e.to_string().contains("longer than the remote"), "{e}");
    // Immediate data on a READ, a 4-byte atomic.
    assert!(p.a.read(mr.slice(..8).unwrap(), r).imm(1).post().is_err());
    assert!(p.a.fetch_add(mr.slice(..4).unwrap(), r, 1).post().is_err());
    // A region peers may not touch has no remote slice.
    let private = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(private.remote(..).is_err());
    // Nothing was posted: the QP is still fine.
    p.a.write(mr.slice(..8).unwrap(), r).post().unwrap();
    p.cq.wait(T).unwrap().ok().unwrap();
}

#[test]
fn max_rd_atomic_zero_is_honoured_on_both_sides() {
    let mut no_rd = ConnectOptions::default();
    no_rd.max_rd_atomic = 0;
    let p = pair_with(&no_rd);
    let mr = p.pd.alloc_mr(4096, ALL).unwrap();
    // The requester may issue none: refused at post, as a NIC would never send it.
    let e =
        p.a.read(mr.slice(..8).unwrap(), mr.remote(..8).unwrap())
            .post()
            .unwrap_err();
    assert!(e.to_string().contains("max_rd_atomic is 0"), "{e}");
    // A requester allowed to issue toward a responder that serves none: NAK invalid request.
    let ctx = verbs_util::loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let (a, b) = (pd.create_rc_qp(&cq).unwrap(), pd.create_rc_qp(&cq).unwrap());
    a.connect(&b.endpoint(), &ConnectOptions::default())
        .unwrap();
    b.connect(&a.endpoint(), &no_rd).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    a.read(mr.slice(..8).unwrap(), mr.remote(8..16).unwrap())
        .post()
        .unwrap();
    let wc = cq.wait(T).unwrap();
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert!(wc
        .ok()
        .unwrap_err()
        .to_string()
        .contains("max_dest_rd_atomic"));
}

#[test]
fn a_remote_access_the_peer_does_not_grant_fails_with_a_cause() {
    let p = pair();
    let local = p.pd.alloc_mr(64, ALL).unwrap();
    let read_only = p.pd.alloc_mr(64, AccessFlags::REMOTE_READ).unwrap();
    p.a.write(local.slice(..8).unwrap(), read_only.remote(..).unwrap())
        .id(5)
        .post()
        .unwrap();
    let err = p.cq.wait(T).unwrap().ok().unwrap_err();
    assert_eq!((err.wc.status, err.wc.wr_id), (WcStatus::RemAccessErr, 5));
    let text = err.to_string();
    assert!(
        text.contains("RDMA WRITE (wr_id 5)") && text.contains("REMOTE_WRITE"),
        "{text}"
    );
}

#[test]
fn waiting_times_out_and_a_wait_leaves_the_cqs_channel_to_the_application() {
    let ctx = verbs_util::loopback_ctx();
    let cq = ctx.create_cq(16, None).unwrap();
    assert!(matches!(
        cq.wait(Duration::from_millis(20)),
        Err(VerbsError::Timeout(_))
    ));
    // With a channel the application armed: the wait returns the completion from another
    // thread, and the channel's event and its blocking mode stay the application's.
    let ch = ctx.create_comp_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    let (a, b) = (pd.create_rc_qp(&cq).unwrap(), pd.create_rc_qp(&cq).unwrap());
    a.connect(&b.endpoint(), &ConnectOptions::default())
        .unwrap();
    b.connect(&a.endpoint(), &ConnectOptions::default())
        .unwrap();
    let mr = pd.alloc_mr(64, ALL).unwrap();
    cq.req_notify(false).unwrap();
    let waiter = {
        let cq = cq.clone();
        std::thread::spawn(move || cq.wait(T).map(|wc| wc.opcode))
    };
    std::thread::sleep(Duration::from_millis(50));
    b.recv(mr.slice(..16).unwrap()).post().unwrap();
    a.send(mr.slice(16..24).unwrap())
        .unsignaled()
        .post()
        .unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), WcOpcode::Recv);
    // SAFETY: F_GETFL on the channel's open descriptor.
    let flags = unsafe { libc::fcntl(ch.fd(), libc::F_GETFL) };
    assert_eq!(flags & libc::O_NONBLOCK, 0, "the channel's fd still blocks");
    let evcq = ch.get_cq_event().unwrap();
    evcq.ack_events(1);
    drop(evcq);
    drop((a, b));
    cq.destroy()
        .map_err(|(e, _)| e)
        .expect("the event was acknowledged: the CQ can go");
}

#[test]
fn owned_regions_give_their_memory_back_and_borrowed_ones_end_with_their_scope() {
    let ctx = verbs_util::loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd
        .register(vec![1u8, 2, 3], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let addr = mr.addr();
    let v = mr.into_inner().unwrap();
    assert_eq!(v, vec![1, 2, 3]);
    assert_eq!(v.as_ptr() as u64, addr, "the same allocation, given back");
    // An alloc_mr region gives a copy of its bytes.
    let mr = pd.alloc_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write(0, b"sixteen bytes!!!").unwrap();
    assert_eq!(mr.into_inner().unwrap(), b"sixteen bytes!!!");
    // A raw region's memory is the caller's: an error, with the region back.
    let mut raw = vec![0u8; 64];
    // SAFETY: `raw` outlives the region (dropped at the end of this test, after it).
    let r =
        unsafe { pd.register_raw(raw.as_mut_ptr(), raw.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    let (e, r) = r.into_inner().unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)));
    assert!(
        r.lock().is_err(),
        "a raw region has no lock (an error, not a panic)"
    );
    drop(r);

    // Borrowed: a peer may write while the scope lasts, not after.
    let p = pair();
    let src = p.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"into the borrowed buffer").unwrap();
    let mut buf = vec![0u8; 64];
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let remote =
        p.pd.register_borrowed(&mut buf, access, |mr| {
            let r = mr.remote(..)?;
            p.a.write(src.slice(..24)?, r).post()?;
            p.cq.wait(T)?.ok()?;
            Ok(r)
        })
        .unwrap();
    assert_eq!(&buf[..24], b"into the borrowed buffer");
    p.a.write(src.slice(..24).unwrap(), remote).post().unwrap();
    let wc = p.cq.wait(T).unwrap();
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "the scope ended: the key is gone"
    );
}

#[test]
fn ud_queue_pairs_send_to_an_address_handle() {
    let ctx = verbs_util::loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let (a, b) = (pd.create_ud_qp(&cq).unwrap(), pd.create_ud_qp(&cq).unwrap());
    a.activate(7).unwrap();
    b.activate(7).unwrap();
    let mr = pd.alloc_mr(512, ALL).unwrap();
    b.recv(mr.slice(..GRH_LEN + 64).unwrap())
        .id(1)
        .post()
        .unwrap();
    mr.write(300, b"ud hello").unwrap();
    let ah = pd.create_ah(&AhAttr::new(ctx.gid())).unwrap();
    a.send_to(mr.slice(300..308).unwrap(), &ah, b.qp_num(), 7)
        .id(2)
        .post()
        .unwrap();
    let mut ids = vec![
        cq.wait(T).unwrap().ok().unwrap().wr_id,
        cq.wait(T).unwrap().ok().unwrap().wr_id,
    ];
    ids.sort();
    assert_eq!(ids, [1, 2]);
    let mut got = [0u8; 8];
    mr.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"ud hello");
}

#[test]
fn endpoints_and_remote_buffers_survive_their_wire_forms() {
    let p = pair();
    let e = p.a.endpoint();
    assert_eq!(QpEndpoint::from_bytes(&e.to_bytes()).unwrap(), e);
    assert_eq!(e.qpn, p.a.qp_num());
    assert!(QpEndpoint::from_bytes(&e.to_bytes()[..25]).is_err());
    let mr = p.pd.alloc_mr(64, ALL).unwrap();
    let r = mr.remote(..).unwrap();
    assert_eq!(RemoteSlice::from_bytes(&r.to_bytes()).unwrap(), r);
    let mut wrap = r.to_bytes();
    wrap[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(RemoteSlice::from_bytes(&wrap).is_err(), "wraps around");
}

#[test]
fn rdma_cm_connections_in_one_call_allow_read_by_default() {
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        listener.accept_with(|pd| {
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
            mr.write(0, b"exposed")?;
            let data = mr.remote(..)?.to_bytes();
            Ok((mr, ConnectionOptions::default().with_private_data(&data)))
        })
    });
    let conn = Connection::connect(
        to,
        &ConnectionOptions::default().with_private_data(b"hi from the client"),
    )
    .unwrap();
    let theirs = RemoteSlice::from_bytes(conn.peer_data()).unwrap();
    let mr = conn.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    conn.qp()
        .read(mr.slice(..7).unwrap(), theirs)
        .post()
        .unwrap();
    conn.cq().wait(T).unwrap().ok().unwrap();
    let mut got = [0u8; 7];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"exposed");
    let (sconn, _mr) = server.join().unwrap().unwrap();
    // Padded with zeros to the REQ's 56 bytes, as librdmacm reports it.
    assert_eq!(sconn.peer_data().len(), 56);
    assert!(sconn.peer_data().starts_with(b"hi from the client"));
    drop(conn);
    assert!(sconn.wait_disconnect(T), "the client's drop disconnects");
}

#[test]
fn rdma_cm_errors_say_where_the_id_is_and_what_comes_next() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let e = id.resolve_route(Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, CmaError::InvalidState(_)));
    assert!(e.to_string().contains("resolve_addr first"), "{e}");
    // Nobody listens: REJECTED, said as such.
    let e = Connection::connect(
        "127.0.0.1:9".parse().unwrap(),
        &ConnectionOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("REJECTED") || e.to_string().contains("UNREACHABLE"),
        "{e}"
    );
    id.destroy();
}

#[test]
fn typed_queue_pairs_refuse_the_wrong_transport() {
    let ctx = verbs_util::loopback_ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let ud = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq)).unwrap();
    assert!(Qp::<Rc>::from_queue_pair(ud).is_err());
    assert!(pd
        .create_typed_qp::<Uc>(&QpInitAttr::new(QpType::Rc, &cq))
        .is_err());
    let uc: Qp<Uc> = pd.create_uc_qp(&cq).unwrap();
    assert_eq!(uc.qp_type(), QpType::Uc);
}

#[test]
fn the_responder_counts_why_it_refused_each_access() {
    // Each refusal fails the requesting QP: a fresh pair per case. A case gives the target
    // and the region it lies in when that is not `local` (kept registered until the answer).
    type Case = dyn Fn(&Pair, &MemoryRegion) -> (RemoteSlice, Option<MemoryRegion>);
    let refused = |case: &Case, opts: &ConnectOptions| -> AccessRefusals {
        let p = pair_with(opts);
        let local = p.pd.alloc_mr(64, ALL).unwrap();
        let (target, _region) = case(&p, &local);
        p.a.write(local.slice(..8).unwrap(), target).post().unwrap();
        let wc = p.cq.wait(T).unwrap();
        assert_eq!(wc.status, WcStatus::RemAccessErr);
        p._ctx.stats().unwrap().refused
    };
    let default = ConnectOptions::default();
    let r = refused(
        &|p, _| {
            let ro = p.pd.alloc_mr(64, AccessFlags::REMOTE_READ).unwrap();
            (ro.remote(..).unwrap(), Some(ro))
        },
        &default,
    );
    assert_eq!(r.region_access, 1, "{r:?}");
    let r = refused(
        &|_, l| {
            let bad_key = RemoteSlice {
                rkey: l.rkey() ^ 0x5a5a_5a5a,
                ..l.remote(..).unwrap()
            };
            (bad_key, None)
        },
        &default,
    );
    assert_eq!(r.unknown_key, 1, "{r:?}");
    let r = refused(
        &|p, _| {
            let gone = p.pd.alloc_mr(64, ALL).unwrap();
            let r = gone.remote(..).unwrap();
            drop(gone);
            (r, None)
        },
        &default,
    );
    assert_eq!(r.deregistered, 1, "{r:?}");
    let r = refused(
        &|_, l| {
            let past_end = RemoteSlice {
                addr: l.addr() + 60,
                ..l.remote(..).unwrap()
            };
            (past_end, None)
        },
        &default,
    );
    assert_eq!(r.out_of_bounds, 1, "{r:?}");
    let mut read_only_qp = ConnectOptions::default();
    read_only_qp.access = Some(AccessFlags::REMOTE_READ);
    let r = refused(&|_, l| (l.remote(..).unwrap(), None), &read_only_qp);
    assert_eq!(r.qp_access, 1, "{r:?}");
}
