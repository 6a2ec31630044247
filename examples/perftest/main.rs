//! perftest's `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_send_bw` and `ib_send_lat` for
//! softrdma: RDMA WRITE, RDMA READ, 8-byte atomics and SEND bandwidth, and the SEND/RECV
//! ping-pong latency (`send_lat`), with perftest's TCP side channel or, with `-R`,
//! everything connected by rdma_cm (`comm.rs`), so it interoperates with perftest (on kernel
//! rdma_rxe) in either role.
//!
//! ```text
//! cargo run --release --example perftest -- write -x 1 -s 65536 -n 1000              # server
//! cargo run --release --example perftest -- write -x 1 -s 65536 -n 1000 127.0.0.1    # client
//! ```
//!
//! The exchange, as perftest 4.5 (version string "6.06") does it on TCP port 18515; in every step
//! the client writes first and then reads, the server reads first and then writes:
//!
//! 1. versions: 16 bytes, a NUL-padded string such as "6.06";
//! 2. system data: page size (cycle buffer) and cache-line size, 4 bytes each, big-endian; both
//!    sides take the maximum;
//! 3. MTU: 2 bytes, the `enum ibv_mtu` value as a decimal string ("5" for 4096); both take the
//!    smaller;
//! 4. three key exchanges (108 bytes each): `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID bytes:SRQN:`,
//!    the QP being moved to RTR/RTS between the first and the second;
//! 5. the client runs the test; then one more key exchange, the client's report (size, iters,
//!    peak, average, message rate: 8-byte big-endian fields, one exchange each), and the close: a
//!    last key exchange and `"done\0"` from each side.
//!
//! The server only lends its memory: the client's WRITEs, READs and atomics land in it.

mod comm;
#[path = "../getopt/mod.rs"]
mod getopt;
mod lat;

use comm::{Comm, Dest};

use std::net::Ipv6Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcStatus,
};
use softrdma::verbs::{Context, QpInitAttr, QpType, QueuePair, RecvWr, SendWr, WorkCompletion};

/// What this tool claims to be in the version exchange (perftest 4.5's `VERSION`).
const VERSION: &str = "6.06";
const VERSION_LEN: usize = 16;
const PAGE_SIZE: u32 = 4096;
const CACHE_LINE: u32 = 64;
const ATOMIC_ADD_VALUE: u64 = 1;
const ATOMIC_SWAP_VALUE: u64 = 0;
/// Receives each side of `send_lat` keeps posted.
const LAT_RX_DEPTH: u64 = 16;
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Write,
    Read,
    Atomic,
    Send,
}

