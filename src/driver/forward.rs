//! Handing a CM MAD to another context on the same shared address (see [`super::share`]).
//!
//! A REQ for an rdma_cm port nobody listens on reaches whichever context the kernel's hash
//! picks. If another process starts listening on that port while the REQ waits
//! (`cm/manager/unclaimed.rs`), the context holding it sends it on, in this envelope, to the
//! listener's socket: the steering program sends a datagram that starts with the probe's magic
//! to the index it names, as it does probes ([`super::probe`]).
//!
//! The envelope is 284 bytes: `ff 'S' 'R' 'P'`, the index (u16, big-endian), the kind (1),
//! a zero byte, the MAD's source GID (16 bytes) and GSI QPN (u32), then the 256-byte MAD.
//! A probe is 16 bytes, so the two never mix. An envelope is taken only from port 4791 of the
//! receiving socket's own address, which only contexts of the same user hold (a reuseport
//! group admits one user's sockets), and its MAD is handled as one from its source; the
//! forwarder checked the packet's ICRC.

use crate::cm::mad::MAD_LEN;
use crate::cm::manager::MadAddr;

use super::probe::PROBE_MAGIC;

const KIND_MAD: u8 = 1;
/// The envelope's length.
pub(crate) const FORWARD_LEN: usize = 8 + 16 + 4 + MAD_LEN;

/// The envelope that sends `mad`, from `src`, to the socket at `index` of the group.
pub(crate) fn envelope(index: u16, src: &MadAddr, mad: &[u8; MAD_LEN]) -> [u8; FORWARD_LEN] {
    let mut b = [0u8; FORWARD_LEN];
    b[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&index.to_be_bytes());
    b[6] = KIND_MAD;
    b[8..24].copy_from_slice(&src.gid);
    b[24..28].copy_from_slice(&src.qpn.to_be_bytes());
    b[28..].copy_from_slice(mad);
    b
}

/// The source and MAD of an envelope, if `data` is one.
pub(crate) fn parse(data: &[u8]) -> Option<(MadAddr, &[u8])> {
    if data.len() != FORWARD_LEN || data[..4] != PROBE_MAGIC.to_be_bytes() || data[6] != KIND_MAD {
        return None;
    }
    let gid: [u8; 16] = data[8..24].try_into().ok()?;
    let qpn = u32::from_be_bytes(data[24..28].try_into().ok()?);
    Some((MadAddr { gid, qpn }, &data[28..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_is_no_probe() {
        let src = MadAddr {
            gid: [7; 16],
            qpn: 1,
        };
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[255] = 9;
        let e = envelope(3, &src, &mad);
        assert_eq!(u16::from_be_bytes([e[4], e[5]]), 3);
        let (s, m) = parse(&e).expect("an envelope");
        assert_eq!((s, m), (src, &mad[..]));
        assert!(super::super::probe::parse(&e).is_none());
        assert!(parse(&e[..FORWARD_LEN - 1]).is_none());
        let mut bad = e;
        bad[6] = 0;
        assert!(parse(&bad).is_none());
    }
}
