//! The endpoint's counters.

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams received on the endpoint's sockets, whatever became of them.
    pub rx_packets: u64,
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Datagrams whose ICRC no IP ID explains (see [`crate::wire::icrc::IcrcGate`]).
    pub rx_bad_icrc: u64,
    /// Datagrams of a length no RoCEv2 sender produces (below BTH + ICRC, above
    /// [`crate::wire::packet::MAX_PACKET_LEN`], or not a multiple of 4): dropped before any CRC.
    pub rx_bad_length: u64,
    /// Datagrams accepted with IP ID 0 (softrdma peers).
    pub rx_icrc_id0: u64,
    /// Datagrams accepted with an IP ID just after the source's last one (rdma_rxe peers).
    pub rx_icrc_predicted: u64,
    /// Datagrams accepted with any other IP ID: a source's first packet or a jump after a pause;
    /// a steady stream of these is corruption or forgery getting through at 2^-16.
    pub rx_icrc_solved: u64,
    /// Datagrams over IPv6 whose ICRC matched (IPv6 has no IP ID: nothing is guessed).
    pub rx_icrc_v6: u64,
    /// Datagrams dropped as malformed: not a transport packet
    /// [`Packet::parse`](crate::wire::Packet::parse) accepts, without a source address or the
    /// network header a UD QP needs, of the wrong address family, or handed over by another
    /// process and refused or unreadable.
    pub rx_malformed: u64,
    /// Packets to a QP number this endpoint does not have (handed to the context that owns it,
    /// if another on the same address does).
    pub rx_unknown_qp: u64,
    /// Packets to the GSI QP1 (connection management), handed to the rdma_cm core.
    pub rx_gsi: u64,
    /// RC and UC packets dropped because they did not come from the QP's peer (its address
    /// vector's IP address) or arrived before the QP had one: forged or stray traffic (IBA
    /// C9-43, rdma_rxe's `check_addr`).
    pub rx_bad_source: u64,
    /// Datagrams not sent: refused by the kernel or with no socket to go out of, or not handed
    /// to another process on the same address.
    pub tx_dropped: u64,
    /// REQs nobody here listened for, handed to another process on the same address that
    /// listens for them now (`driver::forward`).
    pub tx_forwarded: u64,
    /// CM MADs another process on the same address handed to this one.
    pub rx_forwarded: u64,
    /// Rounds of a busy-polling application whose acknowledgements waited to go out behind
    /// its answer (see `driver::batch::TxBatch::hold_acks`).
    pub tx_acks_held: u64,
    /// Remote accesses (RDMA WRITE, READ, atomics) this endpoint's RC QPs refused, by reason
    /// (the requester sees only `RemAccessErr`): summed over the live QPs when read.
    pub refused: crate::transport::AccessRefusals,
}
