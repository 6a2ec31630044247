//! Two RC queue pairs talking over loopback in one process — no NIC, no kernel module, no root.
//!
//! ```text
//! cargo run --release --example loopback
//! SOFTRDMA_PCAP=/tmp/lo.pcap cargo run --release --example loopback   # and look at the packets
//! ```
//!
//! The device is opened twice: the two contexts share the loopback device's UDP endpoint
//! (127.0.0.1:4791) as two processes would, so the two QPs reach each other exactly as two hosts'
//! would. The example connects them (each takes the other's endpoint: QPN, PSN, GID, MTU), then
//! does a SEND/RECV, an RDMA WRITE with immediate, an RDMA READ, a fetch-and-add and a
//! compare-and-swap, checking every completion and every byte. It exits 0 on success and 1 on
//! any failure.

use std::process::ExitCode;
use std::time::Duration;

use softrdma::verbs::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const T: Duration = Duration::from_secs(10);

/// One side of the connection: its own context, PD, CQ, QP and a 4 KiB region.
struct Side {
    qp: Qp<Rc>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
}

/// Offsets inside each side's region.
const MSG: usize = 0; // SEND source / RECV target
const WRITE_AT: usize = 1024; // RDMA WRITE target
const READ_AT: usize = 2048; // RDMA READ source (remote) and target (local)
const ATOMIC_AT: usize = 3072; // 8-byte counter (remote) / result (local)

fn side(ctx: &Context) -> Res<Side> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = pd.create_rc_qp(&cq)?;
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(4096, all)?;
    Ok(Side {
        qp,
        cq,
        mr,
        _pd: pd,
    })
}

/// The next completion on `s`'s CQ: successful, with `wr_id` and `opcode`.
fn expect(s: &Side, wr_id: u64, opcode: WcOpcode) -> Res<WorkCompletion> {
    let wc = s.cq.wait(T)?.ok()?;
    if (wc.wr_id, wc.opcode) != (wr_id, opcode) {
        return Err(format!("expected {opcode} for wr {wr_id}, got {wc:?}").into());
    }
    println!(
        "  completion: wr_id {} {} {} bytes",
        wc.wr_id, wc.opcode, wc.byte_len
    );
    Ok(wc)
}

fn read_u64(mr: &MemoryRegion, off: usize) -> Res<u64> {
    let mut b = [0u8; 8];
    mr.read(off, &mut b)?;
    Ok(u64::from_ne_bytes(b))
}

fn run() -> Res<()> {
    let dev = devices()?
        .into_iter()
        .find(|d| d.is_loopback())
        .ok_or("no loopback device")?;
    println!("device {} on {} ({})", dev.name(), dev.addr(), dev.ifname());
    let (cctx, sctx) = (dev.open()?, dev.open()?);
    let (client, server) = (side(&cctx)?, side(&sctx)?);
    client
        .qp
        .connect(&server.qp.endpoint(), &ConnectOptions::default())?;
    server
        .qp
        .connect(&client.qp.endpoint(), &ConnectOptions::default())?;
    println!(
        "connected: QP {:#x} <-> QP {:#x}, both in RTS\n",
        client.qp.qp_num(),
        server.qp.qp_num()
    );

    println!("SEND/RECV:");
    let msg = b"hello over RoCEv2";
    server
        .qp
        .recv(server.mr.slice(MSG..MSG + 64)?)
        .id(1)
        .post()?;
    client.mr.write(MSG, msg)?;
    client
        .qp
        .send(client.mr.slice(MSG..MSG + msg.len())?)
        .id(2)
        .post()?;
    expect(&client, 2, WcOpcode::Send)?;
    let wc = expect(&server, 1, WcOpcode::Recv)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    server.mr.read(MSG, &mut got)?;
    assert_eq!(got, msg);
    println!("  server received {:?}\n", String::from_utf8_lossy(&got));

    println!("RDMA WRITE with immediate:");
    let data: Vec<u8> = (0..700u32).map(|i| (i * 7) as u8).collect();
    client.mr.write(WRITE_AT, &data)?;
    server
        .qp
        .recv(server.mr.slice(MSG..MSG + 64)?)
        .id(3)
        .post()?;
    let target = server.mr.remote(WRITE_AT..WRITE_AT + data.len())?;
    client
        .qp
        .write(client.mr.slice(WRITE_AT..WRITE_AT + data.len())?, target)
        .imm(0xfeed)
        .id(4)
        .post()?;
    expect(&client, 4, WcOpcode::RdmaWrite)?;
    let wc = expect(&server, 3, WcOpcode::RecvRdmaWithImm)?;
    assert_eq!(wc.imm(), Some(0xfeed));
    let mut got = vec![0u8; data.len()];
    server.mr.read(WRITE_AT, &mut got)?;
    assert_eq!(got, data);
    println!(
        "  server memory holds the {} bytes written, immediate {:#x}\n",
        data.len(),
        0xfeed
    );

    println!("RDMA READ:");
    let text = b"read me from the server's memory";
    server.mr.write(READ_AT, text)?;
    let source = server.mr.remote(READ_AT..READ_AT + text.len())?;
    client
        .qp
        .read(client.mr.slice(READ_AT..READ_AT + text.len())?, source)
        .id(5)
        .post()?;
    expect(&client, 5, WcOpcode::RdmaRead)?;
    let mut got = vec![0u8; text.len()];
    client.mr.read(READ_AT, &mut got)?;
    assert_eq!(got, text);
    println!("  client read {:?}\n", String::from_utf8_lossy(&got));

    println!("atomic FETCH_AND_ADD:");
    server.mr.write(ATOMIC_AT, &100u64.to_ne_bytes())?;
    let counter = server.mr.remote(ATOMIC_AT..ATOMIC_AT + 8)?;
    let result = client.mr.slice(ATOMIC_AT..ATOMIC_AT + 8)?;
    client.qp.fetch_add(result, counter, 5).id(6).post()?;
    expect(&client, 6, WcOpcode::FetchAdd)?;
    let (orig, now) = (
        read_u64(&client.mr, ATOMIC_AT)?,
        read_u64(&server.mr, ATOMIC_AT)?,
    );
    assert_eq!((orig, now), (100, 105));
    println!("  original value {orig}, server counter now {now}\n");

    println!("atomic COMPARE_AND_SWAP:");
    client
        .qp
        .compare_swap(result, counter, 105, 7)
        .id(7)
        .post()?;
    expect(&client, 7, WcOpcode::CompSwap)?;
    client
        .qp
        .compare_swap(result, counter, 105, 9)
        .id(8)
        .post()?;
    expect(&client, 8, WcOpcode::CompSwap)?;
    let (orig, now) = (
        read_u64(&client.mr, ATOMIC_AT)?,
        read_u64(&server.mr, ATOMIC_AT)?,
    );
    assert_eq!((orig, now), (7, 7), "the second compare failed: 7 stays");
    println!("  swapped 105 for 7; a second swap expecting 105 saw 7 and left it\n");
    Ok(())
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
