//! Address handles (`ibv_create_ah`, `ibv_init_ah_from_wc`): where a UD send goes.

use std::sync::Arc;

use super::context::Shared;
use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;
use crate::transport::{AddressVector, Completion, CqSide};

/// `struct ibv_ah_attr` with its GRH: the same fields as a connected QP's address vector. Over
/// RoCEv2 every AH is global: `dgid` carries the peer's IP address (IPv4-mapped, or IPv6), and
/// `sgid_index` picks the local address it is sent from.
pub type AhAttr = AddressVector;

impl AddressVector {
    /// The address of `dgid` (a peer's GID: its IP address) from the device's first address of
    /// its family, on port 1, hop limit 64: what an AH or a connected QP's `ah_attr` usually is.
    /// (`Default` is libibverbs' zeroed structure, whose port 0 an AH refuses.)
    pub fn new(dgid: [u8; 16]) -> AddressVector {
        AddressVector {
            dgid,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }
    }
}

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
        // RoCE needs a GRH: the dgid is an IP address of a family the device has.
        pd.shared
            .io
            .gids
            .check(&attr.dgid, attr.sgid_index)
            .map_err(VerbsError::InvalidArgument)?;
        Ok(AddressHandle {
            av: *attr,
            pd: pd.id,
            shared: pd.shared.clone(),
        })
    }

    /// `ibv_init_ah_from_wc` + `ibv_create_ah` (`ibv_create_ah_from_wc`): an AH that answers the
    /// sender of a received UD message, from the GRH its completion carries, sent from the
    /// address the message came to.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a completion without a GRH (not a UD receive).
    pub fn from_completion(
        pd: &ProtectionDomain,
        port_num: u8,
        wc: &Completion,
    ) -> Result<AddressHandle> {
        let mut attr = Self::attr_from_completion(port_num, wc)?;
        if let Some(i) = wc.grh.and_then(|g| pd.shared.io.gids.index_of(&g.dgid)) {
            attr.sgid_index = i as u8;
        }
        Self::create(pd, &attr)
    }

    /// `ibv_init_ah_from_wc`: the AH attributes that answer the sender of a received UD message
    /// (destination GID = the sender's GID, from the completion's GRH). Without the context's
    /// GID table at hand, `sgid_index` is 0: an IPv6 sender is then answered from the
    /// device's first IPv6 address (see [`Context::gid_index`](super::Context::gid_index)
    /// for the index of the address it came to, `WcGrh::dgid`).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a completion without a GRH (not a UD receive).
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
            "AddressHandle(pd {}, {})",
            self.pd,
            crate::wire::gid::gid_to_ip(&self.av.dgid)
        )
    }
}
