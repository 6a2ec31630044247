//! A device with IPv6 only: `SOFTRDMA_ADDR=::1` pins the device to that one address. Its GID
//! table holds `::1` at indexes 0 and 1 (the first address, as an IPv4 device has its IPv4
//! one there), IPv4 destinations are refused, and two contexts on it talk RC over IPv6 with
//! the default `sgid_index` 0. (One test in its own binary: it sets an environment variable.)
mod verbs_util;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softrdma::transport::{SendOp, WcStatus};
use softrdma::verbs::{gid_from_ipv4, AhAttr};
use verbs_util::{connect, sge, End};

#[test]
fn an_ipv6_only_device_works_over_ipv6() {
    let off = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map_or(true, |s| s.trim() == "1");
    if off {
        eprintln!("IPv6 is disabled on this host: skipped");
        return;
    }
    std::env::set_var("SOFTRDMA_ADDR", "::1");
    let devs = softrdma::devices().unwrap();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert!(d.pinned());
    assert_eq!(d.ipv4(), None);
    assert_eq!(d.addr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(d.ipv6_addrs(), vec![Ipv6Addr::LOCALHOST]);
    assert_eq!(d.ifname(), "lo");
    let (ca, cb) = (d.open().unwrap(), d.open().unwrap());

    let v6 = Ipv6Addr::LOCALHOST.octets();
    assert_eq!(ca.query_port(1).unwrap().gid_tbl_len, 2);
    assert_eq!(ca.query_gid(1, 0).unwrap(), v6);
    assert_eq!(ca.query_gid(1, 1).unwrap(), v6);
    assert!(ca.query_gid(1, 2).is_err());
    assert_eq!((ca.gid(), ca.addr()), (v6, Ipv4Addr::UNSPECIFIED));
    assert_eq!(ca.ip_addrs(), vec![IpAddr::V6(Ipv6Addr::LOCALHOST)]);
    assert_eq!(ca.node_guid() & 0xffff_ffff, 1);

    // No IPv4 address: an IPv4 destination has no route.
    let pd = ca.alloc_pd().unwrap();
    let to_v4 = AhAttr {
        dgid: gid_from_ipv4(Ipv4Addr::LOCALHOST),
        port_num: 1,
        ..Default::default()
    };
    assert!(pd.create_ah(&to_v4).is_err());
    assert!(pd.create_ah(&AhAttr { dgid: v6, ..to_v4 }).is_ok());

    // RC between the two contexts; `connect` leaves sgid_index 0, which is `::1` here.
    let (a, b) = (End::new(ca), End::new(cb));
    connect(&a.qp, 1, b.qp.qp_num(), 2, b.ctx.gid());
    connect(&b.qp, 2, a.qp.qp_num(), 1, a.ctx.gid());
    let (ma, mb) = (a.mr(64), b.mr(64));
    ma.write(0, b"v6 only").unwrap();
    b.post_recv(1, &[sge(&mb, 0, 64)]);
    a.post_send(2, SendOp::Send, &[sge(&ma, 0, 7)]);
    assert_eq!(a.wait().status, WcStatus::Success);
    let wc = b.wait();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 7));
    assert_eq!(&mb.lock().unwrap()[..7], b"v6 only");
    let st = b.ctx.stats().unwrap();
    assert!(st.rx_icrc_v6 > 0 && st.rx_icrc_id0 == 0, "{st:?}");
}
