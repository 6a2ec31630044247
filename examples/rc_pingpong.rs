//! `ibv_rc_pingpong` for softrdma: same flags, same TCP exchange of LID:QPN:PSN:GID, same output,
//! so it interoperates with rdma-core's `ibv_rc_pingpong` (on kernel rdma_rxe) in either role.
//! With `--uc` it is `ibv_uc_pingpong`, whose flow is the same: an Unreliable Connected QP,
//! brought to RTR with only the path, MTU, remote QPN and PSN, to RTS with only the send PSN.
//!
//! ```text
//! cargo run --release --example rc_pingpong -- -g 1              # server
//! cargo run --release --example rc_pingpong -- -g 1 127.0.0.1    # client
//! cargo run --release --example rc_pingpong -- --uc -g 1         # ibv_uc_pingpong's server
//! ```

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Instant;

use softrdma::verbs::{
    AccessFlags, AddressVector, Mtu, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcStatus,
};
use softrdma::verbs::{
    CompletionChannel, Context, QpInitAttr, QpType, RecvWr, SendWr, WorkCompletion,
};

mod getopt;
#[path = "pingpong_exch/mod.rs"]
mod pingpong_exch;
use pingpong_exch::*;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

struct Opts {
    port: u16,
    ib_dev: Option<String>,
    ib_port: u8,
    size: usize,
    mtu: Mtu,
    rx_depth: usize,
    iters: usize,
    sl: u8,
    events: bool,
    gidx: i32,
    server: Option<String>,
    /// `--uc`: a UC QP, as `ibv_uc_pingpong`.
    uc: bool,
}

fn usage(argv0: &str) {
    println!("Usage:");
    println!("  {argv0}            start a server and wait for connection");
    println!("  {argv0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    println!("  -p, --port=<port>      listen on/connect to port <port> (default 18515)");
    println!("  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)");
    println!("  -i, --ib-port=<port>   use port <port> of IB device (default 1)");
    println!("  -s, --size=<size>      size of message to exchange (default 4096)");
    println!("  -m, --mtu=<size>       path MTU (default 1024)");
    println!("  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)");
    println!("  -n, --iters=<iters>    number of exchanges (default 1000)");
    println!("  -l, --sl=<sl>          service level value");
    println!("  -e, --events           sleep on CQ events (default poll)");
    println!("  -g, --gid-idx=<gid index> local port gid index");
    println!("  -U, --uc               use a UC QP, as ibv_uc_pingpong (default RC)");
}

/// `getopt_long(argc, argv, "p:d:i:s:m:r:n:l:eg:", ...)` as `ibv_rc_pingpong` parses it (and
/// `ibv_uc_pingpong`: the same options), plus `-U`/`--uc`.
fn parse_args() -> Result<Opts, ()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = getopt::Spec {
        with_value: "pdismrnlg",
        flags: "eU",
        long: &[
            ("port", 'p'),
            ("ib-dev", 'd'),
            ("ib-port", 'i'),
            ("size", 's'),
            ("mtu", 'm'),
            ("rx-depth", 'r'),
            ("iters", 'n'),
            ("sl", 'l'),
            ("events", 'e'),
            ("gid-idx", 'g'),
            ("uc", 'U'),
        ],
    };
    let mut o = Opts {
        port: 18515,
        ib_dev: None,
        ib_port: 1,
        size: 4096,
        mtu: Mtu::Mtu1024,
        rx_depth: 500,
        iters: 1000,
        sl: 0,
        events: false,
        gidx: -1,
        server: None,
        uc: false,
    };
    for arg in getopt::parse(&args, &spec).map_err(|_| ())? {
        let (opt, val) = match arg {
            getopt::Arg::Positional(host) if o.server.is_none() => {
                o.server = Some(host);
                continue;
            }
            getopt::Arg::Positional(_) => return Err(()),
            getopt::Arg::Opt(opt, val) => (opt, val.unwrap_or_default()),
        };
        let num = || getopt::c_num(&val).ok_or(());
        match opt {
            'e' => o.events = true,
            'U' => o.uc = true,
            'p' => o.port = u16::try_from(num()?).map_err(|_| ())?,
            'd' => o.ib_dev = Some(val.clone()),
            'i' => o.ib_port = u8::try_from(num()?).map_err(|_| ())?.max(1),
            's' => o.size = num()? as usize,
            'm' => o.mtu = Mtu::from_bytes(num()? as usize).ok_or(())?,
            'r' => o.rx_depth = num()? as usize,
            'n' => o.iters = num()? as usize,
            'l' => o.sl = num()? as u8,
            'g' => o.gidx = num()? as i32,
            _ => return Err(()),
        }
    }
    Ok(o)
}

