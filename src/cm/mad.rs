//! The common MAD header (IBA 13.4.3) and the CM class constants (IBA 12.6, 16.7).

use super::{be, CmWireError};

/// Every MAD on QP1 is 256 bytes.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const HDR_LEN: usize = 24;
/// Length of the CM message area after the header.
pub const DATA_LEN: usize = MAD_LEN - HDR_LEN;

/// `BaseVersion` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version Linux speaks (`IB_CM_CLASS_VERSION`).
pub const CLASS_VERSION: u8 = 2;

/// MAD methods used by the CM class.
pub mod method {
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    /// All CM protocol messages travel as `Send`.
    pub const SEND: u8 = 0x03;
    pub const GET_RESP: u8 = 0x81;
}

/// CM attribute IDs (IBA Table 104).
pub mod attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001A;
}

/// The 24-byte common MAD header.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MadHdr {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    /// Method, including the response bit 0x80.
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    /// Transaction ID. Linux `ib_cm` builds it as `hi_tid << 32 | local_comm_id` with the comm ID
    /// taken in CPU order, so on x86 its low half is the *byte-swapped* wire comm ID; see
    /// [`linux_tid`].
    pub tid: u64,
    pub attr_id: u16,
    /// Reserved bytes 18-19.
    pub resv: u16,
    /// Attribute modifier. Linux puts the ECE option bits of REQ/REP here; otherwise 0.
    pub attr_mod: u32,
}

impl MadHdr {
    /// A CM `Send` header for `attr_id` with transaction ID `tid`.
    pub fn cm(attr_id: u16, tid: u64) -> Self {
        MadHdr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CLASS_VERSION,
            method: method::SEND,
            tid,
            attr_id,
            ..Default::default()
        }
    }

    /// Parse the header at the front of `buf` (at least 24 bytes). Checks the base version and
    /// that the class is CM; the class version is left to the caller (the CM answers a wrong one
    /// with REJ reason 31). Never panics.
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        if buf.len() < HDR_LEN {
            return Err(CmWireError::Truncated {
                need: HDR_LEN,
                have: buf.len(),
            });
        }
        let h = MadHdr {
            base_version: buf[0],
            mgmt_class: buf[1],
            class_version: buf[2],
            method: buf[3],
            status: be::u16(&buf[4..]),
            class_specific: be::u16(&buf[6..]),
            tid: be::u64(&buf[8..]),
            attr_id: be::u16(&buf[16..]),
            resv: be::u16(&buf[18..]),
            attr_mod: be::u32(&buf[20..]),
        };
        if h.base_version != BASE_VERSION {
            return Err(CmWireError::BadBaseVersion(h.base_version));
        }
        if h.mgmt_class != MGMT_CLASS_CM {
            return Err(CmWireError::NotCm(h.mgmt_class));
        }
        Ok(h)
    }

    /// Write the 24-byte header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8; HDR_LEN]) {
        buf[0] = self.base_version;
        buf[1] = self.mgmt_class;
        buf[2] = self.class_version;
        buf[3] = self.method;
        be::put_u16(&mut buf[4..], self.status);
        be::put_u16(&mut buf[6..], self.class_specific);
        be::put_u64(&mut buf[8..], self.tid);
        be::put_u16(&mut buf[16..], self.attr_id);
        be::put_u16(&mut buf[18..], self.resv);
        be::put_u32(&mut buf[20..], self.attr_mod);
    }
}

/// The transaction ID Linux `ib_cm` (on a little-endian host) puts on messages of a connection
/// whose local comm ID is `local_comm_id` (as on the wire): the MAD agent's `hi_tid` in the high
/// half, the comm ID's bytes reversed in the low half. REQ, RTU and the active side's DREQ carry
/// the client's; REP/DREP echo the TID of the message they answer.
pub fn linux_tid(hi_tid: u32, local_comm_id: u32) -> u64 {
    (hi_tid as u64) << 32 | local_comm_id.swap_bytes() as u64
}

/// Check the length, the header and the attribute ID of a MAD; return the header and the
/// 232-byte message area.
pub(crate) fn split(buf: &[u8], attr_id: u16) -> Result<(MadHdr, &[u8; DATA_LEN]), CmWireError> {
    if buf.len() != MAD_LEN {
        return Err(CmWireError::Length(buf.len()));
    }
    let hdr = MadHdr::parse(buf)?;
    if hdr.attr_id != attr_id {
        return Err(CmWireError::WrongAttribute {
            expected: attr_id,
            found: hdr.attr_id,
        });
    }
    let data: &[u8; DATA_LEN] = buf[HDR_LEN..]
        .try_into()
        .map_err(|_| CmWireError::Length(buf.len()))?;
    Ok((hdr, data))
}

/// Write `hdr` (with `attr_id` forced) and return the 232-byte message area to fill.
pub(crate) fn emit_hdr<'a>(
    hdr: &MadHdr,
    attr_id: u16,
    buf: &'a mut [u8; MAD_LEN],
) -> &'a mut [u8; DATA_LEN] {
    let (h, d) = buf.split_at_mut(HDR_LEN);
    let h: &mut [u8; HDR_LEN] = h.try_into().expect("HDR_LEN split");
    MadHdr { attr_id, ..*hdr }.emit(h);
    d.try_into().expect("DATA_LEN split")
}

/// A CM MAD kept as bytes: ClassPortInfo, or an attribute this crate has no decoder for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RawCmMad {
    pub hdr: MadHdr,
    pub data: [u8; DATA_LEN],
}

impl RawCmMad {
    /// Parse any CM MAD without looking at its attribute.
    pub fn parse(buf: &[u8]) -> Result<Self, CmWireError> {
        if buf.len() != MAD_LEN {
            return Err(CmWireError::Length(buf.len()));
        }
        let hdr = MadHdr::parse(buf)?;
        Ok(RawCmMad {
            hdr,
            data: be::arr(&buf[HDR_LEN..]),
        })
    }

    pub fn emit(&self, buf: &mut [u8; MAD_LEN]) {
        let d = emit_hdr(&self.hdr, self.hdr.attr_id, buf);
        d.copy_from_slice(&self.data);
    }
}
