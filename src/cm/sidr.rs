//! SIDR_REQ and SIDR_REP, Service ID Resolution (IBA 12.11, Tables 119 and 120): how rdma_cm
//! finds the QPN and Q_Key of a UD service (`RDMA_PS_UDP`, `RDMA_PS_IB` with UD QPs).
//! ```text
//! SIDR_REQ:  0 request ID   4 P_Key   6 rsvd16   8 service ID (64)   16 private data (216)
//! SIDR_REP:  0 request ID   4 status   5 additional info length   6 vendor ID bits 23:8
//!            8 QPN (24) | vendor ID bits 7:0   12 service ID (64)   20 Q_Key
//!           24 additional info (72)   96 private data (136)
//! ```
//! rdma_cm puts its IP header ([`super::CmaHdr`]) at the front of SIDR_REQ private data.

use super::{be, impl_cm_message, mad, private_data::CmaHdr, CmWireError, MadHdr, PrivateData};

/// Size of SIDR_REQ private data.
pub const REQ_PRIVATE_DATA_LEN: usize = 216;
/// Size of the SIDR_REP additional information.
pub const ADDITIONAL_INFO_LEN: usize = 72;
/// Size of SIDR_REP private data.
pub const REP_PRIVATE_DATA_LEN: usize = 136;

/// SIDR_REP status values (IBA Table 121, Linux `enum ib_cm_sidr_status`).
pub mod status {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// A SIDR_REQ message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SidrRequest {
    pub hdr: MadHdr,
    pub request_id: u32,
    pub pkey: u16,
    /// Bytes 6-7, reserved.
    pub rsvd6: u16,
    pub service_id: u64,
    pub private_data: PrivateData<REQ_PRIVATE_DATA_LEN>,
}

impl SidrRequest {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::SIDR_REQ)?;
        Ok(SidrRequest {
            hdr,
            request_id: be::u32(d),
            pkey: be::u16(&d[4..]),
            rsvd6: be::u16(&d[6..]),
            service_id: be::u64(&d[8..]),
            private_data: PrivateData::read(d, 16),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::SIDR_REQ, buf);
        be::put_u32(d, self.request_id);
        be::put_u16(&mut d[4..], self.pkey);
        be::put_u16(&mut d[6..], self.rsvd6);
        be::put_u64(&mut d[8..], self.service_id);
        self.private_data.write(d, 16);
    }

    /// The rdma_cm IP header at the front of the private data, and the consumer's data after it.
    pub fn cma_hdr(&self) -> (CmaHdr, &[u8]) {
        CmaHdr::parse(&self.private_data.0).unwrap_or_default()
    }
}

/// A SIDR_REP message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SidrReply {
    pub hdr: MadHdr,
    pub request_id: u32,
    /// See [`status`].
    pub status: u8,
    pub additional_info_length: u8,
    /// 24 bits, the ECE vendor ID (bytes 6, 7 and 11).
    pub vendor_id: u32,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub additional_info: PrivateData<ADDITIONAL_INFO_LEN>,
    pub private_data: PrivateData<REP_PRIVATE_DATA_LEN>,
}

impl SidrReply {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::SIDR_REP)?;
        Ok(SidrReply {
            hdr,
            request_id: be::u32(d),
            status: d[4],
            additional_info_length: d[5],
            vendor_id: (be::u16(&d[6..]) as u32) << 8 | d[11] as u32,
            qpn: be::u24(&d[8..]),
            service_id: be::u64(&d[12..]),
            qkey: be::u32(&d[20..]),
            additional_info: PrivateData::read(d, 24),
            private_data: PrivateData::read(d, 96),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::SIDR_REP, buf);
        be::put_u32(d, self.request_id);
        d[4] = self.status;
        d[5] = self.additional_info_length;
        be::put_u16(&mut d[6..], (self.vendor_id >> 8) as u16);
        be::put_u24(&mut d[8..], self.qpn);
        d[11] = self.vendor_id as u8;
        be::put_u64(&mut d[12..], self.service_id);
        be::put_u32(&mut d[20..], self.qkey);
        self.additional_info.write(d, 24);
        self.private_data.write(d, 96);
    }
}

impl_cm_message!(SidrRequest, mad::attr::SIDR_REQ);
impl_cm_message!(SidrReply, mad::attr::SIDR_REP);
