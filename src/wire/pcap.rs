//! Reading and writing classic libpcap files.
//!
//! The format (<https://www.tcpdump.org/manpages/pcap-savefile.5.html>): a 24-byte file header
//! whose magic number gives the byte order and the timestamp resolution (0xa1b2c3d4:
//! microseconds, 0xa1b23c4d: nanoseconds, either written in the writer's byte order), then records
//! of a 16-byte header (seconds, fraction, captured length, original length) and the captured
//! bytes.
//!
//! * [`PcapSlice`] iterates over a file already in memory, borrowing each record's bytes:
//!   nothing is allocated per packet.
//! * [`PcapReader`] streams from any [`Read`], reusing one buffer for every record.
//! * [`PcapWriter`] writes Ethernet captures; [`PcapWriter::write_roce`] wraps an IPv4/UDP
//!   datagram in an Ethernet frame so that `tshark -d udp.port==4791,infiniband` decodes it.
//!
//! Readers return errors for truncated or garbage input and never panic.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ethernet::{self, EthHeader, Mac};
use super::ipv4::{IPV4_LEN, UDP_LEN};
use super::ipv6::IPV6_LEN;

/// Magic number of a file with microsecond timestamps.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic number of a file with nanosecond timestamps.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// Length of the file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Length of a record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Link type of Ethernet frames (DLT_EN10MB).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of raw IPv4/IPv6 packets without link-layer header.
pub const LINKTYPE_RAW: u32 = 101;
/// The snapshot length [`PcapWriter`] announces (libpcap's maximum, as tcpdump writes).
pub const DEFAULT_SNAPLEN: u32 = 262_144;
/// [`PcapReader`] refuses records larger than this (a garbage length would otherwise make it
/// read, and buffer, the rest of the stream).
pub const MAX_RECORD_LEN: u32 = 64 << 20;

/// Source MAC address [`PcapWriter::write_roce`] uses: locally administered `02:00:` followed by
/// the IPv4 source address, so that every host keeps one MAC in a capture.
pub fn fake_mac(ip: [u8; 4]) -> Mac {
    [0x02, 0x00, ip[0], ip[1], ip[2], ip[3]]
}

/// Why a pcap file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// Reading the underlying stream failed.
    #[error("I/O error reading pcap: {0}")]
    Io(#[from] io::Error),
    /// The first four bytes are no pcap magic number in either byte order (read little-endian).
    #[error("not a pcap file (magic {0:#010x})")]
    BadMagic(u32),
    /// The input ends within the 24-byte file header.
    #[error("pcap file header truncated")]
    TruncatedHeader,
    /// The input ends within a record's header or data.
    #[error("pcap record at byte {offset} truncated")]
    TruncatedRecord {
        /// Byte offset in the file of the record's header.
        offset: u64,
    },
    /// A record's captured length exceeds [`MAX_RECORD_LEN`].
    #[error("pcap record at byte {offset} claims {len} bytes")]
    RecordTooLarge {
        /// Byte offset in the file of the record's header.
        offset: u64,
        /// The captured length the record header claims.
        len: u32,
    },
}

/// The file header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FileHeader {
    /// The file was written big-endian.
    pub big_endian: bool,
    /// Timestamps are in nanoseconds (else microseconds).
    pub nanos: bool,
    /// Major version of the format (2).
    pub version_major: u16,
    /// Minor version of the format (4).
    pub version_minor: u16,
    /// GMT offset; always 0 in practice.
    pub thiszone: i32,
    /// Timestamp accuracy; always 0 in practice.
    pub sigfigs: u32,
    /// Maximum number of bytes captured of each packet (the snapshot length).
    pub snaplen: u32,
    /// The link-layer header type ([`LINKTYPE_ETHERNET`], ...). The upper bits, which newer
    /// writers use for FCS information, are kept.
    pub linktype: u32,
}

impl FileHeader {
    /// A little-endian version 2.4 header.
    pub const fn new(linktype: u32, snaplen: u32, nanos: bool) -> Self {
        FileHeader {
            big_endian: false,
            nanos,
            version_major: 2,
            version_minor: 4,
            thiszone: 0,
            sigfigs: 0,
            snaplen,
            linktype,
        }
    }

