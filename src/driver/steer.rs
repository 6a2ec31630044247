//! The classic-BPF program that steers each datagram arriving on a shared address to the
//! socket of the context that owns it (see [`super::share`]). It reads the UDP payload, which
//! is where a reuseport program's offset 0 is (the kernel pulls the UDP header first):
//!
//! * BTH byte 5, the destination QPN's top byte, is the owner's slot;
//! * slot 0 is QP1, connection management: the MAD's attribute ID picks the field that names
//!   the owner: REQ and SIDR_REQ the low 16 bits of the Service ID (the rdma_cm port), which
//!   the member listening on it owns; SIDR_REP the top byte of the request ID; every other CM
//!   message the top byte of the remote communication ID (ours, echoed by the peer).
//!
//! The program returns the owner's index in the reuseport group, or an index past the end
//! when there is none, which makes the kernel choose a socket by hash. A probe
//! ([`super::probe`]) goes to the index it names.

use super::share::Layout;

const LD_W_ABS: u16 = 0x20;
const LD_B_ABS: u16 = 0x30;
const LD_H_ABS: u16 = 0x28;
const JEQ_K: u16 = 0x15;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// No owner: past the end of any group, so the kernel falls back to its hash.
pub(crate) const MISS: u32 = u32::MAX;

/// Offsets in the UDP payload: BTH (12 bytes), DETH (8), then the 256-byte MAD whose header
/// is 24 bytes (attribute ID at 16) and whose data follows.
const BTH_QPN_TOP: u32 = 5;
const MAD: u32 = 12 + 8;
const MAD_ATTR_ID: u32 = MAD + 16;
const MAD_DATA: u32 = MAD + 24;
/// REQ and SIDR_REQ: Service ID at data offset 8; rdma_cm's port is its last two bytes.
const SERVICE_PORT: u32 = MAD_DATA + 14;
/// SIDR_REP: request ID at data offset 0.
const SIDR_REP_REQUEST_ID: u32 = MAD_DATA;
/// REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR: remote communication ID at data offset 4.
const REMOTE_COMM_ID: u32 = MAD_DATA + 4;

const ATTR_REQ: u32 = 0x0010;
const ATTR_SIDR_REQ: u32 = 0x0017;
const ATTR_SIDR_REP: u32 = 0x0018;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `jeq #key; ret #index` pairs, then `ret #MISS`.
fn table(out: &mut Vec<libc::sock_filter>, entries: impl Iterator<Item = (u32, u32)>) {
    for (key, index) in entries {
        out.push(ins(JEQ_K, 0, 1, key));
        out.push(ins(RET_K, 0, 0, index));
    }
    out.push(ins(RET_K, 0, 0, MISS));
}

/// The program for `layout` (at most 16 + 2 x (2 x 255 + ports) instructions).
pub(crate) fn program(layout: &Layout) -> Vec<libc::sock_filter> {
    // Probes first: `ld [0]; jeq #PROBE_MAGIC; ldh [4]; ret A`.
    let mut p = vec![
        ins(LD_W_ABS, 0, 0, 0),
        ins(JEQ_K, 0, 2, super::probe::PROBE_MAGIC),
        ins(LD_H_ABS, 0, 0, 4),
        ins(RET_A, 0, 0, 0),
    ];
    p.extend(steering(layout));
    p
}

/// The program's steering part (jumps are relative, so it can follow the probe check).
fn steering(layout: &Layout) -> Vec<libc::sock_filter> {
    let mut ports = Vec::new();
    table(
        &mut ports,
        layout
            .members
            .iter()
            .flat_map(|m| m.ports.iter().map(move |p| (*p as u32, m.index))),
    );
    let mut slots = Vec::new();
    table(
        &mut slots,
        layout.members.iter().map(|m| (m.slot as u32, m.index)),
    );
    // Head: 11 instructions, then PORTS (ldh + the port table), then SLOTS.
    const HEAD: u32 = 11;
    let ports_at = HEAD;
    let slots_at = ports_at + 1 + ports.len() as u32;
    // `ja` at position `at` to `to`: k counts from the next instruction.
    let ja = |at: u32, to: u32| ins(JA, 0, 0, to - at - 1);
    let mut p = vec![
        ins(LD_B_ABS, 0, 0, BTH_QPN_TOP),                   // 0
        ins(JEQ_K, 1, 0, 0),                                // 1: slot 0 -> 3
        ja(2, slots_at),                                    // 2
        ins(LD_H_ABS, 0, 0, MAD_ATTR_ID),                   // 3
        ins(JEQ_K, (ports_at - 5) as u8, 0, ATTR_REQ),      // 4
        ins(JEQ_K, (ports_at - 6) as u8, 0, ATTR_SIDR_REQ), // 5
        ins(JEQ_K, 0, 2, ATTR_SIDR_REP),                    // 6: -> 7, else 9
        ins(LD_B_ABS, 0, 0, SIDR_REP_REQUEST_ID),           // 7
        ja(8, slots_at),                                    // 8
        ins(LD_B_ABS, 0, 0, REMOTE_COMM_ID),                // 9
        ja(10, slots_at),                                   // 10
    ];
    debug_assert_eq!(p.len() as u32, HEAD);
    p.push(ins(LD_H_ABS, 0, 0, SERVICE_PORT));
    p.extend(ports);
    debug_assert_eq!(p.len() as u32, slots_at);
    p.extend(slots);
    p
}