impl Verb {
    fn tool(self) -> &'static str {
        match self {
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "ATOMIC",
            Verb::Send => "Send",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AtomicType {
    FetchAdd,
    CmpSwap,
}

struct Opts {
    verb: Verb,
    port: u16,
    ib_port: u8,
    size: usize,
    iters: u64,
    mtu: Option<Mtu>,
    gid_index: u8,
    tx_depth: usize,
    out_reads: Option<u32>,
    atomic: AtomicType,
    server: Option<String>,
    /// `send_lat`: ib_send_lat's ping-pong instead of a bandwidth test.
    lat: bool,
    /// `-R`: connect with rdma_cm (side channel and test QP).
    rdma_cm: bool,
    /// `-d`: the device (default: the first, as perftest).
    ib_dev: Option<String>,
}

fn usage() {
    println!("Usage: perftest write|read|atomic|send|send_lat [options] [server]");
    println!("  -p, --port=<port>         TCP port of the exchange (default 18515)");
    println!("  -d, --ib-dev=<dev>        device (default: the first; without -R)");
    println!("  -i, --ib-port=<port>      port (default 1)");
    println!("  -s, --size=<size>         message size (default 65536; atomics: 8; send_lat: 2)");
    println!("  -n, --iters=<iters>       iterations (default 5000)");
    println!("  -m, --mtu=<mtu>           path MTU (default: the port's active MTU)");
    println!("  -x, --gid-index=<index>   local GID index (default 1, the IPv4 GID)");
    println!("  -t, --tx-depth=<dep>      outstanding work requests (default 128)");
    println!("  -o, --outs=<num>          outstanding reads/atomics (default: device maximum)");
    println!("  -A, --atomic_type=<type>  FETCH_AND_ADD (default) or CMP_AND_SWAP");
    println!("  -R, --rdma_cm             connect with rdma_cm (side channel and test QP)");
    println!("  -F, --CPU-freq            ignored");
}

fn parse_args() -> Result<Opts, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let lat = args.first().map(String::as_str) == Some("send_lat");
    let verb = match args.first().map(String::as_str) {
        Some("write") => Verb::Write,
        Some("read") => Verb::Read,
        Some("atomic") => Verb::Atomic,
        Some("send" | "send_lat") => Verb::Send,
        _ => return Err("the first argument must be write, read, atomic, send or send_lat".into()),
    };
    let spec = getopt::Spec {
        with_value: "pdisnmxtoA",
        flags: "FhR",
        long: &[
            ("port", 'p'),
            ("ib-dev", 'd'),
            ("ib-port", 'i'),
            ("size", 's'),
            ("iters", 'n'),
            ("mtu", 'm'),
            ("gid-index", 'x'),
            ("tx-depth", 't'),
            ("outs", 'o'),
            ("atomic_type", 'A'),
            ("CPU-freq", 'F'),
            ("rdma_cm", 'R'),
            ("help", 'h'),
        ],
    };
    let mut o = Opts {
        verb,
        port: 18515,
        ib_port: 1,
        size: match verb {
            Verb::Atomic => 8,
            _ if lat => 2,
            _ => 65536,
        },
        iters: if lat { 1000 } else { 5000 },
        mtu: None,
        gid_index: 1,
        tx_depth: 128,
        out_reads: None,
        atomic: AtomicType::FetchAdd,
        server: None,
        lat,
        rdma_cm: false,
        ib_dev: None,
    };
    for arg in getopt::parse(&args[1..], &spec)? {
        let (opt, val) = match arg {
            getopt::Arg::Positional(host) if o.server.is_none() => {
                o.server = Some(host);
                continue;
            }
            getopt::Arg::Positional(a) => return Err(format!("unexpected argument {a}")),
            getopt::Arg::Opt(opt, val) => (opt, val.unwrap_or_default()),
        };
        let num = || {
            getopt::c_num(&val)
                .and_then(|v| u64::try_from(v).ok())
                .ok_or(format!("bad value {val} for -{opt}"))
        };
        match opt {
            'F' => {}
            'd' => o.ib_dev = Some(val),
            'h' => {
                usage();
                std::process::exit(0);
            }
            'R' => o.rdma_cm = true,
            'p' => o.port = u16::try_from(num()?).map_err(|_| "bad port")?,
            'i' => o.ib_port = u8::try_from(num()?).map_err(|_| "bad ib port")?,
            's' => o.size = num()? as usize,
            'n' => o.iters = num()?,
            'm' => o.mtu = Some(Mtu::from_bytes(num()? as usize).ok_or("MTU must be 256..4096")?),
            'x' => o.gid_index = u8::try_from(num()?).map_err(|_| "bad GID index")?,
            't' => o.tx_depth = num()? as usize,
            'o' => o.out_reads = Some(num()? as u32),
            'A' => {
                o.atomic = match val.as_str() {
                    "FETCH_AND_ADD" => AtomicType::FetchAdd,
                    "CMP_AND_SWAP" => AtomicType::CmpSwap,
                    _ => return Err("atomic type: FETCH_AND_ADD or CMP_AND_SWAP".into()),
                }
            }
            other => return Err(format!("unknown option -{other}")),
        }
    }
    if o.verb == Verb::Atomic {
        o.size = 8; // perftest's atomics are always 8 bytes
    }
    if o.size == 0 || o.iters == 0 || o.tx_depth == 0 {
        return Err("size, iterations and tx depth must be positive".into());
    }
    o.tx_depth = o.tx_depth.min(o.iters as usize);
    Ok(o)
}

/// perftest's `struct bw_report_data` (the fields it exchanges).
#[derive(Clone, Copy, Debug, Default)]
struct Report {
    size: u64,
    iters: u64,
    bw_peak: f64,
    bw_avg: f64,
    msg_rate: f64,
}

fn xchg_report(comm: &mut Comm, my: &Report) -> Result<Report, String> {
    let mut f = [0u8; 8];
    let mut r = Report::default();
    comm.xchg(&my.size.to_be_bytes(), &mut f)?;
    r.size = u64::from_be_bytes(f);
    comm.xchg(&my.iters.to_be_bytes(), &mut f)?;
    r.iters = u64::from_be_bytes(f);
    comm.xchg(&my.bw_peak.to_bits().to_be_bytes(), &mut f)?;
    r.bw_peak = f64::from_bits(u64::from_be_bytes(f));
    comm.xchg(&my.bw_avg.to_bits().to_be_bytes(), &mut f)?;
    r.bw_avg = f64::from_bits(u64::from_be_bytes(f));
    comm.xchg(&my.msg_rate.to_bits().to_be_bytes(), &mut f)?;
    r.msg_rate = f64::from_bits(u64::from_be_bytes(f));
    Ok(r)
}

const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

fn print_report(r: &Report) {
    println!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
    );
}

