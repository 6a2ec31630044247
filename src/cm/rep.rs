//! REP, ConnectReply (IBA 12.6.8, Table 110): the passive side accepts a REQ.
//! ```text
//!  0 local comm ID   4 remote comm ID   8 local Q_Key
//! 12 local QPN (24) | vendor ID bits 23:16     16 local EECN (24) | vendor ID bits 15:8
//! 20 starting PSN (24) | vendor ID bits 7:0    24 responder resources   25 initiator depth
//! 26 target ACK delay (5) failover accepted (2) e2e flow control (1)
//! 27 RNR retry count (3) SRQ (1) rsvd (4)      28 local CA GUID (64)   36 private data (196)
//! ```
//! rdma_cm puts no header in REP private data: it is the consumer's, zero-padded.

use super::{be, impl_cm_message, mad, CmWireError, MadHdr, PrivateData};

/// Size of REP private data.
pub const PRIVATE_DATA_LEN: usize = 196;

/// A REP message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConnectReply {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    /// 24 bits, the ECE vendor ID, spread over bytes 15, 19 and 23.
    pub vendor_id: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits: 0 accepted, 1 rejected, 2 unsupported.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// Low 4 bits of byte 27, reserved.
    pub rsvd27: u8,
    pub local_ca_guid: u64,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl ConnectReply {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::REP)?;
        Ok(ConnectReply {
            hdr,
            local_comm_id: be::u32(d),
            remote_comm_id: be::u32(&d[4..]),
            local_qkey: be::u32(&d[8..]),
            local_qpn: be::u24(&d[12..]),
            local_eecn: be::u24(&d[16..]),
            starting_psn: be::u24(&d[20..]),
            vendor_id: (d[15] as u32) << 16 | (d[19] as u32) << 8 | d[23] as u32,
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: d[26] >> 3,
            failover_accepted: (d[26] >> 1) & 0x03,
            end_to_end_flow_control: d[26] & 0x01 != 0,
            rnr_retry_count: d[27] >> 5,
            srq: d[27] & 0x10 != 0,
            rsvd27: d[27] & 0x0f,
            local_ca_guid: be::u64(&d[28..]),
            private_data: PrivateData::read(d, 36),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::REP, buf);
        be::put_u32(d, self.local_comm_id);
        be::put_u32(&mut d[4..], self.remote_comm_id);
        be::put_u32(&mut d[8..], self.local_qkey);
        be::put_u24(&mut d[12..], self.local_qpn);
        d[15] = (self.vendor_id >> 16) as u8;
        be::put_u24(&mut d[16..], self.local_eecn);
        d[19] = (self.vendor_id >> 8) as u8;
        be::put_u24(&mut d[20..], self.starting_psn);
        d[23] = self.vendor_id as u8;
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        d[26] = (self.target_ack_delay & 0x1f) << 3
            | (self.failover_accepted & 0x03) << 1
            | self.end_to_end_flow_control as u8;
        d[27] = (self.rnr_retry_count & 0x07) << 5 | (self.srq as u8) << 4 | (self.rsvd27 & 0x0f);
        be::put_u64(&mut d[28..], self.local_ca_guid);
        self.private_data.write(d, 36);
    }
}

impl_cm_message!(ConnectReply, mad::attr::REP);
