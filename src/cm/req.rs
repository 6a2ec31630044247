//! REQ, ConnectRequest (IBA 12.6.5, Table 106): the active side's offer of a connection.
//!
//! Offsets below are within the 232-byte message area (add 24 for the MAD).
//! ```text
//!   0 local comm ID          4 rsvd8 | vendor ID (24, ECE)   8 service ID (64)
//!  16 local CA GUID (64)    24 rsvd32                        28 local Q_Key
//!  32 local QPN (24) | responder resources                   36 local EECN (24) | initiator depth
//!  40 remote EECN (24) | remote CM resp timeout (5) transport service type (2) e2e flow ctl (1)
//!  44 starting PSN (24) | local CM resp timeout (5) retry count (3)
//!  48 P_Key | path MTU (4) RDC exists (1) RNR retry (3) | max CM retries (4) SRQ (1) ext transport (3)
//!  52 primary path (44 bytes)   96 alternate path (44 bytes)   140 private data (92)
//! ```

use super::{
    be, impl_cm_message, mad, mask, private_data::CmaHdr, CmWireError, MadHdr, PrivateData,
};

/// Size of REQ private data.
pub const PRIVATE_DATA_LEN: usize = 92;

/// Transport service types in [`ConnectRequest::transport_service_type`].
pub mod transport {
    pub const RC: u8 = 0;
    pub const UC: u8 = 1;
    pub const RD: u8 = 2;
}

/// One path (primary or alternate) of a REQ, 44 bytes.
/// ```text
///  0 local port LID   2 remote port LID   4 local port GID (128)   20 remote port GID (128)
/// 36 flow label (20) rsvd (6) packet rate (6)   40 traffic class   41 hop limit
/// 42 SL (4) subnet local (1) rsvd (3)           43 local ACK timeout (5) rsvd (3)
/// ```
/// Over RoCE the LIDs are 0xFFFF (permissive) and the GIDs IPv4-mapped addresses.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PathInfo {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// The 6 reserved bits between the flow label and the packet rate.
    pub rsvd_rate: u8,
    /// 6 bits, IBA rate encoding (0 = port current).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// The low 3 bits of the SL byte, reserved.
    pub rsvd_sl: u8,
    /// 5 bits, 4.096 µs * 2^n.
    pub local_ack_timeout: u8,
    /// The low 3 bits of the ACK timeout byte: reserved, except that in the alternate path of a
    /// REQ bit 2 (0b100) is "SAP supported".
    pub rsvd_ack: u8,
}

/// Length of a [`PathInfo`] on the wire.
pub const PATH_LEN: usize = 44;

impl PathInfo {
    pub(crate) fn read(d: &[u8], at: usize) -> Self {
        let word = be::u32(&d[at + 36..]);
        let sl = d[at + 42];
        let ack = d[at + 43];
        PathInfo {
            local_lid: be::u16(&d[at..]),
            remote_lid: be::u16(&d[at + 2..]),
            local_gid: be::arr(&d[at + 4..]),
            remote_gid: be::arr(&d[at + 20..]),
            flow_label: word >> 12,
            rsvd_rate: ((word >> 6) & 0x3f) as u8,
            packet_rate: (word & 0x3f) as u8,
            traffic_class: d[at + 40],
            hop_limit: d[at + 41],
            sl: sl >> 4,
            subnet_local: sl & 0x08 != 0,
            rsvd_sl: sl & 0x07,
            local_ack_timeout: ack >> 3,
            rsvd_ack: ack & 0x07,
        }
    }