#[cfg(test)]
mod tests {
    use super::super::share::Member;
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions the program uses, to check it
    /// without a kernel.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => match pkt.get(i.k as usize..i.k as usize + 4) {
                    Some(b) => a = u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                    None => return 0,
                },
                RET_A => return a,
                LD_B_ABS => match pkt.get(i.k as usize) {
                    Some(b) => a = *b as u32,
                    None => return 0,
                },
                LD_H_ABS => match pkt.get(i.k as usize..i.k as usize + 2) {
                    Some(b) => a = u16::from_be_bytes([b[0], b[1]]) as u32,
                    None => return 0,
                },
                JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                JA => pc += i.k as usize,
                RET_K => return i.k,
                c => panic!("unexpected code {c:#x}"),
            }
        }
    }

    fn layout() -> Layout {
        Layout {
            next_slot: 1,
            members: vec![
                Member {
                    slot: 3,
                    index: 1,
                    ports: vec![7174],
                    pid: 1,
                    inode: 0,
                },
                Member {
                    slot: 9,
                    index: 0,
                    ports: vec![18515, 4000],
                    pid: 1,
                    inode: 0,
                },
            ],
        }
    }

    fn gsi(attr: u16, data: &[(usize, &[u8])]) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 8 + 256 + 4];
        p[7] = 1; // QPN 1
        p[MAD_ATTR_ID as usize..][..2].copy_from_slice(&attr.to_be_bytes());
        for (off, b) in data {
            p[MAD_DATA as usize + off..][..b.len()].copy_from_slice(b);
        }
        p
    }

    #[test]
    fn data_packets_go_to_the_slot_in_the_qpn() {
        let prog = program(&layout());
        let mut p = vec![0u8; 64];
        p[5..8].copy_from_slice(&[3, 0x12, 0x34]);
        assert_eq!(run(&prog, &p), 1);
        p[5] = 9;
        assert_eq!(run(&prog, &p), 0);
        p[5] = 4;
        assert_eq!(run(&prog, &p), MISS);
    }

    #[test]
    fn cm_messages_go_to_the_listener_or_the_comm_id_owner() {
        let prog = program(&layout());
        let port = |p: u16| {
            let mut sid = [0u8; 8];
            sid[4..6].copy_from_slice(&[0x01, 0x06]);
            sid[6..].copy_from_slice(&p.to_be_bytes());
            sid
        };
        assert_eq!(run(&prog, &gsi(0x10, &[(8, &port(7174))])), 1);
        assert_eq!(run(&prog, &gsi(0x10, &[(8, &port(4000))])), 0);
        assert_eq!(run(&prog, &gsi(0x17, &[(8, &port(18515))])), 0);
        assert_eq!(run(&prog, &gsi(0x10, &[(8, &port(1))])), MISS);
        // SIDR_REP: request ID; REP/RTU/DREQ...: remote comm ID.
        assert_eq!(run(&prog, &gsi(0x18, &[(0, &[3, 0, 0, 1])])), 1);
        for attr in [0x11u16, 0x12, 0x13, 0x14, 0x15, 0x16] {
            assert_eq!(
                run(&prog, &gsi(attr, &[(4, &[9, 1, 2, 3])])),
                0,
                "{attr:#x}"
            );
            assert_eq!(run(&prog, &gsi(attr, &[(4, &[77, 1, 2, 3])])), MISS);
        }
    }

    #[test]
    fn probes_go_to_the_index_they_name() {
        let prog = program(&layout());
        let mut p = vec![0u8; 16];
        p[..4].copy_from_slice(&super::super::probe::PROBE_MAGIC.to_be_bytes());
        for i in [0u16, 1, 7, 300] {
            p[4..6].copy_from_slice(&i.to_be_bytes());
            assert_eq!(run(&prog, &p), i as u32);
        }
    }

    #[test]
    fn a_full_group_fits_the_kernel_limit() {
        let l = Layout {
            next_slot: 1,
            members: (1..=255u8)
                .map(|s| Member {
                    slot: s,
                    index: s as u32 - 1,
                    ports: vec![s as u16 + 1000, s as u16 + 2000],
                    pid: 1,
                    inode: 0,
                })
                .collect(),
        };
        let prog = program(&l);
        // Probe check 4, head 11, port load 1, two table ends 2, then 2 per entry.
        assert_eq!(prog.len(), 18 + 2 * (255 + 510));
        assert!(prog.len() <= 4096, "{}", prog.len()); // BPF_MAXINSNS
        let mut p = vec![0u8; 64];
        p[5] = 255;
        assert_eq!(run(&prog, &p), 254);
        assert_eq!(
            run(&prog, &gsi(0x10, &[(8, &[0, 0, 0, 0, 1, 6, 0x08, 0x34])])),
            (2100 - 2000) - 1
        );
    }
}
