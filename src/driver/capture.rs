//! `SOFTRDMA_PCAP=file.pcap`: every datagram the endpoint sends or receives, as Ethernet frames
//! that Wireshark/tshark decode as RoCEv2 (`-d udp.port==4791,infiniband`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::SystemTime;

pub(crate) struct Capture {
    out: BufWriter<File>,
}

impl Capture {
    pub fn create(path: &Path) -> std::io::Result<Capture> {
        let mut out = BufWriter::new(File::create(path)?);
        // Classic pcap header: magic, v2.4, tz 0, sigfigs 0, snaplen, LINKTYPE_ETHERNET.
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&[0u8; 8])?;
        out.write_all(&262_144u32.to_le_bytes())?;
        out.write_all(&1u32.to_le_bytes())?;
        out.flush()?;
        Ok(Capture { out })
    }

    /// Record one datagram: its IPv4+UDP header and UDP payload.
    pub fn record(&mut self, ip_udp: &[u8; 28], payload: &[u8]) {
        let ts = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let len = (14 + 28 + payload.len()) as u32;
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        hdr[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        hdr[8..12].copy_from_slice(&len.to_le_bytes());
        hdr[12..16].copy_from_slice(&len.to_le_bytes());
        // Locally administered MACs made from the IPv4 addresses; EtherType IPv4.
        let mut eth = [0u8; 14];
        eth[0] = 0x02;
        eth[2..6].copy_from_slice(&ip_udp[16..20]);
        eth[6] = 0x02;
        eth[8..12].copy_from_slice(&ip_udp[12..16]);
        eth[12] = 0x08;
        let _ = self
            .out
            .write_all(&hdr)
            .and_then(|_| self.out.write_all(&eth))
            .and_then(|_| self.out.write_all(ip_udp))
            .and_then(|_| self.out.write_all(payload));
    }

    pub fn flush(&mut self) {
        let _ = self.out.flush();
    }
}
