//! The registry of one address: the members of its reuseport group in the kernel's array
//! order, as text (see `driver::share`), and the names of the files and sockets that belong
//! to it in the state directory.
//!
//! ```text
//! softrdma-share 2
//! next 4
//! m <slot> <index> <pid> <socket inode> [<rdma_cm port>...]
//! ```
//!
//! The first line is the sharing protocol's version: a registry without it (damaged, or
//! written by another version) is not read at all, and its members put themselves back.

use std::net::SocketAddr;

/// The sharing protocol this build speaks: the registry's layout, the probes' answers and the
/// forward sockets. Contexts of another protocol on the same address are refused
/// (`ShareError::OtherVersion`).
pub(crate) const PROTOCOL: u8 = 2;

const HEADER: &str = "softrdma-share 2";

/// One context on the address, as the registry records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub slot: u8,
    /// Its socket's index in the kernel's reuseport array.
    pub index: u32,
    /// Its process.
    pub pid: u32,
    /// Its socket's inode (`/proc/net/udp`): the kernel lists it while it is in the group.
    pub inode: u64,
    /// rdma_cm ports it listens on (REQ and SIDR_REQ go there).
    pub ports: Vec<u16>,
}

/// The registry's contents: the members, in the kernel's array order by `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    pub members: Vec<Member>,
    /// Where the search for a free slot starts: slots are handed out round robin, so a slot
    /// (and its QPNs and CM IDs) is not reused while the old owner's peers may still send.
    pub next_slot: u8,
}

/// The registry could not be read as this protocol's (garbage, truncated, another layout).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Damaged;

impl Layout {
    /// Parse the registry's text; any line this protocol would not write makes it damaged.
    pub fn parse(text: &str) -> Result<Layout, Damaged> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(Damaged);
        }
        let mut l = Layout {
            members: Vec::new(),
            next_slot: 1,
        };
        for line in lines {
            let mut f = line.split(' ');
            match f.next() {
                Some("next") => {
                    l.next_slot = f.next().and_then(|s| s.parse().ok()).ok_or(Damaged)?;
                    if l.next_slot == 0 || f.next().is_some() {
                        return Err(Damaged);
                    }
                }
                Some("m") => {
                    let mut num = || f.next().and_then(|s| s.parse::<u64>().ok()).ok_or(Damaged);
                    let (slot, index, pid, inode) = (num()?, num()?, num()?, num()?);
                    let ports = f
                        .map(|p| p.parse::<u16>().map_err(|_| Damaged))
                        .collect::<Result<Vec<_>, _>>()?;
                    if slot == 0 || slot > 255 || index > u32::MAX as u64 || pid > u32::MAX as u64 {
                        return Err(Damaged);
                    }
                    if l.members.iter().any(|m| m.slot == slot as u8) {
                        return Err(Damaged);
                    }
                    l.members.push(Member {
                        slot: slot as u8,
                        index: index as u32,
                        pid: pid as u32,
                        inode,
                        ports,
                    });
                }
                _ => return Err(Damaged),
            }
        }
        Ok(l)
    }

    pub fn render(&self) -> String {
        let mut s = format!("{HEADER}\nnext {}\n", self.next_slot.max(1));
        for m in &self.members {
            s.push_str(&format!("m {} {} {} {}", m.slot, m.index, m.pid, m.inode));
            for p in &m.ports {
                s.push_str(&format!(" {p}"));
            }
            s.push('\n');
        }
        s
    }

    /// The kernel's `reuseport_detach_sock`: the last socket moves into the leaver's index.
    pub fn detach(&mut self, slot: u8) {
        let Some(pos) = self.members.iter().position(|m| m.slot == slot) else {
            return;
        };
        let gone = self.members.remove(pos).index;
        let last = self.members.len() as u32;
        if let Some(m) = self.members.iter_mut().find(|m| m.index == last) {
            m.index = gone;
        }
    }

    /// The owner of rdma_cm `port`, if a member listens on it.
    pub fn port_owner(&self, port: u16) -> Option<u8> {
        self.members
            .iter()
            .find(|m| m.ports.contains(&port))
            .map(|m| m.slot)
    }

    pub fn member(&self, slot: u8) -> Option<&Member> {
        self.members.iter().find(|m| m.slot == slot)
    }
}

