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
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region that holds the bytes.
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
    /// `IBV_WR_SEND`: the data goes to the peer's next receive WQE.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: a SEND whose receive completion also carries `imm`.
    SendWithImm {
        /// Immediate data, the `imm_data` of the peer's receive completion.
        imm: u32,
    },
    /// `IBV_WR_RDMA_WRITE`: the data is written to the peer's memory; no receive WQE is used.
    RdmaWrite {
        /// Remote virtual address of the first byte written.
        remote_addr: u64,
        /// Remote key of the peer's memory region.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: an RDMA WRITE that also consumes a peer receive WQE, whose
    /// completion carries `imm`.
    RdmaWriteWithImm {
        /// Remote virtual address of the first byte written.
        remote_addr: u64,
        /// Remote key of the peer's memory region.
        rkey: u32,
        /// Immediate data, the `imm_data` of the peer's receive completion.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: the peer's memory is read into the local scatter list.
    RdmaRead {
        /// Remote virtual address of the first byte read.
        remote_addr: u64,
        /// Remote key of the peer's memory region.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: on the peer's 8-byte word, write `swap` if it equals
    /// `compare`; the word's original value lands in the local scatter list.
    CompareSwap {
        /// Remote virtual address of the word (8-byte aligned).
        remote_addr: u64,
        /// Remote key of the peer's memory region.
        rkey: u32,
        /// Value the word is compared with.
        compare: u64,
        /// Value written if the comparison holds.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: add `add` to the peer's 8-byte word; the word's original
    /// value lands in the local scatter list.
    FetchAdd {
        /// Remote virtual address of the word (8-byte aligned).
        remote_addr: u64,
        /// Remote key of the peer's memory region.
        rkey: u32,
        /// Value added (wrapping).
        add: u64,
    },
}

/// A send work request as queued on the send queue.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SendWqe {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its operands.
    pub op: SendOp,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// Local buffers: the data sent or written, or where READ data and atomic results land.
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
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Local buffers the received message is scattered into.
    pub sg_list: SgList,
}

/// Work completion status (`enum ibv_wc_status`), with libibverbs' numeric values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`: the work request completed.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message does not fit the local buffers or exceeds a size limit.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: the QP cannot carry out the request (its state or transport).
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR`: local EE context error (Reliable Datagram only).
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: a local buffer is not in a memory region of the QP's PD, or the
    /// region lacks the access the operation needs.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP went to the error state before the request completed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind failed.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: the responder sent an unexpected transport opcode.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: an incoming RDMA WRITE with immediate hit a local protection
    /// error.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid (NAK Invalid Request).
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused access to its memory (NAK Remote Access
    /// Error).
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the request (NAK Remote Operational
    /// Error).
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no acknowledgment after `retry_cnt` retransmissions.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer answered RNR NAK through `rnr_retry` retries.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`: RDD violation (Reliable Datagram only).
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`: NAK Invalid RD Request (Reliable Datagram only).
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`: the responder aborted the operation.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR`: invalid EE context number (Reliable Datagram only).
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR`: invalid EE context state (Reliable Datagram only).
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`: fatal device error.
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`: response timeout.
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`: an error none of the others describes.
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
    /// `IBV_WC_SEND`: a SEND (with or without immediate) on the send queue.
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`: an RDMA WRITE (with or without immediate).
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`: an RDMA READ.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`: an atomic compare & swap.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`: an atomic fetch & add.
    FetchAdd = 4,
    /// `IBV_WC_RECV`: a receive WQE consumed by a SEND.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive WQE consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

/// Which completion queue a completion belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CqSide {
    /// The send CQ: completions of send work requests.
    Send,
    /// The receive CQ: completions of receive work requests.
    Recv,
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Completion {
    /// The `wr_id` of the work request that completed.
    pub wr_id: u64,
    /// How it completed.
    pub status: WcStatus,
    /// What kind of work request it was.
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
    /// Vendor error code; softrdma always reports 0.
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
    /// Hop limit (TTL over IPv4) of the network header the packet arrived with.
    pub hop_limit: u8,
    /// Traffic class (TOS over IPv4) of the network header the packet arrived with.
    pub traffic_class: u8,
}

/// QP states (`enum ibv_qp_state`), with libibverbs' numeric values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u32)]
pub enum QpState {
    /// `IBV_QPS_RESET`: the state of a new QP; queues empty, no packets processed.
    Reset = 0,
    /// `IBV_QPS_INIT`: receive WRs may be posted; no packets processed yet.
    Init = 1,
    /// `IBV_QPS_RTR`: Ready To Receive; incoming packets are processed.
    Rtr = 2,
    /// `IBV_QPS_RTS`: Ready To Send; send WRs are carried out.
    Rts = 3,
    /// `IBV_QPS_SQD`: Send Queue Drain; send WRs already started finish, new ones wait.
    Sqd = 4,
    /// `IBV_QPS_SQE`: Send Queue Error (UC, UD); sending stopped after an error, receiving
    /// continues.
    Sqe = 5,
    /// `IBV_QPS_ERR`: Error; outstanding and newly posted WRs complete with
    /// [`WcStatus::WrFlushErr`].
    Err = 6,
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Mtu {
    /// `IBV_MTU_256`: 256 bytes.
    Mtu256 = 1,
    /// `IBV_MTU_512`: 512 bytes.
    Mtu512 = 2,
    /// `IBV_MTU_1024`: 1024 bytes.
    Mtu1024 = 3,
    /// `IBV_MTU_2048`: 2048 bytes.
    Mtu2048 = 4,
    /// `IBV_MTU_4096`: 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The MTU of `n` bytes; `None` unless `n` is 256, 512, 1024, 2048 or 4096.
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

    /// The largest MTU of at most `n` bytes (256 when `n` is smaller still).
    pub fn largest_within(n: usize) -> Mtu {
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
            .into_iter()
            .find(|m| m.bytes() <= n)
            .unwrap_or(Mtu::Mtu256)
    }

    /// The MTU of an `enum ibv_mtu` value (1 to 5); `None` for any other.
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

/// The address vector of a connected QP or an address handle (`struct ibv_ah_attr` with its
/// GRH): for RoCEv2 the destination GID carries the peer's IP address.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AddressVector {
    /// Destination GID (`grh.dgid`): the peer's IP address, IPv4-mapped or IPv6.
    pub dgid: [u8; 16],
    /// Index in the local GID table of the address packets are sent from (`grh.sgid_index`).
    pub sgid_index: u8,
    /// GRH hop limit (`grh.hop_limit`); not applied to sent packets (the kernel writes the IP
    /// header).
    pub hop_limit: u8,
    /// GRH traffic class (`grh.traffic_class`); not applied to sent packets.
    pub traffic_class: u8,
    /// GRH flow label, 20 bits (`grh.flow_label`); not applied to sent packets.
    pub flow_label: u32,
    /// Destination LID (`dlid`); unused over RoCE.
    pub dlid: u16,
    /// Service level (`sl`); unused.
    pub sl: u8,
    /// Port number (`port_num`); the device has one port, 1.
    pub port_num: u8,
}

/// Attributes for `modify_qp`/`query_qp` (`struct ibv_qp_attr`). A `Some` field is in the mask.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct QpAttr {
    /// State to move to (`IBV_QP_STATE`); the current state in a query.
    pub qp_state: Option<QpState>,
    /// Expected current state (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: Option<QpState>,
    /// Path MTU, the most payload one packet carries (`IBV_QP_PATH_MTU`).
    pub path_mtu: Option<Mtu>,
    /// Q_Key of a UD QP (`IBV_QP_QKEY`): incoming packets must carry it.
    pub qkey: Option<u32>,
    /// PSN the receive side expects next (`IBV_QP_RQ_PSN`); 24 bits.
    pub rq_psn: Option<u32>,
    /// PSN of the next packet the send side sends (`IBV_QP_SQ_PSN`); 24 bits.
    pub sq_psn: Option<u32>,
    /// QP number of the connected peer (`IBV_QP_DEST_QPN`); 24 bits.
    pub dest_qp_num: Option<u32>,
    /// Remote access the QP allows as responder (`IBV_QP_ACCESS_FLAGS`).
    pub qp_access_flags: Option<AccessFlags>,
    /// Index of the QP's P_Key in the port's P_Key table (`IBV_QP_PKEY_INDEX`).
    pub pkey_index: Option<u16>,
    /// Port number (`IBV_QP_PORT`); must be 1.
    pub port_num: Option<u8>,
    /// Address vector of the connected peer (`IBV_QP_AV`).
    pub ah_attr: Option<AddressVector>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 means infinite (IBA 9.7.6.1.3).
    pub timeout: Option<u8>,
    /// Retransmissions after ACK timeouts before the WR fails with
    /// [`WcStatus::RetryExcErr`] (`IBV_QP_RETRY_CNT`), 0..=7.
    pub retry_cnt: Option<u8>,
    /// Retries after RNR NAKs before the WR fails with [`WcStatus::RnrRetryExcErr`]
    /// (`IBV_QP_RNR_RETRY`), 0..=7; 7 means infinite.
    pub rnr_retry: Option<u8>,
    /// Encoded RNR NAK timer (IBA Table 45) this QP sends when it has no receive WQE.
    pub min_rnr_timer: Option<u8>,
    /// Outstanding READ/atomic requests this QP may issue.
    pub max_rd_atomic: Option<u8>,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: Option<u8>,
    /// `ibv_query_qp` only: the QP is in SQD with send requests still outstanding.
    pub sq_draining: Option<bool>,
}

/// QP capacities fixed at creation (`struct ibv_qp_cap`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpCaps {
    /// Most send WRs outstanding on the send queue.
    pub max_send_wr: u32,
    /// Most receive WRs outstanding on the receive queue.
    pub max_recv_wr: u32,
    /// Most SGEs in one send WR.
    pub max_send_sge: u32,
    /// Most SGEs in one receive WR.
    pub max_recv_sge: u32,
    /// Most bytes of inline data in one send WR.
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
    /// Write `swap` if the word equals `compare`.
    CompareSwap {
        /// Value the word is compared with.
        compare: u64,
        /// Value written if the comparison holds.
        swap: u64,
    },
    /// Add `add` to the word, wrapping.
    FetchAdd {
        /// Value added.
        add: u64,
    },
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

#[cfg(test)]
mod tests {
    use super::Mtu;

    #[test]
    fn the_largest_mtu_within_a_size() {
        assert_eq!(Mtu::largest_within(1500 - 80), Mtu::Mtu1024);
        assert_eq!(Mtu::largest_within(4096), Mtu::Mtu4096);
        assert_eq!(Mtu::largest_within(9000), Mtu::Mtu4096);
        assert_eq!(Mtu::largest_within(2047), Mtu::Mtu1024);
        assert_eq!(Mtu::largest_within(100), Mtu::Mtu256);
    }
}
