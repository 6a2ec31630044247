//! Device list, device/port attributes, GIDs.
mod verbs_util;

use std::net::Ipv4Addr;
use std::process::Command;

use softrdma::transport::Mtu;
use softrdma::verbs::{gid_from_ipv4, ipv4_from_gid, AtomicCap, PortState, VerbsError};
use verbs_util::*;

/// As rdma_rxe: one device per interface; the first one reaches other hosts (the default
/// route's interface when there is one), the loopback device is last.
#[test]
fn list_has_loopback_last_and_names_in_order() {
    if std::env::var_os("SOFTRDMA_ADDR").is_some() {
        return; // the child of `softrdma_addr_env` below
    }
    let devs = softrdma::devices().unwrap();
    assert!(!devs.is_empty());
    let last = devs.last().unwrap();
    assert!(last.addr().is_loopback(), "loopback last: {devs:?}");
    assert_eq!(last.ifname(), "lo");
    assert!(devs[..devs.len() - 1]
        .iter()
        .all(|d| !d.addr().is_loopback()));
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(d.name(), format!("srxe{i}"));
    }
    let ifs: std::collections::HashSet<_> = devs.iter().map(|d| d.ifname()).collect();
    assert_eq!(ifs.len(), devs.len(), "one device per interface: {devs:?}");
    // The default route's interface, if any, comes first.
    let route = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    if let Some(dflt) = route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    }) {
        assert_eq!(devs[0].ifname(), dflt, "{devs:?}");
    }
}

#[test]
fn device_and_port_attributes() {
    let ctx = loopback_ctx();
    let a = ctx.query_device();
    assert_eq!(a.atomic_cap, AtomicCap::Hca);
    assert!(a.max_qp >= 1024 && a.max_qp_wr >= 1024 && a.max_sge >= 4);
    assert!(a.max_cq >= 1024 && a.max_cqe >= 4096 && a.max_mr >= 1024);
    assert!(a.max_qp_rd_atom >= 16 && a.max_qp_init_rd_atom >= 16);
    assert!(a.max_mr_size >= 1 << 30);
    assert_eq!(a.phys_port_cnt, 1);
    assert_eq!(a.node_guid, ctx.node_guid());
    // The GUID carries the bound address.
    assert_eq!(&a.node_guid.to_be_bytes()[4..], &ctx.addr().octets());

    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.max_mtu, Mtu::Mtu4096);
    // Loopback's MTU is 65536: 4096 fits.
    assert_eq!(p.active_mtu, Mtu::Mtu4096);
    assert!(p.link_layer_ethernet);
    assert!(p.gid_tbl_len >= 2);
    assert!(matches!(
        ctx.query_port(2),
        Err(VerbsError::InvalidArgument(_))
    ));
}

#[test]
fn active_mtu_follows_the_interface_like_rxe() {
    // rxe: largest IB MTU <= netdev MTU - 80 (RXE_MAX_HDR_LENGTH).
    for d in softrdma::devices().unwrap() {
        let m = d.active_mtu().bytes() as u32;
        assert!(m <= d.if_mtu().saturating_sub(80) || m == 256, "{d:?}");
        if d.if_mtu() == 1500 {
            assert_eq!(d.active_mtu(), Mtu::Mtu1024);
        }
        if d.if_mtu() >= 4096 + 80 {
            assert_eq!(d.active_mtu(), Mtu::Mtu4096);
        }
    }
}

#[test]
fn gid_indexes_0_and_1_hold_the_ipv4_mapped_gid() {
    let ctx = loopback_ctx();
    let g0 = ctx.query_gid(1, 0).unwrap();
    let g1 = ctx.query_gid(1, 1).unwrap();
    assert_eq!(g0, g1);
    assert_eq!(g0, ctx.gid());
    assert_eq!(&g0[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(ipv4_from_gid(&g0), Some(ctx.addr()));
    // The IPv6 addresses follow (`::1` here, unless IPv6 is off): see tests/verbs_ipv6.rs.
    let len = ctx.query_port(1).unwrap().gid_tbl_len as u8;
    for i in 2..len {
        assert_eq!(ipv4_from_gid(&ctx.query_gid(1, i).unwrap()), None);
    }
    assert!(ctx.query_gid(1, len).is_err());
    assert!(ctx.query_gid(2, 0).is_err());
    assert_eq!(
        gid_from_ipv4(Ipv4Addr::new(10, 1, 2, 3))[12..],
        [10, 1, 2, 3]
    );
    assert_eq!(ipv4_from_gid(&[0xfe; 16]), None);
}

/// Two contexts on one device share it, as two processes on one rdma_rxe device do: one
/// address, one GID, one node GUID; their QPNs differ in the top byte (the slot that steers
/// each datagram to its context: `driver::share`).
#[test]
fn two_contexts_share_the_loopback_device() {
    let a = loopback_ctx();
    let b = loopback_ctx();
    assert!(a.addr().is_loopback());
    assert_eq!(a.addr(), b.addr());
    assert_eq!(a.gid(), b.gid());
    assert_eq!(a.node_guid(), b.node_guid());
    let qpn = |c: &softrdma::verbs::Context| {
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(4, None).unwrap();
        let qp = pd
            .create_qp(&softrdma::verbs::QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: Default::default(),
                qp_type: softrdma::verbs::QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        qp.qp_num()
    };
    let (qa, qb) = (qpn(&a), qpn(&b));
    assert_ne!(qa >> 16, qb >> 16, "{qa:#x} {qb:#x}");
    assert!(qa >> 16 != 0 && qb >> 16 != 0);
}

/// `SOFTRDMA_ADDR` pins the list to one device. Environment changes are process-wide, so the
/// check runs in a child process (this test binary, filtered to the child test).
#[test]
fn softrdma_addr_env() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "softrdma_addr_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SOFTRDMA_ADDR", "127.0.0.9")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by softrdma_addr_env in a child process"]
fn softrdma_addr_child() {
    assert_eq!(std::env::var("SOFTRDMA_ADDR").unwrap(), "127.0.0.9");
    let devs = softrdma::devices().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].name(), "srxe0");
    assert_eq!(devs[0].addr(), Ipv4Addr::new(127, 0, 0, 9));
    assert_eq!(devs[0].ifname(), "lo");
    let ctx = devs[0].open().unwrap();
    assert!(ctx.addr().is_loopback());
}