    /// The link type without the FCS bits.
    pub const fn link_type(&self) -> u16 {
        self.linktype as u16
    }

    /// Parse the first [`FILE_HEADER_LEN`] bytes of a file.
    pub fn parse(b: &[u8]) -> Result<Self, PcapError> {
        if b.len() < FILE_HEADER_LEN {
            return Err(PcapError::TruncatedHeader);
        }
        let le = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let (big_endian, nanos) = match le {
            MAGIC_MICROS => (false, false),
            MAGIC_NANOS => (false, true),
            m if m.swap_bytes() == MAGIC_MICROS => (true, false),
            m if m.swap_bytes() == MAGIC_NANOS => (true, true),
            m => return Err(PcapError::BadMagic(m)),
        };
        let o = Order(big_endian);
        Ok(FileHeader {
            big_endian,
            nanos,
            version_major: o.u16(&b[4..6]),
            version_minor: o.u16(&b[6..8]),
            thiszone: o.u32(&b[8..12]) as i32,
            sigfigs: o.u32(&b[12..16]),
            snaplen: o.u32(&b[16..20]),
            linktype: o.u32(&b[20..24]),
        })
    }

    /// The header's bytes in its byte order.
    pub fn emit(&self) -> [u8; FILE_HEADER_LEN] {
        let o = Order(self.big_endian);
        let mut b = [0u8; FILE_HEADER_LEN];
        let magic = if self.nanos {
            MAGIC_NANOS
        } else {
            MAGIC_MICROS
        };
        o.put_u32(&mut b[0..4], magic);
        o.put_u16(&mut b[4..6], self.version_major);
        o.put_u16(&mut b[6..8], self.version_minor);
        o.put_u32(&mut b[8..12], self.thiszone as u32);
        o.put_u32(&mut b[12..16], self.sigfigs);
        o.put_u32(&mut b[16..20], self.snaplen);
        o.put_u32(&mut b[20..24], self.linktype);
        b
    }

    /// Decode a record header: (timestamp since the epoch, captured length, original length).
    fn record(&self, b: &[u8]) -> (Duration, u32, u32) {
        let o = Order(self.big_endian);
        let secs = Duration::from_secs(o.u32(&b[0..4]) as u64);
        let frac = o.u32(&b[4..8]) as u64;
        let frac = if self.nanos {
            Duration::from_nanos(frac)
        } else {
            Duration::from_micros(frac)
        };
        (secs + frac, o.u32(&b[8..12]), o.u32(&b[12..16]))
    }
}

/// Byte order of a file.
#[derive(Clone, Copy)]
struct Order(bool);

impl Order {
    fn u16(self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.0 {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        }
    }
    fn u32(self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.0 {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }
    fn put_u16(self, b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&if self.0 {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }
    fn put_u32(self, b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&if self.0 {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }
}

/// One captured packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Record<'a> {
    /// Time since the Unix epoch.
    pub ts: Duration,
    /// Length of the packet on the wire; `data` is shorter if the capture cut it.
    pub orig_len: u32,
    /// The captured bytes (for [`LINKTYPE_ETHERNET`], the frame without FCS).
    pub data: &'a [u8],
}

impl Record<'_> {
    /// The timestamp as a [`SystemTime`].
    pub fn timestamp(&self) -> SystemTime {
        UNIX_EPOCH + self.ts
    }

    /// Whether the capture kept fewer bytes than the packet had.
    pub fn is_truncated(&self) -> bool {
        (self.data.len() as u64) < self.orig_len as u64
    }
}

/// A pcap file in memory: an iterator over its records that borrows from the buffer.
///
/// After the first error the iterator ends.
#[derive(Clone, Debug)]
pub struct PcapSlice<'a> {
    header: FileHeader,
    rest: &'a [u8],
    offset: u64,
    done: bool,
}

