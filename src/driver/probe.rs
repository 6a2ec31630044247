//! Probes that read the kernel's reuseport array of a shared address (see [`super::share`]).
//!
//! The steering program sends a probe datagram to the socket at the index the probe names;
//! whichever context owns that socket answers with its slot. Probing every index of the group
//! gives its exact layout, whatever happened before (contexts killed at the same moment, a
//! process that exited while another joined): [`resync`] does it when a context joins, and
//! when a context receives traffic meant for another one.
//!
//! A probe is 16 bytes: `ff 'S' 'R' 'P'`, the index (u16, big-endian), two zero bytes, and a
//! nonce (u64). The answer is `ff 'S' 'R' 'R'`, the index, the slot, the sharing protocol the
//! context speaks (`share::registry::PROTOCOL`; softrdma before protocol 2 sent 0 there) and
//! the nonce. No RoCE packet starts with opcode 0xff, and probes are answered only when they
//! come from the context's own address.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use super::share::registry::PROTOCOL;
use super::share::Layout;

pub(crate) const PROBE_LEN: usize = 16;
/// The probe's first word, which the steering program matches.
pub(crate) const PROBE_MAGIC: u32 = 0xff53_5250; // ff 'S' 'R' 'P'
const REPLY_MAGIC: u32 = 0xff53_5252; // ff 'S' 'R' 'R'
/// How long a resync waits for every context to answer.
const ANSWER_WAIT: Duration = Duration::from_millis(200);

/// The index and nonce of a probe datagram, if `data` is one.
pub(crate) fn parse(data: &[u8]) -> Option<(u16, u64)> {
    if data.len() != PROBE_LEN || data[..4] != PROBE_MAGIC.to_be_bytes() {
        return None;
    }
    let index = u16::from_be_bytes([data[4], data[5]]);
    let nonce = u64::from_be_bytes(data[8..16].try_into().ok()?);
    Some((index, nonce))
}

/// The answer of the context with `slot` to a probe.
pub(crate) fn answer(index: u16, slot: u8, nonce: u64) -> [u8; PROBE_LEN] {
    let mut b = [0u8; PROBE_LEN];
    b[..4].copy_from_slice(&REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&index.to_be_bytes());
    b[6] = slot;
    b[7] = PROTOCOL;
    b[8..].copy_from_slice(&nonce.to_be_bytes());
    b
}

fn probe(index: u16, nonce: u64) -> [u8; PROBE_LEN] {
    let mut b = [0u8; PROBE_LEN];
    b[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&index.to_be_bytes());
    b[8..].copy_from_slice(&nonce.to_be_bytes());
    b
}

/// Read the group of `addr` (port 4791; `n` sockets) with probes and set every member's index in
/// `layout` to what the kernel has. Every context's engine answers the probe that reaches it,
/// the caller's own too (it runs on a thread of its own, see `Io::resync_share_in_background`;
/// nothing here reads the caller's socket, where datagrams of its QPs wait). Returns false,
/// leaving `layout` alone, unless every member of the registry answered at exactly one index
/// (one silent index is taken to be the one member that did not answer); indexes that answer
/// with another protocol, or not at all, are strangers and left alone.
pub(crate) fn resync(addr: SocketAddr, n: usize, layout: &mut Layout) -> io::Result<bool> {
    let mut found: Vec<Option<u8>> = ask(addr, n)?
        .into_iter()
        .map(|a| a.filter(|(_, p)| *p == PROTOCOL).map(|(s, _)| s))
        .collect();
    // One socket silent (its context is busy leaving, say) and one member unaccounted for:
    // that is the one.
    let missing: Vec<usize> = (0..n).filter(|i| found[*i].is_none()).collect();
    let unaccounted: Vec<u8> = layout
        .members
        .iter()
        .map(|m| m.slot)
        .filter(|s| !found.contains(&Some(*s)))
        .collect();
    if let ([i], [s]) = (&missing[..], &unaccounted[..]) {
        found[*i] = Some(*s);
    }
    // Every member must be at exactly one index. Other indexes may be strangers (another
    // softrdma version's sockets, which answer with another protocol or not at all): they
    // are not ours to steer to.
    if n == 0 {
        return Ok(false);
    }
    let mut index_of = Vec::with_capacity(layout.members.len());
    for m in &layout.members {
        let at: Vec<usize> = (0..n).filter(|i| found[*i] == Some(m.slot)).collect();
        let [i] = at[..] else {
            return Ok(false);
        };
        index_of.push(i as u32);
    }
    for (m, i) in layout.members.iter_mut().zip(index_of) {
        m.index = i;
    }
    Ok(true)
}

/// Probe every index of `addr`'s group (`n` sockets): what each answered (its slot and
/// protocol, protocol 1 for softrdma before the field existed), or `None`.
fn ask(addr: SocketAddr, n: usize) -> io::Result<Vec<Option<(u8, u8)>>> {
    let mut from = addr;
    from.set_port(0);
    let s = UdpSocket::bind(from)?;
    s.set_nonblocking(true)?;
    let mut nonce = [0u8; 8];
    let _ = getrandom::getrandom(&mut nonce);
    let nonce = u64::from_ne_bytes(nonce);
    for i in 0..n {
        s.send_to(&probe(i as u16, nonce), addr)?;
    }
    let mut found: Vec<Option<(u8, u8)>> = vec![None; n];
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    while found.iter().any(Option::is_none) && t0.elapsed() < ANSWER_WAIT {
        let mut idle = true;
        while let Ok((len, _)) = s.recv_from(&mut buf) {
            idle = false;
            let b = &buf[..len];
            if len == PROBE_LEN
                && b[..4] == REPLY_MAGIC.to_be_bytes()
                && b[8..16] == nonce.to_be_bytes()
            {
                let i = u16::from_be_bytes([b[4], b[5]]) as usize;
                if let Some(f) = found.get_mut(i) {
                    *f = Some((b[6], b[7].max(1)));
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(found)
}

/// What every index of `addr`'s group (`n` sockets) answers: slot and sharing protocol, or
/// `None` (silent). For naming a stranger in the group.
pub(crate) fn identify(addr: SocketAddr, n: usize) -> Vec<Option<(u8, u8)>> {
    ask(addr, n).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_and_answer_round_trip() {
        let p = probe(7, 0x1122_3344_5566_7788);
        assert_eq!(parse(&p), Some((7, 0x1122_3344_5566_7788)));
        assert_eq!(parse(&p[..15]), None);
        let a = answer(7, 42, 9);
        assert_eq!(parse(&a), None, "an answer is no probe");
        assert_eq!((a[6], u16::from_be_bytes([a[4], a[5]])), (42, 7));
        assert_eq!(a[7], PROTOCOL, "the answer says which protocol it speaks");
        // No RoCE packet is a probe: opcode 0xff is not an IBA opcode.
        assert!(crate::wire::Opcode(0xff).info().is_none());
    }
}
