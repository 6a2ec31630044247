//! Connection records: each context on a shared address keeps the rdma_cm connections it has
//! established in a small file of the state directory (`<registry>.c<slot>`), rewritten when
//! one opens or closes. When a context dies without tearing them down (`kill -9`), a member
//! that sees its slot gone claims the file (renames it away: exactly one member does) and sends
//! a DREQ to each peer in its name, as the Linux kernel does for a process whose rdma_cm file
//! closes: the peer sees DISCONNECTED at once instead of waiting for a timeout that may never
//! come (an idle connection sends nothing).
//!
//! One line per connection: `d <local comm ID> <remote comm ID> <remote QPN> <peer GID hex>
//! <peer GSI QPN>`.

use crate::cm::manager::MadAddr;

/// One established connection of a context, as its DREQ needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnRecord {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The peer's QPN (the DREQ's "remote QPN", which the peer checks).
    pub remote_qpn: u32,
    /// Where the peer's CM is.
    pub peer: MadAddr,
}

pub(crate) fn render(recs: &[ConnRecord]) -> String {
    let mut s = String::new();
    for r in recs {
        let gid: String = r.peer.gid.iter().map(|b| format!("{b:02x}")).collect();
        s.push_str(&format!(
            "d {} {} {} {gid} {}\n",
            r.local_comm_id, r.remote_comm_id, r.remote_qpn, r.peer.qpn
        ));
    }
    s
}

/// The records of `text`; lines that do not parse are skipped (a record is advice: a DREQ the
/// peer does not recognise is answered and dropped).
pub(crate) fn parse(text: &str) -> Vec<ConnRecord> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() != 6 || f[0] != "d" || f[4].len() != 32 {
                return None;
            }
            let mut gid = [0u8; 16];
            for (i, g) in gid.iter_mut().enumerate() {
                *g = u8::from_str_radix(f[4].get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some(ConnRecord {
                local_comm_id: f[1].parse().ok()?,
                remote_comm_id: f[2].parse().ok()?,
                remote_qpn: f[3].parse().ok()?,
                peer: MadAddr {
                    gid,
                    qpn: f[5].parse().ok()?,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_skipped() {
        let r = ConnRecord {
            local_comm_id: 0x0301_0203,
            remote_comm_id: 77,
            remote_qpn: 0x11,
            peer: MadAddr {
                gid: [0xfe; 16],
                qpn: 1,
            },
        };
        let text = render(&[r, r]);
        assert_eq!(parse(&text), vec![r, r]);
        let mixed = format!("junk\n{text}d 1 2 3 zz 1\n\u{0}");
        assert_eq!(parse(&mixed), vec![r, r]);
    }
}