impl<'a> PcapSlice<'a> {
    /// Check the file header of `data`.
    pub fn new(data: &'a [u8]) -> Result<Self, PcapError> {
        let header = FileHeader::parse(data)?;
        Ok(PcapSlice {
            header,
            rest: &data[FILE_HEADER_LEN..],
            offset: FILE_HEADER_LEN as u64,
            done: false,
        })
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// Byte offset in the file of the next record.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl<'a> Iterator for PcapSlice<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.rest.is_empty() {
            return None;
        }
        let offset = self.offset;
        if self.rest.len() < RECORD_HEADER_LEN {
            self.done = true;
            return Some(Err(PcapError::TruncatedRecord { offset }));
        }
        let (ts, incl, orig_len) = self.header.record(&self.rest[..RECORD_HEADER_LEN]);
        let body = &self.rest[RECORD_HEADER_LEN..];
        if incl as u64 > body.len() as u64 {
            self.done = true;
            return Some(Err(PcapError::TruncatedRecord { offset }));
        }
        let (data, rest) = body.split_at(incl as usize);
        self.rest = rest;
        self.offset += (RECORD_HEADER_LEN + data.len()) as u64;
        Some(Ok(Record { ts, orig_len, data }))
    }
}

/// A streaming pcap reader. Records are lent one at a time from an internal buffer that is
/// reused, so [`PcapReader::next_record`] is not an [`Iterator`].
#[derive(Debug)]
pub struct PcapReader<R> {
    r: R,
    header: FileHeader,
    buf: Vec<u8>,
    offset: u64,
    done: bool,
}

impl PcapReader<BufReader<File>> {
    /// Open a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PcapError> {
        PcapReader::new(BufReader::new(File::open(path)?))
    }
}

impl<R: Read> PcapReader<R> {
    /// Read and check the file header.
    pub fn new(mut r: R) -> Result<Self, PcapError> {
        let mut h = [0u8; FILE_HEADER_LEN];
        if read_full(&mut r, &mut h)? < FILE_HEADER_LEN {
            return Err(PcapError::TruncatedHeader);
        }
        Ok(PcapReader {
            r,
            header: FileHeader::parse(&h)?,
            buf: Vec::new(),
            offset: FILE_HEADER_LEN as u64,
            done: false,
        })
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// The next record; `None` at a clean end of file. After an error, always `None`.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, PcapError>> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some((ts, orig_len))) => Some(Ok(Record {
                ts,
                orig_len,
                data: &self.buf,
            })),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    fn read_record(&mut self) -> Result<Option<(Duration, u32)>, PcapError> {
        let offset = self.offset;
        let mut h = [0u8; RECORD_HEADER_LEN];
        match read_full(&mut self.r, &mut h)? {
            0 => return Ok(None),
            RECORD_HEADER_LEN => {}
            _ => return Err(PcapError::TruncatedRecord { offset }),
        }
        let (ts, incl, orig_len) = self.header.record(&h);
        if incl > MAX_RECORD_LEN {
            return Err(PcapError::RecordTooLarge { offset, len: incl });
        }
        self.buf.clear();
        // `take` + `read_to_end` grows the buffer with the data actually read, so a garbage
        // length on a short stream does not allocate the claimed size up front.
        let got = (&mut self.r).take(incl as u64).read_to_end(&mut self.buf)?;
        if got < incl as usize {
            return Err(PcapError::TruncatedRecord { offset });
        }
        self.offset += (RECORD_HEADER_LEN + got) as u64;
        Ok(Some((ts, orig_len)))
    }
}

/// Read until `buf` is full or end of stream; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes an Ethernet (`LINKTYPE_ETHERNET`) capture, little-endian, microsecond timestamps unless
/// made with [`PcapWriter::with_header`]. Flushes on drop (errors there are ignored; call
/// [`PcapWriter::flush`] to see them).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: Option<W>,
    header: FileHeader,
}

impl PcapWriter<BufWriter<File>> {
    /// Create (or truncate) a file and write the file header.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        PcapWriter::new(BufWriter::new(File::create(path)?))
    }
}

