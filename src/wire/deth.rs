//! Datagram Extended Transport Header (IBA 9.3.2): Q_Key and source QP.

use super::{be, WireError};

/// Length of the DETH.
pub const LEN: usize = 8;

/// The well-known Q_Key of the General Services Interface, QP1 (IBA 13.5.3.3).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// A parsed DETH.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Deth {
    /// Queue key (Q_Key) the destination UD QP checks.
    pub qkey: u32,
    /// The reserved byte 4, kept so re-emitting reproduces the bytes.
    pub resv8: u8,
    /// Source queue pair number (SrcQP, 24 bits).
    pub src_qpn: u32,
}

impl Deth {
    /// Parse the first [`LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < LEN {
            return Err(WireError::Truncated);
        }
        Ok(Deth {
            qkey: be::u32(&buf[0..4]),
            resv8: buf[4],
            src_qpn: be::u24(&buf[5..8]),
        })
    }

    /// Write the header into the first [`LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u32(&mut buf[0..4], self.qkey);
        buf[4] = self.resv8;
        be::put_u24(&mut buf[5..8], self.src_qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DETH of frame 1 of tests/data/rxe-basic.pcap: a CM MAD from QP1 with the GSI Q_Key.
    const CM_MAD: [u8; LEN] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
    /// DETH of an ibv_ud_pingpong SEND in rxe-basic.pcap: Q_Key 0x11111111 from QP 0x1b.
    const UD_PINGPONG: [u8; LEN] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x1b];

    #[test]
    fn parse_and_emit_capture_deths() {
        let cases = [(CM_MAD, GSI_QKEY, 1), (UD_PINGPONG, 0x1111_1111, 0x1b)];
        for (bytes, qkey, src_qpn) in cases {
            let d = Deth::parse(&bytes).unwrap();
            assert_eq!(
                d,
                Deth {
                    qkey,
                    resv8: 0,
                    src_qpn
                }
            );
            let mut out = [0u8; LEN];
            d.emit(&mut out);
            assert_eq!(out, bytes);
        }
        let odd = [1, 2, 3, 4, 0xa5, 0xff, 0xff, 0xff];
        let d = Deth::parse(&odd).unwrap();
        assert_eq!((d.resv8, d.src_qpn), (0xa5, 0xff_ffff));
        let mut out = [0u8; LEN];
        d.emit(&mut out);
        assert_eq!(out, odd);
        for n in 0..LEN {
            assert_eq!(Deth::parse(&CM_MAD[..n]), Err(WireError::Truncated));
        }
    }
}