struct Pingpong {
    ctx: Context,
    cq: softrdma::verbs::CompletionQueue,
    channel: Option<CompletionChannel>,
    qp: softrdma::verbs::QueuePair,
    mr: softrdma::verbs::MemoryRegion,
    size: usize,
    send_flags: SendFlags,
    rx_depth: usize,
}

impl Pingpong {
    fn post_recv(&self, n: usize) -> usize {
        let sge = [Sge {
            addr: self.mr.addr(),
            length: self.size as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        };
        for i in 0..n {
            if self.qp.post_recv(std::slice::from_ref(&wr)).is_err() {
                return i;
            }
        }
        n
    }

    fn post_send(&self) -> bool {
        let sge = [Sge {
            addr: self.mr.addr(),
            length: self.size as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = SendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            sg_list: &sge,
            flags: self.send_flags,
        };
        self.qp.post_send(&[wr]).is_ok()
    }

    fn connect(&self, o: &Opts, my_psn: u32, dest: &Dest) -> Result<(), String> {
        let mut av = AddressVector {
            dlid: dest.lid,
            sl: o.sl,
            port_num: o.ib_port,
            ..Default::default()
        };
        if dest.gid[8..].iter().any(|&b| b != 0) {
            av.hop_limit = 1;
            av.dgid = dest.gid;
            av.sgid_index = o.gidx.max(0) as u8;
        }
        let mut rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(o.mtu),
            dest_qp_num: Some(dest.qpn),
            rq_psn: Some(dest.psn),
            ah_attr: Some(av),
            ..Default::default()
        };
        if !o.uc {
            rtr.max_dest_rd_atomic = Some(1);
            rtr.min_rnr_timer = Some(12);
        }
        self.qp
            .modify(&rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        let mut rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(my_psn),
            ..Default::default()
        };
        if !o.uc {
            rts.timeout = Some(14);
            rts.retry_cnt = Some(7);
            rts.rnr_retry = Some(7);
            rts.max_rd_atomic = Some(1);
        }
        self.qp
            .modify(&rts)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    }
}

fn init_ctx(o: &Opts) -> Result<Pingpong, String> {
    let devices = softrdma::devices().map_err(|e| format!("Failed to get IB devices list: {e}"))?;
    let dev = match &o.ib_dev {
        None => devices.into_iter().next().ok_or("No IB devices found")?,
        Some(name) => devices
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| format!("IB device {name} not found"))?,
    };
    let ctx = dev
        .open()
        .map_err(|e| format!("Couldn't get context for {}: {e}", dev.name()))?;
    let channel = if o.events {
        Some(
            ctx.create_comp_channel()
                .map_err(|e| format!("Couldn't create completion channel: {e}"))?,
        )
    } else {
        None
    };
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mr = pd
        .alloc_mr(o.size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    mr.lock().expect("an owned region").fill(0x7b);
    let cq = ctx
        .create_cq(o.rx_depth as u32 + 1, channel.as_ref())
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps {
                max_send_wr: 1,
                max_recv_wr: o.rx_depth as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: if o.uc { QpType::Uc } else { QpType::Rc },
            sq_sig_all: false,
            srq: None,
        })
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    let mut send_flags = SendFlags::SIGNALED;
    if qp.caps().max_inline_data as usize >= o.size {
        send_flags.insert(SendFlags::INLINE);
    }
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(o.ib_port),
        qp_access_flags: Some(AccessFlags::NONE),
        ..Default::default()
    })
    .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    Ok(Pingpong {
        ctx,
        cq,
        channel,
        qp,
        mr,
        size: o.size,
        send_flags,
        rx_depth: o.rx_depth,
    })
}

