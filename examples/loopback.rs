//! Two RC queue pairs talking over loopback in one process — no NIC, no kernel module, no root.
//!
//! ```text
//! cargo run --release --example loopback
//! SOFTRDMA_PCAP=/tmp/lo.pcap cargo run --release --example loopback   # and look at the packets
//! ```
//!
//! The device is opened twice: the two contexts share the loopback device's UDP endpoint
//! (127.0.0.1:4791) as two processes would, so the two QPs reach each other exactly as two hosts'
//! would. The example
//! connects them (RESET→INIT→RTR→RTS with each other's QPN, PSN and GID), then does a SEND/RECV,
//! an RDMA WRITE with immediate, an RDMA READ, a fetch-and-add and a compare-and-swap, checking
//! every completion and every byte. It exits 0 on success and 1 on any failure.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::verbs::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcOpcode,
    WcStatus,
};
use softrdma::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, SendWr, WorkCompletion,
};

type Res<T> = Result<T, String>;

/// One side of the connection.
struct Side {
    name: &'static str,
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    psn: u32,
}

const MR_LEN: usize = 4096;
/// Offsets inside each side's MR.
const MSG: usize = 0; // SEND source / RECV target
const WRITE_AT: usize = 1024; // RDMA WRITE target
const READ_AT: usize = 2048; // RDMA READ source (remote) and target (local)
const ATOMIC_AT: usize = 3072; // 8-byte counter (remote) / result (local)

fn side(name: &'static str, ctx: Context, psn: u32) -> Res<Side> {
    let e = |what: &'static str| {
        move |err: softrdma::verbs::VerbsError| format!("{name}: {what}: {err}")
    };
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let cq = ctx.create_cq(64, None).map_err(e("create_cq"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
        .map_err(e("create_qp"))?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(MR_LEN, access).map_err(e("alloc_mr"))?;
    Ok(Side {
        name,
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
        psn,
    })
}

/// Bring `a`'s QP to RTS towards `b` (what ibv_rc_pingpong's `pp_connect_ctx` does).
fn connect(a: &Side, b: &Side) -> Res<()> {
    let e = |what: &'static str| move |err| format!("{}: modify_qp to {what}: {err}", a.name);
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ),
        ..Default::default()
    })
    .map_err(e("INIT"))?;
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(b.qp.qp_num()),
        rq_psn: Some(b.psn),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(12),
        ah_attr: Some(AddressVector {
            dgid: b.ctx.gid(),
            sgid_index: 1,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        }),
        ..Default::default()
    })
    .map_err(e("RTR"))?;
    a.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(a.psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..Default::default()
    })
    .map_err(e("RTS"))?;
    Ok(())
}

/// Busy-poll `s`'s CQ for one completion and check it.
fn expect(s: &Side, wr_id: u64, opcode: WcOpcode) -> Res<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [WorkCompletion::default()];
    loop {
        let n =
            s.cq.poll(&mut wc)
                .map_err(|e| format!("{}: poll_cq: {e}", s.name))?;
        if n == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{}: no completion for wr_id {wr_id}", s.name));
        }
        std::hint::spin_loop();
    }
    let c = wc[0];
    if c.status != WcStatus::Success || c.wr_id != wr_id || c.opcode != opcode {
        return Err(format!(
            "{}: unexpected completion {c:?} (wanted wr_id {wr_id}, {opcode:?}, success)",
            s.name
        ));
    }
    println!(
        "  {:<6} completion: wr_id {:>2}  {:<16} {:>4} bytes{}  status {}",
        s.name,
        c.wr_id,
        format!("{:?}", c.opcode),
        c.byte_len,
        c.imm_data
            .map_or(String::new(), |i| format!("  imm {i:#x}")),
        c.status.as_str()
    );
    Ok(c)
}

