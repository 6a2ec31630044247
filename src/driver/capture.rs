//! `SOFTRDMA_PCAP=file.pcap` (or [`ContextOptions::pcap`](crate::verbs::ContextOptions)): every
//! datagram the endpoint sends or receives, written by [`crate::wire::pcap::PcapWriter`] as
//! Ethernet frames that Wireshark/tshark decode as RoCEv2 (`-d udp.port==4791,infiniband`).
//!
//! Contexts of one process that name the same file share one writer (the loopback example opens
//! two); a datagram between two of them is then recorded once, when sent, as a capture on `lo`
//! would show it. Which datagrams those are is known by their content, not their source address:
//! other contexts, of this process or another, may share the address without sharing the file.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::SystemTime;

use crate::wire::ipv4::{IPV4_LEN, UDP_LEN};
use crate::wire::ipv6::IPV6_LEN;
use crate::wire::pcap::PcapWriter;

struct Writer {
    out: PcapWriter<BufWriter<File>>,
    /// The first write error stops the capture (the transport goes on).
    failed: bool,
    /// Local addresses of the contexts sharing this file.
    locals: Vec<IpAddr>,
    /// Datagrams recorded as sent to one of `locals` and not yet seen arriving (by
    /// [`fingerprint`], with how many): a context of this file that receives one skips it.
    /// At most [`SENT_KEPT`], oldest forgotten first (`sent_order`): a datagram for a context
    /// that does not record here (another process on the address, say) is never claimed.
    sent: HashMap<u64, u32>,
    sent_order: VecDeque<u64>,
}

/// How many sent datagrams a writer remembers for its receivers to skip.
const SENT_KEPT: usize = 8192;

/// What identifies a datagram between two contexts of one file: its length, BTH (opcode,
/// destination QP, PSN) and ICRC (over everything else).
fn fingerprint(payload: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    payload.len().hash(&mut h);
    payload[..payload.len().min(12)].hash(&mut h);
    payload[payload.len().saturating_sub(4)..].hash(&mut h);
    h.finish()
}

impl Writer {
    /// A datagram this file's contexts sent to `dst`: remember it if one of them may receive it.
    fn sent_to(&mut self, dst: IpAddr, payload: &[u8]) {
        if !self.locals.contains(&dst) {
            return;
        }
        if self.sent_order.len() == SENT_KEPT {
            if let Some(old) = self.sent_order.pop_front() {
                self.forget(old);
            }
        }
        let k = fingerprint(payload);
        *self.sent.entry(k).or_insert(0) += 1;
        self.sent_order.push_back(k);
    }

    /// Whether a datagram received from `src` was recorded when sent (and is now claimed).
    fn claims(&mut self, src: IpAddr, payload: &[u8]) -> bool {
        if !self.locals.contains(&src) {
            return false;
        }
        let k = fingerprint(payload);
        if !self.sent.contains_key(&k) {
            return false;
        }
        self.forget(k);
        true
    }

    fn forget(&mut self, k: u64) {
        if let Some(n) = self.sent.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.sent.remove(&k);
            }
        }
    }
}

/// One context's handle on a (possibly shared) capture file.
pub(crate) struct Capture {
    w: Arc<Mutex<Writer>>,
    /// The context's addresses.
    local: Vec<IpAddr>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Mutex<Writer>>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<Writer>>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl Capture {
    pub fn open(path: &Path, local: &[IpAddr]) -> std::io::Result<Capture> {
        let key = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|d| d.join(path))
                .unwrap_or_else(|_| path.to_path_buf())
        };
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|_, w| w.strong_count() > 0);
        let w = match reg.get(&key).and_then(Weak::upgrade) {
            Some(w) => w,
            None => {
                let w = Arc::new(Mutex::new(Writer {
                    out: PcapWriter::create(path)?,
                    failed: false,
                    locals: Vec::new(),
                    sent: HashMap::new(),
                    sent_order: VecDeque::new(),
                }));
                reg.insert(key, Arc::downgrade(&w));
                w
            }
        };
        w.lock()
            .unwrap_or_else(|p| p.into_inner())
            .locals
            .extend_from_slice(local);
        Ok(Capture {
            w,
            local: local.to_vec(),
        })
    }

    /// Record one datagram: its IPv4+UDP header and UDP payload. `received`: it came from the
    /// socket (skipped if its sender records into the same file).
    pub fn record(&mut self, ip_udp: &[u8; IPV4_LEN + UDP_LEN], payload: &[u8], received: bool) {
        let src = Ipv4Addr::new(ip_udp[12], ip_udp[13], ip_udp[14], ip_udp[15]);
        let dst = Ipv4Addr::new(ip_udp[16], ip_udp[17], ip_udp[18], ip_udp[19]);
        self.write((src.into(), dst.into()), payload, received, |w| {
            w.write_roce(SystemTime::now(), ip_udp, payload)
        });
    }

    /// [`Capture::record`] for a datagram over IPv6.
    pub fn record_v6(&mut self, ip_udp: &[u8; IPV6_LEN + UDP_LEN], payload: &[u8], received: bool) {
        let addr = |at: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&ip_udp[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        };
        self.write((addr(8), addr(24)), payload, received, |w| {
            // The checksum the kernel puts on the wire (the engine leaves it 0: the ICRC masks
            // it), so that the capture shows valid UDP.
            let mut h = *ip_udp;
            let c = crate::wire::ipv6::udp_checksum(&h, payload);
            h[IPV6_LEN + 6..].copy_from_slice(&c.to_be_bytes());
            w.write_roce_v6(SystemTime::now(), &h, payload)
        });
    }

    /// Write one datagram from `src` to `dst` (`addrs`) with `f`, unless it was recorded when a
    /// context of this file sent it.
    fn write(
        &mut self,
        (src, dst): (IpAddr, IpAddr),
        payload: &[u8],
        received: bool,
        f: impl FnOnce(&mut PcapWriter<BufWriter<File>>) -> std::io::Result<()>,
    ) {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        if w.failed {
            return;
        }
        if received {
            if w.claims(src, payload) {
                return;
            }
        } else {
            w.sent_to(dst, payload);
        }
        // Flushed at once: a datagram is in the file before it is on the wire, so a capture
        // is complete whenever the peer has seen the traffic (captures are for debugging; the
        // extra write per packet is fine there).
        let r = f(&mut w.out).and_then(|_| w.out.flush());
        if r.is_err() {
            w.failed = true;
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        for a in &self.local {
            if let Some(i) = w.locals.iter().position(|l| l == a) {
                w.locals.swap_remove(i);
            }
        }
        let _ = w.out.flush();
    }
}

impl crate::endpoint::receive::Tap for Capture {
    fn record(&mut self, ip_udp: &[u8], payload: &[u8], received: bool) {
        if let Ok(h) = <&[u8; IPV4_LEN + UDP_LEN]>::try_from(ip_udp) {
            Capture::record(self, h, payload, received);
        } else if let Ok(h) = <&[u8; IPV6_LEN + UDP_LEN]>::try_from(ip_udp) {
            self.record_v6(h, payload, received);
        }
    }
}