fn print_dest(side: &str, d: &Dest) {
    println!(
        " {side} address: LID {:#06x} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
        d.lid, d.qpn, d.psn, d.rkey, d.vaddr
    );
    let g: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    println!(" GID: {}  ({})", g.join(":"), Ipv6Addr::from(d.gid));
}

fn inc(size: usize, cl: usize) -> usize {
    size.div_ceil(cl) * cl
}

fn run(o: Opts) -> Result<(), String> {
    // The side channel: TCP, or (-R) an RC connection made with rdma_cm whose device then carries
    // the test too. Its own connection asks for no READs (perftest's comm verb is SEND).
    let comm_param = ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    if o.server.is_none() {
        println!("\n************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
    }
    let mut comm = match (&o.server, o.rdma_cm) {
        (Some(host), false) => Comm::tcp_client(host, o.port)?,
        (Some(host), true) => Comm::cm_client(host, o.port, &comm_param)?,
        (None, false) => Comm::tcp_server(o.port)?,
        (None, true) => Comm::cm_server(o.port, &comm_param)?,
    };
    let ctx: Context = match comm.context() {
        Some(c) => c,
        None => {
            let devices = softrdma::devices().map_err(|e| format!("device list: {e}"))?;
            let dev = match &o.ib_dev {
                None => devices.into_iter().next().ok_or("no softrdma device")?,
                Some(d) => devices
                    .into_iter()
                    .find(|x| x.name() == d)
                    .ok_or_else(|| format!("IB device {d} not found"))?,
            };
            dev.open()
                .map_err(|e| format!("Couldn't get context for {}: {e}", dev.name()))?
        }
    };
    let port = ctx
        .query_port(o.ib_port)
        .map_err(|e| format!("query_port: {e}"))?;
    let dev_attr = ctx.query_device();

    // Versions, system data, MTU.
    let mut v = [0u8; VERSION_LEN];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let mut rv = [0u8; VERSION_LEN];
    comm.xchg(&v, &mut rv)?;
    let rem_version = {
        let end = rv.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        String::from_utf8_lossy(&rv[..end]).into_owned()
    };
    let rem_ver_num: f64 = rem_version.trim().parse().unwrap_or(0.0);
    if rem_ver_num < 5.70 {
        return Err(format!(
            "remote perftest version {rem_version:?} is older than 5.70: not compatible"
        ));
    }
    let mut b4 = [0u8; 4];
    comm.xchg(&PAGE_SIZE.to_be_bytes(), &mut b4)?;
    let cycle_buffer = PAGE_SIZE.max(u32::from_be_bytes(b4)) as usize;
    comm.xchg(&CACHE_LINE.to_be_bytes(), &mut b4)?;
    let cache_line = CACHE_LINE.max(u32::from_be_bytes(b4)).max(1) as usize;
    let my_mtu = match o.mtu {
        Some(m) if m as u8 <= port.active_mtu as u8 => m,
        Some(_) => {
            println!("Requested mtu is higher than active mtu ");
            println!("Changing to active mtu - {}", port.active_mtu as u8);
            port.active_mtu
        }
        None => port.active_mtu,
    };
    let mut m2 = [0u8; 2];
    m2[0] = b'0' + my_mtu as u8;
    let mut rm = [0u8; 2];
    comm.xchg(&m2, &mut rm)?;
    let rem_mtu = (rm[0] as char).to_digit(10).unwrap_or(0) as u8;
    let mtu = match Mtu::from_enum(rem_mtu as u32) {
        Some(r) if (r as u8) < (my_mtu as u8) => r,
        _ => my_mtu,
    };

    // Resources: one MR, two halves of max(size, cycle buffer) each; the first half is the local
    // source/target of this side's operations, the second half what the peer may access.
    let half = inc(o.size.max(cycle_buffer), cache_line);
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd
        .alloc_mr(2 * half, access)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    {
        let mut g = mr.lock().expect("an owned region");
        for (i, b) in g.iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0];
        }
        if o.verb == Verb::Atomic {
            g[half..].fill(0);
        }
    }
    let out_reads = match o.verb {
        Verb::Write => 1,
        _ => {
            let max = dev_attr.max_qp_rd_atom;
            match o.out_reads {
                Some(n) if n > 0 && n <= max => n,
                Some(n) if n > max => {
                    eprintln!(" Number of outstanding reads is above max = {max}");
                    eprintln!(" Changing to that max value");
                    max
                }
                _ => max,
            }
        }
    };
    // ib_send_bw's receiver keeps `rx_depth` receives posted (512, at most the iterations);
    // ib_send_lat's sides keep a few.
    let rx_depth = if o.lat {
        o.iters.min(LAT_RX_DEPTH) as usize
    } else if o.verb == Verb::Send {
        o.iters.min(512) as usize
    } else {
        1
    };
    let cq = ctx
        .create_cq((o.tx_depth + rx_depth) as u32 + 1, None)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let qp_attr = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCaps {
            max_send_wr: o.tx_depth as u32,
            max_recv_wr: rx_depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    };
    // With -R the test's QP is connected by rdma_cm too (`create_rdma_cm_connection`), between
    // two handshakes; the CM moves it to RTS. Without, it is moved by hand after the keys.
    let (qp, data_cm) = if o.rdma_cm {
        let reads = if o.verb == Verb::Write {
            0
        } else {
            out_reads.min(255) as u8
        };
        let param = ConnParam {
            responder_resources: reads,
            initiator_depth: reads,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
        comm.hand_shake(&Dest::default())?;
        let (qp, ch, id) = cm_data_qp(&o, &pd, &qp_attr, &param, comm.client)?;
        comm.hand_shake(&Dest::default())?;
        (qp, Some((ch, id)))
    } else {
        let qp = pd
            .create_qp(&qp_attr)
            .map_err(|e| format!("Couldn't create QP: {e}"))?;
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(o.ib_port),
            qp_access_flags: Some(
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            ),
            ..Default::default()
        })
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
        (qp, None)
    };

    let gid = ctx
        .query_gid(o.ib_port, o.gid_index)
        .map_err(|e| format!("query_gid {}: {e}", o.gid_index))?;
    let my = Dest {
        lid: port.lid,
        out_reads,
        qpn: qp.qp_num(),
        psn: getopt::random_psn(),
        rkey: mr.rkey(),
        vaddr: mr.addr() + half as u64,
        gid,
        srqn: 0,
    };

    println!("{RESULT_LINE}");
    println!(
        "                    {} {} Test (softrdma)",
        o.verb.tool().replace('_', " "),
        if o.lat { "Latency" } else { "BW" }
    );
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth        : {}", o.tx_depth);
    if o.verb != Verb::Write {
        println!(" Outstand reads  : {out_reads}");
    }
    if o.verb == Verb::Atomic {
        println!(
            " Atomic Type     : {}",
            match o.atomic {
                AtomicType::FetchAdd => "FETCH_AND_ADD",
                AtomicType::CmpSwap => "CMP_AND_SWAP",
            }
        );
    }
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {}", o.gid_index);
    println!(" Remote version  : {rem_version}");
    println!("{RESULT_LINE}");

    let rem = comm.hand_shake(&my)?;
    let v4 = |g: &[u8; 16]| g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
    if data_cm.is_none() && v4(&my.gid) != v4(&rem.gid) {
        return Err("Found Incompatibility issue with GID types.".into());
    }
    if data_cm.is_none() {
        connect_qp(&o, &qp, &my, &rem, mtu)?;
    }
    print_dest("local", &my);
    comm.hand_shake(&my)?;
    print_dest("remote", &rem);
    // The additional handshake once both QPs are past RTR.
    comm.hand_shake(&my)?;

    println!("{RESULT_LINE}");
    if o.lat {
        println!("{LAT_HEADER}");
    } else {
        println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        );
    }

    if o.lat {
        // ib_send_lat: both sides post their receives, one more handshake, then the ping-pong.
        post_receives(&qp, &mr, half, o.size, rx_depth)?;
        comm.hand_shake(&my)?;
        let lat = lat::ping_pong(&o, &qp, &cq, &mr, half, comm.client)?;
        lat::print(o.size, &lat);
        println!("{RESULT_LINE}");
        comm.close(&my)?;
    } else if o.verb == Verb::Send {
        // ib_send_bw: the receiver posts its receives, one more handshake, then both measure.
        if !comm.client {
            post_receives(&qp, &mr, half, o.size, rx_depth)?;
        }
        comm.hand_shake(&my)?;
        let rep = if comm.client {
            run_client(&o, &qp, &cq, &mr, half, cycle_buffer, cache_line, &rem)?
        } else {
            run_receiver(&o, &qp, &cq, &mr, half)?
        };
        print_report(&rep);
        println!("{RESULT_LINE}");
        comm.close(&my)?;
    } else if comm.client {
        let my_rep = run_client(&o, &qp, &cq, &mr, half, cycle_buffer, cache_line, &rem)?;
        print_report(&my_rep);
        println!("{RESULT_LINE}");
        comm.hand_shake(&my)?;
        xchg_report(&mut comm, &my_rep)?;
        comm.close(&my)?;
    } else {
        // The server only waits for the client to finish: its memory is the target.
        comm.hand_shake(&my)?;
        let rep = xchg_report(&mut comm, &Report::default())?;
        print_report(&rep);
        comm.close(&my)?;
        println!("{RESULT_LINE}");
        if o.verb == Verb::Atomic && o.atomic == AtomicType::FetchAdd {
            // Every FETCH_AND_ADD added 1 to an 8-byte word of the zeroed target half.
            let g = mr.lock().expect("an owned region");
            let sum: u64 = g[half..]
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                .sum();
            println!(
                " atomic check: the target words sum to {sum} (client reported {} iterations)",
                rep.iters
            );
        }
    }
    if let Some((ch, id)) = &data_cm {
        comm::disconnect(ch, id);
    }
    Ok(())
}

