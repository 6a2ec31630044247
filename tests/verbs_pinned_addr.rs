//! `SOFTRDMA_ADDR` pins the device to one address: when another endpoint holds that address's
//! RoCE port, opening the device is an error that names it, never a silent move to another
//! address that peers configured for the pinned one would not reach (issue 7, item 5).
//! (One test in its own binary: it sets an environment variable.)

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

use softrdma::verbs::VerbsError;
use softrdma::wire::ROCE_V2_PORT;

#[test]
fn a_pinned_address_in_use_is_a_clear_error() {
    // Hold some 127.0.0.x:4791 as another process would.
    let (held, _sock) = (180..=250u8)
        .rev()
        .map(|i| Ipv4Addr::new(127, 0, 0, i))
        .find_map(|a| {
            UdpSocket::bind(SocketAddrV4::new(a, ROCE_V2_PORT))
                .ok()
                .map(|s| (a, s))
        })
        .expect("a free loopback address");
    std::env::set_var("SOFTRDMA_ADDR", held.to_string());
    let devs = softrdma::devices().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].addr(), held);
    assert!(devs[0].pinned());
    let err = devs[0].open().expect_err("the pinned address is taken");
    assert!(
        matches!(&err, VerbsError::AddrInUse { addr, holder } if *addr == held && holder.contains("pid")),
        "{err:?}"
    );
    assert_eq!(err.errno(), libc::EADDRINUSE);
    assert!(err.to_string().contains(&held.to_string()), "{err}");

    // Once it is free, the same device opens on exactly that address.
    drop(_sock);
    let ctx = devs[0].open().unwrap();
    assert_eq!(ctx.addr(), held);
}