fn sge(mr: &MemoryRegion, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

fn post(s: &Side, wr_id: u64, op: SendOp, sg: &[Sge]) -> Res<()> {
    s.qp.post_send(&[SendWr {
        wr_id,
        op,
        sg_list: sg,
        flags: SendFlags::default(),
    }])
    .map_err(|e| format!("{}: post_send: {e}", s.name))
}

fn run() -> Res<()> {
    let devices = softrdma::devices().map_err(|e| format!("device list: {e}"))?;
    let dev = devices
        .iter()
        .find(|d| d.addr().is_loopback())
        .ok_or("no loopback device")?;
    println!("device {} on {} ({})", dev.name(), dev.addr(), dev.ifname());
    let ctx_a = dev.open().map_err(|e| format!("open device: {e}"))?;
    let ctx_b = dev.open().map_err(|e| format!("open device again: {e}"))?;
    let a = side("client", ctx_a, 0x1000)?;
    let b = side("server", ctx_b, 0x2000)?;
    for s in [&a, &b] {
        println!(
            "{}: endpoint {}:4791  QPN {:#08x}  PSN {:#08x}  MR addr {:#x} rkey {:#010x}",
            s.name,
            s.ctx.addr(),
            s.qp.qp_num(),
            s.psn,
            s.mr.addr(),
            s.mr.rkey()
        );
    }
    connect(&a, &b)?;
    connect(&b, &a)?;
    println!("connected: both QPs in RTS\n");

    // 1. SEND/RECV.
    println!("SEND/RECV:");
    let msg = b"hello from the client";
    a.mr.write(MSG, msg).map_err(|e| e.to_string())?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[sge(&b.mr, MSG, 1024)],
    }])
    .map_err(|e| format!("server: post_recv: {e}"))?;
    post(&a, 1, SendOp::Send, &[sge(&a.mr, MSG, msg.len())])?;
    expect(&a, 1, WcOpcode::Send)?;
    let wc = expect(&b, 1, WcOpcode::Recv)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    b.mr.read(MSG, &mut got).map_err(|e| e.to_string())?;
    if got != msg {
        return Err(format!("SEND: server got {got:?}"));
    }
    println!("  server received {:?}\n", String::from_utf8_lossy(&got));

    // 2. RDMA WRITE with immediate: the data lands without the server's CPU, the immediate
    //    consumes a receive.
    println!("RDMA WRITE with immediate:");
    let data: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
    a.mr.write(WRITE_AT, &data).map_err(|e| e.to_string())?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[],
    }])
    .map_err(|e| format!("server: post_recv: {e}"))?;
    post(
        &a,
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: b.mr.addr() + WRITE_AT as u64,
            rkey: b.mr.rkey(),
            imm: 0xc0ffee,
        },
        &[sge(&a.mr, WRITE_AT, data.len())],
    )?;
    expect(&a, 2, WcOpcode::RdmaWrite)?;
    let wc = expect(&b, 2, WcOpcode::RecvRdmaWithImm)?;
    if wc.imm_data != Some(0xc0ffee) {
        return Err(format!("WRITE_WITH_IMM: immediate {:?}", wc.imm_data));
    }
    let mut got = vec![0u8; data.len()];
    b.mr.read(WRITE_AT, &mut got).map_err(|e| e.to_string())?;
    if got != data {
        return Err("RDMA WRITE: server memory differs".into());
    }
    println!("  server memory holds the {} bytes written\n", data.len());

    // 3. RDMA READ: the client reads the server's memory; the server does nothing.
    println!("RDMA READ:");
    let secret = b"read me remotely, no server CPU involved";
    b.mr.write(READ_AT, secret).map_err(|e| e.to_string())?;
    post(
        &a,
        3,
        SendOp::RdmaRead {
            remote_addr: b.mr.addr() + READ_AT as u64,
            rkey: b.mr.rkey(),
        },
        &[sge(&a.mr, READ_AT, secret.len())],
    )?;
    expect(&a, 3, WcOpcode::RdmaRead)?;
    let mut got = vec![0u8; secret.len()];
    a.mr.read(READ_AT, &mut got).map_err(|e| e.to_string())?;
    if got != secret {
        return Err(format!("RDMA READ: client got {got:?}"));
    }
    println!("  client read {:?}\n", String::from_utf8_lossy(&got));

    // 4. Fetch-and-add on a 64-bit counter in the server's memory.
    println!("atomic FETCH_AND_ADD:");
    b.mr.write(ATOMIC_AT, &40u64.to_ne_bytes())
        .map_err(|e| e.to_string())?;
    post(
        &a,
        4,
        SendOp::FetchAdd {
            remote_addr: b.mr.addr() + ATOMIC_AT as u64,
            rkey: b.mr.rkey(),
            add: 2,
        },
        &[sge(&a.mr, ATOMIC_AT, 8)],
    )?;
    expect(&a, 4, WcOpcode::FetchAdd)?;
    let (orig, now) = (read_u64(&a.mr, ATOMIC_AT)?, read_u64(&b.mr, ATOMIC_AT)?);
    if (orig, now) != (40, 42) {
        return Err(format!("FETCH_ADD: original {orig}, now {now}"));
    }
    println!("  original value {orig}, server counter now {now}\n");

    // 5. Compare-and-swap: succeeds (42 -> 7), then fails (compare 42 against 7).
    println!("atomic COMPARE_AND_SWAP:");
    for (wr_id, compare, swap, want_orig, want_now) in [(5, 42, 7, 42, 7), (6, 42, 99, 7, 7)] {
        post(
            &a,
            wr_id,
            SendOp::CompareSwap {
                remote_addr: b.mr.addr() + ATOMIC_AT as u64,
                rkey: b.mr.rkey(),
                compare,
                swap,
            },
            &[sge(&a.mr, ATOMIC_AT, 8)],
        )?;
        expect(&a, wr_id, WcOpcode::CompSwap)?;
        let (orig, now) = (read_u64(&a.mr, ATOMIC_AT)?, read_u64(&b.mr, ATOMIC_AT)?);
        if (orig, now) != (want_orig, want_now) {
            return Err(format!("CMP_SWP: original {orig}, now {now}"));
        }
        println!(
            "  compare {compare} swap {swap}: original {orig} -> {}, server value now {now}",
            if orig == compare {
                "swapped"
            } else {
                "unchanged"
            }
        );
    }

    let (sa, sb) = (a.ctx.stats().unwrap(), b.ctx.stats().unwrap());
    println!(
        "\npackets: client sent {} received {}, server sent {} received {}",
        sa.tx_packets, sa.rx_packets, sb.tx_packets, sb.rx_packets
    );
    Ok(())
}

fn read_u64(mr: &MemoryRegion, off: usize) -> Res<u64> {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).map_err(|e| e.to_string())?;
    Ok(u64::from_ne_bytes(b))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("loopback: all operations succeeded");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("loopback: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