impl<W: Write> PcapWriter<W> {
    /// Write the file header of an Ethernet capture with microsecond timestamps.
    pub fn new(w: W) -> io::Result<Self> {
        Self::with_header(
            w,
            FileHeader::new(LINKTYPE_ETHERNET, DEFAULT_SNAPLEN, false),
        )
    }

    /// Write a file with the given header (byte order, resolution and link type are honoured).
    pub fn with_header(mut w: W, header: FileHeader) -> io::Result<Self> {
        w.write_all(&header.emit())?;
        Ok(PcapWriter { w: Some(w), header })
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// Write one record whose data is the concatenation of `parts`.
    pub fn write_parts(&mut self, ts: SystemTime, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "record too large"))?;
        let d = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        let frac = if self.header.nanos {
            d.subsec_nanos()
        } else {
            d.subsec_micros()
        };
        let o = Order(self.header.big_endian);
        let mut h = [0u8; RECORD_HEADER_LEN];
        o.put_u32(&mut h[0..4], secs);
        o.put_u32(&mut h[4..8], frac);
        o.put_u32(&mut h[8..12], len);
        o.put_u32(&mut h[12..16], len);
        let w = self.w.as_mut().expect("writer present until drop");
        w.write_all(&h)?;
        for p in parts {
            w.write_all(p)?;
        }
        Ok(())
    }

    /// Write one frame (the whole link-layer packet).
    pub fn write_frame(&mut self, ts: SystemTime, frame: &[u8]) -> io::Result<()> {
        self.write_parts(ts, &[frame])
    }

    /// Write a RoCEv2 datagram: `ip_udp` is its IPv4 and UDP header as sent (as
    /// [`super::ipv4::Ipv4Udp::emit`] builds it), `udp_payload` BTH to ICRC. The Ethernet header
    /// has fake MACs ([`fake_mac`] of the IPv4 addresses) and EtherType IPv4.
    pub fn write_roce(
        &mut self,
        ts: SystemTime,
        ip_udp: &[u8; IPV4_LEN + UDP_LEN],
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let src = [ip_udp[12], ip_udp[13], ip_udp[14], ip_udp[15]];
        let dst = [ip_udp[16], ip_udp[17], ip_udp[18], ip_udp[19]];
        let eth = eth_header(src, dst, ethernet::ETHERTYPE_IPV4);
        self.write_parts(ts, &[&eth, ip_udp, udp_payload])
    }

    /// [`PcapWriter::write_roce`] for RoCEv2 over IPv6; the fake MACs use the last four bytes of
    /// the addresses.
    pub fn write_roce_v6(
        &mut self,
        ts: SystemTime,
        ip_udp: &[u8; IPV6_LEN + UDP_LEN],
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let src = [ip_udp[20], ip_udp[21], ip_udp[22], ip_udp[23]];
        let dst = [ip_udp[36], ip_udp[37], ip_udp[38], ip_udp[39]];
        let eth = eth_header(src, dst, ethernet::ETHERTYPE_IPV6);
        self.write_parts(ts, &[&eth, ip_udp, udp_payload])
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        match self.w.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        self.w.as_ref().expect("writer present until drop")
    }

    /// The underlying writer, mutably.
    pub fn get_mut(&mut self) -> &mut W {
        self.w.as_mut().expect("writer present until drop")
    }

    /// Flush and return the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.w.take().expect("writer present until drop"))
    }
}

impl<W: Write> Drop for PcapWriter<W> {
    fn drop(&mut self) {
        if let Some(w) = self.w.as_mut() {
            let _ = w.flush();
        }
    }
}

