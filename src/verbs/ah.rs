//! Address handles (`ibv_create_ah`, `ibv_init_ah_from_wc`): where a UD send goes.

use std::sync::Arc;

use super::context::Shared;
use super::device::ipv4_from_gid;
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use crate::transport::{AddressVector, Completion, CqSide};

/// `struct ibv_ah_attr` with its GRH: the same fields as a connected QP's address vector. Over
/// RoCEv2 every AH is global: `dgid` carries the peer's IP address (IPv4-mapped).
pub type AhAttr = AddressVector;

/// Entries in the GID table (`gid_tbl_len`).
const GID_TBL_LEN: u8 = 2;

/// An address handle (`struct ibv_ah`), created in a protection domain and usable by the UD QPs
/// of that PD. Dropping it destroys it (`ibv_destroy_ah`); WRs already posted keep their copy.
#[derive(Clone)]
pub struct AddressHandle {
    av: AddressVector,
    pub(crate) pd: u32,
    pub(crate) shared: Arc<Shared>,
}

impl AddressHandle {
    pub(crate) fn create(pd: &ProtectionDomain, attr: &AhAttr) -> Result<AddressHandle> {
        if attr.port_num != 1 {
            return Err(VerbsError::InvalidArgument("AH: port_num must be 1"));
        }
        if attr.sgid_index >= GID_TBL_LEN {
            return Err(VerbsError::InvalidArgument(
                "AH: sgid_index out of the GID table",
            ));
        }
        // RoCE needs a GRH, and this device speaks RoCEv2 over IPv4 only.
        if ipv4_from_gid(&attr.dgid).is_none() {
            return Err(VerbsError::InvalidArgument(
                "AH: dgid must be an IPv4-mapped RoCEv2 GID (RoCE has no LID-only AH)",
            ));
        }
        Ok(AddressHandle {
            av: *attr,
            pd: pd.id,
            shared: pd.shared.clone(),
        })
    }

    /// `ibv_init_ah_from_wc` + `ibv_create_ah` (`ibv_create_ah_from_wc`): an AH that answers the
    /// sender of a received UD message, from the GRH its completion carries.
    pub fn from_completion(
        pd: &ProtectionDomain,
        port_num: u8,
        wc: &Completion,
    ) -> Result<AddressHandle> {
        Self::create(pd, &Self::attr_from_completion(port_num, wc)?)
    }

    /// `ibv_init_ah_from_wc`: the AH attributes that answer the sender of a received UD message
    /// (destination GID = the sender's GID, from the completion's GRH).
    pub fn attr_from_completion(port_num: u8, wc: &Completion) -> Result<AhAttr> {
        let grh = match (wc.side, wc.grh) {
            (CqSide::Recv, Some(g)) => g,
            _ => {
                return Err(VerbsError::InvalidArgument(
                    "completion has no GRH (not a UD receive completion)",
                ))
            }
        };
        Ok(AhAttr {
            dgid: grh.sgid,
            sgid_index: 0,
            hop_limit: 0xff,
            traffic_class: grh.traffic_class,
            flow_label: 0,
            dlid: 0,
            sl: 0,
            port_num,
        })
    }

    /// `ibv_query_ah`.
    pub fn attr(&self) -> AhAttr {
        self.av
    }

    pub(crate) fn av(&self) -> AddressVector {
        self.av
    }
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AddressHandle(pd {}, {:?})",
            self.pd,
            ipv4_from_gid(&self.av.dgid)
        )
    }
}