    pub(crate) fn write(&self, d: &mut [u8], at: usize) {
        be::put_u16(&mut d[at..], self.local_lid);
        be::put_u16(&mut d[at + 2..], self.remote_lid);
        d[at + 4..at + 20].copy_from_slice(&self.local_gid);
        d[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        let word = (self.flow_label & mask(20)) << 12
            | (self.rsvd_rate as u32 & 0x3f) << 6
            | (self.packet_rate as u32 & 0x3f);
        be::put_u32(&mut d[at + 36..], word);
        d[at + 40] = self.traffic_class;
        d[at + 41] = self.hop_limit;
        d[at + 42] = (self.sl & 0x0f) << 4 | (self.subnet_local as u8) << 3 | (self.rsvd_sl & 0x07);
        d[at + 43] = (self.local_ack_timeout & 0x1f) << 3 | (self.rsvd_ack & 0x07);
    }

    /// True if every field is zero, as for an absent alternate path.
    pub fn is_empty(&self) -> bool {
        *self == PathInfo::default()
    }
}

/// A REQ message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConnectRequest {
    pub hdr: MadHdr,
    pub local_comm_id: u32,
    /// Byte 4, reserved.
    pub rsvd4: u8,
    /// 24 bits: the ECE vendor ID (IBA comment 9434), 0 when ECE is not used.
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    /// Bytes 24-27, reserved.
    pub rsvd24: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits, 4.096 µs * 2^n.
    pub remote_cm_response_timeout: u8,
    /// 2 bits, see [`transport`].
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits, IBA MTU encoding (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits.
    pub extended_transport_type: u8,
    pub primary_path: PathInfo,
    pub alternate_path: PathInfo,
    pub private_data: PrivateData<PRIVATE_DATA_LEN>,
}

impl ConnectRequest {
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, d) = mad::split(buf, mad::attr::REQ)?;
        Ok(ConnectRequest {
            hdr,
            local_comm_id: be::u32(d),
            rsvd4: d[4],
            vendor_id: be::u24(&d[5..]),
            service_id: be::u64(&d[8..]),
            local_ca_guid: be::u64(&d[16..]),
            rsvd24: be::u32(&d[24..]),
            local_qkey: be::u32(&d[28..]),
            local_qpn: be::u24(&d[32..]),
            responder_resources: d[35],
            local_eecn: be::u24(&d[36..]),
            initiator_depth: d[39],
            remote_eecn: be::u24(&d[40..]),
            remote_cm_response_timeout: d[43] >> 3,
            transport_service_type: (d[43] >> 1) & 0x03,
            end_to_end_flow_control: d[43] & 0x01 != 0,
            starting_psn: be::u24(&d[44..]),
            local_cm_response_timeout: d[47] >> 3,
            retry_count: d[47] & 0x07,
            pkey: be::u16(&d[48..]),
            path_mtu: d[50] >> 4,
            rdc_exists: d[50] & 0x08 != 0,
            rnr_retry_count: d[50] & 0x07,
            max_cm_retries: d[51] >> 4,
            srq: d[51] & 0x08 != 0,
            extended_transport_type: d[51] & 0x07,
            primary_path: PathInfo::read(d, 52),
            alternate_path: PathInfo::read(d, 96),
            private_data: PrivateData::read(d, 140),
        })
    }

    pub fn emit(&self, buf: &mut [u8; mad::MAD_LEN]) {
        let d = mad::emit_hdr(&self.hdr, mad::attr::REQ, buf);
        be::put_u32(d, self.local_comm_id);
        d[4] = self.rsvd4;
        be::put_u24(&mut d[5..], self.vendor_id);
        be::put_u64(&mut d[8..], self.service_id);
        be::put_u64(&mut d[16..], self.local_ca_guid);
        be::put_u32(&mut d[24..], self.rsvd24);
        be::put_u32(&mut d[28..], self.local_qkey);
        be::put_u24(&mut d[32..], self.local_qpn);
        d[35] = self.responder_resources;
        be::put_u24(&mut d[36..], self.local_eecn);
        d[39] = self.initiator_depth;
        be::put_u24(&mut d[40..], self.remote_eecn);
        d[43] = (self.remote_cm_response_timeout & 0x1f) << 3
            | (self.transport_service_type & 0x03) << 1
            | self.end_to_end_flow_control as u8;
        be::put_u24(&mut d[44..], self.starting_psn);
        d[47] = (self.local_cm_response_timeout & 0x1f) << 3 | (self.retry_count & 0x07);
        be::put_u16(&mut d[48..], self.pkey);
        d[50] = (self.path_mtu & 0x0f) << 4
            | (self.rdc_exists as u8) << 3
            | (self.rnr_retry_count & 0x07);
        d[51] = (self.max_cm_retries & 0x0f) << 4
            | (self.srq as u8) << 3
            | (self.extended_transport_type & 0x07);
        self.primary_path.write(d, 52);
        self.alternate_path.write(d, 96);
        self.private_data.write(d, 140);
    }

    /// The "SAP supported" bit (IBA 12.6.5, in the alternate path's ACK-timeout byte).
    pub fn sap_supported(&self) -> bool {
        self.alternate_path.rsvd_ack & 0x04 != 0
    }

    /// The rdma_cm IP header at the front of the private data, and the consumer's data after it.
    /// Only meaningful for REQs rdma_cm sends for IP-addressed ids (see
    /// [`super::service_id::split`]).
    pub fn cma_hdr(&self) -> (CmaHdr, &[u8]) {
        // 92 >= 36, so this cannot fail.
        CmaHdr::parse(&self.private_data.0).unwrap_or_default()
    }
}

impl_cm_message!(ConnectRequest, mad::attr::REQ);