/// Without -R: RTR and RTS toward the peer's keys, as perftest's `ctx_connect`.
fn connect_qp(o: &Opts, qp: &QueuePair, my: &Dest, rem: &Dest, mtu: Mtu) -> Result<(), String> {
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(mtu),
        dest_qp_num: Some(rem.qpn),
        rq_psn: Some(rem.psn),
        max_dest_rd_atomic: Some(my.out_reads.min(255) as u8),
        min_rnr_timer: Some(12),
        ah_attr: Some(AddressVector {
            dlid: rem.lid,
            dgid: rem.gid,
            sgid_index: o.gid_index,
            hop_limit: 0xff,
            port_num: o.ib_port,
            ..Default::default()
        }),
        ..Default::default()
    })
    .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(my.psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(rem.out_reads.clamp(1, 128) as u8),
        ..Default::default()
    })
    .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
    Ok(())
}

/// With -R: the test QP's own rdma_cm connection to the same port (`create_rdma_cm_connection`).
/// The client retries while the server is not listening yet (REJECTED), 10 times 100 ms apart.
fn cm_data_qp(
    o: &Opts,
    pd: &softrdma::verbs::ProtectionDomain,
    attr: &QpInitAttr<'_>,
    param: &ConnParam,
    client: bool,
) -> Result<(QueuePair, EventChannel, CmId), String> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    if client {
        let host = o.server.as_deref().expect("client");
        for _ in 0..10 {
            let id = ch.create_id(PortSpace::Tcp).map_err(|e| e.to_string())?;
            comm::resolve(&ch, &id, host, o.port)?;
            let qp = id
                .create_qp(pd, attr)
                .map_err(|e| format!("Failed to create QP: {e}"))?;
            id.connect(param)
                .map_err(|e| format!("Failed to connect through RDMA CM: {e}"))?;
            let ev = ch
                .get_cm_event_timeout(Duration::from_secs(60))
                .ok_or("no answer to the test QP's connection request")?;
            match ev.event() {
                EventType::Established => {
                    drop(ev);
                    return Ok((qp, ch, id));
                }
                EventType::Rejected | EventType::Unreachable => {
                    drop(ev);
                    id.destroy();
                    std::thread::sleep(Duration::from_millis(100));
                }
                e => {
                    return Err(format!(
                        "RDMA CM event error: Event: {e}; error: {}",
                        ev.status()
                    ))
                }
            }
        }
        Err("Failed to connect RDMA CM client, tried 10 times.".into())
    } else {
        let id = comm::accept_one(&ch, o.port)?;
        let qp = id
            .create_qp(pd, attr)
            .map_err(|e| format!("Failed to create QP: {e}"))?;
        id.accept(param)
            .map_err(|e| format!("Failed to accept RDMA CM connection: {e}"))?;
        Ok((qp, ch, id))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_client(
    o: &Opts,
    qp: &softrdma::verbs::QueuePair,
    cq: &softrdma::verbs::CompletionQueue,
    mr: &softrdma::verbs::MemoryRegion,
    half: usize,
    cycle_buffer: usize,
    cache_line: usize,
    rem: &Dest,
) -> Result<Report, String> {
    // Like perftest, walk the remote (and local) address through the cycle buffer in cache-line
    // aligned steps; messages larger than the cycle buffer always use offset 0.
    let step = inc(o.size, cache_line);
    let region = o.size.max(cycle_buffer);
    let offset_of = |k: u64| -> usize {
        let slots = (region / step).max(1);
        (k as usize % slots) * step
    };
    let _ = half;
    let mut posted: u64 = 0;
    let mut done: u64 = 0;
    let mut wcs = vec![WorkCompletion::default(); o.tx_depth.max(16)];
    let start = Instant::now();
    let mut last_progress = Instant::now();
    let mut first_done: Option<Instant> = None;
    while done < o.iters {
        while posted < o.iters && (posted - done) < o.tx_depth as u64 {
            let off = offset_of(posted);
            let sge = [Sge {
                addr: mr.addr() + off as u64,
                length: o.size as u32,
                lkey: mr.lkey(),
            }];
            let remote_addr = rem.vaddr + off as u64;
            let op = match o.verb {
                Verb::Write => SendOp::RdmaWrite {
                    remote_addr,
                    rkey: rem.rkey,
                },
                Verb::Read => SendOp::RdmaRead {
                    remote_addr,
                    rkey: rem.rkey,
                },
                Verb::Send => SendOp::Send,
                Verb::Atomic => match o.atomic {
                    AtomicType::FetchAdd => SendOp::FetchAdd {
                        remote_addr,
                        rkey: rem.rkey,
                        add: ATOMIC_ADD_VALUE,
                    },
                    AtomicType::CmpSwap => SendOp::CompareSwap {
                        remote_addr,
                        rkey: rem.rkey,
                        compare: 0,
                        swap: ATOMIC_SWAP_VALUE,
                    },
                },
            };
            post_signaled(qp, posted, op, &sge)?;
            posted += 1;
        }
        let n = cq
            .poll(&mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        for wc in &wcs[..n] {
            check_wc(wc, "client")?;
        }
        if n > 0 {
            done += n as u64;
            first_done.get_or_insert_with(Instant::now);
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "no completion for 30 s ({done} of {} done, {posted} posted)",
                o.iters
            ));
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let bytes = o.size as f64 * o.iters as f64;
    let bw_avg = bytes / secs / (1u64 << 20) as f64;
    Ok(Report {
        size: o.size as u64,
        iters: o.iters,
        // No per-completion cycle counters here: the peak is the average.
        bw_peak: bw_avg,
        bw_avg,
        msg_rate: o.iters as f64 / secs / 1e6,
    })
}

/// ib_send_bw's `run_iter_bw_server`: count `iters` receive completions, reposting each.
fn run_receiver(
    o: &Opts,
    qp: &QueuePair,
    cq: &softrdma::verbs::CompletionQueue,
    mr: &softrdma::verbs::MemoryRegion,
    half: usize,
) -> Result<Report, String> {
    let sge = [Sge {
        addr: mr.addr() + half as u64,
        length: o.size as u32,
        lkey: mr.lkey(),
    }];
    let mut wcs = vec![WorkCompletion::default(); 64];
    let mut got: u64 = 0;
    let mut posted = o.iters.min(512);
    let mut start: Option<Instant> = None;
    let mut last_progress = Instant::now();
    while got < o.iters {
        let n = cq
            .poll(&mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        for wc in &wcs[..n] {
            check_wc(wc, "server")?;
            got += 1;
            if posted < o.iters {
                qp.post_recv(&[RecvWr {
                    wr_id: posted,
                    sg_list: &sge,
                }])
                .map_err(|e| format!("Couldn't post recv: rcnt={got}: {e}"))?;
                posted += 1;
            }
        }
        if n > 0 {
            start.get_or_insert_with(Instant::now);
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "no receive for 30 s ({got} of {} received)",
                o.iters
            ));
        }
    }
    let secs = start.map_or(1e-9, |t| t.elapsed().as_secs_f64()).max(1e-9);
    let bw = o.size as f64 * o.iters as f64 / secs / (1u64 << 20) as f64;
    Ok(Report {
        size: o.size as u64,
        iters: o.iters,
        bw_peak: bw,
        bw_avg: bw,
        msg_rate: o.iters as f64 / secs / 1e6,
    })
}

/// `ctx_set_recv_wqes`: `n` receives of `size` bytes into the MR's second half.
fn post_receives(
    qp: &QueuePair,
    mr: &softrdma::verbs::MemoryRegion,
    half: usize,
    size: usize,
    n: usize,
) -> Result<(), String> {
    let sge = [Sge {
        addr: mr.addr() + half as u64,
        length: size as u32,
        lkey: mr.lkey(),
    }];
    for i in 0..n {
        qp.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &sge,
        }])
        .map_err(|e| format!(" Failed to post receive recv_wqes: {e}"))?;
    }
    Ok(())
}

/// Post one signaled send work request (`wr_id`, `op` over `sge`).
fn post_signaled(qp: &QueuePair, wr_id: u64, op: SendOp, sge: &[Sge]) -> Result<(), String> {
    qp.post_send(&[SendWr {
        wr_id,
        op,
        sg_list: sge,
        flags: SendFlags::SIGNALED,
    }])
    .map_err(|e| format!("Couldn't post send: scnt={wr_id}: {e}"))
}

/// A completion in error ends the test, as perftest's do.
fn check_wc(wc: &WorkCompletion, side: &str) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    Err(format!(
        "Completion with error at {side}: wr_id {} status {} ({:?})",
        wc.wr_id,
        wc.status.as_str(),
        wc.opcode
    ))
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("perftest: {e}");
            usage();
            return ExitCode::FAILURE;
        }
    };
    match run(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perftest: {e}");
            ExitCode::FAILURE
        }
    }
}
