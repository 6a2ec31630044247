//! LAP, LoadAlternatePath (IBA 12.8.1, Table 115). Linux rdma_cm never sends it over RoCE; it is
//! decoded so that a received one can be answered (with an APR) rather than dropped.
//! ```text
//!  0 local comm ID   4 remote comm ID   8 rsvd32   12 remote QPN/EECN (24) | remote CM resp timeout (5) rsvd (3)
//! 16 rsvd32   20 alt local LID   22 alt remote LID   24 alt local GID   40 alt remote GID
//! 56 alt flow label (20) rsvd (4) | traffic class   60 hop limit   61 rsvd (2) packet rate (6)
//! 62 SL (4) subnet local (1) rsvd (3)   63 local ACK timeout (5) rsvd (3)   64 private data (168)
//! ```

use super::{be, impl_cm_message, mad, mask, CmWireError, MadHdr, PrivateData};

/// Size of LAP private data.
pub const PRIVATE_DATA_LEN: usize = 168;

/// A LAP message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct LoadAlternatePath {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub rsvd8: u32,
    /// 24 bits.
    pub remote_qpn_eecn: u32,
    /// 5 bits.
    pub remote_cm_response_timeout: u8,
    /// Low 3 bits of byte 15.
    pub rsvd15: u8,
    pub rsvd16: u32,
    pub alt_local_lid: u16,
    pub alt_remote_lid: u16,
    pub alt_local_gid: [u8; 16],
    pub alt_remote_gid: [u8; 16],
    /// 20 bits.
    pub alt_flow_label: u32,
    /// Low 4 bits of byte 58.
    pub rsvd58: u8,
    pub alt_traffic_class: u8,
    pub alt_hop_limit: u8,
    /// Top 2 bits of byte 61.
    pub rsvd61: u8,
    /// 6 bits.
    pub alt_packet_rate: u8,
    /// 4 bits.
    pub alt_sl: u8,
    pub alt_subnet_local: bool,
    /// Low 3 bits of byte 62.
    pub rsvd62: u8,
    /// 5 bits.
    pub alt_local_ack_timeout: u8,
    /// Low 3 bits of byte 63.
    pub rsvd63: u8,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl LoadAlternatePath {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::LAP)?;
        let fl = be::u32(&d[56..]);
        Ok(LoadAlternatePath {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            rsvd8: be::u32(&d[8..]),
            remote_qpn_eecn: be::u24(&d[12..]),
            remote_cm_response_timeout: d[15] >> 3,
            rsvd15: d[15] & 0x07,
            rsvd16: be::u32(&d[16..]),
            alt_local_lid: be::u16(&d[20..]),
            alt_remote_lid: be::u16(&d[22..]),
            alt_local_gid: be::arr(&d[24..]),
            alt_remote_gid: be::arr(&d[40..]),
            alt_flow_label: fl >> 12,
            rsvd58: ((fl >> 8) & 0x0f) as u8,
            alt_traffic_class: d[59],
            alt_hop_limit: d[60],
            rsvd61: d[61] >> 6,
            alt_packet_rate: d[61] & 0x3f,
            alt_sl: d[62] >> 4,
            alt_subnet_local: d[62] & 0x08 != 0,
            rsvd62: d[62] & 0x07,
            alt_local_ack_timeout: d[63] >> 3,
            rsvd63: d[63] & 0x07,
            private_data: PrivateData::read(d, 64),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::LAP, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        be::put_u32(&mut d[8..], self.rsvd8);
        be::put_u24(&mut d[12..], self.remote_qpn_eecn);
        d[15] = (self.remote_cm_response_timeout & 0x1f) << 3 | (self.rsvd15 & 0x07);
        be::put_u32(&mut d[16..], self.rsvd16);
        be::put_u16(&mut d[20..], self.alt_local_lid);
        be::put_u16(&mut d[22..], self.alt_remote_lid);
        d[24..40].copy_from_slice(&self.alt_local_gid);
        d[40..56].copy_from_slice(&self.alt_remote_gid);
        let fl = (self.alt_flow_label & mask(20)) << 12
            | (self.rsvd58 as u32 & 0x0f) << 8
            | self.alt_traffic_class as u32;
        be::put_u32(&mut d[56..], fl);
        d[60] = self.alt_hop_limit;
        d[61] = (self.rsvd61 & 0x03) << 6 | (self.alt_packet_rate & 0x3f);
        d[62] =
            (self.alt_sl & 0x0f) << 4 | (self.alt_subnet_local as u8) << 3 | (self.rsvd62 & 0x07);
        d[63] = (self.alt_local_ack_timeout & 0x1f) << 3 | (self.rsvd63 & 0x07);
        self.private_data.write(d, 64);
    }
}

impl_cm_message!(LoadAlternatePath, mad::attr::LAP);