/// The names, in the state directory, of what belongs to one address's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    base: String,
}

impl Names {
    /// The group of `addr` in network namespace `netns`.
    pub fn new(netns: &str, addr: SocketAddr) -> Names {
        let a = match addr {
            SocketAddr::V6(a) if a.scope_id() != 0 => format!("{}%{}", a.ip(), a.scope_id()),
            a => a.ip().to_string(),
        };
        Names {
            base: format!("s{PROTOCOL}-{netns}-{a}"),
        }
    }

    /// The registry.
    pub fn data(&self) -> &str {
        &self.base
    }

    /// Its lock: `flock` guards every change; an OFD lock on byte `slot` holds the slot.
    pub fn lock(&self) -> String {
        format!("{}.lock", self.base)
    }

    /// The forward socket of the member with `slot` (`driver::forward`).
    pub fn forward(&self, slot: u8) -> String {
        format!("{}.f{slot}", self.base)
    }

    /// The connection record of the member with `slot` (`share::conns`).
    pub fn conns(&self, slot: u8) -> String {
        format!("{}.c{slot}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(slot: u8, index: u32) -> Member {
        Member {
            slot,
            index,
            pid: 7,
            inode: 1000 + slot as u64,
            ports: vec![],
        }
    }

    #[test]
    fn detach_moves_the_last_into_the_hole() {
        let mut l = Layout {
            next_slot: 1,
            members: vec![m(1, 0), m(2, 1), m(3, 2), m(4, 3)],
        };
        l.detach(2);
        assert_eq!(l.members, vec![m(1, 0), m(3, 2), m(4, 1)]);
        l.detach(4);
        assert_eq!(l.members, vec![m(1, 0), m(3, 1)]);
        l.detach(3);
        l.detach(1);
        assert!(l.members.is_empty());
    }

    #[test]
    fn layout_round_trips_through_text() {
        let l = Layout {
            next_slot: 9,
            members: vec![
                Member {
                    slot: 7,
                    index: 0,
                    pid: 4242,
                    inode: 123456,
                    ports: vec![7174, 18515],
                },
                m(200, 1),
            ],
        };
        assert_eq!(Layout::parse(&l.render()), Ok(l.clone()));
        assert_eq!(l.port_owner(18515), Some(7));
        assert_eq!(l.port_owner(1), None);
        assert!(l.render().contains("m 7 0 4242 123456 7174 18515\n"));
    }

    #[test]
    fn anything_else_is_damaged() {
        let good = "softrdma-share 2\nnext 3\nm 1 0 10 99\n";
        assert!(Layout::parse(good).is_ok());
        for bad in [
            "",
            "garbage",
            "next 3\nm 1 0 10 99\n",
            // The previous protocol's registry.
            "# softrdma: contexts sharing this address (slot, reuseport index, ports)\nnext 2\nm 1 0 f4000\n",
            "softrdma-share 2\nm 1 0\n",
            "softrdma-share 2\nm 0 0 1 1\n",
            "softrdma-share 2\nm 1 0 1 1\nm 1 1 2 2\n",
            "softrdma-share 2\nm 1 0 1 1 port\n",
            "softrdma-share 2\nnext 0\n",
            "softrdma-share 2\n\u{0}\u{0}\n",
        ] {
            assert_eq!(Layout::parse(bad), Err(Damaged), "{bad:?}");
        }
    }

    #[test]
    fn names_carry_the_protocol_and_the_address() {
        let n = Names::new("4026531840", "127.0.0.1:4791".parse().unwrap());
        assert_eq!(n.data(), "s2-4026531840-127.0.0.1");
        assert_eq!(n.lock(), "s2-4026531840-127.0.0.1.lock");
        assert_eq!(n.forward(3), "s2-4026531840-127.0.0.1.f3");
        let v6 = std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 4791, 0, 2);
        assert_eq!(Names::new("1", v6.into()).data(), "s2-1-fe80::1%2");
    }
}