fn eth_header(src: [u8; 4], dst: [u8; 4], ethertype: u16) -> [u8; ethernet::HEADER_LEN] {
    let mut b = [0u8; ethernet::HEADER_LEN];
    let h = EthHeader {
        dst: fake_mac(dst),
        src: fake_mac(src),
        vlan_tci: None,
        ethertype,
    };
    // Cannot fail: the buffer is exactly an untagged header.
    let _ = h.emit(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::Ipv4Udp;
    use std::net::Ipv4Addr;

    /// The file header of tests/data/rxe-basic.pcap (tcpdump, little-endian, microseconds).
    const BASIC_HEADER: [u8; 24] = [
        0xd4, 0xc3, 0xb2, 0xa1, 0x02, 0x00, 0x04, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x04,
        0x00, 0x01, 0x00, 0x00, 0x00,
    ];

    fn file(header: FileHeader, recs: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let o = Order(header.big_endian);
        let mut v = header.emit().to_vec();
        for (s, f, d) in recs {
            let mut h = [0u8; 16];
            o.put_u32(&mut h[0..4], *s);
            o.put_u32(&mut h[4..8], *f);
            o.put_u32(&mut h[8..12], d.len() as u32);
            o.put_u32(&mut h[12..16], d.len() as u32 + 7);
            v.extend_from_slice(&h);
            v.extend_from_slice(d);
        }
        v
    }

    #[test]
    fn parses_tcpdump_header() {
        let h = FileHeader::parse(&BASIC_HEADER).unwrap();
        assert_eq!(h, FileHeader::new(LINKTYPE_ETHERNET, 262_144, false));
        assert_eq!(h.emit(), BASIC_HEADER);
        assert_eq!(h.link_type(), 1);
    }

    #[test]
    fn both_byte_orders_and_resolutions() {
        for big_endian in [false, true] {
            for nanos in [false, true] {
                let mut hdr = FileHeader::new(LINKTYPE_ETHERNET, 65535, nanos);
                hdr.big_endian = big_endian;
                let frac = if nanos { 123_456_789 } else { 123_456 };
                let f = file(
                    hdr,
                    &[(1_700_000_000, frac, b"abc"), (1_700_000_001, 0, b"")],
                );
                let magic = &f[..4];
                match (big_endian, nanos) {
                    (false, false) => assert_eq!(magic, [0xd4, 0xc3, 0xb2, 0xa1]),
                    (false, true) => assert_eq!(magic, [0x4d, 0x3c, 0xb2, 0xa1]),
                    (true, false) => assert_eq!(magic, [0xa1, 0xb2, 0xc3, 0xd4]),
                    (true, true) => assert_eq!(magic, [0xa1, 0xb2, 0x3c, 0x4d]),
                }
                let s = PcapSlice::new(&f).unwrap();
                assert_eq!(*s.header(), hdr);
                let recs: Vec<_> = s.map(|r| r.unwrap()).collect();
                assert_eq!(recs.len(), 2);
                let want = Duration::new(1_700_000_000, 123_456_789 - if nanos { 0 } else { 789 });
                assert_eq!(recs[0].ts, want);
                assert_eq!(recs[0].data, b"abc");
                assert_eq!(recs[0].orig_len, 10);
                assert!(recs[0].is_truncated());
                assert_eq!(recs[1].ts, Duration::from_secs(1_700_000_001));
                assert_eq!(recs[1].data, b"");

                let mut r = PcapReader::new(&f[..]).unwrap();
                assert_eq!(*r.header(), hdr);
                let a = r.next_record().unwrap().unwrap();
                assert_eq!((a.ts, a.data, a.orig_len), (want, &b"abc"[..], 10));
                let b = r.next_record().unwrap().unwrap();
                assert_eq!(b.data, b"");
                assert!(r.next_record().is_none());
                assert!(r.next_record().is_none());
            }
        }
    }

    #[test]
    fn errors_on_garbage_and_truncation() {
        assert!(matches!(
            PcapSlice::new(b"\x0a\x0d\x0d\x0a0123456789abcdefghijkl"),
            Err(PcapError::BadMagic(0x0a0d_0d0a))
        ));
        assert!(matches!(
            PcapReader::new(&BASIC_HEADER[..23]),
            Err(PcapError::TruncatedHeader)
        ));
        let f = file(
            FileHeader::new(1, 100, false),
            &[(1, 2, b"hello"), (3, 4, b"world")],
        );
        // Every proper prefix that ends inside a record is an error, after the whole records.
        for n in 0..f.len() {
            let whole = match n {
                0..=23 => {
                    assert!(PcapSlice::new(&f[..n]).is_err());
                    assert!(PcapReader::new(&f[..n]).is_err());
                    continue;
                }
                24 => (0, false),
                25..=44 => (0, true),
                45 => (1, false),
                46..=65 => (1, true),
                _ => unreachable!(),
            };
            let items: Vec<_> = PcapSlice::new(&f[..n]).unwrap().collect();
            let oks = items.iter().filter(|r| r.is_ok()).count();
            assert_eq!((oks, items.len() > oks), whole, "slice {n}");
            let mut r = PcapReader::new(&f[..n]).unwrap();
            let (mut oks, mut errs) = (0, 0);
            while let Some(x) = r.next_record() {
                match x {
                    Ok(_) => oks += 1,
                    Err(PcapError::TruncatedRecord { offset }) => {
                        assert_eq!(offset, [24, 45][oks]);
                        errs += 1
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!((oks, errs == 1), whole, "reader {n}");
        }
        // A huge length is refused by the streaming reader before it reads anything.
        let mut g = f.clone();
        g[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            PcapReader::new(&g[..]).unwrap().next_record(),
            Some(Err(PcapError::RecordTooLarge { offset: 24, .. }))
        ));
        assert!(matches!(
            PcapSlice::new(&g).unwrap().next(),
            Some(Err(PcapError::TruncatedRecord { offset: 24 }))
        ));
    }

    #[test]
    fn writer_round_trips_roce() {
        let ip = Ipv4Udp::new(
            Ipv4Addr::new(10, 77, 0, 2),
            0xcb97,
            Ipv4Addr::new(10, 77, 0, 3),
            4791,
            4,
        );
        let mut hdr = [0u8; 28];
        ip.emit(&mut hdr);
        let ts = UNIX_EPOCH + Duration::new(1_795_333_870, 543_323_999);
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_roce(ts, &hdr, &[1, 2, 3, 4]).unwrap();
        w.write_frame(UNIX_EPOCH, &[9; 3]).unwrap();
        let v = w.into_inner().unwrap();
        assert_eq!(v[..24], BASIC_HEADER);
        let mut s = PcapSlice::new(&v).unwrap();
        let r = s.next().unwrap().unwrap();
        assert_eq!(r.ts, Duration::new(1_795_333_870, 543_323_000));
        assert_eq!(r.timestamp(), UNIX_EPOCH + r.ts);
        assert_eq!(r.orig_len, 14 + 28 + 4);
        assert_eq!(
            r.data[..14],
            [2, 0, 10, 77, 0, 3, 2, 0, 10, 77, 0, 2, 0x08, 0x00]
        );
        let (h, p) = ethernet::split_ipv4_udp(r.data).unwrap();
        assert_eq!((h, p), (hdr, &[1u8, 2, 3, 4][..]));
        assert_eq!(s.next().unwrap().unwrap().data, [9; 3]);
        assert!(s.next().is_none());
    }

    #[test]
    fn writer_flushes_on_drop_and_writes_nanos() {
        let path = std::env::temp_dir().join(format!("softrdma-pcap-{}.pcap", std::process::id()));
        {
            let mut w = PcapWriter::create(&path).unwrap();
            w.write_frame(UNIX_EPOCH + Duration::from_micros(5), &[1; 60])
                .unwrap();
        }
        let d = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(d.len(), 24 + 16 + 60);
        let mut r = PcapReader::new(&d[..]).unwrap();
        assert_eq!(
            r.next_record().unwrap().unwrap().ts,
            Duration::from_micros(5)
        );

        let mut h = FileHeader::new(LINKTYPE_ETHERNET, 1000, true);
        h.big_endian = true;
        let mut w = PcapWriter::with_header(Vec::new(), h).unwrap();
        w.write_frame(UNIX_EPOCH + Duration::from_nanos(7), &[1; 2])
            .unwrap();
        let v = w.into_inner().unwrap();
        let mut s = PcapSlice::new(&v).unwrap();
        assert_eq!(*s.header(), h);
        assert_eq!(s.next().unwrap().unwrap().ts, Duration::from_nanos(7));
    }
}