fn server_exch_dest(pp: &Pingpong, o: &Opts, my: &Dest) -> Result<Dest, String> {
    let l = TcpListener::bind(("0.0.0.0", o.port))
        .map_err(|_| format!("Couldn't listen to port {}", o.port))?;
    let (mut s, _) = l.accept().map_err(|_| "accept() failed".to_string())?;
    drop(l);
    let m = read_msg(&mut s).map_err(|_| "Couldn't read remote address".to_string())?;
    let rem = msg_to_dest(&m)
        .ok_or_else(|| format!("{}/{MSG_LEN}: Couldn't read remote address", m.len()))?;
    pp.connect(o, my.psn, &rem)
        .map_err(|e| format!("{e}\nCouldn't connect to remote QP"))?;
    s.write_all(&dest_to_msg(my))
        .map_err(|_| "Couldn't send/recv local address".to_string())?;
    let _ = read_msg(&mut s);
    Ok(rem)
}

fn run(o: Opts) -> Result<(), String> {
    let pp = init_ctx(&o)?;
    let mut routs = pp.post_recv(pp.rx_depth);
    if routs < pp.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if o.events {
        pp.cq
            .req_notify(false)
            .map_err(|_| "Couldn't request CQ notification".to_string())?;
    }
    let port = pp
        .ctx
        .query_port(o.ib_port)
        .map_err(|_| "Couldn't get port info".to_string())?;
    let gid = if o.gidx >= 0 {
        pp.ctx
            .query_gid(o.ib_port, o.gidx as u8)
            .map_err(|_| format!("can't read sgid of index {}", o.gidx))?
    } else {
        [0u8; 16]
    };
    let my = Dest {
        lid: port.lid,
        qpn: pp.qp.qp_num(),
        psn: getopt::random_psn(),
        gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my.lid,
        my.qpn,
        my.psn,
        gid_str(&my.gid)
    );
    let rem = match &o.server {
        Some(server) => client_exch_dest(server, o.port, &my)?,
        None => server_exch_dest(&pp, &o, &my)?,
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        gid_str(&rem.gid)
    );
    if o.server.is_some() {
        pp.connect(&o, my.psn, &rem)?;
    }

    let mut pending = RECV_WRID;
    if o.server.is_some() {
        if !pp.post_send() {
            return Err("Couldn't post send".into());
        }
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt, mut num_cq_events) = (0usize, 0usize, 0u32);
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < o.iters || scnt < o.iters {
        if let Some(ch) = &pp.channel {
            let _ev_cq = ch
                .get_cq_event()
                .map_err(|_| "Failed to get cq_event".to_string())?;
            num_cq_events += 1;
            pp.cq
                .req_notify(false)
                .map_err(|_| "Couldn't request CQ notification".to_string())?;
        }
        let ne = loop {
            let ne = pp
                .cq
                .poll(&mut wc)
                .map_err(|e| format!("poll CQ failed {e}"))?;
            if o.events || ne >= 1 {
                break ne;
            }
        };
        for w in &wc[..ne] {
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    w.status.as_str(),
                    w.status as u32,
                    w.wr_id as i32
                ));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += pp.post_recv(pp.rx_depth - routs);
                        if routs < pp.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {}", other as i32)),
            }
            pending &= !w.wr_id;
            if scnt < o.iters && pending == 0 {
                if !pp.post_send() {
                    return Err("Couldn't post send".into());
                }
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (o.size * o.iters * 2) as u64;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / o.iters as f64
    );
    pp.cq.ack_events(num_cq_events);
    Ok(())
}

fn main() -> ExitCode {
    let argv0 = std::env::args()
        .next()
        .unwrap_or_else(|| "rc_pingpong".into());
    let o = match parse_args() {
        Ok(o) => o,
        Err(()) => {
            usage(&argv0);
            return ExitCode::from(1);
        }
    };
    match run(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
