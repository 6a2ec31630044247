//! The data that crosses between the Verbs API and the transport core: work requests,
//! completions, QP states and attributes. Names and meanings follow libibverbs.

use super::sglist::SgList;

bitflags::bitflags! {
    /// Memory access rights of a memory region or a QP (`IBV_ACCESS_*`, same bits).
    ///
    /// ```
    /// use softrdma::verbs::AccessFlags;
    /// let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    /// assert!(rw.contains(AccessFlags::REMOTE_READ));
    /// assert_eq!(format!("{rw:?}"), "AccessFlags(LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ)");
    /// ```
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
    pub struct AccessFlags: u32 {
        /// The local side may write (receives, READ responses, atomics' results land here).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE into it.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA READ from it.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

impl AccessFlags {
    /// No access beyond local reads (`0`).
    pub const NONE: AccessFlags = AccessFlags::empty();
}

/// One scatter/gather element (`struct ibv_sge`): `length` bytes at virtual address `addr` of
/// the memory region whose lkey is `lkey`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

bitflags::bitflags! {
    /// Send work request flags (`IBV_SEND_*`, same bits). An empty set on a QP created with
    /// `sq_sig_all = false` gives no completion for a successful request, as in libibverbs; the
    /// work-request builders (`QueuePair::send` and friends) signal by default.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
    pub struct SendFlags: u32 {
        /// Wait for all prior READs and atomics to complete before starting (IBA 10.8.3.3).
        const FENCE = 1;
        /// Generate a completion even on a QP created with `sq_sig_all = false`.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet (SEND and WRITE_WITH_IMM).
        const SOLICITED = 1 << 2;
        /// The data is in [`SendWqe::inline_data`], copied at post time; `sg_list` is ignored.
        const INLINE = 1 << 3;
    }
}

/// What a send work request does, with its operation-specific fields.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

/// A send work request as queued on the send queue.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    pub sg_list: SgList,
    /// Inline payload copied at post time (when `flags.contains(SendFlags::INLINE)`).
    pub inline_data: Vec<u8>,
}

impl SendWqe {
    /// Total bytes the request moves (sum of SGE lengths, or the inline length).
    pub fn length(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline_data.len() as u64
        } else {
            self.sg_list.iter().map(|s| s.length as u64).sum()
        }
    }
}

/// A receive work request.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub sg_list: SgList,
}

/// Work completion status (`enum ibv_wc_status`), with libibverbs' numeric values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The text `ibv_wc_status_str` gives.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// Work completion opcode (`enum ibv_wc_opcode`), with libibverbs' numeric values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// Which completion queue a completion belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CqSide {
    Send,
    Recv,
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data, when the message carried one (`IBV_WC_WITH_IMM`).
    pub imm_data: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (receive completions).
    pub src_qp: u32,
    /// The message had the solicited-event bit (receive completions).
    pub solicited: bool,
    /// Which CQ it goes to.
    pub side: CqSide,
    /// Vendor error code; 0 unless the status is an error.
    pub vendor_err: u32,
    /// `IBV_WC_GRH`: what a UD receive completion learned from the packet's GRH (network
    /// header); `None` on RC and on send completions.
    pub grh: Option<WcGrh>,
}

impl Completion {
    /// A completion for the send CQ: no immediate, source QP or GRH, and `qp_num` 0 (the QP's
    /// completion queue fills it in).
    pub(crate) fn send(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Self {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data: None,
            qp_num: 0,
            src_qp: 0,
            solicited: false,
            side: CqSide::Send,
            vendor_err: 0,
            grh: None,
        }
    }

    /// A completion for the receive CQ, from remote QP `src_qp`: no GRH, and `qp_num` 0 (the
    /// QP's completion queue fills it in).
    pub(crate) fn recv(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm_data: Option<u32>,
        src_qp: u32,
        solicited: bool,
    ) -> Self {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data,
            qp_num: 0,
            src_qp,
            solicited,
            side: CqSide::Recv,
            vendor_err: 0,
            grh: None,
        }
    }
}

/// The GRH part of a UD receive completion: the first 40 bytes of the receive buffer hold the
/// GRH area; this is what `ibv_init_ah_from_wc` reads from it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct WcGrh {
    /// The sender's GID (IPv4-mapped over RoCEv2/IPv4).
    pub sgid: [u8; 16],
    /// The GID the message was sent to: the local address it came to.
    pub dgid: [u8; 16],
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// QP states (`enum ibv_qp_state`), with libibverbs' numeric values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u32)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }
    pub const fn from_bytes(n: usize) -> Option<Mtu> {
        match n {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
    pub const fn from_enum(v: u32) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// The address vector of a connected QP (`struct ibv_ah_attr` with its GRH): for RoCEv2 the
/// destination GID carries the peer's IP address.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AddressVector {
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub dlid: u16,
    pub sl: u8,
    pub port_num: u8,
}

/// Attributes for `modify_qp`/`query_qp` (`struct ibv_qp_attr`). A `Some` field is in the mask.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct QpAttr {
    pub qp_state: Option<QpState>,
    /// Expected current state (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: Option<QpState>,
    pub path_mtu: Option<Mtu>,
    pub qkey: Option<u32>,
    pub rq_psn: Option<u32>,
    pub sq_psn: Option<u32>,
    pub dest_qp_num: Option<u32>,
    pub qp_access_flags: Option<AccessFlags>,
    pub pkey_index: Option<u16>,
    pub port_num: Option<u8>,
    pub ah_attr: Option<AddressVector>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 means infinite (IBA 9.7.6.1.3).
    pub timeout: Option<u8>,
    /// 0..=7.
    pub retry_cnt: Option<u8>,
    /// 0..=7; 7 means infinite.
    pub rnr_retry: Option<u8>,
    /// Encoded RNR NAK timer (IBA Table 45) this QP sends when it has no receive WQE.
    pub min_rnr_timer: Option<u8>,
    /// Outstanding READ/atomic requests this QP may issue.
    pub max_rd_atomic: Option<u8>,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: Option<u8>,
    pub sq_draining: Option<bool>,
}

/// QP capacities fixed at creation (`struct ibv_qp_cap`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// An atomic operation on 8 bytes of remote memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AtomicOp {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

impl AtomicOp {
    /// The word's new value when it held `orig` (the operation returns `orig`).
    pub fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
            AtomicOp::CompareSwap { .. } => orig,
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        }
    }
}

#[cfg(test)]
mod atomic_tests {
    use super::AtomicOp;

    #[test]
    fn atomic_ops_compute_the_new_word() {
        let cas = AtomicOp::CompareSwap {
            compare: 5,
            swap: 9,
        };
        assert_eq!(cas.apply(5), 9);
        assert_eq!(cas.apply(6), 6);
        let add = AtomicOp::FetchAdd { add: 3 };
        assert_eq!(add.apply(u64::MAX), 2);
        assert_eq!(add.apply(7), 10);
    }
}
